// The host GEMM at MatmulPrecision::bf16 on CPUs with AVX512_BF16
// (Cooper Lake, Sapphire Rapids and later, Zen 4 and later): bf16 dot
// products, vdpbf16ps, instead of rounding the operands and running an f32
// GEMM. Both operands are packed as bf16 pairs along k (one 32-bit word holds
// op(X)(.., 2q) in its low half and (.., 2q + 1) in its high half, rounded to
// nearest even; an odd K gets a zero pair partner), and the 14 x 32 tile of
// gemm_kernel_avx512.hpp accumulates
//   acc[i][j] += a[i][2q] b[2q][j] + a[i][2q+1] b[2q+1][j]
// per pair in f32: products of bf16 values are exact in f32, so this is
// today's bf16 semantics (kernels/matmul_precision.hpp) up to the order of
// the sums, as a tensor core's. Two differences at the edges of the range,
// both the instruction's: bf16 subnormals (below 1.2e-38) count as zero, and
// a subnormal f32 sum is flushed to zero.
//
// Per element the arithmetic is fixed by the kernel (pairs in order, kc-deep
// blocks, then the f32 kernel's epilogue), so splitting M or N between
// threads or shards changes no bit, as in f32.
#pragma once

#include <algorithm>
#include <cstdint>

#include "loom/kernels/host/cpu_features.hpp"
#include "loom/kernels/host/gemm_packing.hpp"
#include "loom/kernels/trans.hpp"

#if defined(LOOM_GEMM_X86)
#include <immintrin.h>

#define LOOM_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx2,fma")))

namespace loom::kernels::host::gemm_detail {

struct Avx512Bf16Kernel {
    static constexpr const char* shape = "14x32 vdpbf16ps";
    static constexpr int mr = 14;
    static constexpr int nr = 32;
    static constexpr std::int64_t kc = 512;  // 256 pairs: a 32 KiB B panel
    static constexpr std::int64_t mc = 140;
    static constexpr std::int64_t nc = 3072;

