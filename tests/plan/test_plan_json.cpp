// The planner's two input files: clusters (plan/cluster_json.hpp) and model
// descriptions (plan/model_json.hpp), and the messages their mistakes give.
#include <catch2/catch.hpp>

#include <loom/comm/links.hpp>
#include <loom/plan/cluster_json.hpp>
#include <loom/plan/json_fields.hpp>
#include <loom/plan/measure.hpp>
#include <loom/plan/model_json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>

#include "io/temp_dir.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace plan = loom::plan;
using loom::comm::Link;
using loom_test::message_of;

namespace {

std::string cluster_error(std::string_view text) {
    return message_of([&] { (void)plan::read_cluster(text, "cluster.json"); });
}
std::string model_error(std::string_view text) {
    return message_of([&] { (void)plan::read_model(text, "model.json"); });
}

// Two nodes whose only difference from a valid file is `node_fields` in the second.
std::string second_node(std::string_view node_fields) {
    return std::string(R"({"nodes": [{"name": "a", "devices": 1, "tflops": 1},
                                     {)") +
           std::string(node_fields) + R"(}], "inter_node": {"gbit": 1}})";
}

// One layer whose fields are `layer_fields`.
std::string one_layer(std::string_view layer_fields) {
    return std::string(R"({"name": "m", "batch": 2, "layers": [{)") + std::string(layer_fields) + "}]}";
}

constexpr std::string_view valid_layer = R"("name": "l", "forward_flops": 1, "params": 1, "output_bytes": 1)";

std::filesystem::path examples_dir() {
    // tests/plan/this.cpp -> the source tree's examples/plan.
    return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "examples" / "plan";
}

}  // namespace

TEST_CASE("a cluster file lists devices node by node with their speed, memory and links", "[plan]") {
    const plan::Cluster c = plan::read_cluster(R"({
  "nodes": [
    {"name": "t4-0", "devices": 2, "tflops": 65, "memory_gb": 16, "memory_gbps": 320,
     "link": {"gbit": 50, "latency_us": 10}, "cores": 0},
    {"name": "t4-1", "devices": 2, "tflops": 65, "memory_gb": 16, "link": {"gbyte": 25}},
    {"name": "cpu", "devices": 1, "tflops": 0.5, "cores": 4}
  ],
  "inter_node": {"gbit": 10, "latency_us": 50},
  "links": [{"between": ["t4-1", "t4-0"], "gbyte": 12.5, "latency_us": 20}]
})",
                                               "cluster.json");
    REQUIRE(c.size() == 5);
    const char* names[] = {"t4-0/0", "t4-0/1", "t4-1/0", "t4-1/1", "cpu/0"};
    const int node_of[] = {0, 0, 1, 1, 2};
    for (int d = 0; d < 5; ++d) {
        CHECK(c.device(d).name == names[d]);
        CHECK(c.device(d).node == node_of[d]);
    }
    REQUIRE(c.nodes().size() == 3);
    CHECK(c.nodes()[0].name == "t4-0");
    CHECK(c.nodes()[2].name == "cpu");
    CHECK(c.nodes()[2].cores == 4);
    CHECK(c.nodes()[0].cores == 0);
    CHECK(c.shared_cores() == 0);

    CHECK(c.device(0).flops == 65e12);
    CHECK(c.device(4).flops == 0.5e12);
    CHECK(c.device(0).memory == 16e9);
    CHECK(std::isinf(c.device(4).memory));  // no memory_gb: unlimited
    CHECK(c.device(1).bandwidth == 320e9);
    CHECK(c.device(2).bandwidth == 0);  // no memory_gbps: not modelled

    const loom::comm::Links& links = c.links();
    CHECK(links.between(0, 1) == Link::gbit(50, 10e-6));   // inside t4-0
    CHECK(links.between(1, 0) == Link::gbit(50, 10e-6));
    CHECK(links.between(2, 3) == Link::gbytes(25));        // inside t4-1
    CHECK(links.between(0, 2) == Link::gbytes(12.5, 20e-6));  // the pair's own link wins over inter_node
    CHECK(links.between(3, 1) == Link::gbytes(12.5, 20e-6));  // either way round
    CHECK(links.between(0, 4) == Link::gbit(10, 50e-6));   // inter_node for the rest
    CHECK(links.between(4, 3) == Link::gbit(10, 50e-6));
}

