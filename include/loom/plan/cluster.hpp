// Cluster: the machines a plan is made for. Devices (their compute speed and
// memory, grouped into nodes) and the link between every pair of devices
// (bandwidth and latency, the comm::Links that Shaped<Comm> also sleeps by,
// so the planner prices a collective exactly as a shaped run takes it).
//
// A node may say its devices share `cores` CPU cores: rank threads of one
// process on a small machine (ThreadWorld). The simulator then runs them by
// processor sharing, each active device at speed x min(1, cores / active),
// which is how eight rank threads behave on two cores. When the nodes are
// themselves rank threads of one machine (two emulated nodes of four ranks
// on a 2-core laptop), the cores are shared by the whole cluster instead:
// `shared_cores` > 0 says so, and the nodes' own `cores` are then ignored.
//
// Written by hand, read from JSON (plan/cluster_json.hpp), or made by
// Cluster::uniform for tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "loom/comm/links.hpp"
#include "loom/core/error.hpp"

namespace loom::plan {

struct DeviceSpec {
    std::string name;          // "node0/gpu3"
    int node = 0;              // index into Cluster::nodes
    double flops = 1e12;       // sustained FLOP/s of its kernels (measured or given)
    double memory = std::numeric_limits<double>::infinity();  // bytes a rank may use
    double bandwidth = 0;      // bytes/s of device memory; 0: memory-bound work is not priced
};

struct NodeSpec {
    std::string name;
    double cores = 0;          // > 0: its devices share this many cores (processor sharing)
};

class Cluster {
public:
    Cluster() : links_(1) {}
    // `shared_cores` > 0: every device of the cluster shares that many cores
    // (the nodes' own `cores` are ignored); 0: only what each node says.
    Cluster(std::vector<NodeSpec> nodes, std::vector<DeviceSpec> devices, comm::Links links, double shared_cores = 0)
        : nodes_(std::move(nodes)), devices_(std::move(devices)), links_(std::move(links)),
          shared_cores_(shared_cores) {
        LOOM_CHECK(!devices_.empty(), "cluster: it has no devices; a cluster needs at least one");
        LOOM_CHECK(links_.ranks() == size(), "cluster: links for ", links_.ranks(), " devices but the cluster has ",
                   size());
        for (const DeviceSpec& d : devices_) {
            LOOM_CHECK(d.node >= 0 && d.node < static_cast<int>(nodes_.size()), "cluster: device ", d.name,
                       " is on node ", d.node, " of ", nodes_.size());
            LOOM_CHECK(d.flops > 0 && std::isfinite(d.flops), "cluster: device ", d.name, " has speed ", d.flops,
                       " FLOP/s; it must be positive and finite");
            LOOM_CHECK(d.memory > 0, "cluster: device ", d.name, " has ", d.memory, " bytes of memory; it needs some");
            LOOM_CHECK(d.bandwidth >= 0, "cluster: device ", d.name, " has memory bandwidth ", d.bandwidth,
                       " bytes/s; give a positive rate, or 0 when memory-bound work is not priced");
        }
        for (const NodeSpec& n : nodes_)
            LOOM_CHECK(n.cores >= 0 && std::isfinite(n.cores), "cluster: node ", n.name, " has ", n.cores,
                       " cores; give a positive count, or 0 when its devices do not share cores");
        LOOM_CHECK(shared_cores_ >= 0 && std::isfinite(shared_cores_), "cluster: shared_cores is ", shared_cores_,
                   "; give a positive count of cores all devices share, or 0 when they do not share one machine");
    }

    // `nodes` x `per_node` equal devices: `intra` inside a node, `inter` between.
    [[nodiscard]] static Cluster uniform(int nodes, int per_node, double flops, double memory, comm::Link intra,
                                         comm::Link inter, double cores_per_node = 0) {
        LOOM_CHECK(nodes >= 1 && per_node >= 1, "cluster: ", nodes, " nodes of ", per_node,
                   " devices; both must be at least 1");
        std::vector<NodeSpec> node_specs;
        std::vector<DeviceSpec> devices;
        for (int n = 0; n < nodes; ++n) {
            node_specs.push_back({"node" + std::to_string(n), cores_per_node});
            for (int d = 0; d < per_node; ++d)
                devices.push_back({"node" + std::to_string(n) + "/" + std::to_string(d), n, flops, memory});
        }
        return Cluster(std::move(node_specs), std::move(devices),
                       comm::Links::nodes(nodes * per_node, per_node, intra, inter));
    }

