// A Cluster read from a JSON file (the format: docs/plan_files.md):
//
//   {"nodes": [{"name": "t4-0", "devices": 4, "tflops": 65, "memory_gb": 16,
//               "link": {"gbit": 50, "latency_us": 10}}, ...],
//    "inter_node": {"gbit": 10, "latency_us": 50},
//    "links": [{"between": ["t4-0", "t4-1"], "gbyte": 12.5}]}
//
// Devices are numbered node by node in file order (device i is rank i) and
// named "<node>/<i>". "tflops": "measure" and "memory_gbps": "measure" time
// this machine (plan/measure.hpp), once per file however many nodes ask.
// Every mistake is one line with the file, line and column, e.g.
//   cluster.json:7:21: nodes[1].devices is -2; give a whole number of devices, 1 or more
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/comm/links.hpp"
#include "loom/core/error.hpp"
#include "loom/io/json.hpp"
#include "loom/plan/cluster.hpp"
#include "loom/plan/json_fields.hpp"
#include "loom/plan/measure.hpp"

namespace loom::plan {

namespace detail_cluster_json {

namespace jf = json_fields;

// The link matrix is dense (devices^2 entries): a typo such as 1e6 devices
// must fail here with a message rather than exhaust memory.
inline constexpr std::int64_t max_devices = 4096;

inline constexpr std::string_view link_keys_hint =
    R"(give one of "gbit" (Gbit/s), "gbyte" (GB/s) or "unlimited": true)";

// The link fields of an object (a node's "link", "inter_node", an entry of
// "links"): exactly one bandwidth, and a latency in microseconds.
inline comm::Link read_link(const jf::Object& link) {
    const bool gbit = link.has("gbit"), gbyte = link.has("gbyte"), unlimited = link.has("unlimited");
    const int given = int{gbit} + int{gbyte} + int{unlimited};
    if (given == 0) link.node().fail("has no bandwidth; ", link_keys_hint);
    if (given > 1) {
        const char* first = gbit ? "\"gbit\"" : "\"gbyte\"";
        const char* second = gbit && gbyte ? "\"gbyte\"" : "\"unlimited\"";
        link.node().fail("gives both ", first, " and ", second, "; ", link_keys_hint, ", only one");
    }
    // Divided rather than multiplied by 1e-6 so that 10 us is exactly the
    // double 10e-6 a hand-written comm::Link would hold.
    const double latency = link.non_negative_or("latency_us", 0, "microseconds") / 1e6;
    if (gbit) return comm::Link::gbit(link.positive("gbit", "Gbit/s"), latency);
    if (gbyte) return comm::Link::gbytes(link.positive("gbyte", "GB/s"), latency);
    const jf::Node flag = link.required("unlimited", "give true");
    if (!flag.value().boolean())
        flag.invalid(R"(give true, or a bandwidth as "gbit" or "gbyte")");
    return comm::Link{std::numeric_limits<double>::infinity(), latency};
}

[[nodiscard]] inline std::string give_number_or_measure(std::string_view unit) {
    return jf::give_positive(unit) + R"(, or "measure" to time this machine)";
}

// "measure" or a positive number of `unit`; `measured` is called for the
// former and times this machine at most once per file.
template <class Measure>
double number_or_measure(const jf::Node& field, std::string_view unit, std::optional<double>& cache,
                         Measure measured) {
    if (field.is_string("measure")) {
        if (!cache) cache = measured();
        return *cache;
    }
    const std::optional<double> x = field.value().as_double();
    if (!x || !std::isfinite(*x) || *x <= 0) field.invalid(give_number_or_measure(unit));
    return *x;
}

}  // namespace detail_cluster_json

// Parses a cluster file's text; `source` names it in messages ("cluster.json").
[[nodiscard]] inline Cluster read_cluster(std::string_view text, std::string_view source = "cluster") {
    namespace jf = json_fields;
    using namespace detail_cluster_json;
    const jf::Document doc(text, source);
    const jf::Object top = doc.top({"nodes", "inter_node", "links", "shared_cores", "wake_us"});

    const double shared_cores = top.non_negative_or("shared_cores", 0, "cores");
    const std::string nodes_hint =
        R"(give a non-empty array of nodes, e.g. [{"name": "n0", "devices": 1, "tflops": 10}])";
    const jf::Node nodes_field = top.required("nodes", nodes_hint);
    const std::vector<jf::Node> node_fields = nodes_field.elements(nodes_hint);
    if (node_fields.empty()) nodes_field.invalid(nodes_hint);

    std::optional<double> measured_flops, measured_bandwidth;
    std::vector<NodeSpec> nodes;
    std::vector<DeviceSpec> devices;
    std::vector<comm::Link> intra;       // per node; unused when it has one device
    std::vector<int> first_device, device_count;
    for (const jf::Node& field : node_fields) {
        const jf::Object node =
            field.object({"name", "devices", "tflops", "memory_gb", "memory_gbps", "cores", "link"});
        const jf::Node name_field = node.required("name", jf::give_string("a node name"));
        std::string name = name_field.string("a node name");
        if (name.empty()) name_field.invalid("give a node name of one character or more");
        for (std::size_t i = 0; i < nodes.size(); ++i)
            if (nodes[i].name == name)
                name_field.fail("is ", io::json::quote(name), " again (nodes[", i,
                                "] is called that); give each node a different name");
        const jf::Node devices_field =
            node.required("devices", jf::give_integer(1, std::numeric_limits<std::int64_t>::max(), "devices"));
        const std::int64_t count = devices_field.integer(1, "devices");
        const auto before = static_cast<std::int64_t>(devices.size());
        if (count > max_devices - before)
            devices_field.fail("makes ", before, " + ", count,
                               " devices; a cluster may have at most ", max_devices, " in all");

        constexpr std::string_view tflops_unit = "TFLOP/s per device";
        const double flops = 1e12 * number_or_measure(node.required("tflops", give_number_or_measure(tflops_unit)),
                                                      tflops_unit, measured_flops,
                                                      [] { return measure_gemm_flops() / 1e12; });
        double memory = std::numeric_limits<double>::infinity();  // absent: not a constraint
        if (const std::optional<jf::Node> gb = node.optional("memory_gb")) memory = 1e9 * gb->positive("GB");
        double bandwidth = 0;
        if (const std::optional<jf::Node> gbps = node.optional("memory_gbps"))
            bandwidth = 1e9 * number_or_measure(*gbps, "GB/s", measured_bandwidth,
                                                [] { return measure_memory_bandwidth() / 1e9; });
        const double cores = node.non_negative_or("cores", 0, "cores");
        if (cores > 0 && shared_cores > 0)
            node.optional("cores")->fail(
                "is given, and so is \"shared_cores\": all devices share those; drop one (\"cores\" for nodes that are "
                "machines of their own, \"shared_cores\" when all nodes run on one machine)");

        comm::Link link;
        if (const std::optional<jf::Node> link_field = node.optional("link"))
            link = read_link(link_field->object({"gbit", "gbyte", "unlimited", "latency_us"}));
        else if (count > 1)
            node.node().fail("has ", count, " devices but no \"link\" between them; give one, e.g. \"link\": "
                             "{\"gbit\": 100, \"latency_us\": 5} or {\"unlimited\": true}");

        const int index = static_cast<int>(nodes.size());
        first_device.push_back(static_cast<int>(devices.size()));
        device_count.push_back(static_cast<int>(count));
        for (std::int64_t d = 0; d < count; ++d)
            devices.push_back(DeviceSpec{name + "/" + std::to_string(d), index, flops, memory, bandwidth});
        nodes.push_back(NodeSpec{std::move(name), cores});
        intra.push_back(link);
    }

    std::optional<comm::Link> inter_node;
    if (const std::optional<jf::Node> field = top.optional("inter_node"))
        inter_node = read_link(field->object({"gbit", "gbyte", "unlimited", "latency_us"}));

    // Per-pair overrides, symmetric: pair[a][b] is the links[] entry that joins a and b.
    const std::size_t n = nodes.size();
    std::vector<std::optional<comm::Link>> pair(n * n);
    std::vector<std::size_t> pair_entry(n * n, 0);
    if (const std::optional<jf::Node> links_field = top.optional("links")) {
        const std::string links_hint = R"(give an array of {"between": ["a", "b"], "gbit": ...})";
        std::vector<jf::Node> entries = links_field->elements(links_hint);
        for (std::size_t e = 0; e < entries.size(); ++e) {
            const jf::Object entry = entries[e].object({"between", "gbit", "gbyte", "unlimited", "latency_us"});
            const std::string between_hint = R"(give the two node names it joins, e.g. "between": ["a", "b"])";
            const jf::Node between = entry.required("between", between_hint);
            const std::vector<jf::Node> ends = between.elements(between_hint);
            if (ends.size() != 2) between.invalid(between_hint);
            std::size_t at[2] = {0, 0};
            for (int side = 0; side < 2; ++side) {
                const std::string end = ends[static_cast<std::size_t>(side)].string("a node name");
                std::size_t found = n;
                for (std::size_t i = 0; i < n; ++i)
                    if (nodes[i].name == end) found = i;
                if (found == n) {
                    std::string known;
                    for (std::size_t i = 0; i < n; ++i) known += (i == 0 ? "" : ", ") + nodes[i].name;
                    ends[static_cast<std::size_t>(side)].invalid("give one of the nodes: " + known);
                }
                at[side] = found;
            }
            if (at[0] == at[1])
                between.fail("names node ", nodes[at[0]].name,
                             " twice; give two different nodes (the link inside a node is its \"link\")");
            const std::size_t key = at[0] * n + at[1];
            if (pair[key])
                entries[e].fail("joins ", nodes[at[0]].name, " and ", nodes[at[1]].name, " again (links[",
                                pair_entry[key], "] does already); give each pair of nodes once");
            const comm::Link link = read_link(entry);
            pair[key] = pair[at[1] * n + at[0]] = link;
            pair_entry[key] = pair_entry[at[1] * n + at[0]] = e;
        }
    }

    // Every pair of nodes needs a link; name the first without one.
    std::size_t missing = 0, first_a = 0, first_b = 0;
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = a + 1; b < n; ++b)
            if (!pair[a * n + b] && !inter_node && missing++ == 0) {
                first_a = a;
                first_b = b;
            }
    if (missing > 0) {
        const std::string& a = nodes[first_a].name;
        const std::string& b = nodes[first_b].name;
        LOOM_FAIL(source, ": no link between nodes ", a, " and ", b,
                  missing > 1 ? loom::detail::concat(", nor for ", missing - 1, " other pair", missing > 2 ? "s" : "",
                                                     " of nodes")
                              : std::string(),
                  "; add \"inter_node\" or {\"between\": [", io::json::quote(a), ", ", io::json::quote(b),
                  "], \"gbit\": ...} to \"links\"");
    }

