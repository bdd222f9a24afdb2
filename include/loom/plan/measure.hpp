// Micro-benchmarks of this machine, for a cluster file that says "measure"
// instead of quoting a datasheet (plan/cluster_json.hpp): the speed of one
// rank thread's GEMM and the memory bandwidth one thread draws. One thread
// each, because a local "device" is one rank thread with one BLAS thread; how
// many of them the cores can run at once is the cluster's `shared_cores`.
//
// Both take a fraction of a second, print nothing, and report the median of
// `repeats` timed runs after an untimed warm-up, so one descheduled run does
// not set the number. Call them before starting rank threads: the BLAS's
// thread count is process-wide while the GEMM is measured.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/host/gemm.hpp"

namespace loom::plan {

namespace detail_measure {

[[nodiscard]] inline double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Sets the BLAS to one thread for its lifetime and restores the count it
// found, also when the measurement throws.
class OneBlasThread {
public:
    OneBlasThread() : before_(kernels::host::blas_threads()) { kernels::host::set_blas_threads(1); }
    ~OneBlasThread() { kernels::host::set_blas_threads(before_ >= 1 ? before_ : 1); }
    OneBlasThread(const OneBlasThread&) = delete;
    OneBlasThread& operator=(const OneBlasThread&) = delete;

private:
    int before_;
};

}  // namespace detail_measure

// FLOP/s of one thread's square f32 GEMM (2 n^3 flops per n x n x n
// product) through kernels::host::gemm, the kernel every layer runs on.
[[nodiscard]] inline double measure_gemm_flops(std::int64_t n = 512, int repeats = 5) {
    LOOM_CHECK(n >= 1, "measure_gemm_flops: n = ", n, "; give a matrix side of 1 or more");
    LOOM_CHECK(repeats >= 1, "measure_gemm_flops: repeats = ", repeats, "; give 1 or more");
    const detail_measure::OneBlasThread one_thread;
    return kernels::host::measure_sgemm_gflops(n, repeats) * 1e9;
}

// Bytes/s one thread moves through memory running a[i] = b[i] + s * c[i]
// over `floats` elements (the STREAM triad: two arrays read, one written,
// counted as 3 x 4 bytes per element). The default 64 MiB per array is far
// beyond any cache, so this is the memory's rate, not the cache's.
[[nodiscard]] inline double measure_memory_bandwidth(std::int64_t floats = std::int64_t{1} << 24, int repeats = 5) {
    LOOM_CHECK(floats >= 1, "measure_memory_bandwidth: floats = ", floats, "; give 1 or more elements");
    LOOM_CHECK(repeats >= 1, "measure_memory_bandwidth: repeats = ", repeats, "; give 1 or more");
    const auto n = static_cast<std::size_t>(floats);
    // Filled before timing so first-touch page faults stay out of the runs.
    std::vector<float> a(n, 0.0f), b(n, 1.0f), c(n, 2.0f);
    const float s = 0.5f;
    volatile float sink = 0.0f;  // reads the result, so the stores are not optimised away
    auto triad = [&] {
        float* out = a.data();
        const float* x = b.data();
        const float* y = c.data();
        for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + s * y[i];
        sink = sink + out[n / 2];
    };
    triad();  // warm-up
    std::vector<double> seconds(static_cast<std::size_t>(repeats));
    for (double& took : seconds) {
        const auto start = std::chrono::steady_clock::now();
        triad();
        took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    // A clock too coarse for a tiny array could read 0: take one tick instead.
    const double median = std::max(detail_measure::median(std::move(seconds)), 1e-9);
    return 3.0 * sizeof(float) * static_cast<double>(n) / median;
}

}  // namespace loom::plan
