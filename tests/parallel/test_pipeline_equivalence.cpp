// Pipelines on rank threads: every schedule equals the serial run for pp 2
// and 4 x micro-batches 1, 4 and 8, alone and with dp 2 at ZeRO 0-3 (8 rank
// threads at pp 4), with the same tolerances as data parallelism.
#include <catch2/catch.hpp>

#include <loom/comm/thread_world.hpp>

#include "parallel/equivalence_on_threads.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::ScheduleKind;
using loom_test::EquivalenceCase;

namespace {

// Four blocks: 8 units, enough for 4 stages x 2 chunks.
constexpr int pipeline_layers = 4;

const loom_test::SerialRun& serial() {
    static const auto run = loom_test::serial_run(3, pipeline_layers);
    return run;
}

void check_equivalence(const EquivalenceCase& c) { loom_test::check_equivalence_on_threads(c, serial()); }

constexpr ScheduleKind all_schedules[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                          ScheduleKind::zero_bubble_h1, ScheduleKind::zero_bubble_v};

// Interleaving needs the micro-batches to be a multiple of the stages.
bool runs(ScheduleKind s, int pp, int micro_batches) {
    return s != ScheduleKind::interleaved || micro_batches % pp == 0;
}

}  // namespace

TEST_CASE("every pipeline schedule equals serial on rank threads", "[parallel][pipeline]") {
    for (ScheduleKind schedule : all_schedules)
        for (int pp : {2, 4})
            for (int micro_batches : {1, 4, 8}) {
                if (!runs(schedule, pp, micro_batches)) continue;
                const EquivalenceCase c{.dp = 1, .micro_batches = micro_batches, .steps = 3, .pp = pp,
                                        .schedule = schedule, .layers = pipeline_layers};
                DYNAMIC_SECTION(c) { check_equivalence(c); }
            }
}

TEST_CASE("pipelines with dp 2 and ZeRO 0-3 equal serial on up to 8 rank threads", "[parallel][pipeline]") {
    for (ScheduleKind schedule : all_schedules)
        for (int pp : {2, 4})
            for (int stage : {0, 1, 2, 3}) {
                const int micro_batches = stage % 2 == 0 ? 4 : 8;
                const EquivalenceCase c{.dp = 2, .stage = stage, .micro_batches = micro_batches, .steps = 3, .pp = pp,
                                        .schedule = schedule, .layers = pipeline_layers};
                DYNAMIC_SECTION(c) { check_equivalence(c); }
            }
}

}  // namespace LOOM_TEST_FILE