    comm::Links links(static_cast<int>(devices.size()));
    for (std::size_t a = 0; a < n; ++a)
        for (std::size_t b = 0; b < n; ++b) {
            const comm::Link link = a == b ? intra[a] : pair[a * n + b] ? *pair[a * n + b] : *inter_node;
            for (int i = 0; i < device_count[a]; ++i)
                for (int j = 0; j < device_count[b]; ++j)
                    links.set(first_device[a] + i, first_device[b] + j, link);
        }
    Cluster cluster(std::move(nodes), std::move(devices), std::move(links), shared_cores);
    if (const std::optional<jf::Node> wake = top.optional("wake_us")) {
        // "measure": what a blocking exchange costs this machine's rank threads
        // when as many as the cluster's devices share the cores.
        if (wake->is_string("measure")) {
            if (shared_cores <= 0)
                wake->fail(R"(is "measure" without "shared_cores"; give "shared_cores" (the cores the rank threads )"
                           R"(share), or a number of microseconds)");
            cluster.set_wake_seconds(measure_exchange_seconds(cluster.size(), shared_cores));
        } else {
            const std::optional<double> us = wake->value().as_double();
            if (!us || !std::isfinite(*us) || *us < 0)
                wake->invalid(R"(give 0 or more microseconds, or "measure" to time this machine)");
            cluster.set_wake_seconds(*us / 1e6);
        }
    }
    return cluster;
}

// Reads and parses a cluster file; messages name `path`.
[[nodiscard]] inline Cluster load_cluster(const std::string& path) {
    return read_cluster(json_fields::read_file(path, "load_cluster",
                                               "give the path of a cluster file (its format: docs/plan_files.md)"),
                        path);
}

}  // namespace loom::plan
