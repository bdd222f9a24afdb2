// Device mirror of kernels/host/top_k.hpp, top-k sparsification for gradient
// compression on the GPU: the k elements of largest magnitude as (index,
// value) pairs packed in 32-bit words, and their scatter back. The same
// functions and arguments (device pointers; the host's std::vector scratch
// becomes a TopKScratch), the same checks and messages, plus the stream.
//
// The words are the host's, bit for bit: k indices in increasing order, then
// the k values' float bits in the same order (top_k_words(k) = 2k words, the
// host's own function). So a message packed on either side unpacks on the
// other, and every rank selects the same elements whichever side packed.
//
// How the device picks exactly the host's set. The host's rule: magnitudes are
// compared as the bits of |x| with NaN mapped to +Inf's (0x7f800000; NaN and
// Inf tie, -0 and +0 tie); the k-th largest magnitude is the threshold; every
// element above it is taken, and of those equal to it the first k - above in
// index order. The device follows the same steps, each exact:
//   1. mags[i] = min(bits(x[i]) & 0x7fffffff, 0x7f800000), the host's key;
//   2. CUB's radix sort, descending, of the mags (31 bits: 4 passes); the
//      threshold is sorted[k - 1], the k-th largest of the multiset, which is
//      one number however the sort orders equal keys;
//   3. above = the first position of the threshold in the sorted mags (a
//      binary search by one thread), ties = k - above;
//   4. rank[i] = the number of j < i with mags[j] == threshold (an exclusive
//      scan of 0/1 flags: integers, exact);
//   5. CUB's DeviceSelect::If over the indices 0..n-1 keeps i when
//      mags[i] > threshold, or mags[i] == threshold and rank[i] < ties; the
//      compaction is stable, so it writes exactly the host's k indices in
//      increasing order straight into words[0, k);
//   6. words[k + j] = bits(x[words[j]]), and residual[words[j]] = 0.
// No floating-point arithmetic touches a value on the way, so NaN payloads
// and signs travel unchanged, as on the host. Sorting 32-bit magnitudes and
// cutting at a threshold costs about a quarter of sorting 64-bit (magnitude,
// index) keys; a radix select would avoid the sort's writes and is the next
// step if top-k shows in profiles.
//
// Scratch. pack_top_k needs about 8 bytes per element plus CUB's storage. The
// host keeps its magnitudes in a caller-owned vector so a step allocates
// nothing; TopKScratch (a StreamScratch, kernels/cuda/stream_scratch.cuh) is
// the device's equivalent: memory from the stream-ordered pool that grows to
// the largest call and is then reused, safely across streams. One scratch
// serves one call at a time (as the host's vector does); give concurrent
// streams a scratch each to let them overlap.
//
// unpack_top_k_add: out[index] += weight * value, with __fmul_rn and
// __fadd_rn (nvcc would otherwise contract them into an FMA, and the host,
// built for baseline x86-64, rounds twice), so the result is bit for bit the
// host's. The indices are checked first: a one-pass reduction reports the
// first index outside [0, n) and whether the indices strictly increase, and
// the function reads that back (a stream synchronisation) before writing. An
// index outside [0, n) throws the host's message, with nothing written (the
// host has applied the pairs before the bad one; here none are). Strictly
// increasing indices (every message pack_top_k writes) are distinct, so one
// thread per pair updates its own element. Anything else (a message with a
// repeated index) is applied by one thread in pair order, the host's exact
// sequence of updates, rather than racing.
#pragma once

#include <cuda_runtime_api.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "loom/core/check_cuda.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/group_reduce.cuh"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/stream_scratch.cuh"
#include "loom/kernels/host/top_k.hpp"

