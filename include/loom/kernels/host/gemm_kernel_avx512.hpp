// The host GEMM's AVX-512 micro-kernel: a 14 x 32 tile of C held in 28 zmm
// accumulators (two 16-float vectors per row), fed per k step by two aligned
// loads of a packed B row and 14 broadcasts of A, 28 FMAs in all: 28 + 2 + 1
// of the 32 registers, the shape BLIS and OpenBLAS use for Skylake-X and
// later (14 rows keep the two FMA ports busy behind the FMA latency).
//
// Every element's arithmetic is fixed by the kernel alone: acc = 0, then
// acc = fma(a[i][p], b[p][j], acc) for p in order over the k block, then
// C = alpha * acc (beta = 0) or fma(beta, C, alpha * acc). Edge tiles (fewer
// rows, fewer columns) run the same instructions on fewer registers or under
// a mask, so C[i][j] does not depend on where a product is split into tiles,
// blocks or threads (kernels/host/gemm_blocked.hpp).
#pragma once

#include <cstdint>

#include "loom/kernels/host/cpu_features.hpp"
#include "loom/kernels/host/gemm_pack_transposed_avx512.hpp"
#include "loom/kernels/host/gemm_packing.hpp"
#include "loom/kernels/trans.hpp"

#if defined(LOOM_GEMM_X86)
#include <immintrin.h>

#define LOOM_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))

namespace loom::kernels::host::gemm_detail {

struct Avx512Kernel {
    static constexpr CpuIsa isa = CpuIsa::avx512;
    static constexpr const char* shape = "14x32";
    static constexpr int mr = 14;
    static constexpr int nr = 32;
    // Blocking: a kc x 32 panel of B (48 KiB) is reread from L1/L2 across the
    // row tiles of one block; an mc x kc block of A (210 KiB) stays in L2; a
    // kc x nc block of B (4.5 MiB) in L3. Chosen by measurement at 1024^3 on
    // the Xeon of docs/performance.md (kc 128..384 x mc 140..420).
    static constexpr std::int64_t kc = 384;
    static constexpr std::int64_t mc = 140;
    static constexpr std::int64_t nc = 3072;

    // The packing loops (kernels/host/gemm_packing.hpp) compiled for this
    // kernel's instruction set: wider copies, and the bf16 rounding
    // vectorised (a plain call would run them at the baseline's SSE2).
    // A transposed B without rounding (a Linear's weight) by register
    // transposes (gemm_pack_transposed_avx512.hpp).
    template <bool RoundBf16>
    LOOM_TARGET_AVX512 static void pack_b_panels(Trans tb, const float* B, std::int64_t ldb, std::int64_t k0, std::int64_t kc_,
                                        std::int64_t j0, std::int64_t nc_, float* out) noexcept {
        if (!RoundBf16 && tb == Trans::yes)
            pack_b_transposed_avx512(B, ldb, k0, kc_, j0, nc_, out);
        else
            pack_b<nr, RoundBf16>(tb, B, ldb, k0, kc_, j0, nc_, out);
    }
    template <bool RoundBf16>
    LOOM_TARGET_AVX512 static void pack_a_panels(Trans ta, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc_,
                                        std::int64_t k0, std::int64_t kc_, float* out) noexcept {
        pack_a<mr, RoundBf16>(ta, A, lda, i0, mc_, k0, kc_, out);
    }
    LOOM_TARGET_AVX512 static void round_block(Trans ta, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc_,
                                      std::int64_t k0, std::int64_t kc_, float* out) noexcept {
        round_block_bf16(ta, A, lda, i0, mc_, k0, kc_, out);
    }

    // C[rows x cols] (rows <= 14, cols <= 32) from k steps of A, read at
    // a[r * a_rs + p * a_ks], and a B panel read at b[p * b_ks + j], j < 32:
    // packed (b_ks = 32) or a plain B in place (b_ks = ldb). Row r of C is
    // alpha * acc + beta * c_in[r * ldc_in + j]: C itself, or a bias row
    // (ldc_in = 0) that gemm_bias adds in the product's own pass.
    LOOM_TARGET_AVX512 static void tile(int rows, int cols, std::int64_t k, const float* a, std::int64_t a_rs,
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
    LOOM_TARGET_AVX512 static void by_rows(int rows, int cols, std::int64_t k, const float* a, std::int64_t a_rs,
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
    LOOM_TARGET_AVX512 static void rows_tile(int cols, std::int64_t k, const float* a, std::int64_t a_rs,
                                             std::int64_t a_ks, const float* b, std::int64_t b_ks, float* c,
                                             std::int64_t ldc, float alpha, float beta, const float* c_in,
                                             std::int64_t ldc_in) noexcept {
        __m512 lo[R], hi[R];
LOOM_GEMM_UNROLL(14)
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
        for (std::int64_t p = 0; p < k; ++p) {
            const __m512 b0 = _mm512_loadu_ps(b + p * b_ks);
            const __m512 b1 = _mm512_loadu_ps(b + p * b_ks + 16);
LOOM_GEMM_UNROLL(14)
            for (int r = 0; r < R; ++r) {
                const __m512 x = _mm512_set1_ps(Packed ? a[p * mr + r] : a[r * a_rs + p * a_ks]);
                lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
                hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
            }
        }
        const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
        const int lo_cols = cols < 16 ? cols : 16, hi_cols = cols - lo_cols;
        const __mmask16 m0 = static_cast<__mmask16>((1u << lo_cols) - 1u);
        const __mmask16 m1 = static_cast<__mmask16>((1u << hi_cols) - 1u);
LOOM_GEMM_UNROLL(14)
        for (int r = 0; r < R; ++r) {
            float* row = c + r * ldc;
            const float* in = c_in + r * ldc_in;
            __m512 t0 = _mm512_mul_ps(va, lo[r]), t1 = _mm512_mul_ps(va, hi[r]);
            if (beta != 0.0f) {
                t0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, in), t0);
                t1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, in + 16), t1);
            }
            _mm512_mask_storeu_ps(row, m0, t0);
            _mm512_mask_storeu_ps(row + 16, m1, t1);
        }
    }
};

}  // namespace loom::kernels::host::gemm_detail

#endif  // LOOM_GEMM_X86