TEST_CASE("a cluster link may be unlimited and the whole cluster may share cores", "[plan]") {
    const plan::Cluster c = plan::read_cluster(R"({"shared_cores": 2, "nodes": [
        {"name": "local", "devices": 3, "tflops": 1, "link": {"unlimited": true}},
        {"name": "far", "devices": 1, "tflops": 2}],
        "links": [{"between": ["local", "far"], "unlimited": true, "latency_us": 7}]})");
    CHECK(c.shared_cores() == 2);
    CHECK(c.links().between(0, 2) == Link::unlimited());
    CHECK(std::isinf(c.links().between(0, 3).bytes_per_second));
    CHECK(c.links().between(0, 3).latency_seconds == 7e-6);
    CHECK(c.device(3).name == "far/0");
}

TEST_CASE("\"measure\" times this machine once per file and gives a positive, finite speed", "[plan]") {
    const plan::Cluster c = plan::read_cluster(R"({"nodes": [
        {"name": "a", "devices": 2, "tflops": "measure", "memory_gbps": "measure", "link": {"unlimited": true}},
        {"name": "b", "devices": 1, "tflops": "measure", "memory_gbps": "measure"}],
        "inter_node": {"gbit": 1}})");
    const double flops = c.device(0).flops;
    const double bandwidth = c.device(0).bandwidth;
    CHECK(std::isfinite(flops));
    CHECK(flops > 1e6);  // even a slow core does a million FLOP/s
    CHECK(std::isfinite(bandwidth));
    CHECK(bandwidth > 1e6);
    // Measured once for the whole file, so every node reads the same number.
    CHECK(c.device(2).flops == flops);
    CHECK(c.device(2).bandwidth == bandwidth);

    CHECK(plan::measure_gemm_flops(64, 3) > 0);
    CHECK(plan::measure_memory_bandwidth(1 << 16, 3) > 0);
    CHECK_THAT(message_of([] { (void)plan::measure_gemm_flops(0); }), Catch::Contains("n = 0"));
    CHECK_THAT(message_of([] { (void)plan::measure_memory_bandwidth(1024, 0); }), Catch::Contains("repeats = 0"));
}

TEST_CASE("the example cluster files load", "[plan]") {
    const plan::Cluster one = plan::load_cluster((examples_dir() / "local_8_threads.json").string());
    CHECK(one.size() == 8);
    CHECK(one.shared_cores() == 2);
    CHECK(one.links().between(0, 7) == Link::unlimited());

    const plan::Cluster two = plan::load_cluster((examples_dir() / "local_2x4_slow.json").string());
    REQUIRE(two.size() == 8);
    CHECK(two.shared_cores() == 2);
    CHECK(two.device(4).name == "b/0");
    CHECK(two.links().between(0, 3) == Link::unlimited());
    CHECK(two.links().between(3, 4) == Link::gbit(1, 100e-6));
}

TEST_CASE("a model file expands repeats and fills the defaults", "[plan]") {
    const plan::ModelDescription m = plan::read_model(R"({
  "name": "gpt2-24", "batch": 32, "sequence": 1024, "heads": 16, "width": 1024,
  "bytes_per_param": 16, "gradient_bytes": 2,
  "layers": [
    {"name": "embed+block", "forward_flops": 2.6e10, "params": 63000000, "output_bytes": 4194304},
    {"name": "block", "repeat": 22, "forward_flops": 2.6e10, "backward_flops": 5.2e10, "params": 12596224,
     "output_bytes": 4194304, "saved_bytes": 67108864, "tp_bytes": 8388608, "sequence_bytes": 8388608},
    {"name": "head", "repeat": 1, "forward_flops": 1e9, "params": 1.5e6, "output_bytes": 0}
  ]
})");
    CHECK(m.name == "gpt2-24");
    CHECK(m.batch == 32);
    CHECK(m.sequence == 1024);
    CHECK(m.heads == 16);
    CHECK(m.width == 1024);
    CHECK(m.gradient_bytes == 2);
    REQUIRE(m.layers.size() == 24);
    CHECK(m.layers[0].name == "embed+block");
    CHECK(m.layers[1].name == "block[0]");
    CHECK(m.layers[22].name == "block[21]");
    CHECK(m.layers[23].name == "head");  // repeat 1 keeps the name
    CHECK(m.layers[0].backward_flops == -1);
    CHECK(m.layers[0].backward() == 5.2e10);
    CHECK(m.layers[0].saved_bytes == 4194304);  // defaults to output_bytes
    CHECK(m.layers[0].tp_bytes == 0);
    CHECK(m.layers[0].sequence_bytes == 0);
    CHECK(m.layers[5].backward_flops == 5.2e10);
    CHECK(m.layers[5].params == 12596224);
    CHECK(m.layers[5].saved_bytes == 67108864);
    CHECK(m.layers[5].tp_bytes == 8388608);
    CHECK(m.layers[5].sequence_bytes == 8388608);
    CHECK(m.layers[23].params == 1500000);  // 1.5e6 is a whole number too
    CHECK(m.parameters() == 63000000 + 22 * std::int64_t{12596224} + 1500000);

    const plan::ModelDescription small = plan::read_model(one_layer(valid_layer));
    CHECK(small.bytes_per_param == 16);
    CHECK(small.gradient_bytes == 4);
    CHECK(small.sequence == 0);
    CHECK(small.heads == 0);
    CHECK(small.width == 0);
}

