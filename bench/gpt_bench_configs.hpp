// What the GPT training benchmarks (bench_data_parallel, bench_compression)
// share, so that their rows describe the same runs: configs A and B of the
// GPT benchmark (bench/train_gpt.cpp, bench/data_parallel_torch.py) with
// their sequences per rank, the median they report over repetitions, and the
// cores this process may use (its affinity mask, not the machine's count).
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <loom/gpt/model.hpp>

namespace bench {

struct BenchConfig {
    loom::gpt::Config model;
    std::int64_t batch;  // sequences per rank
};

inline const std::map<std::string, BenchConfig>& configs() {
    static const std::map<std::string, BenchConfig> all{
        {"A", {{.layers = 4, .width = 256, .heads = 4, .seq = 128, .vocab = 256}, 8}},
        {"B", {{.layers = 2, .width = 64, .heads = 4, .seq = 64, .vocab = 256}, 4}},
    };
    return all;
}

// The median of the repetitions (0 for none).
inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline int usable_cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace bench
