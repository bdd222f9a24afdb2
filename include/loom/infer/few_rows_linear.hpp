// y = x W^T + b for the few rows a decode step or a speculative verification
// has (one per running sequence, or a draft's γ + 1 positions, or a CaPE
// tree's nodes), without packing W.
//
// Why: loom's host GEMM (kernels/host/gemm_blocked.hpp) packs panels of B for
// its micro-kernel on every call. Over a prompt or a training batch the
// packing is paid once for many rows; for a few rows it is as much work as the
// product: before this path, packing was 46% of bench/generate.cpp's cycles
// (perf; its batch-1 decode and the re-running baseline together) and the
// cached decode ran 3.3x faster than re-running instead of ~9x; and a
// speculative verification of 9-40 rows spent as long packing as multiplying
// (perf of bench_speculative: pack_b_panels 26%, the micro-kernel 27%). W is
// [out, in] row-major (PyTorch's layout), so each output is a dot product of
// a contiguous weight row with an input row: read where they lie.
//
// On AVX-512 a block of 4 weight rows meets up to 4 input rows at once: 16
// dot products in 16 zmm accumulators, 8 loads per 16 FMAs (a lone dot
// product needs 2 per FMA), and the 16 sums reduced together by a transposing
// tree of shuffles (kernels/host/sixteen_sums.hpp). On AVX2, blocks of 2
// weight rows x 2 input rows, each dot product's 16 lanes in two ymm
// accumulators, the same arithmetic. Elsewhere (portable), each dot product
// on its own. The output blocks are split between the GEMM threads when the
// product is large enough to pay for waking them.
//
// Numerics: every dot product, wherever it falls in a block or a thread, is
// the same arithmetic: 16 lanes accumulate x[i] w[i] by FMA in k order (the
// last partial 16 under a mask: zeros elsewhere), then the lanes are summed
// by the halving tree (lane l += lane l + 8, then + 4, + 2, + 1), then the
// bias is added. So a row's outputs are the same bits whether it is
// multiplied alone or with others: a verification pass computes exactly what
// decoding one token at a time would (speculative decoding's greedy tokens
// do not depend on γ or the tree). It differs from nn::Linear's GEMM by float
// rounding (the tests compare logits to 1e-5 relative and greedy tokens).
#pragma once

#include <algorithm>
#include <cstdint>

#include "loom/kernels/host/cpu_features.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/gemm_dispatch.hpp"
#include "loom/kernels/host/gemm_threads.hpp"
#include "loom/kernels/host/sixteen_sums.hpp"

#if defined(LOOM_GEMM_X86)
#include <immintrin.h>
#endif

namespace loom::infer {

namespace few_rows_detail {

// Whether this process's kernels run at AVX2 (not AVX-512): the AVX2 blocks
// below, else (portable) each dot product alone. A rule of the setting, as
// sixteen_sums_on.
[[nodiscard]] inline bool avx2_blocks_on() {
#if defined(LOOM_GEMM_X86)
    return kernels::host::host_gemm().isa == kernels::host::CpuIsa::avx2;
#else
    return false;
#endif
}

// Each dot product alone: kernels/host/elementwise.hpp's sum_over (16 partial
// sums, the same halving tree), compiled at the CPU's level.
LOOM_KERNEL_DISPATCH inline void multiply_each(const float* __restrict x, const float* __restrict w,
                                               const float* __restrict bias, float* __restrict y, std::int64_t rows,
                                               std::int64_t in, std::int64_t out, std::int64_t o_begin,
                                               std::int64_t o_end) noexcept {
    for (std::int64_t o = o_begin; o < o_end; ++o) {
        const float* __restrict row = w + o * in;
        const float b = bias != nullptr ? bias[o] : 0.0f;
        for (std::int64_t r = 0; r < rows; ++r) {
            const float* __restrict xr = x + r * in;
            y[r * out + o] = b + kernels::host::sum_over(in, [&](std::int64_t i) { return xr[i] * row[i]; });
        }
    }
}

#if defined(LOOM_GEMM_X86)
#define LOOM_TARGET_FEW_ROWS LOOM_TARGET_SIXTEEN_SUMS

// 4 output columns [o, o + 4) (clamped: w rows past `outs` repeat the last
// one and are not stored) for R input rows: y[r][o + j] = bias + x_r . w_{o+j}.
template <int R>
LOOM_TARGET_FEW_ROWS inline void block4(const float* x, const float* w, const float* bias, float* y, std::int64_t in,
                                        std::int64_t out, std::int64_t o, int outs) noexcept {
    const float* wr[4];
    for (int j = 0; j < 4; ++j) wr[j] = w + (o + std::min(j, outs - 1)) * in;
    __m512 acc[4][R];
    for (auto& column : acc)
        for (__m512& a : column) a = _mm512_setzero_ps();
    std::int64_t i = 0;
    for (; i + 16 <= in; i += 16) {
        __m512 xv[R];
        for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(x + r * in + i);
        for (int j = 0; j < 4; ++j) {
            // The next block's same line, one block ahead, into L2: four
            // interleaved rows are four short streams the hardware prefetcher
            // barely follows. A 71 MB matrix-vector product (weights past the
            // L3, as a decode step's are) read 9.7 GB/s without it and 19-20
            // GB/s with it (one dot product at a time streams W at 17.5; the
            // hint into L1 gave 11.6). A prefetch past W's end is harmless.
            _mm_prefetch(reinterpret_cast<const char*>(wr[j] + 4 * in + i), _MM_HINT_T1);
            const __m512 wv = _mm512_loadu_ps(wr[j] + i);
            for (int r = 0; r < R; ++r) acc[j][r] = _mm512_fmadd_ps(xv[r], wv, acc[j][r]);
        }
    }
    if (i < in) {
        const auto mask = static_cast<__mmask16>((1u << (in - i)) - 1u);
        __m512 xv[R];
        for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_ps(mask, x + r * in + i);
        for (int j = 0; j < 4; ++j) {
            const __m512 wv = _mm512_maskz_loadu_ps(mask, wr[j] + i);
            for (int r = 0; r < R; ++r) acc[j][r] = _mm512_fmadd_ps(xv[r], wv, acc[j][r]);
        }
    }
    // v[4 j + r] is row r's dot with column j; the rows a block lacks are zeros.
    __m512 v[16];
    for (int j = 0; j < 4; ++j)
        for (int r = 0; r < 4; ++r) v[4 * j + r] = r < R ? acc[j][r] : _mm512_setzero_ps();
    // Block r, lane j: v[r + 4 j]'s whole sum, i.e. row r's column j.
    const __m512 sums = kernels::host::sixteen_sums(v);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sums);
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < outs; ++j)
            y[r * out + o + j] = (bias != nullptr ? bias[o + j] : 0.0f) + lanes[4 * r + j];
}

