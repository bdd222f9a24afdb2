// Device mirror of kernels/host/gemm.hpp's gemm_bf16_inputs: the f32 product
// at MatmulPrecision::bf16 (kernels/matmul_precision.hpp). Both operands are
// rounded to bf16 into a StreamScratch, then cuBLASLt multiplies them with
// f32 accumulation into the f32 C (kernels/cuda/gemm.cuh's bf16 x bf16 -> f32
// overload). The rounding is loom::to_bf16, the host's function, so the
// operands are the host's bit for bit; the sums run in cuBLASLt's order (and
// tensor cores may truncate partial sums rather than round them), which the
// tests bound as for the bf16 GEMM itself.
//
// Each rounded operand's rows start 16 bytes apart at least (its row stride
// is the stored columns rounded up to 8): tensor-core kernels want 16-byte
// aligned rows, and an odd width such as GPT-2's vocabulary of 50257 would
// otherwise push cuBLASLt to slower kernels. Padding along K is zeros, which
// the product reads (see padded_to_8); padding along N, M or a row's end only
// reaches results that are thrown away.
//
// Why round per call rather than keep bf16 copies of the weights: a rounded
// copy of what the layer was handed (a ZeRO-3 gather, a SUMMA block in flight,
// a tensor-parallel shard) needs no bookkeeping of when the weights changed.
// The price is a pass that reads 4 and writes 2 bytes per element of each
// operand. It was expected to cost a few percent of the products; on an H200
// a GPT-2 step's roundings took 6.4 ms beside 10.4 ms of products (the
// activations' and gradients' share as well as the weights'). A persistent
// bf16 weight copy (AdamW's adamw_update_with_bf16_copy writes one in its
// pass) and bf16 activations are the next steps.
//
// Memory: the scratch holds both rounded operands of the largest product (and
// its f32 C where N or M is padded) and is kept, one per rank thread and device. For
// GPT-2 124M at 8 x 1024 tokens the largest is the head's forward, its logits
// [8192, 50264] in f32 beside x and W in bf16: about 1.75 GB per rank thread.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "loom/core/dtype.hpp"
#include "loom/kernels/cuda/gemm.cuh"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/stream_scratch.cuh"

