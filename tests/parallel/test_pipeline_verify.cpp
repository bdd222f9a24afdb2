// The pipeline verifier and simulator on programs built by hand here (not by
// the schedule generators, so a generator bug cannot hide a verifier bug):
// valid GPipe / 1F1B / interleaved / zero-bubble programs pass, each rule's
// violation is one exact message, and the simulator reproduces the textbook
// makespans and bubbles.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <loom/exec/schedule_trace.hpp>
#include <loom/schedule/pipeline_program.hpp>
#include <loom/schedule/program.hpp>
#include <loom/schedule/simulate.hpp>
#include <loom/schedule/verify_pipeline.hpp>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::schedule::Instruction;
using loom::schedule::Op;
using loom::schedule::Payload;
using loom::schedule::PipelineProgram;
using loom::schedule::peak_activations;
using loom::schedule::simulate;
using loom::schedule::StageTimes;
using loom::schedule::verify_pipeline;
using loom_test::message_of;

namespace {

struct Action {
    Op op;
    int chunk;
    int mb;
};

// Per-rank compute orders -> rank programs: a recv right before each compute
// whose input lives on another rank, a send right after each compute whose
// output another rank needs, every send waited at the end.
PipelineProgram build(std::string name, int p, int m, std::vector<int> rank_of_chunk, bool split, int bound,
                      const std::vector<std::vector<Action>>& order) {
    PipelineProgram prog;
    prog.schedule = std::move(name);
    prog.stages = p;
    prog.micro_batches = m;
    prog.chunks = static_cast<int>(rank_of_chunk.size()) / p;
    prog.split_backward = split;
    prog.activation_bound = bound;
    prog.rank_of_chunk = rank_of_chunk;
    const int V = static_cast<int>(rank_of_chunk.size());
    auto owner = [&](int v) { return rank_of_chunk[static_cast<std::size_t>(v)]; };
    for (int r = 0; r < p; ++r) {
        loom::schedule::StepProgram code;
        code.generator = prog.schedule;
        code.micro_batches = m;
        std::vector<int> sends;
        for (const Action& a : order[static_cast<std::size_t>(r)]) {
            const bool fwd = a.op == Op::forward;
            const bool bwd = a.op == Op::backward || a.op == Op::backward_input;
            if (fwd && a.chunk > 0 && owner(a.chunk - 1) != r)
                code.emit({.op = Op::recv, .micro_batch = a.mb, .chunk = a.chunk, .peer = owner(a.chunk - 1),
                           .payload = Payload::activation});
            if (bwd && a.chunk < V - 1 && owner(a.chunk + 1) != r)
                code.emit({.op = Op::recv, .micro_batch = a.mb, .chunk = a.chunk, .peer = owner(a.chunk + 1),
                           .payload = Payload::gradient});
            code.emit({.op = a.op, .micro_batch = a.mb, .chunk = a.chunk});
            if (fwd && a.chunk < V - 1 && owner(a.chunk + 1) != r)
                sends.push_back(code.emit({.op = Op::send, .micro_batch = a.mb, .chunk = a.chunk,
                                           .peer = owner(a.chunk + 1), .payload = Payload::activation}));
            if (bwd && a.chunk > 0 && owner(a.chunk - 1) != r)
                sends.push_back(code.emit({.op = Op::send, .micro_batch = a.mb, .chunk = a.chunk,
                                           .peer = owner(a.chunk - 1), .payload = Payload::gradient}));
        }
        for (int s : sends) code.emit({.op = Op::wait, .target = s});
        prog.ranks.push_back(std::move(code));
    }
    return prog;
}

std::vector<int> identity(int p) {
    std::vector<int> v(static_cast<std::size_t>(p));
    for (int i = 0; i < p; ++i) v[static_cast<std::size_t>(i)] = i;
    return v;
}

// GPipe: every forward, then every backward.
PipelineProgram gpipe(int p, int m, int bound = -1) {
    std::vector<std::vector<Action>> order(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
        for (int k = 0; k < m; ++k) order[static_cast<std::size_t>(r)].push_back({Op::forward, r, k});
        for (int k = 0; k < m; ++k) order[static_cast<std::size_t>(r)].push_back({Op::backward, r, k});
    }
    return build("GPipe", p, m, identity(p), false, bound < 0 ? m : bound, order);
}

// 1F1B: min(p-r-1, m) warm-up forwards, then one forward / one backward, then drain.
PipelineProgram one_f_one_b(int p, int m) {
    std::vector<std::vector<Action>> order(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
        auto& o = order[static_cast<std::size_t>(r)];
        const int warm = std::min(p - r - 1, m);
        int f = 0, b = 0;
        while (f < warm) o.push_back({Op::forward, r, f++});
        while (f < m) {
            o.push_back({Op::forward, r, f++});
            o.push_back({Op::backward, r, b++});
        }
        while (b < m) o.push_back({Op::backward, r, b++});
    }
    return build("1F1B", p, m, identity(p), false, std::min(p, m), order);
}

// Removes instruction i of rank r, renumbering the waits behind it.
void erase(PipelineProgram& prog, int r, int i) {
    auto& code = prog.ranks[static_cast<std::size_t>(r)].code;
    code.erase(code.begin() + i);
    for (auto& in : code)
        if (in.op == Op::wait && in.target > i) --in.target;
}

void swap(PipelineProgram& prog, int r, int i, int j) {
    auto& code = prog.ranks[static_cast<std::size_t>(r)].code;
    std::swap(code[static_cast<std::size_t>(i)], code[static_cast<std::size_t>(j)]);
}

const Instruction& at(const PipelineProgram& prog, int r, int i) {
    return prog.ranks[static_cast<std::size_t>(r)].code[static_cast<std::size_t>(i)];
}

}  // namespace

