// allreduce_anywhere: one function, written once against the Communicator
// concept, averaging every rank's gradient; run on rank threads (the default,
// no launcher) or under mpirun with --mpi. Rank 0 checks the average against
// the serial one computed from the same seeds.
//
//   allreduce_anywhere [--ranks N] [--elements E]          # N rank threads
//   mpirun -np 2 allreduce_anywhere --mpi [--elements E]   # one rank per process
#include <loom/comm/communicator.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/core/rng.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#if LOOM_EXAMPLE_WITH_MPI
#include <loom/comm/communicator_mpi.hpp>
#include <loom/comm/session_mpi.hpp>
#endif

namespace {

// Rank r's gradient: normal numbers from the stream (seed 2024, r).
std::vector<float> gradient_of(int rank, std::int64_t elements) {
    std::vector<float> g(static_cast<std::size_t>(elements));
    loom::RngStream(2024, static_cast<std::uint64_t>(rank)).fill_normal(g, 0, 0.0f, 1.0f);
    return g;
}

template <loom::comm::Communicator Comm>
void average_gradients(Comm& comm, std::int64_t elements, const char* transport) {
    std::vector<float> grad = gradient_of(comm.rank(), elements);
    const auto t = loom::Tensor::of(grad.data(), {elements});
    comm.all_reduce(t, t, loom::comm::ReduceOp::avg);
    if (comm.rank() != 0) return;

    // The serial average: the sum in rank order, divided once.
    std::vector<float> serial = gradient_of(0, elements);
    for (int r = 1; r < comm.size(); ++r) {
        const std::vector<float> g = gradient_of(r, elements);
        for (std::size_t i = 0; i < serial.size(); ++i) serial[i] += g[i];
    }
    double worst = 0;
    for (std::size_t i = 0; i < serial.size(); ++i) {
        serial[i] /= static_cast<float>(comm.size());
        worst = std::max(worst, static_cast<double>(std::fabs(serial[i] - grad[i])));
    }
    const bool identical = std::memcmp(serial.data(), grad.data(), grad.size() * sizeof(float)) == 0;
    std::printf("%d ranks (%s): averaged %lld gradients; ", comm.size(), transport, static_cast<long long>(elements));
    if (identical) std::printf("equal to the serial average bit for bit\n");
    else std::printf("largest difference from the serial average %.3g (summation order)\n", worst);
}

}  // namespace

int main(int argc, char** argv) {
    int ranks = 4;
    std::int64_t elements = 1 << 20;
    bool mpi = false;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (flag == "--mpi") mpi = true;
        else if (flag == "--ranks" && i + 1 < argc) ranks = std::atoi(argv[++i]);
        else if (flag == "--elements" && i + 1 < argc) elements = std::atoll(argv[++i]);
        else {
            std::fprintf(stderr, "allreduce_anywhere: unknown flag %s; flags are --ranks N, --elements E, --mpi\n", argv[i]);
            return 2;
        }
    }
    if (ranks < 1 || ranks > 64 || elements < 0 || elements > (std::int64_t{1} << 30)) {
        std::fprintf(stderr, "allreduce_anywhere: --ranks %d --elements %lld is not valid; use --ranks 1..64, --elements 0..2^30\n",
                     ranks, static_cast<long long>(elements));
        return 2;
    }
    if (mpi) {
#if LOOM_EXAMPLE_WITH_MPI
        loom::comm::MpiSession session(argc, argv);
        auto comm = loom::comm::Mpi::world();
        comm.run([&](loom::comm::Mpi& c) { average_gradients(c, elements, "MPI processes"); });
        return 0;
#else
        std::fprintf(stderr, "allreduce_anywhere: --mpi needs a build with MPI (LOOM_WITH_MPI=ON and an MPI library)\n");
        return 2;
#endif
    }
    loom::comm::ThreadWorld(ranks).run(
        [&](loom::comm::ThreadComm& c) { average_gradients(c, elements, "rank threads"); });
    return 0;
}
