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
// otherwise push cuBLASLt to slower kernels. The padding is never read.
//
// Why round per call rather than keep bf16 copies of the weights: the
// rounding pass reads 4 and writes 2 bytes per element, against the 2N flops
// per element of A (2M per element of B) the product then spends, so for the
// shapes of a training step (hundreds or more) it costs a few percent of the
// GEMM; and a
// rounded copy of what the layer was handed (a ZeRO-3 gather, a SUMMA block
// in flight, a tensor-parallel shard) needs no bookkeeping of when the
// weights changed. A persistent bf16 weight copy (AdamW's
// adamw_update_with_bf16_copy writes one in its pass) is the next step if
// profiles show the rounding.
//
// Memory: the scratch holds both rounded operands of the largest product and
// is kept, one per rank thread and device. For GPT-2 124M at 8 x 1024 tokens
// that is the head's gradient product, [8192, 50257] and [50257, 768] in bf16:
// about 0.9 GB per rank thread.
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
// rounds four neighbours per iteration; the columns past the last four go one
// a thread. A template so every translation unit may define it (see
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
        for (std::int64_t c = quad_cols + first; c < cols; c += stride) out_row[c] = to_bf16(row[c]);
    }
}

// Rounds the rows x cols matrix x (row stride ld) into out (row stride
// out_ld) on `stream`. The first version, one element a thread with a 64-bit
// division each, took 12 ms of an 82 ms GPT-2 step on an H200: about 1.5 TB/s
// by our count of its bytes, where a copy moves 4.2.
inline void round_rows_to_bf16(const float* x, std::int64_t ld, std::int64_t rows, std::int64_t cols, bf16* out,
                               std::int64_t out_ld, cudaStream_t stream) {
    const bool x_quads = reinterpret_cast<std::uintptr_t>(x) % 16 == 0 && ld % 4 == 0;
    const bool out_quads = reinterpret_cast<std::uintptr_t>(out) % 8 == 0 && out_ld % 4 == 0;
    if (ld == cols && out_ld == cols && x_quads && out_quads) {
        round_flat_to_bf16_kernel<float>
            <<<blocks_for((rows * cols + 3) / 4), threads_per_block, 0, stream>>>(x, rows * cols, out);
    } else {
        const bool quads = x_quads && out_quads;
        const std::int64_t across = ((quads ? (cols + 3) / 4 : cols) + threads_per_block - 1) / threads_per_block;
        const auto grid_x = static_cast<unsigned int>(std::clamp<std::int64_t>(across, 1, 64));
        const auto grid_y = static_cast<unsigned int>(std::clamp<std::int64_t>(rows, 1, 4096 / grid_x));
        round_rows_to_bf16_kernel<float>
            <<<dim3(grid_x, grid_y), threads_per_block, 0, stream>>>(x, ld, rows, cols, out, out_ld, quads);
    }
    LOOM_CUDA_CHECK_LAUNCH();
}

// The row stride of a rounded operand: its columns, up to a multiple of 8
// bf16 (16 bytes).
[[nodiscard]] constexpr std::int64_t bf16_operand_ld(std::int64_t cols) noexcept { return (cols + 7) / 8 * 8; }

// Bytes of a rounded operand, rounded up so the next one starts on a
// 256-byte boundary (cuBLASLt's preferred alignment).
[[nodiscard]] inline std::size_t bf16_operand_bytes(std::int64_t rows, std::int64_t cols) {
    const std::size_t bytes = static_cast<std::size_t>(rows * bf16_operand_ld(cols)) * sizeof(bf16);
    return (bytes + 255) / 256 * 256;
}

}  // namespace detail

// C[M, N] = alpha * bf16(op(A)) * bf16(op(B)) + beta * C, f32 sums, f32 C; the
// arguments and checks of gemm (kernels/cuda/gemm.cuh), plus the scratch that
// holds the rounded operands. Queued on context.stream(); nothing waits.
inline void gemm_bf16_inputs(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                             const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                             std::int64_t ldc, GemmContext& context, StreamScratch& scratch) {
    detail::check_gemm_arguments(ta, tb, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0 || K == 0 || alpha == 0.0f) {
        // Nothing to round: C = beta * C at most, which gemm does without reading A or B.
        gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, context);
        return;
    }
    const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
    const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
    const std::size_t a_bytes = detail::bf16_operand_bytes(a_rows, a_cols);
    const cudaStream_t stream = context.stream();
    StreamScratchUse use(scratch, stream);
    auto* base = static_cast<std::byte*>(scratch.acquire(a_bytes + detail::bf16_operand_bytes(b_rows, b_cols), stream));
    auto* a16 = reinterpret_cast<bf16*>(base);
    auto* b16 = reinterpret_cast<bf16*>(base + a_bytes);
    const std::int64_t a16_ld = detail::bf16_operand_ld(a_cols), b16_ld = detail::bf16_operand_ld(b_cols);
    detail::round_rows_to_bf16(A, lda, a_rows, a_cols, a16, a16_ld, stream);
    detail::round_rows_to_bf16(B, ldb, b_rows, b_cols, b16, b16_ld, stream);
    gemm(ta, tb, M, N, K, alpha, a16, a16_ld, b16, b16_ld, beta, C, ldc, context);
}

}  // namespace loom::kernels::cuda