TEST_CASE("a model file's layers may say what they send on a 2D grid", "[plan]") {
    const plan::ModelDescription m = plan::read_model(one_layer(
        std::string(valid_layer) + R"(, "grid_forward": {"row": 8, "weights": 16, "scalars": 4}, )"
                                   R"("grid_backward": {"row": 12, "column": 2}, "grid_vector_params": 1)"));
    const plan::LayerSpec& l = m.layers[0];
    CHECK(l.grid_vector_params == 1);
    CHECK(l.params_per_tp_rank(4, true) == 1);  // the one vector parameter, cut 2 ways, rounded up
    CHECK(l.describes_grid());
    CHECK(l.grid_forward.row == 8);
    CHECK(l.grid_forward.column == 0);
    CHECK(l.grid_forward.weights == 16);
    CHECK(l.grid_forward.scalars == 4);
    CHECK(l.grid_backward.row == 12);
    CHECK(l.grid_backward.column == 2);
    CHECK(l.grid_backward.weights == 0);
    CHECK(l.grid_backward.scalars == 0);
    // Absent (the files written before these fields): not described, so estimated.
    CHECK_FALSE(plan::read_model(one_layer(valid_layer)).layers[0].describes_grid());
}

TEST_CASE("plan files are read from disk under their path's name", "[plan]") {
    loom_test::TempDir dir;
    const std::string path = (dir / "cluster.json").string();
    std::ofstream(path) << R"({"nodes": [{"name": "a", "devices": 1, "tflops": 3}]})";
    CHECK(plan::load_cluster(path).device(0).flops == 3e12);
    std::ofstream(path) << "{\n  \"nodes\": [{\"name\": \"a\", \"devices\": 0, \"tflops\": 3}]}";
    CHECK(message_of([&] { (void)plan::load_cluster(path); }) ==
          path + ":2:38: nodes[0].devices is 0; give a whole number of devices, 1 or more");

    const std::string model_path = (dir / "model.json").string();
    std::ofstream(model_path) << one_layer(valid_layer);
    CHECK(plan::load_model(model_path).layers.size() == 1);
}

TEST_CASE("a missing plan file says which path was not found", "[plan]") {
    loom_test::TempDir dir;
    const std::string missing = (dir / "nowhere.json").string();
    CHECK(message_of([&] { (void)plan::load_cluster(missing); }) ==
          "load_cluster: cannot open " + missing +
              " (no such file); give the path of a cluster file (its format: docs/plan_files.md)");
    CHECK_THAT(message_of([&] { (void)plan::load_model(missing); }),
               Catch::Contains("load_model: cannot open " + missing + " (no such file)"));
    CHECK_THAT(message_of([&] { (void)plan::load_model(dir.path().string()); }), Catch::Contains("is a directory"));
}

TEST_CASE("plan files' positions count lines and characters from 1", "[plan]") {
    namespace jf = plan::json_fields;
    CHECK(jf::position_of("abc", 0).line == 1);
    CHECK(jf::position_of("abc", 0).column == 1);
    CHECK(jf::position_of("ab\ncd", 4).line == 2);
    CHECK(jf::position_of("ab\ncd", 4).column == 2);
    CHECK(jf::position_of("\xc3\xa9x", 2).column == 2);  // the two bytes of an e-acute are one column
    CHECK(jf::location("f.json", "a\nb\nc", 4) == "f.json:3:1");
}

