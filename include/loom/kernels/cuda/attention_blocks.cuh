// Device mirrors of kernels/host/attention_blocks.hpp, the block kernels of
// ring and Ulysses attention (sequence parallelism): one (query block, key
// block) pair forward with its own lse, the log-sum-exp merge of a block's
// result into the running one, and one pair's gradients added into dq, dk
// and dv. Same arguments and layouts as the host's, plus the stream, and the
// host's size, stride and mask checks (not its null checks); heads of more
// than 128 are refused by name.
//
// These are the plain kernels, written for exactness of bookkeeping rather
// than speed: one thread per query row (forward, dq) or key row (dk, dv) of
// one head, scores recomputed where needed, every sum in a fixed order, so
// the results are deterministic. They run what sequence parallelism needs on a
// GPU; the tiled tensor-core kernels of attention.cuh cover the whole-sequence
// case that dominates a step. Against the host they agree to f32 rounding
// (expf and the order of the dot products differ), within the tolerances
// tests/cuda/test_kernels_attention_blocks.cu states.
//
// The bf16 forms (MatmulPrecision::bf16; attention_block_forward_bf16_inputs
// and attention_block_backward_bf16_inputs) are the same kernels with every
// product's operands rounded to bf16 as they are read (q, k, v, dO, P, dS),
// the forward's shift at bf16_softmax_shift, and sums in f32: the host's
// emulation (kernels/host/attention_blocks_bf16.hpp) up to the order of the
// sums and expf against the host's exp. CUDA cores, not tensor cores: like the f32 forms, they are written
// for exact bookkeeping; they passed their tests on an H200 (docs/cuda.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "loom/core/check_cuda.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/host/attention_blocks.hpp"