namespace loom::kernels::cuda {

// The wire format and the count are shared with the host, so are their functions.
using host::top_k_count;
using host::top_k_words;

// pack_top_k's scratch is a StreamScratch (kernels/cuda/stream_scratch.cuh):
// the host's `scratch` vector on the device. Create one per stream of packing
// (a compressor's member, say).
using TopKScratch = StreamScratch;

namespace detail {

// The host's magnitude key: |x|'s bits, NaN counted as Inf.
inline constexpr std::uint32_t top_k_inf_bits = 0x7f80'0000u;

// What step 3 finds: the threshold magnitude and how many elements equal to
// it are taken.
struct TopKThreshold {
    std::uint32_t magnitude;
    std::uint32_t ties;
};

// Rounds a byte offset up to 256, CUB's and cudaMalloc's alignment.
[[nodiscard]] constexpr std::size_t top_k_align(std::size_t bytes) noexcept { return (bytes + 255) / 256 * 256; }

template <class Word>
__global__ void top_k_magnitude_kernel(const float* __restrict__ x, std::int64_t n, Word* __restrict__ mags) {
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) {
        const Word bits = __float_as_uint(x[i]) & 0x7fff'ffffu;
        mags[i] = bits > top_k_inf_bits ? top_k_inf_bits : bits;
    }
}

// One thread: the k-th largest magnitude of the descending `sorted`, and how
// many of the k it makes up (k minus those strictly above it, found by a
// binary search: sorted[j] > threshold exactly for j < above).
template <class Word>
__global__ void top_k_threshold_kernel(const Word* __restrict__ sorted, std::int64_t k,
                                       TopKThreshold* __restrict__ threshold) {
    const Word magnitude = sorted[k - 1];
    std::int64_t lo = 0, hi = k - 1;
    while (lo < hi) {
        const std::int64_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] > magnitude)
            lo = mid + 1;
        else
            hi = mid;
    }
    threshold->magnitude = magnitude;
    threshold->ties = static_cast<std::uint32_t>(k - lo);
}

template <class Word>
__global__ void top_k_tie_flags_kernel(const Word* __restrict__ mags, std::int64_t n,
                                       const TopKThreshold* __restrict__ threshold, Word* __restrict__ flags) {
    const Word magnitude = threshold->magnitude;
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) flags[i] = mags[i] == magnitude ? 1u : 0u;
}

// DeviceSelect::If's predicate over the indices: the host's rule.
struct TopKPick {
    const std::uint32_t* mags;
    const std::uint32_t* tie_ranks;
    const TopKThreshold* threshold;
    __device__ bool operator()(std::uint32_t i) const {
        const std::uint32_t m = mags[i];
        return m > threshold->magnitude || (m == threshold->magnitude && tie_ranks[i] < threshold->ties);
    }
};

// words[k + j] = x[words[j]]'s bits, and the residual's selected elements 0.
// x and residual are not __restrict__: the residual may be x itself.
template <class Word>
__global__ void top_k_values_kernel(const float* x, std::int64_t k, Word* __restrict__ words, float* residual) {
    for (std::int64_t j = grid_index(); j < k; j += grid_stride()) {
        const Word i = words[j];
        words[k + j] = __float_as_uint(x[i]);
        if (residual != nullptr) residual[i] = 0.0f;  // may be x itself: this thread read x[i] already
    }
}

// What unpack's check tells the host.
struct TopKUnpackReport {
    long long first_bad;        // the first pair whose index is >= n; k when none
    long long first_unordered;  // the first pair j >= 1 with index <= the previous one; k when none
    long long bad_index;        // the index of pair first_bad
};

inline constexpr unsigned int top_k_check_max_blocks = 1024;

// First pass: each block's least bad pair and least out-of-order pair.
template <int Threads, class Word>
__global__ void top_k_check_indices_kernel(const Word* __restrict__ words, std::int64_t k, std::int64_t n,
                                           long long* __restrict__ block_first_bad,
                                           long long* __restrict__ block_first_unordered) {
    __shared__ long long shared[Threads / 32];
    long long first_bad = k, first_unordered = k;
    for (std::int64_t j = grid_index(); j < k; j += grid_stride()) {
        const Word index = words[j];
        if (first_bad == k && static_cast<std::int64_t>(index) >= n) first_bad = j;
        if (first_unordered == k && j > 0 && index <= words[j - 1]) first_unordered = j;
    }
    first_bad = group_reduce<Threads>(first_bad, MinOp{}, shared);
    first_unordered = group_reduce<Threads>(first_unordered, MinOp{}, shared);
    if (threadIdx.x == 0) {
        block_first_bad[blockIdx.x] = first_bad;
        block_first_unordered[blockIdx.x] = first_unordered;
    }
}

