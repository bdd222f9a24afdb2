// Packing a transposed B (stored [N, K], as a Linear's weight is) into the
// AVX-512 kernel's 32-column panels with 16 x 16 register transposes. The
// portable loop (gemm_packing.hpp's pack_b) writes one float per store, 32
// floats apart, and a 1,024-token prefill spent 3% of one thread packing its
// Linears' weights that way, 4.5% of each of two threads (each packs the whole
// weight for its rows). Here 16 rows of B are loaded 16 floats at a time,
// transposed in registers (64 shuffles per 256 floats) and stored as 16 full
// panel rows. Packing copies: the packed panels are the same floats in the
// same places as pack_b's, so no product changes.
#pragma once

#include <cstdint>
#include <cstring>

#include "loom/kernels/host/cpu_features.hpp"

#if defined(LOOM_GEMM_X86)
#include <immintrin.h>

#define LOOM_TARGET_AVX512_PACK __attribute__((target("avx512f,avx512dq,avx2,fma")))

namespace loom::kernels::host::gemm_detail {

// r[i] becomes column i of the 16 x 16 matrix whose rows were r[0..15]:
// 32-bit then 64-bit interleaves within each 128-bit lane, then two rounds of
// 128-bit lane shuffles. (The all-ones maskz forms: GCC 12's unmasked forms
// pass an undefined vector through, which -Wmaybe-uninitialized reports.)
LOOM_TARGET_AVX512_PACK inline void transpose16x16(__m512 r[16]) noexcept {
    __m512 t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_maskz_unpacklo_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, r[2 * i], r[2 * i + 1]);
    }
    // u[4i + m], lane L: column 4L + m of rows 4i .. 4i + 3.
    for (int i = 0; i < 4; ++i) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        u[4 * i] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, a, c));
        u[4 * i + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, a, c));
        u[4 * i + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, b, d));
        u[4 * i + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, b, d));
    }
    for (int m = 0; m < 4; ++m) {
        const __m512 v_even = _mm512_maskz_shuffle_f32x4(0xFFFF, u[m], u[4 + m], 0x88);  // lanes 0, 2 of rows 0-7
        const __m512 v_odd = _mm512_maskz_shuffle_f32x4(0xFFFF, u[m], u[4 + m], 0xDD);   // lanes 1, 3
        const __m512 w_even = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + m], u[12 + m], 0x88);
        const __m512 w_odd = _mm512_maskz_shuffle_f32x4(0xFFFF, u[8 + m], u[12 + m], 0xDD);
        r[m] = _mm512_maskz_shuffle_f32x4(0xFFFF, v_even, w_even, 0x88);       // column m
        r[8 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, v_even, w_even, 0xDD);   // column 8 + m
        r[4 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, v_odd, w_odd, 0x88);     // column 4 + m
        r[12 + m] = _mm512_maskz_shuffle_f32x4(0xFFFF, v_odd, w_odd, 0xDD);    // column 12 + m
    }
}

// op(B) = B^T, B stored [N, K] with row stride ldb: columns [j0, j0 + nc) and
// k in [k0, k0 + kc) into 32-wide panels of kc rows, panel after panel,
// columns past nc zero (gemm_packing.hpp's pack_b<32> with Trans::yes).
LOOM_TARGET_AVX512_PACK inline void pack_b_transposed_avx512(const float* B, std::int64_t ldb, std::int64_t k0,
                                                             std::int64_t kc, std::int64_t j0, std::int64_t nc,
                                                             float* out) noexcept {
    constexpr int NR = 32;
    const std::int64_t k_full = kc - kc % 16;
    for (std::int64_t jp = 0; jp < nc; jp += NR) {
        const std::int64_t cols = nc - jp < NR ? nc - jp : NR;
        float* panel = out + (jp / NR) * kc * NR;
        for (std::int64_t half = 0; half < NR; half += 16) {
            const std::int64_t here = cols - half < 16 ? (cols - half > 0 ? cols - half : 0) : 16;
            if (here == 0) {  // the panel's second half lies past nc
                for (std::int64_t p = 0; p < kc; ++p) std::memset(panel + p * NR + half, 0, 16 * sizeof(float));
                continue;
            }
            const float* rows = B + (j0 + jp + half) * ldb + k0;
            if (here == 16) {
                for (std::int64_t p = 0; p < k_full; p += 16) {
                    __m512 r[16];
                    for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_ps(rows + c * ldb + p);
                    transpose16x16(r);
                    for (int q = 0; q < 16; ++q) _mm512_storeu_ps(panel + (p + q) * NR + half, r[q]);
                }
            } else {
                for (std::int64_t p = 0; p < k_full; ++p)
                    for (std::int64_t c = 0; c < 16; ++c) panel[p * NR + half + c] = c < here ? rows[c * ldb + p] : 0.0f;
            }
            for (std::int64_t p = k_full; p < kc; ++p)
                for (std::int64_t c = 0; c < 16; ++c) panel[p * NR + half + c] = c < here ? rows[c * ldb + p] : 0.0f;
        }
    }
}

}  // namespace loom::kernels::host::gemm_detail

#endif  // LOOM_GEMM_X86
