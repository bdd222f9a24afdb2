// Device mirror of kernels/host/embedding.hpp, GPT-2's wte/wpe lookup: the
// same functions, arguments (device pointers), checks and messages, plus the
// stream to launch on (the vocabulary-slice functions check their sizes in
// one message where the host's has two).
//   forward:  out[b, t, :] = token_table[tokens[b, t], :] + position_table[t, :], written;
//   backward: dtoken_table[tokens[b, t], :] += dout[b, t, :],
//             dposition_table[t, :] += dout[b, t, :], accumulated.
// Tables are row-major [vocab, C] and [>= T, C]; tokens are [B, T] int32.
//
// Token checks. The host checks every token before it writes anything and
// names the first bad one. Here the tokens are on the device, so two small
// kernels find the first bad flat position (each block the least in its
// slice, then one block the least of those: a minimum, the same in any
// order) together with the largest token, and the function reads that report
// back (one stream synchronisation per call) before it launches anything that
// writes. A bad batch throws the host's message, word for word, and leaves
// every output as it was. The synchronisation is the price of failing loudly
// at the call that got the bad id; after it the work is queued and the
// function returns without waiting.
//
// Backward, deterministic and bit for bit the host's. The host adds the
// contributions to each table row in (b, t) order, one rounding per addition.
// Float addition is not associative, so the device reproduces that order
// instead of racing atomics:
//   * token table: the flat positions p = b * T + t are sorted by token id
//     with CUB's radix sort, which is stable, so the positions of one token
//     stay in increasing p, which is (b, t) order. A stable compaction (CUB's
//     DeviceSelect::If) lists where each run of equal ids starts. Then one
//     thread per (run, channel) loads the table's value, adds the run's rows
//     in order in a register and stores the sum: the host's additions, in
//     the host's order. Rows of ids absent from the batch are not touched.
//     The sort covers only the bits the largest token needs (16 for GPT-2's
//     50257), which the check reports anyway: two radix passes, not four.
//   * position table: one thread per (t, channel) adds dout[b, t, c] for
//     b = 0, 1, ... into the row's value, again the host's order.
// Only additions, so FMA contraction cannot apply; subnormals are kept (loom
// never builds with -ftz). The one difference: where a NaN meets a NaN, x86
// keeps the first operand's payload and the GPU returns its canonical NaN;
// both are NaN. The forward is one addition per element: bit for bit too.
//
// Scratch memory (the check's report, the sort's keys and values, the run
// starts, CUB's temporary storage) comes from CUDA's stream-ordered pool:
// cudaMallocAsync on the caller's stream, cudaFreeAsync on it once the work
// is queued, so it lives exactly as long as the kernels that use it, needs no
// synchronisation of its own, and the caller keeps the host's signature (no
// workspace argument). The pool caches freed blocks, so steady-state training
// does not reach the driver (see core/buffer_cuda.hpp). The backward takes
// about 16 bytes per position (B * T) plus CUB's storage, the forward a few
// kilobytes; a caller-owned workspace can replace this later if profiles ask.
#pragma once

#include <cuda_runtime_api.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "loom/core/check_cuda.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/group_reduce.cuh"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace detail {

// The host's check, word for word (tests compare the messages).
inline void check_embedding_sizes(std::int64_t B, std::int64_t T, std::int64_t C) {
    LOOM_CHECK(B >= 0 && T >= 0 && C >= 0, "embedding: sizes B = ", B, ", T = ", T, ", C = ", C,
               " must all be >= 0");
}

// What the token check tells the host.
struct EmbeddingTokenReport {
    long long first_bad;   // the first flat position b * T + t with a bad id; n when none
    long long max_token;   // the largest id (-1 for no tokens)
    std::int32_t bad_token;  // tokens[first_bad], when there is one
};

// Blocks of the check's first pass: enough to keep the loads in flight, few
// enough that one block combines their results in a handful of steps.
inline constexpr unsigned int embedding_check_max_blocks = 1024;

struct EmbeddingMaxOp {
    __device__ long long operator()(long long a, long long b) const { return a < b ? b : a; }
};

