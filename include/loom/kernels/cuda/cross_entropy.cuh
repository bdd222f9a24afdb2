// Device mirror of kernels/host/cross_entropy.hpp's fused log-softmax and
// negative log-likelihood, as PyTorch's F.cross_entropy(logits, targets)
// (mean over rows, every target a class): the same functions, arguments
// (device pointers) and error messages, plus the stream to launch on.
//   forward:  logsumexp[r] = max + log(sum_j e^(x_j - max)) per row, written;
//             returns mean_r (logsumexp[r] - logits[r, targets[r]]);
//   backward: dlogits = (softmax - onehot(targets)) * dloss / rows, written,
//             softmax rebuilt as e^(x - logsumexp) from the forward's logsumexp.
// And the vocabulary-parallel pieces (Megatron), on a rank's columns
// [start, start + V) of `classes`, the caller reducing over the group between
// them: cross_entropy_slice_max (the slice's row max, to all-reduce-max),
// cross_entropy_slice_sums (the slice's sum of e^(x - the group's max), and the
// target's logit where the slice holds it, else 0, to all-reduce-sum) and
// cross_entropy_slice_backward (the backward on the slice, from the whole
// row's logsumexp; a target outside the slice has no one-hot term here).
//
// Launch shapes. A row gets a group of threads (a warp when V <= 1024, else a
// 256-thread block) that takes the row's max and then its sum of
// exponentials, each by strided slices combined in a fixed tree of shuffles.
// The per-row losses lse - x[target] are kept in double, as on the host, and
// summed by one thread block in a fixed order: deterministic, no atomics.
//
// Targets. The host checks them before writing anything; here they are on the
// device, so a one-block kernel finds the first row with a target outside
// [0, V) and the kernels after it write nothing when there is one. The
// function then reads that verdict back (a stream synchronisation: the
// forward needs one anyway to return the loss; the backward pays it to fail
// loudly) and throws the host's message. Scratch for the verdict and the row
// losses comes from CUDA's stream-ordered pool on the caller's stream.
//
// The pieces check what the host checks (slice_max and slice_backward: the
// targets against [0, classes), so they wait for the stream like the
// backward; slice_sums checks nothing, as on the host) in the host's order,
// with its words, and write nothing when they throw.
//
// Against the host: the same formulas in f32, with CUDA's expf/logf (within
// 2 ulp) for the host's fast_exp (within 1 ulp, and exactly 0 below e^-87) and
// different summation orders. Expect logsumexp and the loss to agree to a
// relative ~1e-5, and dlogits to a relative ~1e-5 of each value (the exp
// amplifies logsumexp's absolute error into a relative one), not bit equality.
// The slice pieces: the row max and the target's logit bit for bit (a max is
// exact in any order, and the host's NaN rule is kept: its max is NaN exactly
// when the row's first value is NaN, otherwise NaN values are passed over;
// only a max of zeros may keep the other sign, which no e^(x - max) sees);
// the sums of exponentials relative ~1e-5 (plus e^-87 per term, where the
// host's fast_exp flushes to 0 and expf does not); the backward as the whole
// row's, and bit for bit with the device's own whole-row backward (the same
// kernel, element by element, from the same logsumexp).
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "loom/core/check_cuda.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/group_reduce.cuh"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace detail {

// What the device tells the host after a forward or a backward.
struct CrossEntropyReport {
    std::int64_t first_bad_row;  // rows when every target is a class
    double loss_sum;             // sum over rows of lse - x[target] (forward only)
};

// The host's checks on the sizes, word for word (tests compare the messages).
inline void check_cross_entropy_sizes(std::int64_t rows, std::int64_t V) {
    LOOM_CHECK(rows >= 1, "cross_entropy: rows = ", rows, " has nothing to average; pass rows >= 1");
    LOOM_CHECK(V >= 1, "cross_entropy: V = ", V, " has no classes; pass V >= 1");
}

// One block of Threads threads: the first row whose target is outside [0, V)
// (rows if none), and a zero loss sum.
template <int Threads>
__global__ void cross_entropy_check_targets_kernel(const std::int32_t* __restrict__ targets, std::int64_t rows,
                                                   std::int64_t V, CrossEntropyReport* __restrict__ report) {
    __shared__ long long shared[Threads / 32];
    long long first = rows;
    for (std::int64_t r = threadIdx.x; r < rows; r += Threads) {
        const std::int32_t t = targets[r];
        if (t < 0 || t >= V) {
            first = r;  // this thread's rows only grow
            break;
        }
    }
    first = group_reduce<Threads>(first, MinOp{}, shared);
    if (threadIdx.x == 0) {
        report->first_bad_row = first;
        report->loss_sum = 0.0;
    }
}

// visit(j, xr[j]) for the thread's slice of a row, j = lane, lane +
// RowThreads, ... < V, in that order, with the loads of four visits issued
// before the first of them runs. Why: one load in flight a thread kept these
// passes at about half the H200's copy bandwidth (the backward: 2.0 ms for
// the 3.3 GB of GPT-2's vocabulary-wide logits and their gradient, where a
// copy moves it in 0.8 ms); by Little's law four in flight are enough. The
// visits, and so every sum over them, keep their order: the results are the
// one-at-a-time loop's bit for bit.
template <int RowThreads, class Visit>
__device__ inline void for_each_in_slice(const float* xr, std::int64_t V, int lane, Visit visit) {
    constexpr int ahead = 4;
    std::int64_t j = lane;
    for (; j + (ahead - 1) * RowThreads < V; j += ahead * RowThreads) {
        float x[ahead];
#pragma unroll
        for (int u = 0; u < ahead; ++u) x[u] = xr[j + u * RowThreads];
#pragma unroll
        for (int u = 0; u < ahead; ++u) visit(j + u * RowThreads, x[u]);
    }
    for (; j < V; j += RowThreads) visit(j, xr[j]);
}

// The max of a row's V values over its group: each thread's strided slice,
// then the group's fixed tree; fmaxf passes NaN over.
template <int RowThreads>
__device__ inline float row_max_of(const float* xr, std::int64_t V, int lane, float* shared) {
    float m = -INFINITY;
    for_each_in_slice<RowThreads>(xr, V, lane, [&](std::int64_t, float x) { m = fmaxf(m, x); });
    return group_reduce<RowThreads>(m, MaxOp{}, shared);
}

// sum_j e^(x_j - m) over a row's V values, in the same order.
template <int RowThreads>
__device__ inline float row_exp_sum(const float* xr, std::int64_t V, float m, int lane, float* shared) {
    float sum = 0.0f;
    for_each_in_slice<RowThreads>(xr, V, lane, [&](std::int64_t, float x) { sum += expf(x - m); });
    return group_reduce<RowThreads>(sum, SumOp{}, shared);
}

// logsumexp per row, and the row's loss in double. Writes nothing after a bad
// target (the check is uniform over the grid, so no group is split by it).
template <int RowThreads>
__global__ void cross_entropy_logsumexp_kernel(const float* __restrict__ logits,
                                               const std::int32_t* __restrict__ targets,
                                               float* __restrict__ logsumexp, double* __restrict__ row_loss,
                                               const CrossEntropyReport* __restrict__ report, std::int64_t rows,
                                               std::int64_t V) {
    using Group = RowGroup<RowThreads>;
    __shared__ float shared[threads_per_block / 32];
    if (report->first_bad_row < rows) return;
    const int lane = Group::lane();
    for (std::int64_t r = Group::first_row(); r < rows; r += Group::row_stride()) {
        const float* xr = logits + r * V;
        const float row_max = row_max_of<RowThreads>(xr, V, lane, shared);
        const float sum = row_exp_sum<RowThreads>(xr, V, row_max, lane, shared);
        const float lse = row_max + logf(sum);
        if (lane == 0) {
            logsumexp[r] = lse;
            row_loss[r] = static_cast<double>(lse) - static_cast<double>(xr[targets[r]]);
        }
    }
}

// One block of Threads threads: the sum of the row losses in a fixed order.
template <int Threads>
__global__ void cross_entropy_loss_sum_kernel(const double* __restrict__ row_loss, std::int64_t rows,
                                              CrossEntropyReport* __restrict__ report) {
    __shared__ double shared[Threads / 32];
    if (report->first_bad_row < rows) return;
    double sum = 0.0;
    for (std::int64_t r = threadIdx.x; r < rows; r += Threads) sum += row_loss[r];
    sum = group_reduce<Threads>(sum, SumOp{}, shared);
    if (threadIdx.x == 0) report->loss_sum = sum;
}

template <int RowThreads>
__global__ void cross_entropy_backward_kernel(const float* __restrict__ logits,
                                              const std::int32_t* __restrict__ targets,
                                              const float* __restrict__ logsumexp, float scale,
                                              float* __restrict__ dlogits,
                                              const CrossEntropyReport* __restrict__ report,
                                              std::int64_t rows, std::int64_t V, std::int64_t start) {
    using Group = RowGroup<RowThreads>;
    if (report->first_bad_row < rows) return;
    const int lane = Group::lane();
    for (std::int64_t r = Group::first_row(); r < rows; r += Group::row_stride()) {
        const float* xr = logits + r * V;
        float* dr = dlogits + r * V;
        const float lse = logsumexp[r];
        // The target's column in this slice (start = 0: the whole row); no
        // j matches one outside it.
        const std::int64_t t = targets[r] - start;
        // (p - 1) * scale rather than p * scale - scale, as on the host: p - 1
        // is exact for p >= 0.5, so a confident right answer keeps its small gradient.
        for_each_in_slice<RowThreads>(xr, V, lane, [&](std::int64_t j, float x) {
            const float p = expf(x - lse);
            dr[j] = (j == t ? p - 1.0f : p) * scale;
        });
    }
}

// The slice's max per row, written where the targets are all classes: a max
// is exact in any order, and the host's NaN rule (std::max from x[0] on: NaN
// exactly when x[0] is NaN) on top of fmaxf (which passes NaN over).
template <int RowThreads>
__global__ void cross_entropy_slice_max_kernel(const float* __restrict__ logits, float* __restrict__ row_max,
                                               const CrossEntropyReport* __restrict__ report, std::int64_t rows,
                                               std::int64_t V) {
    using Group = RowGroup<RowThreads>;
    __shared__ float shared[threads_per_block / 32];
    if (report->first_bad_row < rows) return;
    const int lane = Group::lane();
    for (std::int64_t r = Group::first_row(); r < rows; r += Group::row_stride()) {
        const float* xr = logits + r * V;
        const float m = row_max_of<RowThreads>(xr, V, lane, shared);
        if (lane == 0) row_max[r] = isnan(xr[0]) ? xr[0] : m;
    }
}

// sums[r] = sum_j e^(x_j - row_max[r]) over the slice, and sums[rows + r] the
// target's logit where the slice holds it, else 0. No checks, as on the host.
template <int RowThreads>
__global__ void cross_entropy_slice_sums_kernel(const float* __restrict__ logits,
                                                const std::int32_t* __restrict__ targets,
                                                const float* __restrict__ row_max, float* __restrict__ sums,
                                                std::int64_t rows, std::int64_t V, std::int64_t start) {
    using Group = RowGroup<RowThreads>;
    __shared__ float shared[threads_per_block / 32];
    const int lane = Group::lane();
    for (std::int64_t r = Group::first_row(); r < rows; r += Group::row_stride()) {
        const float* xr = logits + r * V;
        const float sum = row_exp_sum<RowThreads>(xr, V, row_max[r], lane, shared);
        if (lane == 0) {
            const std::int64_t t = targets[r] - start;
            sums[r] = sum;
            sums[rows + r] = t >= 0 && t < V ? xr[t] : 0.0f;
        }
    }
}

// Stream-ordered device memory for one call: a CrossEntropyReport, then
// `rows` doubles for the row losses. Allocated and freed on the caller's
// stream, so it lives exactly as long as the work queued there uses it.
class CrossEntropyScratch {
public:
    CrossEntropyScratch(std::int64_t row_losses, cudaStream_t stream) : stream_(stream) {
        const auto bytes = sizeof(CrossEntropyReport) + static_cast<std::size_t>(row_losses) * sizeof(double);
        LOOM_CUDA_CHECK(cudaMallocAsync(&memory_, bytes, stream));
    }
    CrossEntropyScratch(const CrossEntropyScratch&) = delete;
    CrossEntropyScratch& operator=(const CrossEntropyScratch&) = delete;
    ~CrossEntropyScratch() { cudaFreeAsync(memory_, stream_); }  // cannot throw; errors surface on the next call

    [[nodiscard]] CrossEntropyReport* report() const { return static_cast<CrossEntropyReport*>(memory_); }
    [[nodiscard]] double* row_losses() const { return reinterpret_cast<double*>(report() + 1); }

    // Queues the check of targets [rows] against [0, classes) on the stream:
    // the report's first bad row (rows if none), and a zero loss sum.
    void check_targets(const std::int32_t* targets, std::int64_t rows, std::int64_t classes) const {
        cross_entropy_check_targets_kernel<threads_per_block>
            <<<1, threads_per_block, 0, stream_>>>(targets, rows, classes, report());
        LOOM_CUDA_CHECK_LAUNCH();
    }

    // Waits for the stream and returns the report.
    [[nodiscard]] CrossEntropyReport read_report() const {
        CrossEntropyReport host{};
        LOOM_CUDA_CHECK(cudaMemcpyAsync(&host, report(), sizeof host, cudaMemcpyDeviceToHost, stream_));
        LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
        return host;
    }

private:
    void* memory_ = nullptr;
    cudaStream_t stream_;
};

// The host's message for the first bad target, which is read from the device.
inline void throw_if_bad_target(const CrossEntropyReport& report, const std::int32_t* targets, std::int64_t rows,
                                std::int64_t V, cudaStream_t stream) {
    const std::int64_t r = report.first_bad_row;
    if (r >= rows) return;
    std::int32_t target = 0;
    LOOM_CUDA_CHECK(cudaMemcpyAsync(&target, targets + r, sizeof target, cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    LOOM_FAIL("cross_entropy: target ", target, " at row ", r, " is outside the classes [0, ", V, ")");
}

// Launches `launch.template operator()<RowThreads>()` with RowThreads = a
// warp per row when a row holds V <= warp_row_limit values, else the whole
// thread block, and checks the launch. The kernel's grid is
// blocks_for(rows * RowThreads).
template <class Launch>
void launch_per_row(std::int64_t V, Launch&& launch) {
    if (V <= warp_row_limit)
        launch.template operator()<32>();
    else
        launch.template operator()<threads_per_block>();
    LOOM_CUDA_CHECK_LAUNCH();
}

// dlogits on columns [start, start + V) of each row (start = 0, V = all:
// the whole row), scaled by dloss / rows, after the report's target check.
inline void launch_backward(const float* logits, const std::int32_t* targets, const float* logsumexp, float dloss,
                            float* dlogits, std::int64_t rows, std::int64_t V, std::int64_t start,
                            const CrossEntropyReport* report, cudaStream_t stream) {
    const float scale = dloss / static_cast<float>(rows);
    launch_per_row(V, [&]<int RowThreads>() {
        cross_entropy_backward_kernel<RowThreads><<<blocks_for(rows * RowThreads), threads_per_block, 0, stream>>>(
            logits, targets, logsumexp, scale, dlogits, report, rows, V, start);
    });
}

}  // namespace detail

// logits: [rows, V]; targets: [rows]; logsumexp: [rows], written; all on the
// device. Returns mean_r (logsumexp[r] - logits[r, targets[r]]), so it waits
// for `stream`. A target outside [0, V) throws, and nothing is written.
[[nodiscard]] inline float cross_entropy_forward(const float* logits, const std::int32_t* targets, float* logsumexp,
                                                 std::int64_t rows, std::int64_t V, cudaStream_t stream = nullptr) {
    detail::check_cross_entropy_sizes(rows, V);
    const detail::CrossEntropyScratch scratch(rows, stream);
    scratch.check_targets(targets, rows, V);
    detail::launch_per_row(V, [&]<int RowThreads>() {
        detail::cross_entropy_logsumexp_kernel<RowThreads>
            <<<blocks_for(rows * RowThreads), threads_per_block, 0, stream>>>(
                logits, targets, logsumexp, scratch.row_losses(), scratch.report(), rows, V);
    });
    detail::cross_entropy_loss_sum_kernel<threads_per_block>
        <<<1, threads_per_block, 0, stream>>>(scratch.row_losses(), rows, scratch.report());
    LOOM_CUDA_CHECK_LAUNCH();
    const detail::CrossEntropyReport report = scratch.read_report();
    detail::throw_if_bad_target(report, targets, rows, V, stream);
    return static_cast<float>(report.loss_sum / static_cast<double>(rows));
}

// dlogits = (softmax(logits) - onehot(targets)) * dloss / rows, written, with
// the logsumexp the forward saved; all on the device. Waits for `stream` to
// report a target outside [0, V), which throws with nothing written.
inline void cross_entropy_backward(const float* logits, const std::int32_t* targets, const float* logsumexp,
                                   float dloss, float* dlogits, std::int64_t rows, std::int64_t V,
                                   cudaStream_t stream = nullptr) {
    detail::check_cross_entropy_sizes(rows, V);
    const detail::CrossEntropyScratch scratch(0, stream);
    scratch.check_targets(targets, rows, V);
    detail::launch_backward(logits, targets, logsumexp, dloss, dlogits, rows, V, 0, scratch.report(), stream);
    detail::throw_if_bad_target(scratch.read_report(), targets, rows, V, stream);
}

// Vocabulary-parallel pieces. logits: [rows, V] on the device, columns
// [start, start + V) of `classes`; targets: [rows] on the device, in
// [0, classes), checked (by slice_max and slice_backward, as on the host).

// row_max[r] = max_j logits[r, j] over this slice, written (all-reduce-max
// it). Waits for `stream` to check the targets; throws the host's words for
// the host's first failed check (rows, classes, a target, then V), writing
// nothing.
inline void cross_entropy_slice_max(const float* logits, const std::int32_t* targets, float* row_max,
                                    std::int64_t rows, std::int64_t V, std::int64_t classes,
                                    cudaStream_t stream = nullptr) {
    detail::check_cross_entropy_sizes(rows, classes);
    const detail::CrossEntropyScratch scratch(0, stream);
    scratch.check_targets(targets, rows, classes);
    if (V >= 1)
        detail::launch_per_row(V, [&]<int RowThreads>() {
            detail::cross_entropy_slice_max_kernel<RowThreads>
                <<<blocks_for(rows * RowThreads), threads_per_block, 0, stream>>>(logits, row_max, scratch.report(),
                                                                                 rows, V);
        });
    detail::throw_if_bad_target(scratch.read_report(), targets, rows, classes, stream);
    LOOM_CHECK(V >= 1, "cross_entropy: V = ", V, " has no classes; pass V >= 1");
}

// With row_max the whole row's max (on the device): sums[r] = sum_j
// e^(logits[r, j] - row_max[r]) over this slice, and sums[rows + r] =
// logits[r, targets[r] - start] where this slice holds the target, else 0;
// written (all-reduce-sum both halves). Checks nothing and does not wait, as
// the host checks nothing here.
inline void cross_entropy_slice_sums(const float* logits, const std::int32_t* targets, const float* row_max,
                                     float* sums, std::int64_t rows, std::int64_t V, std::int64_t start,
                                     cudaStream_t stream = nullptr) {
    if (rows <= 0) return;
    detail::launch_per_row(V, [&]<int RowThreads>() {
        detail::cross_entropy_slice_sums_kernel<RowThreads>
            <<<blocks_for(rows * RowThreads), threads_per_block, 0, stream>>>(logits, targets, row_max, sums, rows, V,
                                                                             start);
    });
}

// dlogits = (softmax(logits) - onehot(targets)) * dloss / rows on this slice,
// written, with the whole row's logsumexp; no communication. Waits for
// `stream` to report a target outside [0, classes), which throws with
// nothing written.
inline void cross_entropy_slice_backward(const float* logits, const std::int32_t* targets, const float* logsumexp,
                                         float dloss, float* dlogits, std::int64_t rows, std::int64_t V,
                                         std::int64_t start, std::int64_t classes, cudaStream_t stream = nullptr) {
    detail::check_cross_entropy_sizes(rows, classes);
    const detail::CrossEntropyScratch scratch(0, stream);
    scratch.check_targets(targets, rows, classes);
    if (V >= 1)
        detail::launch_backward(logits, targets, logsumexp, dloss, dlogits, rows, V, start, scratch.report(), stream);
    detail::throw_if_bad_target(scratch.read_report(), targets, rows, classes, stream);
}

}  // namespace loom::kernels::cuda