TEST_CASE("malformed plan JSON is located by line and column", "[plan]") {
    CHECK(model_error("{\n  \"name\": \"m\",\n  \"batch\": 4 \"layers\": []\n}") ==
          "model.json:3:14: invalid JSON: expected ',' or '}' in an object but found '\"'");
    CHECK(cluster_error("{\"nodes\": [\n") ==
          "cluster.json:2:1: invalid JSON: the text ends where a value was expected");
    CHECK(cluster_error("") == "cluster.json:1:1: invalid JSON: the text ends where a value was expected");
    CHECK(cluster_error("{\"nodes\": [], \"nodes\": []}") ==
          "cluster.json:1:15: invalid JSON: duplicate object key \"nodes\"");
    CHECK(cluster_error("[1, 2]") == "cluster.json:1:1: the top level is an array; give an object {...}");
}

TEST_CASE("plan files name an unknown key, where it is and the valid keys", "[plan]") {
    CHECK(cluster_error(second_node(R"("name": "b", "devices": 1, "tflop": 65)")) ==
          "cluster.json:2:66: nodes[1] has an unknown key \"tflop\"; the valid keys are name, devices, tflops, "
          "memory_gb, memory_gbps, cores, link");
    CHECK_THAT(cluster_error(R"({"nodes": [{"name": "a", "devices": 1, "tflops": 1}], "inter": {"gbit": 1}})"),
               Catch::Contains("the top level has an unknown key \"inter\"; the valid keys are nodes, inter_node, "
                               "links, shared_cores"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 2, "tflops": 1, "link": {"gbits": 1})")),
               Catch::Contains("nodes[1].link has an unknown key \"gbits\"; the valid keys are gbit, gbyte, "
                               "unlimited, latency_us"));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "flops": 1, "params": 1, "output_bytes": 1)")),
               Catch::Contains("layers[0] has an unknown key \"flops\"; the valid keys are name, repeat, "
                               "forward_flops, backward_flops, params, output_bytes, saved_bytes, backward_bytes, "
                               "tp_bytes, tp_backward_bytes, tp_replicated_params, grid_vector_params, sequence_bytes, recomputable, recomputed_bytes, recompute_flops, "
                               "rerun_bytes, product_bytes, product_flops, grid_forward, grid_backward"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "grid_forward": {"rows": 1})")),
               Catch::Contains("layers[0].grid_forward has an unknown key \"rows\"; the valid keys are row, column, "
                               "weights, scalars"));
    CHECK_THAT(model_error(R"({"name": "m", "batch": 1, "layer": []})"),
               Catch::Contains("model.json:1:27: the top level has an unknown key \"layer\"; the valid keys are "
                               "name, batch, sequence, heads, width, bytes_per_param, gradient_bytes, layers"));
}

TEST_CASE("\"wake_us\": \"measure\" times a blocking exchange of the cluster's rank threads", "[plan]") {
    const plan::Cluster c = plan::read_cluster(
        R"({"shared_cores": 1, "wake_us": "measure", "nodes": [{"name": "a", "devices": 2, "tflops": 1, "link": {"unlimited": true}}]})");
    CHECK(std::isfinite(c.wake_seconds()));
    CHECK(c.wake_seconds() >= 0);
    CHECK(c.wake_seconds() < 1);  // a thread's turn, not a timeout
    CHECK(plan::measure_exchange_seconds(2, 1, 2, 5, 1e-4, 1) >= 0);

    CHECK(cluster_error(R"({"wake_us": "measure", "nodes": [{"name": "a", "devices": 2, "tflops": 1, "link": {"unlimited": true}}]})") ==
          "cluster.json:1:13: wake_us is \"measure\" without \"shared_cores\"; give \"shared_cores\" (the cores the rank "
          "threads share), or a number of microseconds");
    CHECK_THAT(cluster_error(R"({"shared_cores": 2, "wake_us": "slow", "nodes": [{"name": "a", "devices": 1, "tflops": 1}]})"),
               Catch::Contains("wake_us is \"slow\"; give 0 or more microseconds, or \"measure\" to time this machine"));
    CHECK_THAT(cluster_error(R"({"shared_cores": 2, "wake_us": -1, "nodes": [{"name": "a", "devices": 1, "tflops": 1}]})"),
               Catch::Contains("wake_us is -1; give 0 or more microseconds"));
    CHECK_THAT(message_of([] { (void)plan::measure_exchange_seconds(1, 2); }), Catch::Contains("threads = 1; give 2 or more"));
    CHECK_THAT(message_of([] { (void)plan::measure_exchange_seconds(6, 2, 4); }),
               Catch::Contains("group = 4 for 6 threads; give 2 or more that divides the threads"));
    CHECK_THAT(message_of([] { (void)plan::measure_exchange_seconds(4, 0); }), Catch::Contains("cores = 0"));
    CHECK_THAT(message_of([] { (void)plan::measure_exchange_seconds(4, 2, 2, 0); }), Catch::Contains("rounds = 0"));
    CHECK_THAT(message_of([] { (void)plan::measure_exchange_seconds(4, 2, 2, 5, -1); }),
               Catch::Contains("round_seconds = -1"));
}