// First pass: each block's first bad position and largest token over its
// grid-stride slice. A token is bad when it is < 0 or >= limit. A thread's
// positions only grow, so the first bad one it meets is its least.
template <int Threads>
__global__ void embedding_check_tokens_kernel(const std::int32_t* __restrict__ tokens, std::int64_t n,
                                              std::int64_t limit, long long* __restrict__ block_first_bad,
                                              long long* __restrict__ block_max_token) {
    __shared__ long long shared[Threads / 32];
    long long first_bad = n, max_token = -1;
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) {
        const std::int32_t token = tokens[i];
        if (first_bad == n && (token < 0 || token >= limit)) first_bad = i;
        max_token = token > max_token ? token : max_token;
    }
    first_bad = group_reduce<Threads>(first_bad, MinOp{}, shared);
    max_token = group_reduce<Threads>(max_token, EmbeddingMaxOp{}, shared);
    if (threadIdx.x == 0) {
        block_first_bad[blockIdx.x] = first_bad;
        block_max_token[blockIdx.x] = max_token;
    }
}

// Second pass, one block: the least and the largest over the blocks, and the
// bad id itself, so the host reads one small struct.
template <int Threads>
__global__ void embedding_check_combine_kernel(const std::int32_t* __restrict__ tokens, std::int64_t n,
                                               const long long* __restrict__ block_first_bad,
                                               const long long* __restrict__ block_max_token, unsigned int blocks,
                                               EmbeddingTokenReport* __restrict__ report) {
    __shared__ long long shared[Threads / 32];
    long long first_bad = n, max_token = -1;
    for (unsigned int b = threadIdx.x; b < blocks; b += Threads) {
        first_bad = block_first_bad[b] < first_bad ? block_first_bad[b] : first_bad;
        max_token = block_max_token[b] > max_token ? block_max_token[b] : max_token;
    }
    first_bad = group_reduce<Threads>(first_bad, MinOp{}, shared);
    max_token = group_reduce<Threads>(max_token, EmbeddingMaxOp{}, shared);
    if (threadIdx.x == 0) {
        report->first_bad = first_bad;
        report->max_token = max_token;
        report->bad_token = first_bad < n ? tokens[first_bad] : 0;
    }
}

// One thread per element of out [B, T, C]: one addition, as on the host.
template <class Float>
__global__ void embedding_forward_kernel(const std::int32_t* __restrict__ tokens, const Float* __restrict__ token_table,
                                         const Float* __restrict__ position_table, Float* __restrict__ out,
                                         std::int64_t T, std::int64_t C, std::int64_t count) {
    for (std::int64_t i = grid_index(); i < count; i += grid_stride()) {
        const std::int64_t row = i / C, c = i - row * C;
        const std::int64_t t = row % T;
        out[i] = token_table[static_cast<std::int64_t>(tokens[row]) * C + c] + position_table[t * C + c];
    }
}

// A vocabulary slice's lookup: the row of an id in [start, stop), zeros for
// the rest (the slices' sum over the tp group is the whole lookup).
template <class Float>
__global__ void embedding_slice_lookup_kernel(const std::int32_t* __restrict__ tokens,
                                              const Float* __restrict__ token_table, Float* __restrict__ out,
                                              std::int64_t C, std::int64_t start, std::int64_t stop,
                                              std::int64_t count) {
    for (std::int64_t i = grid_index(); i < count; i += grid_stride()) {
        const std::int64_t row = i / C, c = i - row * C;
        const std::int64_t id = tokens[row];
        out[i] = id >= start && id < stop ? token_table[(id - start) * C + c] : Float(0);
    }
}

// Positions 0, 1, ..., n - 1: the values the sort carries along with the ids.
template <class Index>
__global__ void embedding_iota_kernel(Index* __restrict__ positions, std::int64_t n) {
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) positions[i] = static_cast<Index>(i);
}

// DeviceSelect::If's predicate over the sorted ids: i starts a run of equal ids.
struct EmbeddingRunStart {
    const std::int32_t* sorted_tokens;
    __device__ bool operator()(std::int32_t i) const { return i == 0 || sorted_tokens[i] != sorted_tokens[i - 1]; }
};