TEST_CASE("hand-built GPipe, 1F1B, interleaved and V-shaped programs verify", "[parallel][pipeline]") {
    for (int p = 2; p <= 3; ++p)
        for (int m = 2; m <= 4; ++m) {
            INFO("p=" << p << " m=" << m);
            CHECK(message_of([&] { verify_pipeline(gpipe(p, m)); }) == "(no error)");
            CHECK(message_of([&] { verify_pipeline(one_f_one_b(p, m)); }) == "(no error)");
            for (int r = 0; r < p; ++r) {
                CHECK(peak_activations(gpipe(p, m), r) == m);
                CHECK(peak_activations(one_f_one_b(p, m), r) == std::min(p - r, m));
            }
        }
    // Two chunks per rank, interleaved (rank v % p) and V-shaped (rank s holds s and 2p-1-s).
    for (const auto& chunks : {std::vector<int>{0, 1, 0, 1}, std::vector<int>{0, 1, 1, 0}}) {
        std::vector<std::vector<Action>> order(2);
        for (int v = 0; v < 4; ++v)
            for (int k = 0; k < 3; ++k) order[static_cast<std::size_t>(chunks[v])].push_back({Op::forward, v, k});
        for (int v = 3; v >= 0; --v)
            for (int k = 0; k < 3; ++k) order[static_cast<std::size_t>(chunks[v])].push_back({Op::backward, v, k});
        const auto prog = build("by hand", 2, 3, chunks, false, 6, order);
        CHECK(message_of([&] { verify_pipeline(prog); }) == "(no error)");
        CHECK(peak_activations(prog, 0) == 6);
    }
}

TEST_CASE("a send without its recv, or sent twice, is rejected", "[parallel][pipeline]") {
    auto prog = gpipe(2, 2);
    REQUIRE(at(prog, 1, 0).op == Op::recv);
    erase(prog, 1, 0);
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 0 #1 (send activation to rank 1 c0 mb0) is never "
          "received: rank 1 has no matching recv");

    prog = gpipe(2, 2);
    auto& code = prog.ranks[0].code;
    code.push_back(code[1]);
    code.push_back({.op = Op::wait, .target = static_cast<int>(code.size()) - 1});
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 0 #1 (send activation to rank 1 c0 mb0) is sent 2 "
          "times; also by rank 0 #10 (send activation to rank 1 c0 mb0)");

    // A recv nobody sends: the example from the verifier's documentation.
    prog = gpipe(2, 2);
    erase(prog, 0, 8);  // wait #1
    erase(prog, 0, 1);  // send activation c0 mb0
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 1 #0 (recv activation from rank 0 c1 mb0) waits "
          "forever: no rank sends it");
}

