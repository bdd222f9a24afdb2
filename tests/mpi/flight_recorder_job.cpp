// An MPI job that goes wrong on purpose, for the flight recorder's tests
// (mpi_tests.cmake runs it under mpirun -np 4 with LOOM_FLIGHT_RECORDER_DIR
// set, then loom-flight on the files). argv[1]:
//   mismatch  with check_calls, world rank 2 passes 7 floats to the fourth
//             collective (call 3) where the others pass 8;
//   stall     world rank 3 sleeps before its third collective (call 2) far
//             past the 300 ms timeout; the others time out inside it.
// Every rank prints what it caught; the report, not this program, is checked.
#include <loom/comm/communicator_mpi.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

using loom::comm::Mpi;
using loom::comm::ReduceOp;

int main(int argc, char** argv) {
    loom::comm::MpiSession session(argc, argv);
    const std::string scenario = argc > 1 ? argv[1] : "";
    const bool mismatch = scenario == "mismatch";
    if (!mismatch && scenario != "stall") {
        if (session.world_rank() == 0) std::printf("unknown scenario \"%s\"; use mismatch or stall\n", scenario.c_str());
        return 2;
    }
    Mpi comm = Mpi::world(loom::comm::CommOptions{std::chrono::milliseconds(mismatch ? 5000 : 300), mismatch});
    std::vector<float> x(8, 1.0f);
    auto all_reduce = [&](std::int64_t n) {
        const auto t = loom::Tensor::of(x.data(), loom::Shape{n});
        comm.all_reduce(t, t, ReduceOp::sum);
    };
    try {
        all_reduce(8);
        all_reduce(8);
        if (mismatch) {
            comm.barrier();
            all_reduce(comm.rank() == 2 ? 7 : 8);
        } else {
            if (comm.rank() == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
            all_reduce(8);
        }
        std::printf("world rank %d: no error\n", comm.rank());
    } catch (const std::exception& e) {
        std::printf("world rank %d caught: %s\n", comm.rank(), e.what());
    }
    std::fflush(stdout);
    return 0;
}