// One thread per (run of equal ids, channel): the table's value plus the
// run's rows in increasing flat position, which is the host's (b, t) order.
// Neighbouring threads take neighbouring channels of one run, so they read
// one dout row together (coalesced) and the position index is a broadcast.
// The grid covers n * C, the most runs * C can be; threads past the runs stop.
// Only ids in [first, stop) have a row here (a vocabulary slice's table
// starts at id `first`); the others' runs are skipped.
template <class Float>
__global__ void embedding_token_grad_kernel(const std::int32_t* __restrict__ run_starts,
                                            const long long* __restrict__ run_count,
                                            const std::int32_t* __restrict__ sorted_tokens,
                                            const std::int32_t* __restrict__ sorted_positions,
                                            const Float* __restrict__ dout, Float* __restrict__ dtoken_table,
                                            std::int64_t n, std::int64_t C, std::int64_t first, std::int64_t stop) {
    const std::int64_t runs = *run_count;
    const std::int64_t count = runs * C;
    for (std::int64_t i = grid_index(); i < count; i += grid_stride()) {
        const std::int64_t r = i / C, c = i - r * C;
        const std::int64_t start = run_starts[r];
        const std::int64_t end = r + 1 < runs ? static_cast<std::int64_t>(run_starts[r + 1]) : n;
        const std::int64_t id = sorted_tokens[start];
        if (id < first || id >= stop) continue;
        Float* row = dtoken_table + (id - first) * C + c;
        Float sum = *row;
        for (std::int64_t s = start; s < end; ++s) sum += dout[static_cast<std::int64_t>(sorted_positions[s]) * C + c];
        *row = sum;
    }
}

// One thread per (t, channel): the row's value plus dout[b, t, c] for
// b = 0, 1, ..., the host's order. dout's rows for one t are T * C apart.
template <class Float>
__global__ void embedding_position_grad_kernel(const Float* __restrict__ dout, Float* __restrict__ dposition_table,
                                               std::int64_t B, std::int64_t T, std::int64_t C) {
    const std::int64_t count = T * C, batch_stride = T * C;
    for (std::int64_t i = grid_index(); i < count; i += grid_stride()) {
        Float sum = dposition_table[i];
        for (std::int64_t b = 0; b < B; ++b) sum += dout[b * batch_stride + i];
        dposition_table[i] = sum;
    }
}

// Device memory for one call from the stream-ordered pool, freed on the
// same stream when the scope ends (after the work that uses it is queued).
class EmbeddingScratch {
public:
    EmbeddingScratch(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
        LOOM_CUDA_CHECK(cudaMallocAsync(&memory_, bytes, stream));
    }
    EmbeddingScratch(const EmbeddingScratch&) = delete;
    EmbeddingScratch& operator=(const EmbeddingScratch&) = delete;
    ~EmbeddingScratch() { cudaFreeAsync(memory_, stream_); }  // cannot throw; errors surface on the next call

    [[nodiscard]] std::byte* bytes() const { return static_cast<std::byte*>(memory_); }

private:
    void* memory_ = nullptr;
    cudaStream_t stream_;
};

// Rounds a byte offset up to 256, CUB's and cudaMalloc's alignment.
[[nodiscard]] constexpr std::size_t embedding_align(std::size_t bytes) noexcept { return (bytes + 255) / 256 * 256; }

// Checks tokens[0, n) against [0, limit) on the device and returns the
// report, waiting for `stream`.
inline EmbeddingTokenReport check_embedding_tokens(const std::int32_t* tokens, std::int64_t n, std::int64_t limit,
                                                   cudaStream_t stream) {
    const unsigned int blocks = std::min(blocks_for(n), embedding_check_max_blocks);
    const std::size_t partials = embedding_align(blocks * sizeof(long long));
    EmbeddingScratch scratch(embedding_align(sizeof(EmbeddingTokenReport)) + 2 * partials, stream);
    auto* report = reinterpret_cast<EmbeddingTokenReport*>(scratch.bytes());
    auto* block_first_bad = reinterpret_cast<long long*>(scratch.bytes() + embedding_align(sizeof(EmbeddingTokenReport)));
    auto* block_max_token = reinterpret_cast<long long*>(reinterpret_cast<std::byte*>(block_first_bad) + partials);
    embedding_check_tokens_kernel<threads_per_block>
        <<<blocks, threads_per_block, 0, stream>>>(tokens, n, limit, block_first_bad, block_max_token);
    LOOM_CUDA_CHECK_LAUNCH();
    embedding_check_combine_kernel<threads_per_block>
        <<<1, threads_per_block, 0, stream>>>(tokens, n, block_first_bad, block_max_token, blocks, report);
    LOOM_CUDA_CHECK_LAUNCH();
    EmbeddingTokenReport host{};
    LOOM_CUDA_CHECK(cudaMemcpyAsync(&host, report, sizeof host, cudaMemcpyDeviceToHost, stream));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return host;
}

}  // namespace detail

