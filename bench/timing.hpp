// How the CPU benchmarks time a piece of work: the median of several
// repetitions (machines here are noisy; every CPU benchmark reports this one
// median, bench/gpu keeps its own), with an untimed step before each
// (restoring an input the work changes in place), and a compiler barrier that
// keeps timed stores from being optimised away.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

namespace bench {

// The median of the repetitions: the middle one, or the mean of the middle
// two for an even count (0 for none).
inline double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Makes the compiler assume `p`'s memory is read, so timed stores are kept.
inline void keep_memory(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

// The median of `reps` timings of `timed`, in seconds; `before` runs before
// each one, off the clock.
template <class F>
double median_seconds(int reps, F&& timed, const std::function<void()>& before = {}) {
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
        if (before) before();
        const auto t0 = std::chrono::steady_clock::now();
        timed();
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(std::move(times));
}

}  // namespace bench
