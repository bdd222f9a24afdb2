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
//
// A third, measure_exchange_seconds, times what a blocking exchange costs
// rank threads that outnumber the cores (the cluster's "wake_us":
// "measure"): the same GEMM loop run by every thread with and without a
// small all-reduce between its rounds, through Shaped as a --cluster run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/comm/links.hpp"
#include "loom/comm/shaped.hpp"
#include "loom/comm/thread_comm.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
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

// CPU seconds of the shared cores one blocking exchange costs a rank thread
// when `threads` rank threads share `cores` cores: each thread runs `rounds`
// rounds of about `round_seconds` of f32 GEMMs (a layer's piece of work
// between two of tensor parallelism's all-reduces), first alone, then each
// round followed by a blocking all-reduce of one float in groups of `group`
// threads. A thread that blocks gives its core away and comes back with
// cold caches after the scheduler's turn; if the cores then idle or rerun
// what was evicted, the second run is longer. The difference in wall time,
// spread over the threads' exchanges as CPU time of the `cores`, is the
// price (plan/step_simulator.hpp charges it per exchange while a pool is
// oversubscribed); never below 0. The median of `repeats` pairs of runs.
[[nodiscard]] inline double measure_exchange_seconds(int threads, double cores, int group = 2, int rounds = 100,
                                                     double round_seconds = 1e-3, int repeats = 3) {
    LOOM_CHECK(threads >= 2, "measure_exchange_seconds: threads = ", threads, "; give 2 or more");
    LOOM_CHECK(cores > 0 && std::isfinite(cores), "measure_exchange_seconds: cores = ", cores, "; give a positive number");
    LOOM_CHECK(group >= 2 && threads % group == 0, "measure_exchange_seconds: group = ", group, " for ", threads,
               " threads; give 2 or more that divides the threads");
    LOOM_CHECK(rounds >= 1 && repeats >= 1, "measure_exchange_seconds: rounds = ", rounds, ", repeats = ", repeats,
               "; give 1 or more of each");
    LOOM_CHECK(round_seconds > 0 && std::isfinite(round_seconds), "measure_exchange_seconds: round_seconds = ",
               round_seconds, "; give a positive number");
    const detail_measure::OneBlasThread one_thread;
    // A 128 x 256 by 256 x 256 product per GEMM: the shapes of a narrow
    // layer's micro-batch, 0.5 MB of operands per thread.
    constexpr std::int64_t m = 128, n = 256;
    const auto gemm_round = [&](std::vector<float>& a, std::vector<float>& b, std::vector<float>& c, int count) {
        for (int i = 0; i < count; ++i)
            kernels::host::gemm(kernels::Trans::no, kernels::Trans::no, m, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                                c.data(), n);
    };
    std::vector<float> a(static_cast<std::size_t>(m * n), 0.5f), b(static_cast<std::size_t>(n * n), 0.25f),
        c(static_cast<std::size_t>(m * n), 0.0f);
    // GEMMs per round, from one thread's speed alone.
    gemm_round(a, b, c, 4);
    const auto start = std::chrono::steady_clock::now();
    gemm_round(a, b, c, 16);
    const double each = std::max(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 16,
                                 1e-9);
    const int per_round = std::max(1, static_cast<int>(round_seconds / each + 0.5));
    const auto timed = [&](bool exchange) {
        const auto t0 = std::chrono::steady_clock::now();
        comm::ThreadWorld(threads).run([&](comm::ThreadComm& world) {
            // Through Shaped with unlimited links, as train_gpt --cluster runs
            // the ranks: each blocking collective is then two asynchronous ones
            // (the arrival times, then the data) that the rank's progress
            // thread runs, one more thread to wake on the taken cores.
            comm::Shaped<comm::ThreadComm> shaped(world.split(0, world.rank()), comm::Links(threads));
            comm::Shaped<comm::ThreadComm> peers = shaped.split(world.rank() / group, world.rank());
            std::vector<float> x(a.size(), 0.5f), w(b.size(), 0.25f), y(c.size(), 0.0f);
            float value = 1.0f;
            const Tensor one = Tensor::of(&value, {1});
            world.barrier();
            for (int r = 0; r < rounds; ++r) {
                gemm_round(x, w, y, per_round);
                if (exchange) peers.all_reduce(one, one, comm::ReduceOp::sum);
            }
            world.barrier();
        });
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    std::vector<double> extra(static_cast<std::size_t>(repeats));
    for (double& e : extra) {
        const double alone = timed(false);
        e = (timed(true) - alone) * cores / (static_cast<double>(threads) * rounds);
    }
    return std::max(0.0, detail_measure::median(std::move(extra)));
}

}  // namespace loom::plan
