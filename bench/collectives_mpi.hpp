// The MPI half of bench/collectives: the parent starts this same binary under
// mpirun with --mpi-worker; the worker times MPI's own collectives ("MPI") and
// loom's Mpi communicator ("loom::Mpi") on the same sizes and prints rows in
// the parent's format, which the parent reads back.
#pragma once

#include <loom/comm/communicator_mpi.hpp>
#include <loom/comm/session_mpi.hpp>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "collectives_common.hpp"

#ifndef LOOM_BENCH_MPIEXEC
#define LOOM_BENCH_MPIEXEC "mpirun"
#endif

namespace loom_bench {

// Median over repetitions of the slowest rank's time per op.
inline double time_mpi(MPI_Comm comm, std::size_t bytes, int reps, const std::function<void()>& once) {
    const int iterations = iterations_for(bytes);
    once();
    std::vector<double> times;
    for (int rep = 0; rep < reps; ++rep) {
        MPI_Barrier(comm);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < iterations; ++i) once();
        double mine = (MPI_Wtime() - t0) / iterations, slowest = 0;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
        times.push_back(slowest);
    }
    return median(times);
}

inline int mpi_worker(int argc, char** argv) {
    loom::comm::MpiSession session(argc, argv);
    Options options;
    if (!options.parse(argc, argv, 2)) return 2;
    auto comm = loom::comm::Mpi::world();
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const std::size_t max_elements = options.max_bytes / sizeof(float);
    std::vector<float> send(max_elements, 1.0f), recv(max_elements, 0.0f);
    using loom::Tensor;
    using loom::comm::ReduceOp;
    for (const auto& op : options.ops) {
        for (std::size_t bytes : options.sizes()) {
            const int count = static_cast<int>(bytes / sizeof(float));
            const int block = count / ranks;
            float* s = send.data();
            float* r = recv.data();
            auto raw = [&] {
                if (op == "all_reduce") MPI_Allreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                else if (op == "reduce_scatter") MPI_Reduce_scatter_block(s, r, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                else if (op == "all_gather") MPI_Allgather(s, block, MPI_FLOAT, r, block, MPI_FLOAT, MPI_COMM_WORLD);
                else if (op == "broadcast") MPI_Bcast(s, count, MPI_FLOAT, 0, MPI_COMM_WORLD);
                else if (op == "all_to_all") MPI_Alltoall(s, block, MPI_FLOAT, r, block, MPI_FLOAT, MPI_COMM_WORLD);
            };
            const std::int64_t n = count, b = block, all = std::int64_t{block} * ranks;
            auto ours = [&] {
                if (op == "all_reduce") comm.all_reduce(Tensor::of(s, {n}), Tensor::of(r, {n}), ReduceOp::sum);
                else if (op == "reduce_scatter") comm.reduce_scatter(Tensor::of(s, {all}), Tensor::of(r, {b}), ReduceOp::sum);
                else if (op == "all_gather") comm.all_gather(Tensor::of(s, {b}), Tensor::of(r, {all}));
                else if (op == "broadcast") comm.broadcast(Tensor::of(s, {n}), 0);
                else if (op == "all_to_all") comm.all_to_all(Tensor::of(s, {all}), Tensor::of(r, {all}));
            };
            // Interleaved, so both see the same machine state.
            const double t_raw = time_mpi(MPI_COMM_WORLD, bytes, options.reps, raw);
            const double t_ours = time_mpi(MPI_COMM_WORLD, bytes, options.reps, ours);
            if (rank == 0) {
                std::printf("%s\n", make_row("MPI", op, ranks, bytes, t_raw).format().c_str());
                std::printf("%s\n", make_row("loom::Mpi", op, ranks, bytes, t_ours).format().c_str());
                std::fflush(stdout);
            }
        }
    }
    return 0;
}

// Starts the worker under mpirun and collects its rows.
inline std::vector<Row> run_mpi_worker(const char* self, const Options& options, int ranks) {
    std::string command = std::string(LOOM_BENCH_MPIEXEC) + " -n " + std::to_string(ranks);
    command += " --oversubscribe --bind-to none";  // Open MPI: the bench decides the ranks, not the slots
    if (geteuid() == 0) command += " --allow-run-as-root";
    command += std::string(" ") + self + " --mpi-worker " + options.worker_flags();
    std::vector<Row> rows;
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) {
        std::fprintf(stderr, "collectives: could not start '%s'\n", command.c_str());
        return rows;
    }
    char line[512];
    while (std::fgets(line, sizeof line, pipe) != nullptr) {
        Row row;
        if (Row::parse(line, row)) rows.push_back(row);
        else std::fputs(line, stderr);  // mpirun's own messages
    }
    if (int status = pclose(pipe); status != 0)
        std::fprintf(stderr, "collectives: '%s' exited with status %d\n", command.c_str(), status);
    return rows;
}

}  // namespace loom_bench