// Second pass, one block: the least over the blocks, and the bad index.
template <int Threads, class Word>
__global__ void top_k_check_combine_kernel(const Word* __restrict__ words, std::int64_t k,
                                           const long long* __restrict__ block_first_bad,
                                           const long long* __restrict__ block_first_unordered, unsigned int blocks,
                                           TopKUnpackReport* __restrict__ report) {
    __shared__ long long shared[Threads / 32];
    long long first_bad = k, first_unordered = k;
    for (unsigned int b = threadIdx.x; b < blocks; b += Threads) {
        first_bad = block_first_bad[b] < first_bad ? block_first_bad[b] : first_bad;
        first_unordered = block_first_unordered[b] < first_unordered ? block_first_unordered[b] : first_unordered;
    }
    first_bad = group_reduce<Threads>(first_bad, MinOp{}, shared);
    first_unordered = group_reduce<Threads>(first_unordered, MinOp{}, shared);
    if (threadIdx.x == 0) {
        report->first_bad = first_bad;
        report->first_unordered = first_unordered;
        report->bad_index = first_bad < k ? static_cast<long long>(words[first_bad]) : 0;
    }
}

// out[words[j]] += weight * value_j, rounded twice as on the host. Launched
// over a grid when the indices are distinct, else as one thread, which then
// walks j = 0, 1, ... in the host's order.
template <class Word>
__global__ void top_k_scatter_kernel(const Word* __restrict__ words, std::int64_t k, float* __restrict__ out,
                                     float weight) {
    for (std::int64_t j = grid_index(); j < k; j += grid_stride()) {
        const Word i = words[j];
        out[i] = __fadd_rn(out[i], __fmul_rn(weight, __uint_as_float(words[k + j])));
    }
}

// Device memory for one unpack check, from the stream-ordered pool, freed on
// the same stream when the scope ends.
class TopKCheckScratch {
public:
    TopKCheckScratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
        LOOM_CUDA_CHECK(cudaMallocAsync(&memory_, bytes, stream));
    }
    TopKCheckScratch(const TopKCheckScratch&) = delete;
    TopKCheckScratch& operator=(const TopKCheckScratch&) = delete;
    ~TopKCheckScratch() { cudaFreeAsync(memory_, stream_); }  // cannot throw; errors surface on the next call

    [[nodiscard]] std::byte* bytes() const { return static_cast<std::byte*>(memory_); }

private:
    void* memory_ = nullptr;
    cudaStream_t stream_;
};

}  // namespace detail

// Selects the k largest |x[i]| of x[0, n) into words (top_k_words(k) words:
// k indices, then k values, in increasing index order); with `residual`, it
// gets x with the selected elements zeroed (what was not sent; it may be x
// itself). All on the device; queued on `stream`, nothing waits. Ties go to
// the lower index and NaN counts as the largest magnitude (tied with Inf):
// the host's selection exactly, so the words equal the host's bit for bit.
inline void pack_top_k(const float* x, std::int64_t n, std::int64_t k, std::uint32_t* words, TopKScratch& scratch,
                       float* residual = nullptr, cudaStream_t stream = nullptr) {
    LOOM_CHECK(k >= 0 && k <= n, "pack_top_k: k = ", k, " of ", n, " values; it must be in 0..", n);
    LOOM_CHECK(n <= std::numeric_limits<std::int32_t>::max(), "pack_top_k: ", n, " values do not fit 32-bit indices");
    if (residual != nullptr && residual != x && n > 0)
        LOOM_CUDA_CHECK(cudaMemcpyAsync(residual, x, static_cast<std::size_t>(n) * sizeof(float),
                                        cudaMemcpyDeviceToDevice, stream));
    if (k == 0) return;

    using Word = std::uint32_t;
    const auto items = static_cast<std::int32_t>(n);
    const thrust::counting_iterator<Word> indices(0);
    std::size_t sort_bytes = 0, scan_bytes = 0, select_bytes = 0;
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(nullptr, sort_bytes, static_cast<const Word*>(nullptr),
                                                             static_cast<Word*>(nullptr), items, 0, 31, stream));
    LOOM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<Word*>(nullptr), items, stream));
    LOOM_CUDA_CHECK(cub::DeviceSelect::If(nullptr, select_bytes, indices, words, static_cast<long long*>(nullptr), n,
                                          detail::TopKPick{nullptr, nullptr, nullptr}, stream));

    // Layout: the magnitudes, a second array (sorted magnitudes, then the tie
    // flags and their ranks), the threshold, the selected count, CUB's storage
    // (shared by the sort, the scan and the select, which run in turn).
    const std::size_t array = detail::top_k_align(static_cast<std::size_t>(n) * sizeof(Word));
    const std::size_t threshold_bytes = detail::top_k_align(sizeof(detail::TopKThreshold));
    const std::size_t count_bytes = detail::top_k_align(sizeof(long long));
    const std::size_t temp_bytes = std::max({sort_bytes, scan_bytes, select_bytes});
    // However the call ends, the scratch is not reused or freed under the work it queued.
    StreamScratchUse use(scratch, stream);
    auto* base = static_cast<std::byte*>(scratch.acquire(2 * array + threshold_bytes + count_bytes + temp_bytes, stream));
    auto* mags = reinterpret_cast<Word*>(base);
    auto* work = reinterpret_cast<Word*>(base + array);
    auto* threshold = reinterpret_cast<detail::TopKThreshold*>(base + 2 * array);
    auto* selected = reinterpret_cast<long long*>(base + 2 * array + threshold_bytes);
    void* temp = base + 2 * array + threshold_bytes + count_bytes;

    detail::top_k_magnitude_kernel<Word><<<blocks_for(n), threads_per_block, 0, stream>>>(x, n, mags);
    LOOM_CUDA_CHECK_LAUNCH();
    std::size_t bytes = temp_bytes;
    // Magnitudes are at most 0x7f800000: 31 bits.
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortKeysDescending(temp, bytes, mags, work, items, 0, 31, stream));
    detail::top_k_threshold_kernel<Word><<<1, 1, 0, stream>>>(work, k, threshold);
    LOOM_CUDA_CHECK_LAUNCH();
    detail::top_k_tie_flags_kernel<Word><<<blocks_for(n), threads_per_block, 0, stream>>>(mags, n, threshold, work);
    LOOM_CUDA_CHECK_LAUNCH();
    bytes = temp_bytes;
    LOOM_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, work, items, stream));
    bytes = temp_bytes;
    LOOM_CUDA_CHECK(cub::DeviceSelect::If(temp, bytes, indices, words, selected, n,
                                          detail::TopKPick{mags, work, threshold}, stream));
    detail::top_k_values_kernel<Word><<<blocks_for(k), threads_per_block, 0, stream>>>(x, k, words, residual);
    LOOM_CUDA_CHECK_LAUNCH();
}