// Output columns [o_begin, o_end) for every row, in blocks of 4 columns x 4 rows.
LOOM_TARGET_FEW_ROWS inline void multiply_blocks(const float* x, const float* w, const float* bias, float* y,
                                                 std::int64_t rows, std::int64_t in, std::int64_t out,
                                                 std::int64_t o_begin, std::int64_t o_end) noexcept {
    for (std::int64_t o = o_begin; o < o_end; o += 4) {
        const int outs = static_cast<int>(std::min<std::int64_t>(4, o_end - o));
        std::int64_t r = 0;
        for (; r + 4 <= rows; r += 4) block4<4>(x + r * in, w, bias, y + r * out, in, out, o, outs);
        switch (rows - r) {
        case 3: block4<3>(x + r * in, w, bias, y + r * out, in, out, o, outs); break;
        case 2: block4<2>(x + r * in, w, bias, y + r * out, in, out, o, outs); break;
        case 1: block4<1>(x + r * in, w, bias, y + r * out, in, out, o, outs); break;
        default: break;
        }
    }
}

// The AVX2 form of the same arithmetic: each dot product's 16 lanes are two
// ymm accumulators (lanes 0-7 and 8-15), so a block is 2 weight rows x up to 2
// input rows (8 accumulators, 1 load per FMA: Zen 3 and Haswell-class cores
// issue 2 of each per cycle); the masked tail loads zeros, and the lanes are
// summed by the same halving tree (lane l += lane l + 8, + 4, + 2, + 1). So a
// row's outputs are the bits the AVX-512 blocks give, alone or in a block.
#define LOOM_TARGET_FEW_ROWS_AVX2 __attribute__((target("avx2,fma")))

LOOM_TARGET_FEW_ROWS_AVX2 inline float halving_sum(__m256 low, __m256 high) noexcept {
    const __m256 eight = _mm256_add_ps(low, high);                                                       // l += l + 8
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));  // l += l + 4
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));                                     // l += l + 2
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));                                        // l += l + 1
}