    // 16 floats at `src` (the first `count`, the rest read as 0) as bf16,
    // nearest even, in a 256-bit vector.
    LOOM_TARGET_AVX512_BF16 static __m256i to_bf16x16(const float* src, int count) noexcept {
        const __mmask16 m = static_cast<__mmask16>(count >= 16 ? 0xffffu : (1u << count) - 1u);
        return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src)));
    }

    // Pair words of one stored row contiguous along k: element (x, k) at
    // src[k], k in [0, kc), into out[q * stride] for q in [0, ceil(kc / 2)).
    LOOM_TARGET_AVX512_BF16 static void pack_along(const float* src, std::int64_t kc_, std::uint32_t* out,
                                                   std::int64_t stride) noexcept {
        alignas(32) std::uint32_t words[8];
        for (std::int64_t k = 0; k < kc_; k += 16) {
            const int count = static_cast<int>(std::min<std::int64_t>(16, kc_ - k));
            _mm256_store_si256(reinterpret_cast<__m256i*>(words), to_bf16x16(src + k, count));
            const int pairs = (count + 1) / 2;
            for (int w = 0; w < pairs; ++w) out[(k / 2 + w) * stride] = words[w];
        }
    }

    // Pair words of two stored rows contiguous across the tile: element
    // (2q, c) at even[c], (2q + 1, c) at odd[c] (odd = nullptr: zeros), c in
    // [0, count), into out[c]; out[count .. width) are zeroed.
    LOOM_TARGET_AVX512_BF16 static void pack_across(const float* even, const float* odd, int count, int width,
                                                    std::uint32_t* out) noexcept {
        for (int c = 0; c < width; c += 16) {
            const int n = std::max(0, std::min(16, count - c));
            // The maskz forms: GCC 12's plain ones start from an "undefined"
            // vector that -Wmaybe-uninitialized reports.
            const __mmask16 all = 0xffffu;
            const __m512i lo = _mm512_maskz_cvtepu16_epi32(all, to_bf16x16(even + c, n));
            const __m512i hi =
                odd != nullptr ? _mm512_maskz_cvtepu16_epi32(all, to_bf16x16(odd + c, n)) : _mm512_setzero_si512();
            const __m512i words = _mm512_or_si512(lo, _mm512_maskz_slli_epi32(all, hi, 16));
            const __mmask16 m = static_cast<__mmask16>(width - c >= 16 ? 0xffffu : (1u << (width - c)) - 1u);
            _mm512_mask_storeu_epi32(out + c, m, words);
        }
    }

    // op(B)[k0, k0 + kc) x [j0, j0 + nc) as pair words: panels of 32 columns,
    // ceil(kc / 2) words deep.
    LOOM_TARGET_AVX512_BF16 static void pack_b(Trans tb, const float* B, std::int64_t ldb, std::int64_t k0,
                                               std::int64_t kc_, std::int64_t j0, std::int64_t nc_,
                                               std::uint32_t* out) noexcept {
        const std::int64_t pairs = (kc_ + 1) / 2;
        for (std::int64_t jp = 0; jp < nc_; jp += nr) {
            const int cols = static_cast<int>(std::min<std::int64_t>(nr, nc_ - jp));
            std::uint32_t* panel = out + (jp / nr) * pairs * nr;
            if (tb == Trans::no) {
                for (std::int64_t q = 0; q < pairs; ++q) {
                    const float* even = B + (k0 + 2 * q) * ldb + j0 + jp;
                    const float* odd = 2 * q + 1 < kc_ ? even + ldb : nullptr;
                    pack_across(even, odd, cols, nr, panel + q * nr);
                }
            } else {
                for (int c = 0; c < nr; ++c) {
                    if (c < cols)
                        pack_along(B + (j0 + jp + c) * ldb + k0, kc_, panel + c, nr);
                    else
                        for (std::int64_t q = 0; q < pairs; ++q) panel[q * nr + c] = 0u;
                }
            }
        }
    }

    // op(A)[i0, i0 + mc) x [k0, k0 + kc) as pair words: panels of 14 rows.
    LOOM_TARGET_AVX512_BF16 static void pack_a(Trans ta, const float* A, std::int64_t lda, std::int64_t i0,
                                               std::int64_t mc_, std::int64_t k0, std::int64_t kc_,
                                               std::uint32_t* out) noexcept {
        const std::int64_t pairs = (kc_ + 1) / 2;
        for (std::int64_t ip = 0; ip < mc_; ip += mr) {
            const int rows = static_cast<int>(std::min<std::int64_t>(mr, mc_ - ip));
            std::uint32_t* panel = out + (ip / mr) * pairs * mr;
            if (ta == Trans::no) {
                for (int r = 0; r < mr; ++r) {
                    if (r < rows)
                        pack_along(A + (i0 + ip + r) * lda + k0, kc_, panel + r, mr);
                    else
                        for (std::int64_t q = 0; q < pairs; ++q) panel[q * mr + r] = 0u;
                }
            } else {
                for (std::int64_t q = 0; q < pairs; ++q) {
                    const float* even = A + (k0 + 2 * q) * lda + i0 + ip;
                    const float* odd = 2 * q + 1 < kc_ ? even + lda : nullptr;
                    pack_across(even, odd, rows, mr, panel + q * mr);
                }
            }
        }
    }

    // C[rows x cols] from `pairs` pair steps of the packed panels; beta's term
    // read at c_in[r * ldc_in + j] (C itself, or a bias row with ldc_in = 0).
    LOOM_TARGET_AVX512_BF16 static void tile(int rows, int cols, std::int64_t pairs, const std::uint32_t* a,
                                             const std::uint32_t* b, float* c, std::int64_t ldc, float alpha,
                                             float beta, const float* c_in, std::int64_t ldc_in) noexcept {
        by_rows<mr>(rows, cols, pairs, a, b, c, ldc, alpha, beta, c_in, ldc_in);
    }