TEST_CASE("plan files name a missing required field and what to give", "[plan]") {
    CHECK(cluster_error(second_node(R"("name": "b", "tflops": 1)")) ==
          "cluster.json:2:38: nodes[1] has no \"devices\"; give a whole number of devices, 1 or more");
    CHECK_THAT(cluster_error(second_node(R"("devices": 1, "tflops": 1)")),
               Catch::Contains("nodes[1] has no \"name\"; give a node name as a string"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 1)")),
               Catch::Contains("nodes[1] has no \"tflops\"; give a positive number of TFLOP/s per device, or "
                               "\"measure\""));
    CHECK_THAT(cluster_error("{}"), Catch::Contains("cluster.json:1:1: the top level has no \"nodes\"; give a "
                                                    "non-empty array of nodes"));
    CHECK_THAT(model_error(R"({"batch": 1, "layers": [{}]})"),
               Catch::Contains("the top level has no \"name\"; give the model's name as a string"));
    CHECK_THAT(model_error(R"({"name": "m", "layers": [{}]})"),
               Catch::Contains("the top level has no \"batch\"; give a whole number of samples per step, 1 or more"));
    CHECK_THAT(model_error(R"({"name": "m", "batch": 1})"), Catch::Contains("the top level has no \"layers\""));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "params": 1, "output_bytes": 1)")),
               Catch::Contains("layers[0] has no \"forward_flops\"; give a number of FLOPs per sample, 0 or more"));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": 1, "output_bytes": 1)")),
               Catch::Contains("layers[0] has no \"params\""));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": 1, "params": 1)")),
               Catch::Contains("layers[0] has no \"output_bytes\""));
    CHECK_THAT(model_error(one_layer(R"("forward_flops": 1, "params": 1, "output_bytes": 1)")),
               Catch::Contains("layers[0] has no \"name\""));
}

TEST_CASE("plan files name a field of the wrong type and what it should be", "[plan]") {
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": "4", "tflops": 1)")),
               Catch::Contains("nodes[1].devices is \"4\"; give a whole number of devices, 1 or more"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 2.5, "tflops": 1)")),
               Catch::Contains("nodes[1].devices is 2.5; give a whole number of devices, 1 or more"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 1, "tflops": "fast")")),
               Catch::Contains("nodes[1].tflops is \"fast\"; give a positive number of TFLOP/s per device, or "
                               "\"measure\""));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 1, "tflops": 1, "memory_gbps": [1])")),
               Catch::Contains("nodes[1].memory_gbps is an array; give a positive number of GB/s, or \"measure\""));
    CHECK_THAT(cluster_error(second_node(R"("name": 7, "devices": 1, "tflops": 1)")),
               Catch::Contains("nodes[1].name is 7; give a node name as a string"));
    CHECK_THAT(cluster_error(R"({"nodes": {"name": "a"}})"),
               Catch::Contains("cluster.json:1:11: nodes is an object; give a non-empty array of nodes"));
    CHECK_THAT(cluster_error(R"({"nodes": [3]})"), Catch::Contains("nodes[0] is 3; give an object {...}"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 2, "tflops": 1, "link": {"unlimited": false})")),
               Catch::Contains("nodes[1].link.unlimited is false; give true, or a bandwidth as \"gbit\" or \"gbyte\""));
    CHECK_THAT(model_error(R"({"name": 5, "batch": 1, "layers": []})"),
               Catch::Contains("name is 5; give the model's name as a string"));
    CHECK_THAT(model_error(R"({"name": "m", "batch": null, "layers": []})"),
               Catch::Contains("batch is null; give a whole number of samples per step, 1 or more"));
    CHECK_THAT(model_error(R"({"name": "m", "batch": 1, "layers": "block"})"),
               Catch::Contains("layers is \"block\"; give a non-empty array of layers"));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": true, "params": 1, "output_bytes": 1)")),
               Catch::Contains("layers[0].forward_flops is true; give a number of FLOPs per sample, 0 or more"));
}

