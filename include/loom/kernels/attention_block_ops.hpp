// The block kernels of sequence-parallel attention (kernels/host/
// attention_blocks.hpp) on a device chosen at run time: the host's for host
// memory, the device backend's entries for a device's (kernels/kernel_table.hpp). Unlike kernels/ops.hpp
// these take pointers with the device named: ring and Ulysses attention
// address blocks inside larger tensors (a run of rows, a head's columns, the
// key half of a packed K/V block), which no Tensor describes. At
// MatmulPrecision::bf16 the forward and backward read bf16 operands
// (kernels/host/attention_blocks_bf16.hpp); the merge has no products.
#pragma once

#include <cstdint>

#include "loom/core/device.hpp"
#include "loom/kernels/kernel_list.hpp"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/attention_blocks_bf16.hpp"
#include "loom/kernels/matmul_precision.hpp"

namespace loom::kernels {

using host::BlockMask;


inline void attention_block_forward(Device where, const float* q, std::int64_t ld_q, const float* k, const float* v,
                                    std::int64_t ld_kv, float* out, float* lse, std::int64_t B, std::int64_t Tq,
                                    std::int64_t Tk, std::int64_t H, std::int64_t D, BlockMask mask,
                                    MatmulPrecision precision = MatmulPrecision::f32) {
    if (precision == MatmulPrecision::bf16)
        run<kernel::attention_block_forward_bf16_inputs>(where, q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask);
    else
        run<kernel::attention_block_forward>(where, q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask);
}

inline void attention_merge(Device where, float* out, float* lse, const float* out_b, const float* lse_b,
                            std::int64_t B, std::int64_t Tq, std::int64_t H, std::int64_t D) {
    run<kernel::attention_merge>(where, out, lse, out_b, lse_b, B, Tq, H, D);
}

inline void attention_block_backward(Device where, const float* q, std::int64_t ld_q, const float* k, const float* v,
                                     std::int64_t ld_kv, const float* out, const float* dout, const float* lse,
                                     float* dq, float* dk, float* dv, std::int64_t B, std::int64_t Tq,
                                     std::int64_t Tk, std::int64_t H, std::int64_t D, BlockMask mask,
                                     MatmulPrecision precision = MatmulPrecision::f32) {
    if (precision == MatmulPrecision::bf16)
        run<kernel::attention_block_backward_bf16_inputs>(where, q, ld_q, k, v, ld_kv, out, dout, lse, dq, dk, dv, B,
                                                          Tq, Tk, H, D, mask);
    else
        run<kernel::attention_block_backward>(where, q, ld_q, k, v, ld_kv, out, dout, lse, dq, dk, dv, B, Tq, Tk, H, D,
                                              mask);
}

}  // namespace loom::kernels
