// The executor's pipeline pieces: its stage bounds (the partition, or costs
// balanced min-max), the micro-batch pool, a pipelined step on two rank
// threads and the strategy check, and the unit profiler that prices stages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/micro_batch_pool.hpp>
#include <loom/gpt/model.hpp>
#include <loom/nn/units.hpp>
#include <loom/plan/profile.hpp>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::ScheduleKind;
using loom::schedule::Payload;
using loom::schedule::StageBounds;
using loom_test::message_of;

namespace {

}  // namespace

// --- the executor's stage bounds ----------------------------------------------------

TEST_CASE("exec::stage_bounds refuses a bad partition or costs in one line", "[parallel][pipeline][executor]") {
    using loom::exec::ExecutorOptions;
    using loom::exec::stage_bounds;
    CHECK(message_of([] { (void)stage_bounds(10, 4, ExecutorOptions{.partition = {3, 3, 4}}); }) ==
          "Executor: a partition of 3 stages for a pipeline of 4 virtual stages; give one count per virtual stage");
    CHECK(message_of([] { (void)stage_bounds(10, 4, ExecutorOptions{.partition = {4, 0, 3, 3}}); }) ==
          "Executor: a stage of 0 units in the partition; every stage needs at least 1");
    CHECK(message_of([] { (void)stage_bounds(10, 4, ExecutorOptions{.partition = {3, 3, 3, 3}}); }) ==
          "Executor: the partition covers 12 units but the model has 10; the counts must sum to 10");
    CHECK(message_of([] { (void)stage_bounds(10, 4, ExecutorOptions{.unit_costs = std::vector<double>(9, 1.0)}); }) ==
          "Executor: 9 unit costs for 10 units; give one per unit");
    // More virtual stages than units: schedule::balance's message (in its words: layers).
    CHECK(message_of([] { (void)stage_bounds(3, 4, ExecutorOptions{}); }) ==
          "partition: 4 stages but the model has 3 layers; every stage needs at least one layer, so use at most 3 stages");
    // A given partition is used as it is.
    CHECK(stage_bounds(10, 4, ExecutorOptions{.partition = {4, 1, 3, 2}}).bounds == std::vector<int>{0, 4, 5, 8, 10});
}

TEST_CASE("exec::stage_bounds balances equal costs min-max, ties to the smaller first stages",
          "[parallel][pipeline][executor]") {
    using loom::exec::ExecutorOptions;
    using loom::exec::stage_bounds;
    // Ten equal units over four stages: no split beats a slowest stage of 3,
    // and schedule::balance breaks ties towards "earlier, smaller first stages":
    // for stage 0 it tries 1 unit first, and 1 unit leaves 9 for 3 stages at
    // 3 each, which is optimal, so {1, 3, 3, 3} (not {3, 3, 2, 2}).
    const StageBounds four = stage_bounds(10, 4, ExecutorOptions{});
    CHECK(four.bounds == std::vector<int>{0, 1, 4, 7, 10});
    CHECK(four.stages() == 4);
    CHECK(four.units() == 10);
    // The same rule at 8 virtual stages (4 ranks x 2 chunks): six of one, two of two.
    CHECK(stage_bounds(10, 8, ExecutorOptions{}).bounds == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 8, 10});
    // Costs move the cuts: a heavy first unit gets a stage of its own and the rest split.
    std::vector<double> costs(10, 1.0);
    costs[0] = 5.0;
    CHECK(stage_bounds(10, 3, ExecutorOptions{.unit_costs = costs}).bounds == std::vector<int>{0, 1, 5, 10});
    // The chunk map of a V: rank 0 holds virtual stages 0 and 3 of {1, 3, 3, 3}.
    CHECK(four.chunk_of_unit({0, 1, 1, 0}, 0) == std::vector<int>{0, -1, -1, -1, -1, -1, -1, 3, 3, 3});
    CHECK(four.chunk_of_unit({0, 1, 1, 0}, 1) == std::vector<int>{-1, 1, 1, 1, 2, 2, 2, -1, -1, -1});
}

// --- the micro-batch pool ---------------------------------------------------------