TEST_CASE("plan files refuse negative and zero sizes", "[plan]") {
    // The message of the format's own example, exactly: file, line, column, path, value and what to give.
    CHECK(cluster_error(R"({
  "nodes": [
    {"name": "a", "devices": 4, "tflops": 65, "memory_gb": 16,
     "link": {"gbit": 50}},
    {"name": "b",
     "tflops": 65,
     "devices": -2}
  ],
  "inter_node": {"gbit": 10}
})") == "cluster.json:7:17: nodes[1].devices is -2; give a whole number of devices, 1 or more");
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 0, "tflops": 1)")),
               Catch::Contains("nodes[1].devices is 0; give a whole number of devices, 1 or more"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 1, "tflops": 0)")),
               Catch::Contains("nodes[1].tflops is 0; give a positive number of TFLOP/s per device"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 1, "tflops": 1, "memory_gb": -16)")),
               Catch::Contains("nodes[1].memory_gb is -16; give a positive number of GB"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 1, "tflops": 1, "memory_gbps": 0)")),
               Catch::Contains("nodes[1].memory_gbps is 0; give a positive number of GB/s"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 1, "tflops": 1, "cores": -1)")),
               Catch::Contains("nodes[1].cores is -1; give a number of cores, 0 or more"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 2, "tflops": 1, "link": {"gbit": 0})")),
               Catch::Contains("nodes[1].link.gbit is 0; give a positive number of Gbit/s"));
    CHECK_THAT(cluster_error(second_node(
                   R"("name": "b", "devices": 2, "tflops": 1, "link": {"gbyte": 1, "latency_us": -5})")),
               Catch::Contains("nodes[1].link.latency_us is -5; give a number of microseconds, 0 or more"));
    CHECK_THAT(cluster_error(R"({"shared_cores": -2, "nodes": [{"name": "a", "devices": 1, "tflops": 1}]})"),
               Catch::Contains("shared_cores is -2; give a number of cores, 0 or more"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 5000, "tflops": 1)")),
               Catch::Contains("nodes[1].devices makes 1 + 5000 devices; a cluster may have at most 4096 in all"));

    CHECK_THAT(model_error(R"({"name": "m", "batch": 0, "layers": []})"),
               Catch::Contains("model.json:1:24: batch is 0; give a whole number of samples per step, 1 or more"));
    CHECK_THAT(model_error(R"({"name": "m", "batch": 1, "sequence": -1, "layers": []})"),
               Catch::Contains("sequence is -1; give a whole number of tokens per sample, 0 or more"));
    CHECK_THAT(model_error(R"({"name": "m", "batch": 1, "bytes_per_param": 0, "layers": []})"),
               Catch::Contains("bytes_per_param is 0; give a positive number of bytes"));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": -1, "params": 1, "output_bytes": 1)")),
               Catch::Contains("layers[0].forward_flops is -1; give a number of FLOPs per sample, 0 or more"));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": 1, "params": -5, "output_bytes": 1)")),
               Catch::Contains("layers[0].params is -5; give a whole number of parameters, 0 or more"));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": 1, "params": 1, "output_bytes": -1)")),
               Catch::Contains("layers[0].output_bytes is -1; give a number of bytes per sample, 0 or more"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "backward_flops": -2)")),
               Catch::Contains("layers[0].backward_flops is -2; give a number of FLOPs per sample, 0 or more"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "saved_bytes": -2)")),
               Catch::Contains("layers[0].saved_bytes is -2"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "tp_bytes": -2)")),
               Catch::Contains("layers[0].tp_bytes is -2"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "sequence_bytes": -2)")),
               Catch::Contains("layers[0].sequence_bytes is -2"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "grid_backward": {"weights": -2})")),
               Catch::Contains("layers[0].grid_backward.weights is -2; give a number of bytes per micro-batch, times "
                               "the grid side, 0 or more"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "grid_vector_params": -1)")),
               Catch::Contains("layers[0].grid_vector_params is -1; give a whole number of parameters a 2D grid cuts q "
                               "ways, 0 or more"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "grid_vector_params": 2)")),
               Catch::Contains("layer l has 2 vector parameters a 2D grid cuts q ways; give 0 to its 1 parameters"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "grid_forward": 3)")),
               Catch::Contains("layers[0].grid_forward is 3; give an object {...}"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "repeat": 0)")),
               Catch::Contains("layers[0].repeat is 0; give a whole number of consecutive copies, 1 or more"));
    CHECK_THAT(model_error(one_layer(std::string(valid_layer) + R"(, "repeat": 1e9)")),
               Catch::Contains("layers[0].repeat makes 0 + 1000000000 layers; a model may have at most 1000000"));
}