TEST_CASE("p2p peers must follow rank_of_chunk, and chunks of one rank exchange nothing", "[parallel][pipeline]") {
    auto prog = gpipe(3, 2);
    REQUIRE(at(prog, 0, 1).op == Op::send);
    prog.ranks[0].code[1].peer = 2;
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=3, m=2) is invalid: rank 0 #1 (send activation to rank 2 c0 mb0) names rank 2 "
          "but c1 lives on rank 1");

    prog = gpipe(3, 2);
    REQUIRE(at(prog, 2, 0).op == Op::recv);
    prog.ranks[2].code[0].peer = 0;
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=3, m=2) is invalid: rank 2 #0 (recv activation from rank 0 c2 mb0) names rank 0 "
          "but c1 lives on rank 1");

    // V-shape: c1 and c2 both live on rank 1.
    std::vector<std::vector<Action>> order(2);
    const std::vector<int> v_shape{0, 1, 1, 0};
    for (int v = 0; v < 4; ++v) order[static_cast<std::size_t>(v_shape[v])].push_back({Op::forward, v, 0});
    for (int v = 3; v >= 0; --v) order[static_cast<std::size_t>(v_shape[v])].push_back({Op::backward, v, 0});
    prog = build("ZB-V", 2, 1, v_shape, false, 2, order);
    prog.ranks[1].code.push_back({.op = Op::send, .micro_batch = 0, .chunk = 1, .peer = 1, .payload = Payload::activation});
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (ZB-V, p=2, m=1, v=2) is invalid: rank 1 #" + std::to_string(prog.ranks[1].code.size() - 1) +
              " (send activation to rank 1 c1 mb0) crosses from c1 to c2, both on rank 1; chunks on one rank exchange "
              "nothing");
}

TEST_CASE("every send is waited exactly once", "[parallel][pipeline]") {
    auto prog = gpipe(2, 2);
    REQUIRE(at(prog, 0, 8).op == Op::wait);
    erase(prog, 0, 8);
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 0 #1 (send activation to rank 1 c0 mb0) is never "
          "waited for");

    prog = gpipe(2, 2);
    prog.ranks[0].code[9].target = 1;
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 0 #9 (wait #1) waits for #1 a second time");
}

TEST_CASE("compute runs only after its inputs exist", "[parallel][pipeline]") {
    // Forward before the activation's recv.
    auto prog = gpipe(2, 2);
    swap(prog, 1, 0, 1);
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 1 #0 (forward c1 mb0) runs before its activation "
          "arrives: no earlier recv activation from rank 0 c1 mb0");

    // Backward before the gradient's recv.
    prog = gpipe(2, 2);
    REQUIRE(at(prog, 0, 4).op == Op::recv);
    swap(prog, 0, 4, 5);
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 0 #4 (backward c0 mb0) runs before its gradient "
          "arrives: no earlier recv gradient from rank 1 c0 mb0");

    // The last stage's backward before its forward.
    prog = gpipe(2, 2);
    REQUIRE(at(prog, 1, 6).op == Op::backward);
    swap(prog, 1, 3, 6);
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 1 #3 (backward c1 mb1) runs before forward c1 mb1");

    // W before B when the backward is split.
    prog = build("ZB-H1", 2, 1, {0, 1}, true, 1,
                 {{{Op::forward, 0, 0}, {Op::backward_input, 0, 0}, {Op::backward_weight, 0, 0}},
                  {{Op::forward, 1, 0}, {Op::backward_input, 1, 0}, {Op::backward_weight, 1, 0}}});
    REQUIRE(message_of([&] { verify_pipeline(prog); }) == "(no error)");
    swap(prog, 1, 2, 4);  // recv, forward, B, send, W -> recv, forward, W, send, B
    swap(prog, 1, 3, 4);  // -> recv, forward, W, B, send
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (ZB-H1, p=2, m=1) is invalid: rank 1 #2 (backward_weight c1 mb0) runs before "
          "backward_input c1 mb0");

    // A combined backward in a split program.
    prog.ranks[1].code[2].op = Op::backward;
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (ZB-H1, p=2, m=1) is invalid: rank 1 #2 (backward c1 mb0) is a combined backward in a "
          "program that splits backward_input and backward_weight");
}