// tokens: [B, T] int32; token_table: [vocab, C]; position_table: [>= T, C];
// out: [B, T, C], written; all on the device. Every token is checked before
// anything is written (this waits for `stream`), so a bad batch leaves `out`
// as it was; the error names the first bad id and where it sits.
inline void embedding_forward(const std::int32_t* tokens, const float* token_table, const float* position_table,
                              float* out, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t vocab,
                              cudaStream_t stream = nullptr) {
    detail::check_embedding_sizes(B, T, C);
    LOOM_CHECK(vocab >= 1, "embedding: vocab = ", vocab, " has no tokens; pass vocab >= 1");
    const std::int64_t n = B * T;
    if (n == 0) return;
    const detail::EmbeddingTokenReport report = detail::check_embedding_tokens(tokens, n, vocab, stream);
    if (const std::int64_t i = report.first_bad; i < n)
        LOOM_FAIL("embedding: token id ", report.bad_token, " at batch ", i / T, ", position ", i % T,
                  " is outside the vocabulary [0, ", vocab, ")");
    if (C == 0) return;
    detail::embedding_forward_kernel<float><<<blocks_for(n * C), threads_per_block, 0, stream>>>(
        tokens, token_table, position_table, out, T, C, n * C);
    LOOM_CUDA_CHECK_LAUNCH();
}

// The gradients of a vocabulary slice's lookup: n tokens in sequences of T,
// this table holding ids [start, stop). dtoken_table[tokens[i] - start, :] +=
// dout[i, :] for the slice's ids, dposition_table[i % T, :] += dout[i, :] for
// every row; accumulated, in the host's order (embedding_backward is the
// slice of every id). The ids' signs are checked first, before any write
// (this waits for `stream`). n must fit 32 bits, the positions the sort carries.
inline void embedding_slice_backward(const std::int32_t* tokens, const float* dout, float* dtoken_table,
                                     float* dposition_table, std::int64_t n, std::int64_t T, std::int64_t C,
                                     std::int64_t start, std::int64_t stop, cudaStream_t stream = nullptr) {
    LOOM_CHECK(n >= 0 && T >= 1 && n % T == 0 && C >= 0 && start >= 0 && stop >= start, "embedding backward: ", n,
               " tokens in sequences of T = ", T, ", C = ", C, ", ids [", start, ", ", stop,
               "); n must be a multiple of T >= 1, C >= 0 and the ids a range");
    if (n == 0) return;
    const detail::EmbeddingTokenReport report =
        detail::check_embedding_tokens(tokens, n, std::numeric_limits<std::int64_t>::max(), stream);
    if (const std::int64_t i = report.first_bad; i < n)
        LOOM_FAIL("embedding backward: token id ", report.bad_token, " at batch ", i / T, ", position ", i % T,
                  " is negative; token ids are in [0, vocab)");
    if (C == 0) return;
    LOOM_CHECK(n <= std::numeric_limits<std::int32_t>::max(), "embedding backward on the device: ", n,
               " positions do not fit the 32-bit positions its sort carries");

    // The ids are all >= 0 and <= max_token, so the sort needs their low bits
    // only. (CUB flips the sign bit of signed keys, which is bit 31 of every
    // id here, outside the bits sorted.)
    const int end_bit = std::max(1, static_cast<int>(std::bit_width(static_cast<std::uint64_t>(report.max_token))));
    const auto items = static_cast<std::int32_t>(n);
    const detail::EmbeddingRunStart run_start_query{nullptr};
    std::size_t sort_bytes = 0, select_bytes = 0;
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, tokens, static_cast<std::int32_t*>(nullptr),
                                                    static_cast<const std::int32_t*>(nullptr),
                                                    static_cast<std::int32_t*>(nullptr), items, 0, end_bit, stream));
    LOOM_CUDA_CHECK(cub::DeviceSelect::If(nullptr, select_bytes, static_cast<const std::int32_t*>(nullptr),
                                          static_cast<std::int32_t*>(nullptr), static_cast<long long*>(nullptr), n,
                                          run_start_query, stream));

    // Layout: sorted ids, positions in, positions sorted, run starts (n int32
    // each), the run count, CUB's storage (shared by the sort and the select,
    // which run one after the other on the stream).
    const std::size_t array = detail::embedding_align(static_cast<std::size_t>(n) * sizeof(std::int32_t));
    const std::size_t count_bytes = detail::embedding_align(sizeof(long long));
    const std::size_t temp_bytes = std::max(sort_bytes, select_bytes);
    detail::EmbeddingScratch scratch(4 * array + count_bytes + temp_bytes, stream);
    auto* sorted_tokens = reinterpret_cast<std::int32_t*>(scratch.bytes());
    auto* positions = reinterpret_cast<std::int32_t*>(scratch.bytes() + array);
    auto* sorted_positions = reinterpret_cast<std::int32_t*>(scratch.bytes() + 2 * array);
    auto* run_starts = reinterpret_cast<std::int32_t*>(scratch.bytes() + 3 * array);
    auto* run_count = reinterpret_cast<long long*>(scratch.bytes() + 4 * array);
    void* temp = scratch.bytes() + 4 * array + count_bytes;

    detail::embedding_iota_kernel<std::int32_t><<<blocks_for(n), threads_per_block, 0, stream>>>(positions, n);
    LOOM_CUDA_CHECK_LAUNCH();
    std::size_t bytes = temp_bytes;
    LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, tokens, sorted_tokens, positions, sorted_positions,
                                                    items, 0, end_bit, stream));
    // `positions` still holds 0..n-1 (the sort does not modify its inputs):
    // the select's input, so it writes the indices where runs start.
    bytes = temp_bytes;
    LOOM_CUDA_CHECK(cub::DeviceSelect::If(temp, bytes, positions, run_starts, run_count, n,
                                          detail::EmbeddingRunStart{sorted_tokens}, stream));
    detail::embedding_token_grad_kernel<float><<<blocks_for(n * C), threads_per_block, 0, stream>>>(
        run_starts, run_count, sorted_tokens, sorted_positions, dout, dtoken_table, n, C, start, stop);
    LOOM_CUDA_CHECK_LAUNCH();
    detail::embedding_position_grad_kernel<float>
        <<<blocks_for(T * C), threads_per_block, 0, stream>>>(dout, dposition_table, n / T, T, C);
    LOOM_CUDA_CHECK_LAUNCH();
}