namespace loom::kernels::cuda {

namespace detail {

// to_bf16 of four floats, packed as they lie in memory: one 8-byte store.
__device__ inline uint2 rounded_quad(float4 v) {
    const bf16 rounded[4] = {to_bf16(v.x), to_bf16(v.y), to_bf16(v.z), to_bf16(v.w)};
    uint2 packed;
    static_assert(sizeof rounded == sizeof packed);
    memcpy(&packed, rounded, sizeof packed);
    return packed;
}

// out[i] = to_bf16(x[i]) for n / 4 * 4 elements four at a time, the rest one
// a thread: the rounding of a contiguous operand (ld = out_ld = cols), most of
// a training step's, as one flat pass. x is 16-byte aligned, out 8-byte.
template <class T>
__global__ void round_flat_to_bf16_kernel(const T* __restrict__ x, std::int64_t n, bf16* __restrict__ out) {
    const auto* x4 = reinterpret_cast<const float4*>(x);
    auto* out4 = reinterpret_cast<uint2*>(out);
    for (std::int64_t i = grid_index(); i < n / 4; i += grid_stride()) out4[i] = rounded_quad(x4[i]);
    for (std::int64_t i = n / 4 * 4 + grid_index(); i < n; i += grid_stride()) out[i] = to_bf16(x[i]);
}

// out[r * out_ld + c] = to_bf16(x[r * ld + c]) for the rows x cols live
// elements of a strided f32 matrix (a sub-matrix, or rows padded to out_ld).
// Rows go by blockIdx.y, capped so that each block loops over several rows;
// with `quads` (x 16-byte aligned, ld a multiple of 4, out_ld of 4) a thread
// rounds four neighbours per iteration; otherwise (the vocabulary-wide
// gradient of GPT-2's head: ld = 50257) one column at a time, the loads of
// four columns issued before the first is rounded, since one load in flight a
// thread leaves the memory bus half idle (1.04 ms a call on an H200, where a
// copy of its bytes takes 0.6). The columns past the last four go one a
// thread. A template so every translation unit may define it (see
// elementwise.cuh).
template <class T>
__global__ void round_rows_to_bf16_kernel(const T* __restrict__ x, std::int64_t ld, std::int64_t rows,
                                          std::int64_t cols, bf16* __restrict__ out, std::int64_t out_ld, bool quads) {
    const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    const std::int64_t quad_cols = quads ? cols / 4 * 4 : 0;
    for (std::int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const T* row = x + r * ld;
        bf16* out_row = out + r * out_ld;
        for (std::int64_t c = 4 * first; c < quad_cols; c += 4 * stride)
            *reinterpret_cast<uint2*>(out_row + c) = rounded_quad(*reinterpret_cast<const float4*>(row + c));
        std::int64_t c = quad_cols + first;
        for (; c + 3 * stride < cols; c += 4 * stride) {
            T v[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) v[u] = row[c + u * stride];
#pragma unroll
            for (int u = 0; u < 4; ++u) out_row[c + u * stride] = to_bf16(v[u]);
        }
        for (; c < cols; c += stride) out_row[c] = to_bf16(row[c]);
    }
}

// How round_rows_to_bf16 covers a rows x cols matrix: one flat pass where
// both sides are contiguous and aligned, else round_rows_to_bf16_kernel on
// a grid of grid_x blocks across a row (four columns a thread: four
// neighbours with `quads`, else four strided ones loaded together) and
// grid_y down the rows, 4096 blocks at most.
struct RoundingLaunch {
    bool flat;
    bool quads;
    unsigned int grid_x, grid_y;
};

[[nodiscard]] inline RoundingLaunch rounding_launch(const float* x, std::int64_t ld, std::int64_t rows,
                                                    std::int64_t cols, const bf16* out, std::int64_t out_ld) {
    const bool x_quads = reinterpret_cast<std::uintptr_t>(x) % 16 == 0 && ld % 4 == 0;
    const bool out_quads = reinterpret_cast<std::uintptr_t>(out) % 8 == 0 && out_ld % 4 == 0;
    if (ld == cols && out_ld == cols && x_quads && out_quads) return {true, true, blocks_for((rows * cols + 3) / 4), 1};
    const std::int64_t across = ((cols + 3) / 4 + threads_per_block - 1) / threads_per_block;
    const auto grid_x = static_cast<unsigned int>(std::clamp<std::int64_t>(across, 1, 64));
    const auto grid_y = static_cast<unsigned int>(std::clamp<std::int64_t>(rows, 1, 4096 / grid_x));
    return {false, x_quads && out_quads, grid_x, grid_y};
}

// Rounds the rows x cols matrix x (row stride ld) into out (row stride
// out_ld) on `stream`. The first version, one element a thread with a 64-bit
// division each, took 12 ms of an 82 ms GPT-2 step on an H200: about 1.5 TB/s
// by our count of its bytes, where a copy moves 4.2.
inline void round_rows_to_bf16(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t cols, bf16* out,
                               std::int64_t out_ld, cudaStream_t stream) {
    const RoundingLaunch launch = rounding_launch(x, ld, rows, cols, out, out_ld);
    if (launch.flat)
        round_flat_to_bf16_kernel<float><<<launch.grid_x, threads_per_block, 0, stream>>>(x, rows * cols, out);
    else
        round_rows_to_bf16_kernel<float><<<dim3(launch.grid_x, launch.grid_y), threads_per_block, 0, stream>>>(
            x, ld, rows, cols, out, out_ld, launch.quads);
    LOOM_CUDA_CHECK_LAUNCH();
}

// The row stride of a rounded operand: its columns, up to a multiple of 8
// bf16 (16 bytes).
[[nodiscard]] constexpr std::int64_t bf16_operand_ld(std::int64_t cols) noexcept { return (cols + 7) / 8 * 8; }

// A product's N, K and M, up to a multiple of 8. cuBLASLt picks a slow
// kernel when one is not, however the rows are aligned: on an H200, GPT-2's
// head (vocabulary 50257) took 5.6 ms (y = x W), 4.6 ms (dW) and 6.4 ms (dX)
// a product, and 1.06, 0.76 and 0.84 ms with N or K padded to 50264; with M
// (cuBLASLt's n) left odd, the head's dW still ran on an sm80 cutlass kernel
// in 1.31 ms, and in 0.83 ms with M padded too.
[[nodiscard]] constexpr std::int64_t padded_to_8(std::int64_t n) noexcept { return (n + 7) / 8 * 8; }

// Bytes rounded up so that what follows starts on a 256-byte boundary
// (cuBLASLt's preferred alignment).
[[nodiscard]] constexpr std::size_t whole_256(std::size_t bytes) noexcept { return (bytes + 255) / 256 * 256; }

// Bytes of a rounded operand of rows x cols, rows bf16_operand_ld(cols) apart.
[[nodiscard]] constexpr std::size_t bf16_operand_bytes(std::int64_t rows, std::int64_t cols) noexcept {
    return whole_256(static_cast<std::size_t>(rows * bf16_operand_ld(cols)) * sizeof(bf16));
}

// Zeros in a rounded operand's padding: the columns [cols, padded_cols) of its
// live rows, and the rows [rows, padded_rows) up to padded_cols.
inline void zero_padding(bf16* out, std::int64_t out_ld, std::int64_t rows, std::int64_t cols,
                         std::int64_t padded_rows, std::int64_t padded_cols, cudaStream_t stream) {
    const auto bytes = [](std::int64_t elements) { return static_cast<std::size_t>(elements) * sizeof(bf16); };
    if (padded_cols > cols && rows > 0)
        LOOM_CUDA_CHECK(cudaMemset2DAsync(out + cols, bytes(out_ld), 0, bytes(padded_cols - cols),
                                          static_cast<std::size_t>(rows), stream));
    if (padded_rows > rows)
        LOOM_CUDA_CHECK(cudaMemset2DAsync(out + rows * out_ld, bytes(out_ld), 0, bytes(padded_cols),
                                          static_cast<std::size_t>(padded_rows - rows), stream));
}

// Rounds the live rows x cols of x into out, zero-padded to padded_rows x
// padded_cols, rows bf16_operand_ld(padded_cols) apart; returns that stride.
inline std::int64_t rounded_operand(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t cols,
                                    std::int64_t padded_rows, std::int64_t padded_cols, bf16* out,
                                    cudaStream_t stream) {
    const std::int64_t out_ld = bf16_operand_ld(padded_cols);
    round_rows_to_bf16(x, ld, rows, cols, out, out_ld, stream);
    zero_padding(out, out_ld, rows, cols, padded_rows, padded_cols, stream);
    return out_ld;
}

}  // namespace detail

namespace detail {

// gemm_bf16_inputs, or with `bias` (beta 0) gemm_bias_bf16_inputs; each
// product goes to gemm_lt (gemm.cuh), which takes the bias, or none, itself.
inline void gemm_bf16_inputs_lt(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                                const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                                float* C, std::int64_t ldc, GemmContext& context, StreamScratch& scratch,
                                const float* bias) {
    check_gemm_arguments(ta, tb, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0 || K == 0 || alpha == 0.0f) {
        // Nothing to round: C = beta * C, or the bias rows, written without reading A or B.
        gemm_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, context, bias);
        return;
    }
    const std::int64_t padded_K = padded_to_8(K), padded_N = padded_to_8(N), padded_M = padded_to_8(M);
    const bool a_plain = ta == Trans::no, b_plain = tb == Trans::no;
    // Stored shapes: A is [M, K] or [K, M], B [K, N] or [N, K]; live, then padded.
    const std::int64_t a_rows = a_plain ? M : K, a_cols = a_plain ? K : M;
    const std::int64_t b_rows = b_plain ? K : N, b_cols = b_plain ? N : K;
    const std::int64_t a_padded_rows = a_plain ? padded_M : padded_K, a_padded_cols = a_plain ? padded_K : padded_M;
    const std::int64_t b_padded_rows = b_plain ? padded_K : padded_N, b_padded_cols = b_plain ? padded_N : padded_K;
    const bool c_through_scratch = padded_N != N || padded_M != M;
    const std::size_t a_bytes = bf16_operand_bytes(a_padded_rows, a_padded_cols);
    const std::size_t b_bytes = bf16_operand_bytes(b_padded_rows, b_padded_cols);
    const std::size_t c_bytes =
        c_through_scratch ? whole_256(static_cast<std::size_t>(padded_M * padded_N) * sizeof(float)) : 0;
    // A bias of the padded N for a C of the padded N: zeros past N.
    const std::size_t bias_bytes =
        c_through_scratch && bias != nullptr ? whole_256(static_cast<std::size_t>(padded_N) * sizeof(float)) : 0;
    const cudaStream_t stream = context.stream();
    StreamScratchUse use(scratch, stream);
    auto* base = static_cast<std::byte*>(scratch.acquire(a_bytes + b_bytes + c_bytes + bias_bytes, stream));
    auto* a16 = reinterpret_cast<bf16*>(base);
    auto* b16 = reinterpret_cast<bf16*>(base + a_bytes);
    const std::int64_t a16_ld = rounded_operand(A, lda, a_rows, a_cols, a_padded_rows, a_padded_cols, a16, stream);
    const std::int64_t b16_ld = rounded_operand(B, ldb, b_rows, b_cols, b_padded_rows, b_padded_cols, b16, stream);
    if (!c_through_scratch) {
        gemm_lt(ta, tb, M, N, padded_K, alpha, a16, a16_ld, b16, b16_ld, beta, C, ldc, context, bias);
        return;
    }
    auto* c32 = reinterpret_cast<float*>(base + a_bytes + b_bytes);
    const std::size_t row_bytes = static_cast<std::size_t>(N) * sizeof(float);
    const std::size_t c_pitch = static_cast<std::size_t>(ldc) * sizeof(float);
    const std::size_t scratch_pitch = static_cast<std::size_t>(padded_N) * sizeof(float);
    float* padded_bias = nullptr;
    if (bias != nullptr) {  // C is written, not read
        padded_bias = reinterpret_cast<float*>(base + a_bytes + b_bytes + c_bytes);
        LOOM_CUDA_CHECK(cudaMemcpyAsync(padded_bias, bias, row_bytes, cudaMemcpyDeviceToDevice, stream));
        LOOM_CUDA_CHECK(cudaMemsetAsync(padded_bias + N, 0, scratch_pitch - row_bytes, stream));
    } else if (beta != 0.0f) {
        LOOM_CUDA_CHECK(cudaMemcpy2DAsync(c32, scratch_pitch, C, c_pitch, row_bytes, static_cast<std::size_t>(M),
                                          cudaMemcpyDeviceToDevice, stream));
    }
    gemm_lt(ta, tb, padded_M, padded_N, padded_K, alpha, a16, a16_ld, b16, b16_ld, beta, c32, padded_N, context,
            padded_bias);
    LOOM_CUDA_CHECK(cudaMemcpy2DAsync(C, c_pitch, c32, scratch_pitch, row_bytes, static_cast<std::size_t>(M),
                                      cudaMemcpyDeviceToDevice, stream));
}

}  // namespace detail

