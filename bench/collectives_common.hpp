// Shared by the collectives benchmark's parent and its MPI worker: options,
// one result row in nccl-tests units, and the ratios the issue asks for.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "timing.hpp"

namespace loom_bench {

using bench::median;

inline const std::vector<std::string>& all_ops() {
    static const std::vector<std::string> ops{"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"};
    return ops;
}

// nccl-tests' bus bandwidth factor: what each rank's link must carry.
inline double busbw_factor(const std::string& op, int ranks) {
    const double n = ranks;
    if (op == "all_reduce") return 2.0 * (n - 1) / n;
    if (op == "broadcast") return 1.0;
    return (n - 1) / n;
}

// Enough iterations that one timed repetition lasts about 20 ms or more.
inline int iterations_for(std::size_t bytes) {
    return static_cast<int>(std::clamp<std::size_t>((std::size_t{64} << 20) / std::max<std::size_t>(bytes, 1), 1, 2000));
}

struct Row {
    std::string backend, op;
    int ranks = 0;
    std::size_t bytes = 0;
    double seconds = 0, algbw = 0, busbw = 0;

    static std::string header() {
        return "# backend        op              ranks        bytes     time_us  algbw_GB/s  busbw_GB/s";
    }
    [[nodiscard]] std::string format() const {
        char line[200];
        std::snprintf(line, sizeof line, "%-16s %-15s %5d %12zu %11.1f %11.2f %11.2f", backend.c_str(), op.c_str(),
                      ranks, bytes, seconds * 1e6, algbw, busbw);
        return line;
    }
    // Reads back a line written by format() (the MPI worker's output).
    static bool parse(const std::string& line, Row& row) {
        if (line.empty() || line[0] == '#') return false;
        std::istringstream in(line);
        double time_us = 0;
        if (!(in >> row.backend >> row.op >> row.ranks >> row.bytes >> time_us >> row.algbw >> row.busbw)) return false;
        row.seconds = time_us / 1e6;
        return true;
    }
};

inline Row make_row(std::string backend, std::string op, int ranks, std::size_t bytes, double seconds) {
    Row row{std::move(backend), std::move(op), ranks, bytes, seconds, 0, 0};
    row.algbw = static_cast<double>(bytes) / seconds / 1e9;
    row.busbw = row.algbw * busbw_factor(row.op, ranks);
    return row;
}

struct Options {
    std::vector<int> ranks{2};
    std::vector<std::string> ops = all_ops();
    std::size_t min_bytes = 4096, max_bytes = std::size_t{256} << 20;
    int reps = 5;
    bool mpi = true;

    [[nodiscard]] std::vector<std::size_t> sizes() const {
        std::vector<std::size_t> out;
        for (std::size_t b = min_bytes; b <= max_bytes; b *= 4) out.push_back(b);
        return out;
    }

    // The flags the parent passes on to its MPI worker.
    [[nodiscard]] std::string worker_flags() const {
        std::string ops_list;
        for (const auto& op : ops) ops_list += (ops_list.empty() ? "" : ",") + op;
        return "--ops " + ops_list + " --min-bytes " + std::to_string(min_bytes) + " --max-bytes " +
               std::to_string(max_bytes) + " --reps " + std::to_string(reps);
    }

    bool parse(int argc, char** argv, int first = 1) {
        auto fail = [](const std::string& what) {
            std::fprintf(stderr,
                         "collectives: %s; flags are --ranks 2,4  --ops %s  --min-bytes N  --max-bytes N  --reps R  "
                         "--no-mpi\n",
                         what.c_str(), "all_reduce,reduce_scatter,all_gather,broadcast,all_to_all");
            return false;
        };
        auto split = [](std::string_view text) {
            std::vector<std::string> parts;
            std::stringstream in{std::string(text)};
            for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
            return parts;
        };
        for (int i = first; i < argc; ++i) {
            const std::string_view flag = argv[i];
            if (flag == "--no-mpi") {
                mpi = false;
                continue;
            }
            if (i + 1 >= argc) return fail("flag " + std::string(flag) + " needs a value");
            const std::string value = argv[++i];
            if (flag == "--ranks") {
                ranks.clear();
                for (const auto& r : split(value)) {
                    const int n = std::atoi(r.c_str());
                    if (n < 1 || n > 64) return fail("--ranks " + r + " is not in 1..64");
                    ranks.push_back(n);
                }
            } else if (flag == "--ops") {
                ops = split(value);
                for (const auto& op : ops)
                    if (std::find(all_ops().begin(), all_ops().end(), op) == all_ops().end())
                        return fail("--ops " + op + " is not an operation");
            } else if (flag == "--min-bytes") {
                min_bytes = std::strtoull(value.c_str(), nullptr, 10);
            } else if (flag == "--max-bytes") {
                max_bytes = std::strtoull(value.c_str(), nullptr, 10);
            } else if (flag == "--reps") {
                reps = std::atoi(value.c_str());
            } else {
                return fail("unknown flag " + std::string(flag));
            }
        }
        if (min_bytes < 256 || min_bytes > max_bytes || max_bytes > (std::size_t{4} << 30))
            return fail("--min-bytes " + std::to_string(min_bytes) + " --max-bytes " + std::to_string(max_bytes) +
                        " must satisfy 256 <= min <= max <= 4 GiB");
        if (reps < 1 || reps > 1000) return fail("--reps " + std::to_string(reps) + " is not in 1..1000");
        return true;
    }
};

// Bytes a shared-memory implementation must read plus write for one op, over
// all ranks, with S the full array: every rank reads S and writes S for
// all_reduce, all_gather and all_to_all; reduce_scatter writes only its block;
// broadcast leaves the root idle.
inline double bytes_moved(const std::string& op, int ranks, double bytes) {
    const double n = ranks;
    if (op == "reduce_scatter") return n * bytes + bytes;
    if (op == "broadcast") return 2 * (n - 1) * bytes;
    return 2 * n * bytes;
}

// The figures: ThreadWorld's all_reduce busbw against MPI_Allreduce,
// loom's Mpi backend against raw MPI, and the fraction of the machine's
// memory-copy limit: the time memcpy on all cores needs to move the op's
// bytes, over the op's time (above 100% means the data sat in the caches).
inline void print_ratios(const std::vector<Row>& rows, double copy_limit_gbps) {
    auto find = [&](std::string_view backend, const Row& like) -> const Row* {
        for (const Row& r : rows)
            if (r.backend == backend && r.op == like.op && r.ranks == like.ranks && r.bytes == like.bytes) return &r;
        return nullptr;
    };
    std::printf("# ratios (busbw over busbw, same op, ranks and bytes, same run)\n");
    for (const Row& row : rows) {
        if (row.backend != "ThreadWorld" && row.backend != "loom::Mpi") continue;
        const Row* peer = find("MPI", row);
        if (peer == nullptr) continue;
        std::printf("%-12s %-15s %2d ranks %10zu B: %6.2f x MPI (%.2f vs %.2f GB/s)", row.backend.c_str(),
                    row.op.c_str(), row.ranks, row.bytes, row.busbw / peer->busbw, row.busbw, peer->busbw);
        if (row.backend == "ThreadWorld") {
            // memcpy moves 2 bytes (one read, one write) per byte copied.
            const double floor_seconds = bytes_moved(row.op, row.ranks, static_cast<double>(row.bytes)) / (2 * copy_limit_gbps * 1e9);
            std::printf(", %.0f%% of the memory-copy limit", 100 * floor_seconds / row.seconds);
        }
        std::printf("\n");
    }
}

}  // namespace loom_bench