TEST_CASE("every (stage, micro-batch) runs forward and backward exactly once, on its rank", "[parallel][pipeline]") {
    auto prog = gpipe(2, 2);
    REQUIRE(at(prog, 0, 2).op == Op::forward);
    erase(prog, 0, 2);
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: forward c0 mb1 never runs (rank 0 holds c0)");

    prog = gpipe(2, 2);
    prog.ranks[1].code.push_back({.op = Op::backward, .micro_batch = 1, .chunk = 1});
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 1 #10 (backward c1 mb1) runs a second time; the first "
          "was #6");

    prog = gpipe(2, 2);
    prog.ranks[1].code[1].chunk = 0;
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank 1 #1 (forward c0 mb0) runs on rank 1 but c0 lives on "
          "rank 0");

    prog = gpipe(2, 2);
    prog.rank_of_chunk = {0, 2};
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank_of_chunk[1] = 2 is not a rank in [0, 2)");
    prog.rank_of_chunk = {0, 1, 1};
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: rank_of_chunk has 3 entries for 2 virtual stages");
    prog = gpipe(2, 2);
    prog.ranks.pop_back();
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=2) is invalid: it has 1 rank programs for 2 stages");
}

TEST_CASE("two ranks that each recv from the other first deadlock", "[parallel][pipeline]") {
    // Rank 0 waits for the gradient before sending the activation that rank 1
    // needs to produce it. Every rank's own order is fine.
    PipelineProgram prog;
    prog.schedule = "by hand";
    prog.stages = 2;
    prog.activation_bound = 1;
    prog.rank_of_chunk = {0, 1};
    prog.ranks.resize(2);
    auto& r0 = prog.ranks[0];
    r0.emit({.op = Op::forward, .micro_batch = 0, .chunk = 0});
    r0.emit({.op = Op::recv, .micro_batch = 0, .chunk = 0, .peer = 1, .payload = Payload::gradient});
    r0.emit({.op = Op::send, .micro_batch = 0, .chunk = 0, .peer = 1, .payload = Payload::activation});
    r0.emit({.op = Op::backward, .micro_batch = 0, .chunk = 0});
    r0.emit({.op = Op::wait, .target = 2});
    auto& r1 = prog.ranks[1];
    r1.emit({.op = Op::recv, .micro_batch = 0, .chunk = 1, .peer = 0, .payload = Payload::activation});
    r1.emit({.op = Op::forward, .micro_batch = 0, .chunk = 1});
    r1.emit({.op = Op::backward, .micro_batch = 0, .chunk = 1});
    r1.emit({.op = Op::send, .micro_batch = 0, .chunk = 1, .peer = 0, .payload = Payload::gradient});
    r1.emit({.op = Op::wait, .target = 3});
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (by hand, p=2, m=1) is invalid: deadlock: rank 0 #1 (recv gradient from rank 1 c0 mb0) "
          "waits for rank 1 #3 (send gradient to rank 0 c1 mb0), rank 1 #0 (recv activation from rank 0 c1 mb0) "
          "waits for rank 0 #2 (send activation to rank 1 c0 mb0)");
    CHECK_THROWS_WITH(simulate(prog), Catch::Contains("never finishes"));

    // Sending first fixes it.
    swap(prog, 0, 1, 2);
    prog.ranks[0].code[4].target = 1;
    CHECK(message_of([&] { verify_pipeline(prog); }) == "(no error)");
}

TEST_CASE("a rank holding more activations than the bound is rejected", "[parallel][pipeline]") {
    const auto prog = gpipe(2, 4, 2);
    CHECK(peak_activations(prog, 0) == 4);
    CHECK(message_of([&] { verify_pipeline(prog); }) ==
          "pipeline program (GPipe, p=2, m=4) is invalid: rank 0 holds a peak of 4 activations at rank 0 #6 (forward "
          "c0 mb3), above the promised bound of 2");
    CHECK(message_of([&] { (void)peak_activations(prog, 2); }) == "peak_activations: rank 2 of 2");
}

