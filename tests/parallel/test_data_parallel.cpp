// Data parallelism and ZeRO on rank threads: the equivalence with the serial
// run for dp 2..4 x stage 0..3 x micro-batches 1 and 4, and the step programs.
#include <catch2/catch.hpp>

#include <loom/comm/thread_world.hpp>

#include "parallel/equivalence_on_threads.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom_test::EquivalenceCase;

namespace {

const loom_test::SerialRun& serial() {
    static const auto run = loom_test::serial_run(5);
    return run;
}

void check_equivalence(const EquivalenceCase& c) { loom_test::check_equivalence_on_threads(c, serial()); }

}  // namespace

TEST_CASE("data parallel equals serial on rank threads", "[parallel]") {
    for (int dp : {2, 3, 4})
        for (int stage : {0, 1, 2, 3})
            for (int micro_batches : {1, 4}) {
                DYNAMIC_SECTION("dp " << dp << " stage " << stage << " micro-batches " << micro_batches) {
                    check_equivalence({.dp = dp, .stage = stage, .micro_batches = micro_batches});
                }
            }
}

TEST_CASE("one data-parallel rank is the serial run bit for bit", "[parallel]") {
    for (int stage : {0, 1, 2, 3}) {
        INFO("stage " << stage);
        const auto& reference = serial();
        loom::comm::ThreadWorld world(1);
        world.run([&](loom::comm::ThreadComm& comm) {
            const auto result = loom_test::run_equivalence(comm, {.dp = 1, .stage = stage}, reference);
            CHECK(result.losses == reference.losses);
            CHECK(result.worst_param_error == 0.0);
        });
    }
}

}  // namespace LOOM_TEST_FILE
