// Ring attention's block kernels at MatmulPrecision::bf16: the host's exact
// emulation of kernels/cuda/attention_blocks.cuh's bf16 form, as
// kernels/host/attention_bf16.hpp is of the whole-sequence kernel. Same
// layouts, arguments, checks and messages as kernels/host/attention_blocks.hpp;
// the products read what attention_bf16.hpp's do:
//
//   forward   S = scale * q k^T on bf16 q, k; P rounded to bf16 where it is
//             formed; out += P v on bf16 v (the softmax's max and sums f32)
//   backward  dP = dO v^T on bf16 dO, v; dS = P (dP - D_i) in f32; dV, dQ
//             and dK from bf16 P, dS, dO, q and k
//
// The merge (attention_merge) has no products and stays as it is: f32 out
// and lse, the same weights. A block shifts its P by its own running max,
// not the whole row's, but in multiples of ln 2 (bf16_softmax_shift), so its
// P rounds as the serial kernel's does up to a power of two, which the merge
// removes: a query's result merged over its key blocks is the serial bf16
// attention's to f32 reassociation. The backward's P = exp(S - lse) uses the
// final, merged lse, as the serial backward does.
//
// Costs rounded copies of q, k, v (and dout) per call: an emulation for
// tests and reference runs, not a fast path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/gemm.hpp"

namespace loom::kernels::host {

namespace attention_block_detail {

// q, k and v rounded, each at its caller's strides, which the backward also
// writes the gradients at. Only the first C floats of a row are read, so a
// block inside a wider tensor (q in qkv, v in a packed K/V block) is read
// within its bounds.
struct RoundedBlock {
    std::vector<float> q, k, v;
    RoundedBlock(const float* q_in, std::int64_t ld_q, const float* k_in, const float* v_in, std::int64_t ld_kv,
                 std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t C)
        : q(host::detail::rounded_to_bf16(q_in, B * Tq, C, ld_q, ld_q)),
          k(host::detail::rounded_to_bf16(k_in, B * Tk, C, ld_kv, ld_kv)),
          v(host::detail::rounded_to_bf16(v_in, B * Tk, C, ld_kv, ld_kv)) {}
};

}  // namespace attention_block_detail

// attention_block_forward with bf16 products (arguments as there).
inline void attention_block_forward_bf16_inputs(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                                std::int64_t ld_kv, float* out, float* lse, std::int64_t B,
                                                std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D,
                                                BlockMask mask) {
    namespace detail = attention_block_detail;
    detail::check_forward(q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask);
    const detail::RoundedBlock r(q, ld_q, k, v, ld_kv, B, Tq, Tk, H * D);
    detail::forward_blocks(r.q.data(), ld_q, r.k.data(), r.v.data(), ld_kv, out, lse, B, Tq, Tk, H, D, mask,
                           /*round_products=*/true);
}

// attention_block_backward with bf16 products (arguments as there): the
// gradients are added into dq, dk and dv, in f32.
inline void attention_block_backward_bf16_inputs(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                                 std::int64_t ld_kv, const float* out, const float* dout,
                                                 const float* lse, float* dq, float* dk, float* dv, std::int64_t B,
                                                 std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D,
                                                 BlockMask mask) {
    namespace detail = attention_block_detail;
    detail::check_backward(q, ld_q, k, v, ld_kv, out, dout, lse, dq, dk, dv, B, Tq, Tk, H, D, mask);
    const std::int64_t C = H * D;
    const detail::RoundedBlock r(q, ld_q, k, v, ld_kv, B, Tq, Tk, C);
    const std::vector<float> dout_rounded = host::detail::rounded_to_bf16(dout, B * Tq, C, C);
    detail::backward_blocks(r.q.data(), ld_q, r.k.data(), r.v.data(), ld_kv, out, dout, dout_rounded.data(), lse, dq,
                            dk, dv, B, Tq, Tk, H, D, mask);
}

}  // namespace loom::kernels::host