// A vocabulary slice's lookup: out[i, :] = token_table[tokens[i] - start, :]
// for ids in [start, stop), zeros for the rest; n tokens in sequences of T.
// Every id is checked against the whole vocabulary first (this waits for
// `stream`), so every rank throws on the same bad batch with nothing written.
inline void embedding_slice_lookup(const std::int32_t* tokens, const float* token_table, float* out, std::int64_t n,
                                   std::int64_t T, std::int64_t C, std::int64_t start, std::int64_t stop,
                                   std::int64_t whole_vocab, cudaStream_t stream = nullptr) {
    LOOM_CHECK(n >= 0 && T >= 1 && n % T == 0 && C >= 0 && start >= 0 && stop >= start, "embedding: ", n,
               " tokens in sequences of T = ", T, ", C = ", C, ", ids [", start, ", ", stop,
               "); n must be a multiple of T >= 1, C >= 0 and the ids a range");
    if (n == 0) return;
    const detail::EmbeddingTokenReport report = detail::check_embedding_tokens(tokens, n, whole_vocab, stream);
    if (const std::int64_t i = report.first_bad; i < n)
        LOOM_FAIL("embedding: token id ", report.bad_token, " at batch ", i / T, ", position ", i % T,
                  " is outside the vocabulary [0, ", whole_vocab, ")");
    if (C == 0) return;
    detail::embedding_slice_lookup_kernel<float>
        <<<blocks_for(n * C), threads_per_block, 0, stream>>>(tokens, token_table, out, C, start, stop, n * C);
    LOOM_CUDA_CHECK_LAUNCH();
}

// dtoken_table[tokens[b, t], :] += dout[b, t, :];  dposition_table[t, :] += dout[b, t, :].
// Accumulated, so a tied output projection can add its gradient to the same
// table; all on the device. The tokens are those the forward accepted; only
// their sign is checked again here (there is no vocab to check against),
// before any write (this waits for `stream`). Deterministic, and bit for bit
// the host's sums (see the header comment). B * T must fit 32 bits, the
// positions the sort carries.
inline void embedding_backward(const std::int32_t* tokens, const float* dout, float* dtoken_table,
                               float* dposition_table, std::int64_t B, std::int64_t T, std::int64_t C,
                               cudaStream_t stream = nullptr) {
    detail::check_embedding_sizes(B, T, C);
    if (B * T == 0) return;
    embedding_slice_backward(tokens, dout, dtoken_table, dposition_table, B * T, T, C, 0,
                             std::numeric_limits<std::int64_t>::max(), stream);
}

}  // namespace loom::kernels::cuda