TEST_CASE("cluster files refuse two nodes of one name", "[plan]") {
    CHECK_THAT(cluster_error(second_node(R"("name": "a", "devices": 1, "tflops": 1)")),
               Catch::Contains("nodes[1].name is \"a\" again (nodes[0] is called that); give each node a different "
                               "name"));
    CHECK_THAT(cluster_error(second_node(R"("name": "", "devices": 1, "tflops": 1)")),
               Catch::Contains("nodes[1].name is \"\"; give a node name of one character or more"));
}

TEST_CASE("cluster links name an unknown node, a pair given twice and a node linked to itself", "[plan]") {
    constexpr std::string_view three = R"({"nodes": [{"name": "a", "devices": 1, "tflops": 1},
        {"name": "b", "devices": 1, "tflops": 1}, {"name": "c", "devices": 1, "tflops": 1}],
        "inter_node": {"gbit": 1}, "links": )";
    auto with_links = [&](std::string_view links) { return std::string(three) + std::string(links) + "}"; };
    CHECK_THAT(cluster_error(with_links(R"([{"between": ["a", "d"], "gbit": 5}])")),
               Catch::Contains("links[0].between[1] is \"d\"; give one of the nodes: a, b, c"));
    CHECK_THAT(cluster_error(with_links(R"([{"between": ["a", "b"], "gbit": 5}, {"between": ["b", "a"], "gbit": 6}])")),
               Catch::Contains("links[1] joins b and a again (links[0] does already); give each pair of nodes once"));
    CHECK_THAT(cluster_error(with_links(R"([{"between": ["c", "c"], "gbit": 5}])")),
               Catch::Contains("links[0].between names node c twice; give two different nodes"));
    CHECK_THAT(cluster_error(with_links(R"([{"between": ["a", "b", "c"], "gbit": 5}])")),
               Catch::Contains("links[0].between is an array; give the two node names it joins"));
    CHECK_THAT(cluster_error(with_links(R"([{"gbit": 5}])")), Catch::Contains("links[0] has no \"between\""));
    CHECK_THAT(cluster_error(with_links(R"([{"between": ["a", "b"]}])")),
               Catch::Contains("links[0] has no bandwidth; give one of \"gbit\" (Gbit/s), \"gbyte\" (GB/s) or "
                               "\"unlimited\": true"));
    CHECK_THAT(cluster_error(with_links(R"({"a": 1})")), Catch::Contains("links is an object; give an array of"));
}

TEST_CASE("cluster files name the first pair of nodes without a link and how many lack one", "[plan]") {
    CHECK(cluster_error(R"({"nodes": [{"name": "a", "devices": 1, "tflops": 1},
                                      {"name": "b", "devices": 1, "tflops": 1}]})") ==
          "cluster.json: no link between nodes a and b; add \"inter_node\" or {\"between\": [\"a\", \"b\"], "
          "\"gbit\": ...} to \"links\"");
    CHECK(cluster_error(R"({"nodes": [{"name": "a", "devices": 1, "tflops": 1},
                                      {"name": "b", "devices": 1, "tflops": 1},
                                      {"name": "c", "devices": 1, "tflops": 1},
                                      {"name": "d", "devices": 1, "tflops": 1}],
                            "links": [{"between": ["a", "b"], "gbit": 1}]})") ==
          "cluster.json: no link between nodes a and c, nor for 4 other pairs of nodes; add \"inter_node\" or "
          "{\"between\": [\"a\", \"c\"], \"gbit\": ...} to \"links\"");
}