TEST_CASE("MicroBatchPool reuses closed contexts: it grows to the peak in flight", "[parallel][pipeline][executor]") {
    loom::exec::MicroBatchPool pool;
    pool.start_step(1, 8);
    // 1F1B on the first of 3 stages: 3 warm-up forwards, then F B pairs, then the drain.
    int open = 0, peak = 0;
    const auto f = [&](int mb) {
        (void)pool.open(0, mb);
        peak = std::max(peak, ++open);
    };
    const auto b = [&](int mb) {
        pool.close(0, mb);
        --open;
    };
    f(0);
    f(1);
    f(2);
    for (int i = 0; i < 5; ++i) {
        b(i);
        f(i + 3);
    }
    for (int i = 5; i < 8; ++i) b(i);
    CHECK(peak == 3);
    CHECK(pool.contexts() == 3);
    // Another step of the same shape allocates nothing.
    pool.start_step(1, 8);
    for (int mb = 0; mb < 3; ++mb) f(mb);
    for (int mb = 0; mb < 3; ++mb) b(mb);
    CHECK(pool.contexts() == 3);
    // GPipe-like: all open at once.
    pool.start_step(2, 4);
    for (int v = 0; v < 2; ++v)
        for (int mb = 0; mb < 4; ++mb) (void)pool.open(v, mb);
    CHECK(pool.contexts() == 8);
}

TEST_CASE("MicroBatchPool refuses what a correct schedule never does, in one line", "[parallel][pipeline][executor]") {
    loom::exec::MicroBatchPool pool;
    pool.start_step(2, 4);
    (void)pool.open(1, 2);
    CHECK(message_of([&] { (void)pool.open(1, 2); }) == "Executor: chunk 1 micro-batch 2 started twice in one step");
    CHECK(message_of([&] { (void)pool.inbox(Payload::activation, 1, 3); }) ==
          "Executor: chunk 1 micro-batch 3 needs its activation, which has not arrived");
    CHECK(message_of([&] { (void)pool.inbox(Payload::gradient, 0, 0); }) ==
          "Executor: chunk 0 micro-batch 0 needs its gradient, which has not arrived");
    CHECK(message_of([&] { (void)pool.outbox(Payload::activation, 0, 1); }) ==
          "Executor: chunk 0 micro-batch 1 has no activation to send yet");
    CHECK(message_of([&] { (void)pool.context(0, 2); }) ==
          "Executor: chunk 0 micro-batch 2 computes before its forward opened it");
    CHECK(message_of([&] { (void)pool.open(2, 0); }) == "Executor: chunk 2 micro-batch 0 is outside the step's 2 chunk(s) x 4 micro-batch(es)");
    // Closed, it can open again; a put inbox entry is found (and a new step forgets it).
    pool.close(1, 2);
    CHECK(message_of([&] { (void)pool.open(1, 2); }) == "(no error)");
    float x = 1.5f;
    pool.put_inbox(Payload::activation, 1, 3, loom::Tensor::of(&x, {1}));
    CHECK(pool.inbox(Payload::activation, 1, 3).raw() == &x);
    CHECK(message_of([&] { (void)pool.inbox(Payload::gradient, 1, 3); }) ==
          "Executor: chunk 1 micro-batch 3 needs its gradient, which has not arrived");
    pool.start_step(2, 4);
    CHECK(message_of([&] { (void)pool.inbox(Payload::activation, 1, 3); }) ==
          "Executor: chunk 1 micro-batch 3 needs its activation, which has not arrived");
    CHECK(message_of([&] { (void)pool.open(1, 2); }) == "(no error)");
}

// --- the executor on rank threads ------------------------------------------------

namespace {

const loom::gpt::Config tiny_gpt{.layers = 2, .width = 16, .heads = 2, .seq = 8, .vocab = 32};

struct PipelineRun {
    std::int64_t activations = 0;
    float loss = 0;
    bool holds_first = false;
    std::string error;
};

// One step of `kind` over pp 2 (dp 1) with 4 micro-batches of one row each.
std::vector<PipelineRun> run_pipeline(ScheduleKind kind) {
    using loom::comm::ThreadComm;
    std::vector<PipelineRun> runs(2);
    loom::comm::ThreadWorld(2).run([&](ThreadComm& world) {
        auto& mine = runs[static_cast<std::size_t>(world.rank())];
        loom::comm::Mesh<ThreadComm> mesh(world, {{"dp", 1}, {"pp", 2}});
        auto model = loom::gpt::make_model(tiny_gpt);
        const loom::exec::ExecutionPlan plan{.zero_stage = 0, .pipelined = true, .schedule = kind, .chunks = 1};
        mine.error = message_of([&] {
            loom::exec::Executor<ThreadComm> exec(model, mesh.axis("dp"), &mesh.axis("pp"), plan,
                                                  {.micro_batches = 4});
            exec.initialize(3);
            std::vector<std::int32_t> inputs, targets;
            for (int k = 0; k < 4 * tiny_gpt.seq; ++k) {
                inputs.push_back(static_cast<std::int32_t>(k * 7 % tiny_gpt.vocab));
                targets.push_back(static_cast<std::int32_t>(k * 5 % tiny_gpt.vocab));
            }
            mine.loss = exec.step(loom::Tensor::of(inputs.data(), {4, tiny_gpt.seq}),
                                  loom::Tensor::of(targets.data(), {4, tiny_gpt.seq}), 1e-3f);
            mine.activations = exec.memory_report().activations;
            mine.holds_first = exec.holds_unit(0);
        });
    });
    return runs;
}

}  // namespace