    [[nodiscard]] int size() const noexcept { return static_cast<int>(devices_.size()); }
    [[nodiscard]] const std::vector<DeviceSpec>& devices() const noexcept { return devices_; }
    [[nodiscard]] const std::vector<NodeSpec>& nodes() const noexcept { return nodes_; }
    [[nodiscard]] const DeviceSpec& device(int i) const { return devices_.at(static_cast<std::size_t>(i)); }
    [[nodiscard]] const comm::Links& links() const noexcept { return links_; }
    // > 0: all devices share this many cores, whatever the nodes say.
    [[nodiscard]] double shared_cores() const noexcept { return shared_cores_; }

    // Rank threads that outnumber their cores: the CPU seconds of the cores
    // one blocking exchange costs a thread (the scheduler's turn and the
    // caches it refills; plan/measure.hpp's measure_exchange_seconds times
    // it). 0 for devices of their own.
    [[nodiscard]] double wake_seconds() const noexcept { return wake_seconds_; }
    Cluster& set_wake_seconds(double seconds) {
        LOOM_CHECK(seconds >= 0 && std::isfinite(seconds), "cluster: wake_us is ", seconds * 1e6,
                   "; give 0 or more microseconds");
        wake_seconds_ = seconds;
        return *this;
    }

    // The fewest devices on one node: the largest tensor-parallel group that
    // stays inside every node.
    [[nodiscard]] int smallest_node() const {
        int smallest = size();
        for (int n = 0; n < static_cast<int>(nodes_.size()); ++n) {
            const auto count = static_cast<int>(
                std::count_if(devices_.begin(), devices_.end(), [n](const DeviceSpec& d) { return d.node == n; }));
            if (count > 0) smallest = std::min(smallest, count);
        }
        return smallest;
    }

    [[nodiscard]] double total_memory() const {
        double sum = 0;
        for (const DeviceSpec& d : devices_) sum += d.memory;
        return sum;
    }

    // "3 nodes, 12 devices: node0 4 x 65 TFLOP/s 16 GB; ...; Links(...)".
    friend std::ostream& operator<<(std::ostream& out, const Cluster& c) {
        out << c.nodes_.size() << " node" << (c.nodes_.size() == 1 ? "" : "s") << ", " << c.size() << " device"
            << (c.size() == 1 ? "" : "s");
        for (int n = 0; n < static_cast<int>(c.nodes_.size()); ++n) {
            int count = 0;
            const DeviceSpec* first = nullptr;
            for (const DeviceSpec& d : c.devices_)
                if (d.node == n && count++ == 0) first = &d;
            if (first == nullptr) continue;
            out << (n == 0 ? ": " : "; ") << c.nodes_[static_cast<std::size_t>(n)].name << " " << count << " x "
                << first->flops / 1e12 << " TFLOP/s";
            if (std::isfinite(first->memory)) out << " " << first->memory / 1e9 << " GB";
            if (c.shared_cores_ == 0 && c.nodes_[static_cast<std::size_t>(n)].cores > 0)
                out << " sharing " << c.nodes_[static_cast<std::size_t>(n)].cores << " cores";
        }
        if (c.shared_cores_ > 0) out << "; all sharing " << c.shared_cores_ << " cores";
        if (c.wake_seconds_ > 0) out << ", " << c.wake_seconds_ * 1e6 << " us of CPU per blocking exchange";
        return out << "; " << c.links_;
    }

private:
    std::vector<NodeSpec> nodes_;
    std::vector<DeviceSpec> devices_;
    comm::Links links_;
    double shared_cores_ = 0;
    double wake_seconds_ = 0;
};

}  // namespace loom::plan
