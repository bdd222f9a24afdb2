// launch_mpi_processes: the body runs once on every process, as "MPI
// processes", over a working communicator of the whole world.
#include <catch2/catch.hpp>

#include <loom/comm/communicator_mpi.hpp>
#include <loom/train/transport_launch_mpi.hpp>

#include <string>
#include <utility>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("launch_mpi_processes runs the body on every process", "[train]") {
    loom::comm::Mpi world = loom::comm::Mpi::world();
    const int world_size = world.size();
    std::string transport;
    int size = 0, runs = 0;
    float sum = 0.0f;
    CHECK(loom::train::launch_mpi_processes(std::move(world), {}, [&](loom::comm::AnyComm& comm, const char* name, loom::Device device) {
        CHECK(device == loom::host_device);
        transport = name;
        size = comm.size();
        ++runs;
        float one = 1.0f;
        comm.all_reduce(loom::Tensor::of(&one, {1}), loom::Tensor::of(&sum, {1}), loom::comm::ReduceOp::sum);
    }));
    CHECK(runs == 1);
    CHECK(transport == "MPI processes");
    CHECK(size == world_size);
    CHECK(sum == static_cast<float>(world_size));
}

}  // namespace LOOM_TEST_FILE