TEST_CASE("a 1F1B step on two pipeline ranks holds no more activations than its bound", "[parallel][pipeline][executor]") {
    // The pool's contexts are not exposed; but every context of a rank peaks
    // at the same bytes (one micro-batch of the same chunk), so activations
    // are (contexts) x (one context's peak). GPipe opens all m = 4 on each
    // rank; 1F1B opens min(p - r, m): 2 on rank 0, 1 on rank 1.
    const auto one_f_one_b = run_pipeline(ScheduleKind::one_f_one_b);
    const auto gpipe = run_pipeline(ScheduleKind::gpipe);
    for (int r = 0; r < 2; ++r) {
        INFO("rank " << r);
        const auto& a = one_f_one_b[static_cast<std::size_t>(r)];
        const auto& g = gpipe[static_cast<std::size_t>(r)];
        REQUIRE(a.error == "(no error)");
        REQUIRE(g.error == "(no error)");
        CHECK(a.holds_first == (r == 0));
        CHECK(a.activations > 0);
        CHECK(std::isfinite(a.loss));
        CHECK(a.loss == one_f_one_b[0].loss);  // every stage returns the step's loss
        const std::int64_t contexts_1f1b = std::min(2 - r, 4);
        CHECK(a.activations * 4 == g.activations * contexts_1f1b);
        CHECK(g.activations % 4 == 0);
    }
}

TEST_CASE("an Executor with a pp axis of 2 and no Pipeline<...> is refused", "[parallel][pipeline][executor]") {
    using loom::comm::ThreadComm;
    std::vector<std::string> seen(2);
    loom::comm::ThreadWorld(2).run([&](ThreadComm& world) {
        loom::comm::Mesh<ThreadComm> mesh(world, {{"dp", 1}, {"pp", 2}});
        auto model = loom::gpt::make_model(tiny_gpt);
        seen[static_cast<std::size_t>(world.rank())] = message_of([&] {
            loom::exec::Executor<ThreadComm> exec(model, mesh.axis("dp"), &mesh.axis("pp"), loom::exec::ExecutionPlan{},
                                                  {});
        });
    });
    for (const auto& message : seen)
        CHECK(message ==
              "Executor: a pipeline axis of 2 ranks for a strategy without Pipeline<...>; add Pipeline<Schedule> or "
              "use a pp axis of 1");
}

// --- the unit profiler -----------------------------------------------------------

TEST_CASE("plan::profile_units times every unit of a tiny GPT", "[parallel][pipeline][partition]") {
    auto probe = loom::gpt::make_model(tiny_gpt);
    std::vector<std::int32_t> inputs, targets;
    for (int k = 0; k < 2 * tiny_gpt.seq; ++k) {
        inputs.push_back(static_cast<std::int32_t>(k * 3 % tiny_gpt.vocab));
        targets.push_back(static_cast<std::int32_t>((k * 3 + 1) % tiny_gpt.vocab));
    }
    const auto seconds = loom::plan::profile_units(probe, 5, loom::Tensor::of(inputs.data(), {2, tiny_gpt.seq}),
                                                   loom::Tensor::of(targets.data(), {2, tiny_gpt.seq}));
    REQUIRE(seconds.size() == loom::nn::units_of(probe).size());
    CHECK(seconds.size() == 6);
    for (double s : seconds) {
        CHECK(s > 0.0);
        CHECK(s < 1.0);
    }
    CHECK(message_of([&] {
              (void)loom::plan::profile_units(probe, 5, loom::Tensor::of(inputs.data(), {2, tiny_gpt.seq}),
                                              loom::Tensor::of(targets.data(), {2, tiny_gpt.seq}), 0);
          }) == "profile_units: 0 repeats; give at least 1");
}

}  // namespace LOOM_TEST_FILE