// C[M, N] = alpha * bf16(op(A)) * bf16(op(B)) + beta * C, f32 sums, f32 C; the
// arguments and checks of gemm (kernels/cuda/gemm.cuh), plus the scratch that
// holds the rounded operands. Queued on context.stream(); nothing waits.
// K, N and M go to cuBLASLt padded to multiples of 8 (detail::padded_to_8): K
// with zeros in both rounded operands, which add nothing to any sum; N or M,
// where either was not one already, through an f32 C in the scratch of the
// padded shape, filled from C first when beta reads it and copied back to C's
// M x N after, so that nothing past them is written. (cuBLASLt's n is our M:
// GPT-2's head gradient dW, M = 50257, ran on its cutlass fallback in 1.3 ms.)
inline void gemm_bf16_inputs(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                             const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                             std::int64_t ldc, GemmContext& context, StreamScratch& scratch) {
    detail::gemm_bf16_inputs_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, context, scratch, nullptr);
}

// C[M, N] = alpha * bf16(op(A)) * bf16(op(B)) + bias on every row (bias[N],
// f32, not rounded: the host adds it in f32 too), in the product's epilogue
// (gemm.cuh's gemm_bias); C is written, not read.
inline void gemm_bias_bf16_inputs(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                                  const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                                  const float* bias, float* C, std::int64_t ldc, GemmContext& context,
                                  StreamScratch& scratch) {
    LOOM_CHECK(bias != nullptr || M == 0 || N == 0, "gemm_bias: the bias is null; pass N = ", N, " floats");
    detail::gemm_bf16_inputs_lt(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc, context, scratch, bias);
}

}  // namespace loom::kernels::cuda