TEST_CASE("simulated GPipe and 1F1B have the textbook makespan and bubble", "[parallel][pipeline]") {
    const int p = 4, m = 8;
    for (const auto& prog : {gpipe(p, m), one_f_one_b(p, m)}) {
        INFO(prog.schedule);
        REQUIRE(message_of([&] { verify_pipeline(prog); }) == "(no error)");
        // F = 1 and a combined backward = B + W = 1: the defaults' B and W halved.
        const auto sim = simulate(prog, StageTimes{.forward = 1, .backward_input = 0.5, .backward_weight = 0.5});
        CHECK(sim.makespan == (m + p - 1) * 2.0);
        CHECK(sim.bubble == static_cast<double>(p - 1) / (m + p - 1));
        CHECK(sim.events.size() == static_cast<std::size_t>(p));
        for (const auto& rank : sim.events)
            CHECK(std::count_if(rank.begin(), rank.end(), [](const auto& e) { return e.lane == 0; }) == 2 * m);
    }
    // Rank 0's first backward starts once the gradient has come back through
    // every stage; it waited on lane 1 from the end of its forwards.
    const auto sim = simulate(gpipe(p, m), StageTimes{.forward = 1, .backward_input = 0.5, .backward_weight = 0.5});
    const auto& waited = sim.events[0][static_cast<std::size_t>(m)];
    CHECK(waited.name == "recv gradient c0 mb0");
    CHECK(waited.lane == 1);
    CHECK(waited.start == m);
    CHECK(waited.duration == 2.0 * (p - 1));
    const auto& first_b = sim.events[0][static_cast<std::size_t>(m) + 1];
    CHECK(first_b.name == "B c0 mb0");
    CHECK(first_b.category == "backward");
    CHECK(first_b.lane == 0);
    CHECK(first_b.start == m + 2.0 * (p - 1));

    // GPipe: p2p latency adds one hop per stage boundary, each way.
    const StageTimes slow_link{.forward = 1, .backward_input = 0.5, .backward_weight = 0.5, .p2p = 0.25};
    CHECK(simulate(gpipe(p, m), slow_link).makespan == (m + p - 1) * 2.0 + 2 * (p - 1) * 0.25);
    CHECK(simulate(one_f_one_b(p, m), slow_link).makespan > (m + p - 1) * 2.0);
}

TEST_CASE("a ZB-H1-like split schedule for p=2 has less bubble than 1F1B", "[parallel][pipeline]") {
    const int m = 4;
    // Rank 0 fills the wait for each gradient with the previous W; rank 1
    // (the last stage) defers each W behind the next forward.
    std::vector<std::vector<Action>> order(2);
    order[0] = {{Op::forward, 0, 0}, {Op::forward, 0, 1}};
    for (int k = 0; k < m; ++k) {
        order[0].push_back({Op::backward_input, 0, k});
        order[0].push_back({Op::backward_weight, 0, k});
        if (k + 2 < m) order[0].push_back({Op::forward, 0, k + 2});
    }
    order[1] = {{Op::forward, 1, 0}, {Op::backward_input, 1, 0}};
    for (int k = 1; k < m; ++k) {
        order[1].push_back({Op::forward, 1, k});
        order[1].push_back({Op::backward_weight, 1, k - 1});
        order[1].push_back({Op::backward_input, 1, k});
    }
    order[1].push_back({Op::backward_weight, 1, m - 1});
    const auto zb = build("ZB-H1", 2, m, {0, 1}, true, 2, order);
    REQUIRE(message_of([&] { verify_pipeline(zb); }) == "(no error)");
    CHECK(peak_activations(zb, 0) == 2);
    CHECK(peak_activations(zb, 1) == 2);

    const StageTimes times{.forward = 1, .backward_input = 1, .backward_weight = 1};
    const auto split = simulate(zb, times);
    const auto plain = simulate(one_f_one_b(2, m), times);
    CHECK(plain.makespan == (m + 1) * 3.0);
    CHECK(plain.bubble == 1.0 / (m + 1));
    CHECK(split.makespan == 14.0);
    CHECK(split.bubble < plain.bubble);
    for (const auto& e : split.events[1])
        if (e.category == "backward_weight") CHECK(e.name.rfind("W c1 mb", 0) == 0);
}

TEST_CASE("a simulated schedule writes a Chrome trace", "[parallel][pipeline]") {
    const auto sim = simulate(gpipe(2, 2), StageTimes{.p2p = 0.5});
    const auto events = loom::exec::schedule_trace_events(sim);
    REQUIRE(events.size() == 2);
    CHECK(events[0].front().name == "F c0 mb0");
    CHECK(events[0].front().duration_us == 1000.0);
    // Rank 1 waits on lane 1 for the first activation: 1 unit of forward + 0.5 in flight.
    CHECK(events[1].front().category == "recv");
    CHECK(events[1].front().lane == 1);
    CHECK(events[1].front().duration_us == 1500.0);
    const auto path = std::filesystem::temp_directory_path() / "loom_test_pipeline_trace.json";
    loom::exec::write_schedule_trace(sim, path);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    CHECK(text.str().find("\"name\":\"B c1 mb1\",\"cat\":\"backward\"") != std::string::npos);
    std::filesystem::remove(path);
}

}  // namespace LOOM_TEST_FILE
