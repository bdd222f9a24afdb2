// One AdamW step over n elements with the step's scalars, computed once by
// the optimiser (optim/adamw.hpp): the update of torch.optim.AdamW, bit for
// bit. A kernel of the table (kernels/kernel_list.hpp); optim/adamw.cuh is
// its device form.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loom/kernels/host/gemm_threads.hpp"

#if defined(__SSE__) || defined(__AVX__)
#include <immintrin.h>
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace loom::kernels::host {

// The per-step scalars of one AdamW step, computed in double and rounded to
// float once, the way PyTorch hands Python floats to its f32 kernels.
struct AdamWScalars {
    float decay;                  // 1 - lr * weight_decay
    float beta1, one_minus_beta1;
    float beta2, one_minus_beta2;
    float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
    float eps;
    float neg_step_size;          // -lr / (1 - beta1^t)
};

// Square roots of one block of 16 floats in vector instructions. std::sqrt
// does not vectorise unless the whole program is built with -fno-math-errno:
// GCC keeps a libm call for negative inputs (to set errno), and a call is
// control flow the vectoriser refuses. These instructions compute the same
// correctly rounded IEEE square root, so the bits equal std::sqrt's.
inline void sqrt_block16(const float* in, float* out) {
#if defined(__AVX__)
    for (int k = 0; k < 16; k += 8) _mm256_storeu_ps(out + k, _mm256_sqrt_ps(_mm256_loadu_ps(in + k)));
#elif defined(__SSE__)
    for (int k = 0; k < 16; k += 4) _mm_storeu_ps(out + k, _mm_sqrt_ps(_mm_loadu_ps(in + k)));
#elif defined(__ARM_NEON) && defined(__aarch64__)
    for (int k = 0; k < 16; k += 4) vst1q_f32(out + k, vsqrtq_f32(vld1q_f32(in + k)));
#else
    for (int k = 0; k < 16; ++k) out[k] = std::sqrt(in[k]);
#endif
}

inline constexpr std::size_t adamw_block = 16;

// `blocks` blocks of 16 elements, in the order of PyTorch's
// _single_tensor_adamw: decoupled decay p *= 1 - lr wd;
// m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g g;
// p += -step_size * m / (sqrt(v) / sqrt(bc2) + eps), with divisions rather
// than reciprocal multiplies so the rounding matches PyTorch's.
// __restrict: the arrays do not overlap (adamw_step checked), so the compiler
// needs no runtime alias checks. Loops of 16 have a constant trip count, which
// GCC vectorises even at -O2 (its cheap cost model refuses unknown counts).
// noinline on purpose: the tail of an arena goes through this same machine
// code on a zero-padded block, so every element gets the same instructions
// wherever it sits. Separately inlined copies may be compiled differently
// (with FMA, GCC contracted p * decay + update in one copy and not in the
// other), and then a shard's update would not equal the whole arena's bit for
// bit.
[[gnu::noinline]] inline void adamw_blocks(float* __restrict params, const float* __restrict grads,
                                           float* __restrict m, float* __restrict v, std::size_t blocks,
                                           const AdamWScalars s) {  // by value: in registers
    for (std::size_t base = 0; base < blocks * adamw_block; base += adamw_block) {
        float* __restrict p = params + base;
        const float* __restrict g = grads + base;
        float* __restrict mb = m + base;
        float* __restrict vb = v + base;
        for (std::size_t i = 0; i < adamw_block; ++i) {
            p[i] *= s.decay;
            mb[i] = s.beta1 * mb[i] + s.one_minus_beta1 * g[i];
            vb[i] = s.beta2 * vb[i] + s.one_minus_beta2 * g[i] * g[i];
        }
        float root[adamw_block];
        sqrt_block16(vb, root);
        // Without this, GCC -O3 unrolls the loop completely before the
        // vectoriser sees it and then vectorises only part of it. (nvcc's
        // front end does not know the pragma and would warn, which loom's
        // -Werror turns into an error for any .cu including this header.)
#if !defined(__CUDACC__)
#pragma GCC unroll 1
#endif
        for (std::size_t i = 0; i < adamw_block; ++i) {
            const float denom = root[i] / s.bias_correction2_sqrt + s.eps;
            p[i] += s.neg_step_size * mb[i] / denom;
        }
    }
}

// The whole update, one pass: full blocks in place, then the last n % 16
// elements through the same code on a block padded with zeros (g = m = v = 0
// there, which gives denom = eps and an update of exactly 0).
inline void adamw_update(float* params, const float* grads, float* m, float* v, std::int64_t count,
                         const AdamWScalars& s) {
    const auto n = static_cast<std::size_t>(count);
    const std::size_t blocks = n / adamw_block;
    const std::size_t done = blocks * adamw_block;
    // Blocks are independent and run the same machine code wherever they sit:
    // a rank with GEMM threads updates ranges of them side by side (at least
    // 16 K elements each, below which a second thread does not pay).
    run_in_ranges(static_cast<std::int64_t>(blocks), [&](std::int64_t first, std::int64_t end) {
        const std::size_t at = static_cast<std::size_t>(first) * adamw_block;
        adamw_blocks(params + at, grads + at, m + at, v + at, static_cast<std::size_t>(end - first), s);
    }, std::int64_t{1024});
    const std::size_t rest = n - done;
    if (rest == 0) return;
    alignas(64) float p[adamw_block] = {}, g[adamw_block] = {}, mb[adamw_block] = {}, vb[adamw_block] = {};
    std::copy_n(params + done, rest, p);
    std::copy_n(grads + done, rest, g);
    std::copy_n(m + done, rest, mb);
    std::copy_n(v + done, rest, vb);
    adamw_blocks(p, g, mb, vb, 1, s);
    std::copy_n(p, rest, params + done);
    std::copy_n(mb, rest, m + done);
    std::copy_n(vb, rest, v + done);
}

}  // namespace loom::kernels::host
