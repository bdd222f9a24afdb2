// Device mirror of kernels/host/gemm.hpp's gemm_bf16_inputs: the f32 product
// at MatmulPrecision::bf16 (kernels/matmul_precision.hpp). Both operands are
// rounded to bf16 into a StreamScratch (packed: row stride = stored columns),
// then cuBLASLt multiplies them on tensor cores with f32 accumulation into the
// f32 C (kernels/cuda/gemm.cuh's bf16 x bf16 -> f32 overload). The rounding is
// loom::to_bf16, the host's function, so the operands are the host's bit for
// bit and the products only differ from the host's emulation in the order
// of the f32 sums.
//
// Why round per call rather than keep bf16 copies of the weights: the
// rounding pass reads 4 and writes 2 bytes per element, against the 2K flops
// per element the product then spends, so for the shapes of a training step
// (K in the hundreds or more) it costs a few percent of the GEMM; and a
// rounded copy of what the layer was handed (a ZeRO-3 gather, a SUMMA block
// in flight, a tensor-parallel shard) needs no bookkeeping of when the
// weights changed. A persistent bf16 weight copy (AdamW's
// adamw_update_with_bf16_copy writes one in its pass) is the next step if
// profiles show the rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/kernels/cuda/gemm.cuh"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/stream_scratch.cuh"

namespace loom::kernels::cuda {

namespace detail {

// out[r * cols + c] = to_bf16(x[r * ld + c]): a strided f32 matrix, packed.
// A template so every translation unit may define it (see elementwise.cuh).
template <class T>
__global__ void round_rows_to_bf16_kernel(const T* __restrict__ x, std::int64_t ld, std::int64_t rows,
                                          std::int64_t cols, bf16* __restrict__ out) {
    const std::int64_t n = rows * cols;
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) {
        const std::int64_t r = i / cols, c = i - r * cols;
        out[i] = to_bf16(x[r * ld + c]);
    }
}

// Bytes of a packed bf16 matrix, rounded up so the next one starts on a
// 256-byte boundary (cuBLASLt's preferred alignment).
[[nodiscard]] inline std::size_t bf16_operand_bytes(std::int64_t rows, std::int64_t cols) {
    const std::size_t bytes = static_cast<std::size_t>(rows * cols) * sizeof(bf16);
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
    detail::round_rows_to_bf16_kernel<float>
        <<<blocks_for(a_rows * a_cols), threads_per_block, 0, stream>>>(A, lda, a_rows, a_cols, a16);
    LOOM_CUDA_CHECK_LAUNCH();
    detail::round_rows_to_bf16_kernel<float>
        <<<blocks_for(b_rows * b_cols), threads_per_block, 0, stream>>>(B, ldb, b_rows, b_cols, b16);
    LOOM_CUDA_CHECK_LAUNCH();
    gemm(ta, tb, M, N, K, alpha, a16, a_cols, b16, b_cols, beta, C, ldc, context);
}

}  // namespace loom::kernels::cuda