// Columns [o, o + C) (C <= 2) for R (<= 2) input rows.
template <int R, int C>
LOOM_TARGET_FEW_ROWS_AVX2 inline void block2(const float* x, const float* w, const float* bias, float* y,
                                             std::int64_t in, std::int64_t out, std::int64_t o) noexcept {
    const float* wr[C];
    for (int j = 0; j < C; ++j) wr[j] = w + (o + j) * in;
    __m256 low[C][R], high[C][R];
    for (int j = 0; j < C; ++j)
        for (int r = 0; r < R; ++r) low[j][r] = high[j][r] = _mm256_setzero_ps();
    std::int64_t i = 0;
    for (; i + 16 <= in; i += 16) {
        __m256 xl[R], xh[R];
        for (int r = 0; r < R; ++r) {
            xl[r] = _mm256_loadu_ps(x + r * in + i);
            xh[r] = _mm256_loadu_ps(x + r * in + i + 8);
        }
        for (int j = 0; j < C; ++j) {
            _mm_prefetch(reinterpret_cast<const char*>(wr[j] + 2 * in + i), _MM_HINT_T1);  // as block4's
            const __m256 wl = _mm256_loadu_ps(wr[j] + i), wh = _mm256_loadu_ps(wr[j] + i + 8);
            for (int r = 0; r < R; ++r) {
                low[j][r] = _mm256_fmadd_ps(xl[r], wl, low[j][r]);
                high[j][r] = _mm256_fmadd_ps(xh[r], wh, high[j][r]);
            }
        }
    }
    if (i < in) {
        alignas(32) std::int32_t lanes[16];
        for (int l = 0; l < 16; ++l) lanes[l] = i + l < in ? -1 : 0;
        const __m256i ml = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes)),
                      mh = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 8));
        for (int j = 0; j < C; ++j) {
            const __m256 wl = _mm256_maskload_ps(wr[j] + i, ml), wh = _mm256_maskload_ps(wr[j] + i + 8, mh);
            for (int r = 0; r < R; ++r) {
                low[j][r] = _mm256_fmadd_ps(_mm256_maskload_ps(x + r * in + i, ml), wl, low[j][r]);
                high[j][r] = _mm256_fmadd_ps(_mm256_maskload_ps(x + r * in + i + 8, mh), wh, high[j][r]);
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < C; ++j)
            y[r * out + o + j] = (bias != nullptr ? bias[o + j] : 0.0f) + halving_sum(low[j][r], high[j][r]);
}

LOOM_TARGET_FEW_ROWS_AVX2 inline void multiply_blocks_avx2(const float* x, const float* w, const float* bias, float* y,
                                                           std::int64_t rows, std::int64_t in, std::int64_t out,
                                                           std::int64_t o_begin, std::int64_t o_end) noexcept {
    // Every row for C columns from o, two rows at a time.
    auto columns = [&]<int C>(std::int64_t o) {
        std::int64_t r = 0;
        for (; r + 2 <= rows; r += 2) block2<2, C>(x + r * in, w, bias, y + r * out, in, out, o);
        if (r < rows) block2<1, C>(x + r * in, w, bias, y + r * out, in, out, o);
    };
    std::int64_t o = o_begin;
    for (; o + 2 <= o_end; o += 2) columns.template operator()<2>(o);
    if (o < o_end) columns.template operator()<1>(o);
}
#endif

}  // namespace few_rows_detail

// Rows at or below which a forward's Linears take this path; above, the
// packed GEMM's reuse of each panel across 14-row tiles wins. Measured with
// bench_few_rows, one thread: on an AMD EPYC (Zen 4) the AVX-512 blocks beat
// pack-and-multiply up to 48-64 rows at width 256's shapes and past 96 at
// width 384's; on an AMD EPYC at AVX2 (Zen 3) the AVX2 blocks up to 12-24
// rows (20-45 GFLOP/s; each dot product alone, before them, 21-25 and only
// up to 4-5 rows).
[[nodiscard]] inline std::int64_t few_rows() {
    if (kernels::host::sixteen_sums_on()) return 64;
    return few_rows_detail::avx2_blocks_on() ? 12 : 4;
}

// x [rows, in], w [out, in], bias [out] or null, y [rows, out] (not overlapping x).
inline void few_rows_linear(const float* x, const float* w, const float* bias, float* y, std::int64_t rows,
                            std::int64_t in, std::int64_t out) {
    if (rows <= 0 || out <= 0) return;
    const bool blocks = kernels::host::sixteen_sums_on(), avx2_blocks = few_rows_detail::avx2_blocks_on();
    // Ranges of 4-column blocks, each worth a thread's wake-up (as the GEMM's
    // threshold: kernels/host/gemm_dispatch.hpp's min_threaded_macs).
    const std::int64_t column_blocks = (out + 3) / 4;
    const std::int64_t macs_per_block = std::max<std::int64_t>(1, rows * in * 4);
    const std::int64_t grain = std::max<std::int64_t>(1, kernels::host::gemm_detail::min_threaded_macs / macs_per_block);
    kernels::host::run_in_ranges(
        column_blocks,
        [&](std::int64_t first, std::int64_t last) {
            const std::int64_t o_begin = first * 4, o_end = std::min(out, last * 4);
#if defined(LOOM_GEMM_X86)
            if (blocks) {
                few_rows_detail::multiply_blocks(x, w, bias, y, rows, in, out, o_begin, o_end);
                return;
            }
            if (avx2_blocks) {
                few_rows_detail::multiply_blocks_avx2(x, w, bias, y, rows, in, out, o_begin, o_end);
                return;
            }
#endif
            few_rows_detail::multiply_each(x, w, bias, y, rows, in, out, o_begin, o_end);
        },
        grain);
    (void)blocks;
    (void)avx2_blocks;
}

}  // namespace loom::infer
