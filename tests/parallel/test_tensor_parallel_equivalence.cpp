// Tensor parallelism (Megatron 1D) trains the GPT to the serial run's losses
// and parameters: tp 2 and 4 alone, tp 2 with dp 2 at every ZeRO stage, and
// 3D parallelism dp 2 x pp 2 x tp 2 on 8 rank threads; the same tolerances
// as data parallelism (tests/parallel/equivalence_suite.hpp).
#include <catch2/catch.hpp>

#include <loom/comm/thread_world.hpp>

#include "parallel/equivalence_on_threads.hpp"

using loom_test::EquivalenceCase;

namespace {

constexpr int tp_layers = 4, tp_heads = 4;

const loom_test::SerialRun& serial() {
    static const auto run = loom_test::serial_run(3, tp_layers, tp_heads);
    return run;
}

void check_equivalence(const EquivalenceCase& c) { loom_test::check_equivalence_on_threads(c, serial()); }

}  // namespace

TEST_CASE("tensor parallelism equals serial on rank threads", "[parallel][tp]") {
    for (int tp : {2, 4})
        for (int micro_batches : {1, 4}) {
            const EquivalenceCase c{.dp = 1, .micro_batches = micro_batches, .steps = 3, .layers = tp_layers, .tp = tp,
                                    .heads = tp_heads};
            DYNAMIC_SECTION(c) { check_equivalence(c); }
        }
}

TEST_CASE("tensor parallelism with dp 2 at ZeRO 0-3 equals serial", "[parallel][tp]") {
    for (int stage : {0, 1, 2, 3}) {
        const EquivalenceCase c{.dp = 2, .stage = stage, .micro_batches = 2, .steps = 3, .layers = tp_layers, .tp = 2,
                                .heads = tp_heads};
        DYNAMIC_SECTION(c) { check_equivalence(c); }
    }
}

TEST_CASE("3D parallelism dp 2 x pp 2 x tp 2 on 8 rank threads equals serial", "[parallel][tp]") {
    for (auto schedule : {loom::ScheduleKind::one_f_one_b, loom::ScheduleKind::zero_bubble_v})
        for (int stage : {0, 3}) {
            const EquivalenceCase c{.dp = 2, .stage = stage, .micro_batches = 4, .steps = 3, .pp = 2,
                                    .schedule = schedule, .layers = tp_layers, .tp = 2, .heads = tp_heads};
            DYNAMIC_SECTION(c) { check_equivalence(c); }
        }
}
