// Data parallelism and ZeRO under mpirun: the equivalence suite of
// tests/parallel (the same body the rank-thread tests run), with dp = the
// number of processes, every ZeRO stage, 1 and 4 micro-batches.
#include <catch2/catch.hpp>

#include <loom/comm/communicator_mpi.hpp>

#include "parallel/equivalence_suite.hpp"

TEST_CASE("data parallel equals serial under MPI", "[parallel]") {
    static const auto serial = loom_test::serial_run(5);
    auto world = loom::comm::Mpi::world();
    for (int stage : {0, 1, 2, 3})
        for (int micro_batches : {1, 4}) {
            const loom_test::EquivalenceCase c{.dp = world.size(), .stage = stage, .micro_batches = micro_batches};
            const auto result = loom_test::run_equivalence(world, c, serial);
            INFO("dp " << c.dp << ", stage " << stage << ", " << micro_batches << " micro-batches, rank "
                       << world.rank() << ": " << result.describe());
            CHECK(result.worst_loss_error <= 1e-5);
            CHECK(result.worst_param_error <= 1e-5);
        }
}