private:
    template <int R>
    LOOM_TARGET_AVX512_BF16 static void by_rows(int rows, int cols, std::int64_t pairs, const std::uint32_t* a,
                                                const std::uint32_t* b, float* c, std::int64_t ldc, float alpha,
                                                float beta, const float* c_in, std::int64_t ldc_in) noexcept {
        if constexpr (R > 1) {
            if (rows < R) {
                by_rows<R - 1>(rows, cols, pairs, a, b, c, ldc, alpha, beta, c_in, ldc_in);
                return;
            }
        }
        rows_tile<R>(cols, pairs, a, b, c, ldc, alpha, beta, c_in, ldc_in);
    }

    template <int R>
    LOOM_TARGET_AVX512_BF16 static void rows_tile(int cols, std::int64_t pairs, const std::uint32_t* a,
                                                  const std::uint32_t* b, float* c, std::int64_t ldc, float alpha,
                                                  float beta, const float* c_in, std::int64_t ldc_in) noexcept {
        __m512 lo[R], hi[R];
        LOOM_GEMM_UNROLL(14)
        for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
        for (std::int64_t q = 0; q < pairs; ++q) {
            const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(b + q * 32));
            const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_load_si512(b + q * 32 + 16));
            LOOM_GEMM_UNROLL(14)
            for (int r = 0; r < R; ++r) {
                const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[q * mr + r])));
                lo[r] = _mm512_dpbf16_ps(lo[r], x, b0);
                hi[r] = _mm512_dpbf16_ps(hi[r], x, b1);
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

// The blocked loops of gemm_blocked.hpp for the bf16 kernel: both operands
// always packed (packing is where they are rounded). M, N, K >= 1. A `bias`:
// blocked_gemm's meaning, added by the first k block's tiles.
inline void blocked_gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                              const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                              float* C, std::int64_t ldc, const float* bias = nullptr) {
    using Kernel = Avx512Bf16Kernel;
    constexpr int MR = Kernel::mr, NR = Kernel::nr;
    thread_local PackBuffer b_buffer, a_buffer;
    const std::int64_t pairs_max = (std::min<std::int64_t>(Kernel::kc, K) + 1) / 2;
    const std::int64_t nc_max = std::min<std::int64_t>(Kernel::nc, N);
    auto* bp = reinterpret_cast<std::uint32_t*>(b_buffer.reserve(pairs_max * ((nc_max + NR - 1) / NR) * NR));
    auto* ap = reinterpret_cast<std::uint32_t*>(a_buffer.reserve(pairs_max * ((Kernel::mc + MR - 1) / MR) * MR));
    for (std::int64_t jc = 0; jc < N; jc += Kernel::nc) {
        const std::int64_t nc = std::min<std::int64_t>(Kernel::nc, N - jc);
        for (std::int64_t pc = 0; pc < K; pc += Kernel::kc) {
            const std::int64_t kc = std::min<std::int64_t>(Kernel::kc, K - pc), pairs = (kc + 1) / 2;
            const bool onto_bias = pc == 0 && bias != nullptr;
            const float beta_block = pc == 0 && bias == nullptr ? beta : 1.0f;
            Kernel::pack_b(tb, B, ldb, pc, kc, jc, nc, bp);
            for (std::int64_t ic = 0; ic < M; ic += Kernel::mc) {
                const std::int64_t mc = std::min<std::int64_t>(Kernel::mc, M - ic);
                Kernel::pack_a(ta, A, lda, ic, mc, pc, kc, ap);
                for (std::int64_t jr = 0; jr < nc; jr += NR) {
                    const int cols = static_cast<int>(std::min<std::int64_t>(NR, nc - jr));
                    for (std::int64_t ir = 0; ir < mc; ir += MR) {
                        const int rows = static_cast<int>(std::min<std::int64_t>(MR, mc - ir));
                        float* c_tile = C + (ic + ir) * ldc + jc + jr;
                        Kernel::tile(rows, cols, pairs, ap + (ir / MR) * pairs * MR, bp + (jr / NR) * pairs * NR,
                                     c_tile, ldc, alpha, beta_block, onto_bias ? bias + jc + jr : c_tile,
                                     onto_bias ? 0 : ldc);
                    }
                }
            }
        }
    }
}

}  // namespace loom::kernels::host::gemm_detail

#endif  // LOOM_GEMM_X86
