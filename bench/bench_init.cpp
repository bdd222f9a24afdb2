// bench_init: how fast the counter-based RNG fills parameters, against the
// machine's memory bandwidth measured in the same run (memset and memcpy of
// the same bytes). Median of several repetitions; one thread.
//
//   bench_init [--mib N] [--reps R]
#include <loom/core/rng.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "timing.hpp"

using bench::keep_memory;
using bench::median_seconds;

int main(int argc, char** argv) {
    std::size_t mib = 64;
    int reps = 7;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (flag == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
        else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "bench_init: unknown flag %s; flags are --mib N, --reps R\n", argv[i]);
            return 2;
        }
    }
    if (mib < 1 || mib > 16384 || reps < 1 || reps > 1000) {
        std::fprintf(stderr, "bench_init: --mib %zu --reps %d is not valid; use --mib 1..16384 and --reps 1..1000\n",
                     mib, reps);
        return 2;
    }
    const std::size_t n = mib * (1 << 20) / sizeof(float);
    std::vector<float> a(n, 1.0f), b(n, 2.0f);
    const double bytes = static_cast<double>(n * sizeof(float));
    const loom::RngStream rng{42, loom::stream_id("bench")};

    const double t_memset = median_seconds(reps, [&] {
        std::memset(a.data(), reps, n * sizeof(float));
        keep_memory(a.data());
    });
    const double t_memcpy = median_seconds(reps, [&] {
        std::memcpy(b.data(), a.data(), n * sizeof(float));
        keep_memory(b.data());
    });
    const double t_uniform = median_seconds(reps, [&] {
        rng.fill_uniform(a, 0, -1.0f, 1.0f);
        keep_memory(a.data());
    });
    const double t_normal = median_seconds(reps, [&] {
        rng.fill_normal(a, 0, 0.0f, 0.02f);
        keep_memory(a.data());
    });

    const double write_bw = bytes / t_memset;  // write-only peer: what a fill can at best reach
    std::printf("bench_init: %zu MiB of f32, median of %d reps, 1 thread\n", mib, reps);
    std::printf("%-14s %10s %12s %18s\n", "what", "ms", "GB/s", "vs memset (limit)");
    auto row = [&](const char* what, double t) {
        std::printf("%-14s %10.2f %12.2f %17.1f%%\n", what, t * 1e3, bytes / t / 1e9, 100.0 * (bytes / t) / write_bw);
    };
    row("memset", t_memset);
    std::printf("%-14s %10.2f %12.2f %18s\n", "memcpy", t_memcpy * 1e3, 2 * bytes / t_memcpy / 1e9, "(read+write)");
    row("fill_uniform", t_uniform);
    row("fill_normal", t_normal);
    return 0;
}
