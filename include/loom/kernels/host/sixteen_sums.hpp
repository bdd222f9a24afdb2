// Sixteen 16-lane accumulators summed at once: the horizontal sums of 16 zmm
// vectors in one zmm, by a transposing tree of shuffles (15 adds, 30
// shuffles) instead of 16 separate reductions (64 of each).
//
// Each vector's lanes are summed by the same halving tree as
// kernels/host/elementwise.hpp's sum_over (lane l += lane l + 8, then + 4,
// + 2, + 1; float addition is commutative, so which operand a shuffle puts
// first does not matter): a dot product accumulated 16 lanes wide and summed
// here is the same bits as one summed alone. Used by the few-row Linears
// (infer/few_rows_linear.hpp) and a decode step's attention scores
// (infer/few_queries_attention.hpp).
#pragma once

#include "loom/kernels/host/cpu_features.hpp"
#include "loom/kernels/host/gemm_dispatch.hpp"

namespace loom::kernels::host {

// Whether this process's kernels run at AVX-512 (loom's GEMM level, or the
// CPU's with the BLAS backend): the callers' sixteen-sum paths, else their
// portable ones. A rule of the setting, so a process always runs the same bits.
[[nodiscard]] inline bool sixteen_sums_on() {
#if defined(LOOM_GEMM_X86)
    return host_gemm().isa == CpuIsa::avx512;
#else
    return false;
#endif
}

}  // namespace loom::kernels::host

#if defined(LOOM_GEMM_X86)
#include <immintrin.h>

#define LOOM_TARGET_SIXTEEN_SUMS __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma")))

namespace loom::kernels::host::sixteen_sums_detail {

// The 128-bit shuffles run masked with a full mask: the same instruction,
// without GCC 12's -Wuninitialized false alarm on the unmasked form's
// undefined source.

// Lanes 0-7: a's halves summed (a[i] + a[i + 8]); lanes 8-15: b's.
LOOM_TARGET_SIXTEEN_SUMS inline __m512 halves(__m512 a, __m512 b) noexcept {
    const auto all = static_cast<__mmask16>(0xFFFF);
    return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, a, b, 0x44), _mm512_maskz_shuffle_f32x4(all, a, b, 0xEE));
}
// From (a8 | b8) and (c8 | d8): (a4 | b4 | c4 | d4), each x4[i] = x8[i] + x8[i + 4].
LOOM_TARGET_SIXTEEN_SUMS inline __m512 quarters(__m512 u, __m512 v) noexcept {
    const auto all = static_cast<__mmask16>(0xFFFF);
    return _mm512_add_ps(_mm512_maskz_shuffle_f32x4(all, u, v, 0x88), _mm512_maskz_shuffle_f32x4(all, u, v, 0xDD));
}

}  // namespace loom::kernels::host::sixteen_sums_detail

namespace loom::kernels::host {

// The sums of v[0..15]'s lanes: lane 4 r + j of the result is v[r + 4 j]'s sum.
LOOM_TARGET_SIXTEEN_SUMS inline __m512 sixteen_sums(const __m512 (&v)[16]) noexcept {
    using namespace sixteen_sums_detail;
    __m512 h[8], q[4], e[2];
    for (int k = 0; k < 8; ++k) h[k] = halves(v[2 * k], v[2 * k + 1]);   // (v8 | v'8)
    for (int k = 0; k < 4; ++k) q[k] = quarters(h[2 * k], h[2 * k + 1]);  // 4 vectors' 4-sums each
    // Within each 128-bit block: (x4[0] + x4[2], x4[1] + x4[3]) of two vectors.
    for (int k = 0; k < 2; ++k)
        e[k] = _mm512_add_ps(_mm512_shuffle_ps(q[2 * k], q[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(q[2 * k], q[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace loom::kernels::host

#endif