TEST_CASE("cluster links give exactly one bandwidth, and nodes of several devices a link", "[plan]") {
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 2, "tflops": 1, "link": {"gbit": 1, "gbyte": 1})")),
               Catch::Contains("nodes[1].link gives both \"gbit\" and \"gbyte\"; give one of \"gbit\" (Gbit/s), "
                               "\"gbyte\" (GB/s) or \"unlimited\": true, only one"));
    CHECK_THAT(cluster_error(second_node(
                   R"("name": "b", "devices": 2, "tflops": 1, "link": {"gbyte": 1, "unlimited": true})")),
               Catch::Contains("nodes[1].link gives both \"gbyte\" and \"unlimited\""));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 2, "tflops": 1, "link": {"latency_us": 1})")),
               Catch::Contains("nodes[1].link has no bandwidth"));
    CHECK_THAT(cluster_error(second_node(R"("name": "b", "devices": 4, "tflops": 1)")),
               Catch::Contains("nodes[1] has 4 devices but no \"link\" between them; give one"));
    CHECK_THAT(cluster_error(R"({"nodes": [{"name": "a", "devices": 1, "tflops": 1}], "inter_node": 10})"),
               Catch::Contains("inter_node is 10; give an object"));
    // One device needs no link.
    CHECK(plan::read_cluster(R"({"nodes": [{"name": "a", "devices": 1, "tflops": 1}]})").size() == 1);
}

TEST_CASE("cluster files refuse per-node cores together with shared_cores", "[plan]") {
    CHECK_THAT(cluster_error(R"({"shared_cores": 2, "nodes": [{"name": "a", "devices": 1, "tflops": 1, "cores": 2}]})"),
               Catch::Contains("nodes[0].cores is given, and so is \"shared_cores\""));
}

TEST_CASE("plan files refuse an empty list of nodes or layers", "[plan]") {
    CHECK_THAT(cluster_error(R"({"nodes": []})"),
               Catch::Contains("cluster.json:1:11: nodes is an empty array; give a non-empty array of nodes"));
    CHECK_THAT(model_error(R"({"name": "m", "batch": 1, "layers": []})"),
               Catch::Contains("model.json:1:37: layers is an empty array; give a non-empty array of layers"));
}

TEST_CASE("a model file's layers say what recomputing them keeps and costs", "[plan][recompute]") {
    const plan::ModelDescription m = plan::read_model(one_layer(
        R"("name": "l", "forward_flops": 10, "params": 1, "output_bytes": 4, "saved_bytes": 64, "recomputable": false, )"
        R"("recomputed_bytes": 8, "recompute_flops": 6)"));
    CHECK_FALSE(m.layers[0].recomputable);
    CHECK(m.layers[0].kept_when_recomputed() == 8);
    CHECK(m.layers[0].recompute() == 6);
    const plan::ModelDescription plain = plan::read_model(one_layer(valid_layer));
    CHECK(plain.layers[0].recomputable);
    CHECK(plain.layers[0].kept_when_recomputed() == plain.layers[0].output_bytes);
    CHECK(plain.layers[0].recompute() == plain.layers[0].forward_flops);
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": 1, "params": 1, "output_bytes": 1, "recomputable": 1)")),
               Catch::Contains("layers[0].recomputable is 1; give true or false"));
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": 1, "params": 1, "output_bytes": 1, "recompute_flops": -2)")),
               Catch::Contains("layers[0].recompute_flops is -2; give"));
    // What its backward holds, its rerun's peak, and Selective's products.
    const plan::ModelDescription selective = plan::read_model(one_layer(
        R"("name": "l", "forward_flops": 10, "params": 1, "output_bytes": 4, "saved_bytes": 64, "backward_bytes": 32, )"
        R"("rerun_bytes": 90, "product_bytes": 16, "product_flops": 7)"));
    const plan::LayerSpec& l = selective.layers[0];
    CHECK(l.held_bytes() == 96);
    CHECK(l.rerun_peak(false) == 90);
    CHECK(l.rerun_peak(true) == 74);
    CHECK(l.kept_when_selective() == 4 + 16);
    CHECK(l.selective_recompute() == 3);
    CHECK(plain.layers[0].held_bytes() == plain.layers[0].saved_bytes);  // no backward_bytes: none
    CHECK_THAT(model_error(one_layer(R"("name": "l", "forward_flops": 1, "params": 1, "output_bytes": 1, "backward_bytes": -1)")),
               Catch::Contains("layers[0].backward_bytes is -1; give"));
}

}  // namespace LOOM_TEST_FILE