namespace loom::kernels::cuda {

using host::BlockMask;

namespace block_detail {

// The largest head a thread keeps in registers (and local memory) here: the
// tiled kernels' limit too (named in the host core, for host-side checks).
inline constexpr std::int64_t max_head = cuda_attention_max_head_size;

// Keys query t of a block sees: all Tk, or 0..t on the causal diagonal.
__device__ inline std::int64_t keys_seen(std::int64_t t, std::int64_t Tk, bool causal) {
    return causal ? t + 1 : Tk;
}

// What a product reads: x itself (f32), or with Round (MatmulPrecision::bf16)
// x rounded to bf16, to nearest with ties to even, as the host emulation
// rounds (kernels/host/attention_blocks_bf16.hpp). A product of two bf16
// values is exact in f32, so only the sums' order differs from the host.
template <bool Round>
__device__ inline float operand(float x) {
    if constexpr (Round)
        return __bfloat162float(__float2bfloat16_rn(x));
    else
        return x;
}

template <bool Round>
__device__ float dot(const float* a, const float* b, std::int64_t D) {
    float sum = 0;
    for (std::int64_t d = 0; d < D; ++d) sum += operand<Round>(a[d]) * operand<Round>(b[d]);
    return sum;
}

// One thread per (b, h, t): two passes over the keys the query sees (the
// max, then the weights and the weighted values), normalised over this
// block. With Round, P is rounded for the product with v; the row sum adds
// the unrounded P, as the host's does.
template <bool Round>
__global__ void block_forward_kernel(const float* __restrict__ q, std::int64_t ld_q, const float* __restrict__ k,
                                     const float* __restrict__ v, std::int64_t ld_kv, float* __restrict__ out,
                                     float* __restrict__ lse, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                                     std::int64_t H, std::int64_t D, bool causal, float scale) {
    const std::int64_t rows = B * H * Tq, C = H * D;
    for (std::int64_t i = grid_index(); i < rows; i += grid_stride()) {
        const std::int64_t t = i % Tq, bh = i / Tq, h = bh % H, b = bh / H;
        const float* qt = q + (b * Tq + t) * ld_q + h * D;
        const float* kb = k + b * Tk * ld_kv + h * D;
        const float* vb = v + b * Tk * ld_kv + h * D;
        const std::int64_t seen = keys_seen(t, Tk, causal);
        float m = -INFINITY;
        for (std::int64_t j = 0; j < seen; ++j) m = fmaxf(m, scale * dot<Round>(qt, kb + j * ld_kv, D));
        if constexpr (Round) m = bf16_softmax_shift(m);  // as the host's bf16 forward shifts
        float acc[max_head];
        for (std::int64_t d = 0; d < D; ++d) acc[d] = 0;
        float l = 0;
        for (std::int64_t j = 0; j < seen; ++j) {
            const float p = expf(scale * dot<Round>(qt, kb + j * ld_kv, D) - m);
            l += p;
            const float p_product = operand<Round>(p);
            for (std::int64_t d = 0; d < D; ++d) acc[d] += p_product * operand<Round>(vb[j * ld_kv + d]);
        }
        float* row = out + (b * Tq + t) * C + h * D;
        for (std::int64_t d = 0; d < D; ++d) row[d] = acc[d] / l;
        lse[bh * Tq + t] = m + logf(l);
    }
}

// One thread per (b, t, h): the host's stable merge, the same formula.
template <class T>
__global__ void merge_kernel(T* __restrict__ out, T* __restrict__ lse, const T* __restrict__ out_b,
                             const T* __restrict__ lse_b, std::int64_t B, std::int64_t Tq, std::int64_t H,
                             std::int64_t D) {
    const std::int64_t rows = B * Tq * H, C = H * D;
    for (std::int64_t i = grid_index(); i < rows; i += grid_stride()) {
        const std::int64_t h = i % H, bt = i / H, t = bt % Tq, b = bt / Tq;
        T* running = lse + (b * H + h) * Tq + t;
        const T block = lse_b[(b * H + h) * Tq + t];
        T* row = out + bt * C + h * D;
        const T* row_b = out_b + bt * C + h * D;
        if (*running == -INFINITY) {
            for (std::int64_t d = 0; d < D; ++d) row[d] = row_b[d];
            *running = block;
            continue;
        }
        const T e = expf(-fabsf(*running - block));
        const T larger = fmaxf(*running, block);
        const T w_larger = 1.0f / (1.0f + e);
        const T w_smaller = e * w_larger;
        const bool running_larger = *running >= block;
        const T w_running = running_larger ? w_larger : w_smaller;
        const T w_block = running_larger ? w_smaller : w_larger;
        for (std::int64_t d = 0; d < D; ++d) row[d] = row[d] * w_running + row_b[d] * w_block;
        *running = larger + log1pf(e);
    }
}

// dS for query t and key j: P (dP - Di), with P from the final lse; the
// products read bf16 operands with Round, Di (the caller's) and dS stay f32.
template <bool Round>
__device__ float score_gradient(const float* qt, const float* kj, const float* vj, const float* dout_t, float lse_t,
                                float Di, std::int64_t D, float scale, float* p_out) {
    const float p = expf(scale * dot<Round>(qt, kj, D) - lse_t);
    *p_out = p;
    return p * (dot<Round>(dout_t, vj, D) - Di);
}

// One thread per (b, h, t): dq_t += scale sum_j dS_tj k_j.
template <bool Round>
__global__ void block_backward_dq_kernel(const float* __restrict__ q, std::int64_t ld_q, const float* __restrict__ k,
                                         const float* __restrict__ v, std::int64_t ld_kv, const float* __restrict__ out,
                                         const float* __restrict__ dout, const float* __restrict__ lse,
                                         float* __restrict__ dq, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                                         std::int64_t H, std::int64_t D, bool causal, float scale) {
    const std::int64_t rows = B * H * Tq, C = H * D;
    for (std::int64_t i = grid_index(); i < rows; i += grid_stride()) {
        const std::int64_t t = i % Tq, bh = i / Tq, h = bh % H, b = bh / H;
        const float* qt = q + (b * Tq + t) * ld_q + h * D;
        const float* ot = out + (b * Tq + t) * C + h * D;
        const float* dout_t = dout + (b * Tq + t) * C + h * D;
        const float* kb = k + b * Tk * ld_kv + h * D;
        const float* vb = v + b * Tk * ld_kv + h * D;
        const float Di = dot<false>(dout_t, ot, D), lse_t = lse[bh * Tq + t];
        float acc[max_head];
        for (std::int64_t d = 0; d < D; ++d) acc[d] = 0;
        for (std::int64_t j = 0; j < keys_seen(t, Tk, causal); ++j) {
            float p;
            const float ds = operand<Round>(
                score_gradient<Round>(qt, kb + j * ld_kv, vb + j * ld_kv, dout_t, lse_t, Di, D, scale, &p));
            for (std::int64_t d = 0; d < D; ++d) acc[d] += ds * operand<Round>(kb[j * ld_kv + d]);
        }
        float* dqt = dq + (b * Tq + t) * ld_q + h * D;
        for (std::int64_t d = 0; d < D; ++d) dqt[d] += scale * acc[d];
    }
}

// One thread per (b, h, j): dk_j += scale sum_t dS_tj q_t, dv_j += sum_t P_tj dout_t.
template <bool Round>
__global__ void block_backward_dkv_kernel(const float* __restrict__ q, std::int64_t ld_q, const float* __restrict__ k,
                                          const float* __restrict__ v, std::int64_t ld_kv,
                                          const float* __restrict__ out, const float* __restrict__ dout,
                                          const float* __restrict__ lse, float* __restrict__ dk,
                                          float* __restrict__ dv, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                                          std::int64_t H, std::int64_t D, bool causal, float scale) {
    const std::int64_t rows = B * H * Tk, C = H * D;
    for (std::int64_t i = grid_index(); i < rows; i += grid_stride()) {
        const std::int64_t j = i % Tk, bh = i / Tk, h = bh % H, b = bh / H;
        const float* kj = k + (b * Tk + j) * ld_kv + h * D;
        const float* vj = v + (b * Tk + j) * ld_kv + h * D;
        float dk_acc[max_head], dv_acc[max_head];
        for (std::int64_t d = 0; d < D; ++d) dk_acc[d] = dv_acc[d] = 0;
        for (std::int64_t t = causal ? j : 0; t < Tq; ++t) {
            const float* qt = q + (b * Tq + t) * ld_q + h * D;
            const float* ot = out + (b * Tq + t) * C + h * D;
            const float* dout_t = dout + (b * Tq + t) * C + h * D;
            float p;
            const float ds = operand<Round>(score_gradient<Round>(qt, kj, vj, dout_t, lse[bh * Tq + t],
                                                                  dot<false>(dout_t, ot, D), D, scale, &p));
            const float p_product = operand<Round>(p);
            for (std::int64_t d = 0; d < D; ++d) {
                dk_acc[d] += ds * operand<Round>(qt[d]);
                dv_acc[d] += p_product * operand<Round>(dout_t[d]);
            }
        }
        float* dkj = dk + (b * Tk + j) * ld_kv + h * D;
        float* dvj = dv + (b * Tk + j) * ld_kv + h * D;
        for (std::int64_t d = 0; d < D; ++d) {
            dkj[d] += scale * dk_acc[d];
            dvj[d] += dv_acc[d];
        }
    }
}

inline void check_head(const char* who, std::int64_t D) {
    LOOM_CHECK(D <= max_head, who, " on the device: head size D = ", D, " is more than the ", max_head,
               " it supports; use D <= ", max_head, " or the host kernel");
}

template <bool Round>
void block_forward(const float* q, std::int64_t ld_q, const float* k, const float* v, std::int64_t ld_kv, float* out,
                   float* lse, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D,
                   BlockMask mask, cudaStream_t stream) {
    host::attention_block_detail::check_block("attention_block_forward", ld_q, ld_kv, B, Tq, Tk, H, D, mask);
    check_head("attention_block_forward", D);
    block_forward_kernel<Round><<<blocks_for(B * H * Tq), threads_per_block, 0, stream>>>(
        q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask == BlockMask::causal, attention_scale(D));
    LOOM_CUDA_CHECK_LAUNCH();
}

template <bool Round>
void block_backward(const float* q, std::int64_t ld_q, const float* k, const float* v, std::int64_t ld_kv,
                    const float* out, const float* dout, const float* lse, float* dq, float* dk, float* dv,
                    std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D, BlockMask mask,
                    cudaStream_t stream) {
    host::attention_block_detail::check_block("attention_block_backward", ld_q, ld_kv, B, Tq, Tk, H, D, mask);
    check_head("attention_block_backward", D);
    const bool causal = mask == BlockMask::causal;
    const float scale = attention_scale(D);
    block_backward_dq_kernel<Round><<<blocks_for(B * H * Tq), threads_per_block, 0, stream>>>(
        q, ld_q, k, v, ld_kv, out, dout, lse, dq, B, Tq, Tk, H, D, causal, scale);
    LOOM_CUDA_CHECK_LAUNCH();
    block_backward_dkv_kernel<Round><<<blocks_for(B * H * Tk), threads_per_block, 0, stream>>>(
        q, ld_q, k, v, ld_kv, out, dout, lse, dk, dv, B, Tq, Tk, H, D, causal, scale);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace block_detail

// The host's attention_block_forward on device pointers (same checks).
inline void attention_block_forward(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                    std::int64_t ld_kv, float* out, float* lse, std::int64_t B, std::int64_t Tq,
                                    std::int64_t Tk, std::int64_t H, std::int64_t D, BlockMask mask,
                                    cudaStream_t stream = nullptr) {
    block_detail::block_forward<false>(q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask, stream);
}

// The host's attention_block_forward_bf16_inputs on device pointers.
inline void attention_block_forward_bf16_inputs(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                                std::int64_t ld_kv, float* out, float* lse, std::int64_t B,
                                                std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D,
                                                BlockMask mask, cudaStream_t stream = nullptr) {
    block_detail::block_forward<true>(q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask, stream);
}

// The host's attention_merge on device pointers.
inline void attention_merge(float* out, float* lse, const float* out_b, const float* lse_b, std::int64_t B,
                            std::int64_t Tq, std::int64_t H, std::int64_t D, cudaStream_t stream = nullptr) {
    host::attention_block_detail::check_heads("attention_merge", B, Tq, H, D);
    block_detail::check_head("attention_merge", D);
    block_detail::merge_kernel<float>
        <<<blocks_for(B * Tq * H), threads_per_block, 0, stream>>>(out, lse, out_b, lse_b, B, Tq, H, D);
    LOOM_CUDA_CHECK_LAUNCH();
}

// The host's attention_block_backward on device pointers: added into dq, dk, dv.
inline void attention_block_backward(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                     std::int64_t ld_kv, const float* out, const float* dout, const float* lse,
                                     float* dq, float* dk, float* dv, std::int64_t B, std::int64_t Tq,
                                     std::int64_t Tk, std::int64_t H, std::int64_t D, BlockMask mask,
                                     cudaStream_t stream = nullptr) {
    block_detail::block_backward<false>(q, ld_q, k, v, ld_kv, out, dout, lse, dq, dk, dv, B, Tq, Tk, H, D, mask,
                                        stream);
}

// The host's attention_block_backward_bf16_inputs on device pointers.
inline void attention_block_backward_bf16_inputs(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                                 std::int64_t ld_kv, const float* out, const float* dout,
                                                 const float* lse, float* dq, float* dk, float* dv, std::int64_t B,
                                                 std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D,
                                                 BlockMask mask, cudaStream_t stream = nullptr) {
    block_detail::block_backward<true>(q, ld_q, k, v, ld_kv, out, dout, lse, dq, dk, dv, B, Tq, Tk, H, D, mask,
                                       stream);
}

}  // namespace loom::kernels::cuda