// out[index] += weight * value for each of the k pairs (out of n elements),
// all on the device; an index outside [0, n) is a corrupted message and
// refused with the host's message, before anything is written. Waits for
// `stream` (the check is read back).
inline void unpack_top_k_add(const std::uint32_t* words, std::int64_t k, std::int64_t n, float* out,
                             float weight = 1.0f, cudaStream_t stream = nullptr) {
    if (k <= 0) return;
    using Word = std::uint32_t;
    const unsigned int blocks = std::min(blocks_for(k), detail::top_k_check_max_blocks);
    const std::size_t report_bytes = detail::top_k_align(sizeof(detail::TopKUnpackReport));
    const std::size_t partials = detail::top_k_align(blocks * sizeof(long long));
    detail::TopKCheckScratch scratch(report_bytes + 2 * partials, stream);
    auto* report = reinterpret_cast<detail::TopKUnpackReport*>(scratch.bytes());
    auto* block_first_bad = reinterpret_cast<long long*>(scratch.bytes() + report_bytes);
    auto* block_first_unordered = reinterpret_cast<long long*>(scratch.bytes() + report_bytes + partials);
    detail::top_k_check_indices_kernel<threads_per_block, Word>
        <<<blocks, threads_per_block, 0, stream>>>(words, k, n, block_first_bad, block_first_unordered);
    LOOM_CUDA_CHECK_LAUNCH();
    detail::top_k_check_combine_kernel<threads_per_block, Word>
        <<<1, threads_per_block, 0, stream>>>(words, k, block_first_bad, block_first_unordered, blocks, report);
    LOOM_CUDA_CHECK_LAUNCH();
    detail::TopKUnpackReport host_report{};
    LOOM_CUDA_CHECK(cudaMemcpyAsync(&host_report, report, sizeof host_report, cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    LOOM_CHECK(host_report.first_bad == k, "top-k: index ", static_cast<std::int64_t>(host_report.bad_index),
               " received for a chunk of ", n, " values");
    if (host_report.first_unordered == k)
        detail::top_k_scatter_kernel<Word><<<blocks_for(k), threads_per_block, 0, stream>>>(words, k, out, weight);
    else
        detail::top_k_scatter_kernel<Word><<<1, 1, 0, stream>>>(words, k, out, weight);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
