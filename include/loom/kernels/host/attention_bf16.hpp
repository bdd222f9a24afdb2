// Causal multi-head self-attention at MatmulPrecision::bf16
// (kernels/matmul_precision.hpp): the host's exact emulation of a
// tensor-core attention kernel (kernels/cuda/attention_mma.cuh), as
// host::gemm_bf16_inputs is of a bf16 GEMM. Same layouts, arguments and
// messages as kernels/host/attention.hpp; what changes is what each of the
// products reads:
//
//   forward   S = scale * q k^T      q, k rounded to bf16, f32 sums
//             out += P v             P rounded where it is formed, v rounded;
//                                    the softmax's running max and row sums
//                                    use the unrounded scores and P, and the
//                                    max moves in multiples of ln 2
//                                    (bf16_softmax_shift)
//   backward  dP = dO v^T            dO, v rounded
//             dS = P * (dP - D_i)    f32: P recomputed from the rounded q, k;
//                                    D_i = rowsum(dO * out) from the unrounded
//                                    dO and out
//             dV += P^T dO           P rounded, dO rounded
//             dQ += scale * dS k     dS rounded, k rounded
//             dK += scale * dS^T q   dS rounded, q rounded
//
// That is FlashAttention-2's arithmetic in bf16 (its P and dS are formed in
// f32 registers and converted to bf16 for the next mma), and what PyTorch's
// SDPA does under bf16 autocast, except in two places. out, lse and dqkv
// stay f32 here, as the products' outputs do everywhere in loom. And P is
// e^(s - shift) with the shift a multiple of ln 2 at or above the running
// max, not at it, so a row's largest P lies in (1/2, 1] rather than being
// exactly 1 (bf16_softmax_shift says why; the rounding error of each P is
// still at most half a bf16 step). A product of two
// bf16 values is exact in f32, and the shift in multiples of ln 2 makes
// every kernel round P alike up to a power of two whatever its key tiles,
// so a tensor-core kernel equals this up to the order of its sums (and the
// rare bf16 rounding that order moves across a midpoint).
//
// Costs a rounded copy of qkv (forward and backward) and of dout (backward)
// per call: an emulation for tests and reference runs, not a fast path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/gemm.hpp"

namespace loom::kernels::host {

inline void attention_forward_bf16_inputs(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                                          std::int64_t H, std::int64_t D) {
    check_attention_forward_arguments(qkv, out, lse, B, T, H, D);
    if (B == 0 || T == 0) return;
    const std::vector<float> rounded = detail::rounded_to_bf16(qkv, B * T, 3 * H * D, 3 * H * D);
    attention_detail::forward_heads(rounded.data(), out, lse, B, T, H, D, /*round_products=*/true);
}

inline void attention_backward_bf16_inputs(const float* qkv, const float* out, const float* dout, const float* lse,
                                           float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                                           std::int64_t D) {
    check_attention_backward_arguments(qkv, out, dout, lse, dqkv, B, T, H, D);
    if (B == 0 || T == 0) return;
    const std::vector<float> rounded = detail::rounded_to_bf16(qkv, B * T, 3 * H * D, 3 * H * D);
    const std::vector<float> dout_rounded = detail::rounded_to_bf16(dout, B * T, H * D, H * D);
    attention_detail::backward_heads(rounded.data(), out, dout, dout_rounded.data(), lse, dqkv, B, T, H, D);
}

}  // namespace loom::kernels::host
