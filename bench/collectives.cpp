// bench/collectives: nccl-tests style timings of loom's communicators beside
// MPI's own collectives, measured in the same run on the same buffers sizes.
// One line per (backend, op, ranks, bytes): time, algbw and busbw (nccl-tests
// conventions: algbw = bytes / time; busbw = algbw * 2(n-1)/n for all_reduce,
// * (n-1)/n for reduce_scatter, all_gather and all_to_all, * 1 for broadcast).
// The MPI rows come from this same binary, started by the bench under mpirun.
//
//   collectives [--ranks 2,4] [--ops all_reduce,...] [--min-bytes 4096]
//               [--max-bytes 268435456] [--reps 5] [--no-mpi]
#include <loom/comm/thread_world.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "collectives_common.hpp"

#if LOOM_BENCH_WITH_MPI
#include "collectives_mpi.hpp"
#endif

namespace {

using namespace loom_bench;
using loom::Tensor;
using loom::comm::ReduceOp;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;

// Times one op on `ranks` threads for every size; rank 0 prints.
void bench_threads(const Options& options, int ranks, const std::string& op, std::vector<Row>& rows) {
    const std::size_t max_elements = options.max_bytes / sizeof(float);
    std::vector<std::vector<float>> send(static_cast<std::size_t>(ranks)), recv(static_cast<std::size_t>(ranks));
    ThreadWorld(ranks).run([&](ThreadComm& comm) {
        const auto me = static_cast<std::size_t>(comm.rank());
        // Each rank touches its own pages first (as a real rank would).
        send[me].assign(max_elements, 1.0f);
        recv[me].assign(max_elements, 0.0f);
        comm.barrier();
        for (std::size_t bytes : options.sizes()) {
            const auto count = static_cast<std::int64_t>(bytes / sizeof(float));
            const auto block = count / ranks;
            auto once = [&] {
                float* s = send[me].data();
                float* r = recv[me].data();
                if (op == "all_reduce") comm.all_reduce(Tensor::of(s, {count}), Tensor::of(r, {count}), ReduceOp::sum);
                else if (op == "reduce_scatter") comm.reduce_scatter(Tensor::of(s, {block * ranks}), Tensor::of(r, {block}), ReduceOp::sum);
                else if (op == "all_gather") comm.all_gather(Tensor::of(s, {block}), Tensor::of(r, {block * ranks}));
                else if (op == "broadcast") comm.broadcast(Tensor::of(s, {count}), 0);
                else if (op == "all_to_all") comm.all_to_all(Tensor::of(s, {block * ranks}), Tensor::of(r, {block * ranks}));
            };
            const int iterations = iterations_for(bytes);
            once();  // warm-up
            std::vector<double> times;
            for (int rep = 0; rep < options.reps; ++rep) {
                comm.barrier();
                const auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < iterations; ++i) once();
                // Every collective ends with all ranks done, so rank 0's clock is the op's.
                times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                                iterations);
            }
            if (comm.rank() == 0) rows.push_back(make_row("ThreadWorld", op, ranks, bytes, median(times)));
        }
    });
}

// Memory bandwidth the same run sees: memcpy of `bytes` on 1 and on 2 threads.
double memcpy_gbps(std::size_t bytes, int threads, int reps) {
    std::vector<std::vector<char>> from(static_cast<std::size_t>(threads), std::vector<char>(bytes, 1));
    std::vector<std::vector<char>> to(static_cast<std::size_t>(threads), std::vector<char>(bytes, 0));
    std::vector<double> times;
    for (int rep = 0; rep < reps + 1; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                std::memcpy(to[static_cast<std::size_t>(t)].data(), from[static_cast<std::size_t>(t)].data(), bytes);
            });
        for (auto& th : pool) th.join();
        if (rep > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return static_cast<double>(bytes) * threads / median(times) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
#if LOOM_BENCH_WITH_MPI
    if (argc > 1 && std::string_view(argv[1]) == "--mpi-worker") return mpi_worker(argc, argv);
#endif
    Options options;
    if (!options.parse(argc, argv)) return 2;

    const double copy1 = memcpy_gbps(64u << 20, 1, options.reps);
    const double copy2 = memcpy_gbps(64u << 20, 2, options.reps);
    std::printf("# memcpy of 64 MiB: %.1f GB/s on 1 thread, %.1f GB/s on 2 threads together (the limit)\n", copy1,
                copy2);
    std::printf("%s\n", Row::header().c_str());

    std::vector<Row> rows;
    for (int ranks : options.ranks) {
        for (const auto& op : options.ops) {
            const std::size_t before = rows.size();
            bench_threads(options, ranks, op, rows);
            for (std::size_t i = before; i < rows.size(); ++i) std::printf("%s\n", rows[i].format().c_str());
            std::fflush(stdout);
        }
#if LOOM_BENCH_WITH_MPI
        if (options.mpi) {
            for (Row& row : run_mpi_worker(argv[0], options, ranks)) {
                std::printf("%s\n", row.format().c_str());
                rows.push_back(std::move(row));
            }
            std::fflush(stdout);
        }
#endif
    }
    print_ratios(rows, copy2);
    return 0;
}
