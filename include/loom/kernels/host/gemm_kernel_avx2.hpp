// The host GEMM's AVX2 + FMA micro-kernel: a 6 x 16 tile of C in 12 ymm
// accumulators, fed per k step by two loads of a packed B row and 6
// broadcasts of A (12 + 2 + 1 of the 16 registers; BLIS's Haswell shape,
// transposed for row-major C). The arithmetic per element is the AVX-512
// kernel's (kernels/host/gemm_kernel_avx512.hpp): an FMA chain over k, then
// alpha * acc, then fma(beta, C, that) where beta != 0. Column edges compute
// the full 16 columns and write the valid ones with the same scalar FMA.
#pragma once

#include <cmath>
#include <cstdint>

#include "loom/kernels/host/cpu_features.hpp"
#include "loom/kernels/host/gemm_packing.hpp"
#include "loom/kernels/trans.hpp"

#if defined(LOOM_GEMM_X86)
#include <immintrin.h>

#define LOOM_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace loom::kernels::host::gemm_detail {

struct Avx2Kernel {
    static constexpr CpuIsa isa = CpuIsa::avx2;
    static constexpr const char* shape = "6x16";
    static constexpr int mr = 6;
    static constexpr int nr = 16;
    static constexpr std::int64_t kc = 256;
    static constexpr std::int64_t mc = 144;
    static constexpr std::int64_t nc = 2048;

    // The packing loops (kernels/host/gemm_packing.hpp) compiled for this
    // kernel's instruction set: wider copies, and the bf16 rounding
    // vectorised (a plain call would run them at the baseline's SSE2).
    template <bool RoundBf16>
    LOOM_TARGET_AVX2 static void pack_b_panels(Trans tb, const float* B, std::int64_t ldb, std::int64_t k0, std::int64_t kc_,
                                        std::int64_t j0, std::int64_t nc_, float* out) noexcept {
        pack_b<nr, RoundBf16>(tb, B, ldb, k0, kc_, j0, nc_, out);
    }
    template <bool RoundBf16>
    LOOM_TARGET_AVX2 static void pack_a_panels(Trans ta, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc_,
                                        std::int64_t k0, std::int64_t kc_, float* out) noexcept {
        pack_a<mr, RoundBf16>(ta, A, lda, i0, mc_, k0, kc_, out);
    }
    LOOM_TARGET_AVX2 static void round_block(Trans ta, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc_,
                                      std::int64_t k0, std::int64_t kc_, float* out) noexcept {
        round_block_bf16(ta, A, lda, i0, mc_, k0, kc_, out);
    }

    LOOM_TARGET_AVX2 static void tile(int rows, int cols, std::int64_t k, const float* a, std::int64_t a_rs,
                                      std::int64_t a_ks, const float* b, std::int64_t b_ks, float* c,
                                      std::int64_t ldc, float alpha, float beta, const float* c_in,
                                             std::int64_t ldc_in) noexcept {
        if (a_rs == 1 && a_ks == mr)
            by_rows<mr, true>(rows, cols, k, a, 1, mr, b, b_ks, c, ldc, alpha, beta, c_in, ldc_in);
        else
            by_rows<mr, false>(rows, cols, k, a, a_rs, a_ks, b, b_ks, c, ldc, alpha, beta, c_in, ldc_in);
    }

private:
    template <int R, bool Packed>
    LOOM_TARGET_AVX2 static void by_rows(int rows, int cols, std::int64_t k, const float* a, std::int64_t a_rs,
                                         std::int64_t a_ks, const float* b, std::int64_t b_ks, float* c,
                                         std::int64_t ldc, float alpha, float beta, const float* c_in,
                                             std::int64_t ldc_in) noexcept {
        if constexpr (R > 1) {
            if (rows < R) {
                by_rows<R - 1, Packed>(rows, cols, k, a, a_rs, a_ks, b, b_ks, c, ldc, alpha, beta, c_in, ldc_in);
                return;
            }
        }
        rows_tile<R, Packed>(cols, k, a, a_rs, a_ks, b, b_ks, c, ldc, alpha, beta, c_in, ldc_in);
    }

    template <int R, bool Packed>
    LOOM_TARGET_AVX2 static void rows_tile(int cols, std::int64_t k, const float* a, std::int64_t a_rs,
                                           std::int64_t a_ks, const float* b, std::int64_t b_ks, float* c,
                                           std::int64_t ldc, float alpha, float beta, const float* c_in,
                                             std::int64_t ldc_in) noexcept {
        __m256 lo[R], hi[R];
LOOM_GEMM_UNROLL(6)
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
        for (std::int64_t p = 0; p < k; ++p) {
            const __m256 b0 = _mm256_loadu_ps(b + p * b_ks);
            const __m256 b1 = _mm256_loadu_ps(b + p * b_ks + 8);
LOOM_GEMM_UNROLL(6)
            for (int r = 0; r < R; ++r) {
                const __m256 x = _mm256_broadcast_ss(Packed ? a + p * mr + r : a + r * a_rs + p * a_ks);
                lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
                hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
            }
        }
        const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
        if (cols == 16) {
LOOM_GEMM_UNROLL(6)
            for (int r = 0; r < R; ++r) {
                float* row = c + r * ldc;
                const float* in = c_in + r * ldc_in;
                __m256 t0 = _mm256_mul_ps(va, lo[r]), t1 = _mm256_mul_ps(va, hi[r]);
                if (beta != 0.0f) {
                    t0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(in), t0);
                    t1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(in + 8), t1);
                }
                _mm256_storeu_ps(row, t0);
                _mm256_storeu_ps(row + 8, t1);
            }
            return;
        }
        alignas(32) float t[16];
LOOM_GEMM_UNROLL(6)
        for (int r = 0; r < R; ++r) {
            _mm256_store_ps(t, _mm256_mul_ps(va, lo[r]));
            _mm256_store_ps(t + 8, _mm256_mul_ps(va, hi[r]));
            float* row = c + r * ldc;
            const float* in = c_in + r * ldc_in;
            for (int j = 0; j < cols; ++j) row[j] = beta != 0.0f ? std::fma(beta, in[j], t[j]) : t[j];
        }
    }
};

}  // namespace loom::kernels::host::gemm_detail

#endif  // LOOM_GEMM_X86
