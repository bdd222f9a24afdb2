// Causal attention of a decode step's few new rows of one sequence over
// everything its cache holds, as dot products and one softmax per row and
// head, not through the FlashAttention block kernels.
//
// Why: the block path (infer/cached_rows.hpp's attend_cached_pages) runs
// every cached page of 16 positions as its own pair of GEMM calls (scores,
// then P V) and a log-sum-exp merge, and the host GEMM packs its operands on
// every call: for one query row against 16 keys the packing is most of the
// work. bench_generate_hf with 64 running requests of ~400 cached positions
// took 94 ms per decode step where 16 cached positions took 17 ms, with
// pack_b_panels at 28% of the cycles (perf). Here a row's keys are read once,
// straight from the pages.
//
// Numerics: the exact softmax (max, exp, sum over all of a row's keys at
// once) rather than the blocks' online one, kernels/host/elementwise.hpp's
// 16-strand sums for the dot products, and attention.hpp's exp_approx (3 ulp),
// so results differ from the block path by float rounding only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/infer/kv_cache.hpp"
#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/sixteen_sums.hpp"

namespace loom::infer {

// Segments of at most this many new rows take this path (a decode step's
// one row, a speculative round's few); longer ones (prompts) keep the block
// kernels, whose GEMMs are then wide enough to pay for their packing.
inline constexpr std::int64_t few_queries = 8;

namespace few_queries_detail {

// Each of H rows of `keys` scores (scores[h * keys + p]) becomes its
// unnormalised softmax, exp(s - max) (attention.hpp's exp_approx); the rows'
// sums go to scores[H * keys + h], which is returned.
LOOM_KERNEL_DISPATCH inline float* softmax_rows(float* __restrict scores, std::int64_t H, std::int64_t keys) {
    float* __restrict total = scores + H * keys;
    for (std::int64_t h = 0; h < H; ++h) {
        float* __restrict row = scores + h * keys;
        const float top = kernels::host::max_over(keys, [&](std::int64_t p) { return row[p]; });
        for (std::int64_t p = 0; p < keys; ++p) row[p] = kernels::host::attention_detail::exp_approx(row[p] - top);
        total[h] = kernels::host::sum_over(keys, [&](std::int64_t p) { return row[p]; });
    }
    return total;
}

// One query row, every head, over `keys` cached positions: out (H x D
// floats) = softmax(scale q_h.k_h) v_h for each head h. Position p's K row
// (all heads, H x D floats) is at pages[p / page_size] + (p % page_size) *
// stride, its V row `v_offset` floats further on. scores: H x (keys + 1)
// floats of scratch. Position by position, all heads at once (the layout the
// AVX-512 path below shares; this order alone measured no faster than head
// by head). Each (head, position) dot product, the softmax and the sum over
// positions are the per-head loops' own, in the same order: the same bits.
LOOM_KERNEL_DISPATCH inline void attend_row(const float* __restrict q, const float* const* pages,
                                            std::int64_t page_size, std::int64_t stride, std::int64_t v_offset,
                                            std::int64_t keys, std::int64_t H, std::int64_t D, float scale,
                                            float* __restrict scores, float* __restrict out) {
    // Page by page, so a position's place costs no division.
    for (std::int64_t first = 0, b = 0; first < keys; first += page_size, ++b) {
        const float* __restrict page = pages[b];
        const std::int64_t n = std::min(page_size, keys - first);
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t h = 0; h < H; ++h) {
                const float* __restrict k = page + i * stride + h * D;
                const float* __restrict qh = q + h * D;
                scores[h * keys + first + i] =
                    scale * kernels::host::sum_over(D, [&](std::int64_t d) { return qh[d] * k[d]; });
            }
    }
    const float* total = softmax_rows(scores, H, keys);
    for (std::int64_t d = 0; d < H * D; ++d) out[d] = 0.0f;
    for (std::int64_t first = 0, b = 0; first < keys; first += page_size, ++b) {
        const float* __restrict page = pages[b] + v_offset;
        const std::int64_t n = std::min(page_size, keys - first);
        for (std::int64_t i = 0; i < n; ++i)
            for (std::int64_t h = 0; h < H; ++h) {
                const float* __restrict v = page + i * stride + h * D;
                float* __restrict o = out + h * D;
                const float w = scores[h * keys + first + i];
                for (std::int64_t d = 0; d < D; ++d) o[d] += w * v[d];
            }
    }
    for (std::int64_t h = 0; h < H; ++h) {
        const float inverse = 1.0f / total[h];
        for (std::int64_t d = 0; d < D; ++d) out[h * D + d] *= inverse;
    }
}

#if defined(LOOM_GEMM_X86)
// attend_row's arithmetic at AVX-512, for D and H x D multiples of 16. The
// scores of 4 positions x 4 heads at a time, 16 lanes wide over D, summed by
// sixteen_sums (the same halving tree as sum_over's: the same dot products);
// the values' sum with the row's outputs held in registers, 16 vectors at a
// time, each position's weight broadcast to its head's lanes (the same FMAs
// in the same order). Per-dot reductions and reloading the outputs at every
// position made attend_row a quarter of bench_generate_hf's mixed batch.
LOOM_TARGET_SIXTEEN_SUMS inline void attend_row_avx512(const float* q, const float* const* pages,
                                                       std::int64_t page_size, std::int64_t stride,
                                                       std::int64_t v_offset, std::int64_t keys, std::int64_t H,
                                                       std::int64_t D, float scale, float* scores, float* out) {
    alignas(64) float lanes[16];
    for (std::int64_t p0 = 0; p0 < keys; p0 += 4) {
        const int P = static_cast<int>(std::min<std::int64_t>(4, keys - p0));
        const float* row[4];
        for (int r = 0; r < 4; ++r) {
            const std::int64_t p = p0 + std::min(r, P - 1);
            row[r] = pages[p / page_size] + (p % page_size) * stride;
        }
        for (std::int64_t h0 = 0; h0 < H; h0 += 4) {
            const int heads = static_cast<int>(std::min<std::int64_t>(4, H - h0));
            std::int64_t at[4];  // each lane group's head offset (the last head repeated past H)
            for (int j = 0; j < 4; ++j) at[j] = (h0 + std::min(j, heads - 1)) * D;
            __m512 acc[16];
            for (__m512& a : acc) a = _mm512_setzero_ps();
            for (std::int64_t c = 0; c < D; c += 16)
                for (int j = 0; j < 4; ++j) {
                    const __m512 qv = _mm512_loadu_ps(q + at[j] + c);
                    for (int r = 0; r < 4; ++r)
                        acc[4 * j + r] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(row[r] + at[j] + c), acc[4 * j + r]);
                }
            _mm512_store_ps(lanes, kernels::host::sixteen_sums(acc));  // lane 4 r + j: position r, head j
            for (int r = 0; r < P; ++r)
                for (int j = 0; j < heads; ++j) scores[(h0 + j) * keys + p0 + r] = scale * lanes[4 * r + j];
        }
    }
    const float* total = softmax_rows(scores, H, keys);
    const std::int64_t width = H * D;
    for (std::int64_t c0 = 0; c0 < width; c0 += 256) {
        const int vectors = static_cast<int>(std::min<std::int64_t>(16, (width - c0) / 16));
        const float* weight[16];  // each vector's head's weights
        for (int k = 0; k < vectors; ++k) weight[k] = scores + ((c0 + 16 * k) / D) * keys;
        __m512 o[16];
        for (__m512& v : o) v = _mm512_setzero_ps();
        for (std::int64_t first = 0, b = 0; first < keys; first += page_size, ++b) {
            const float* page = pages[b] + v_offset + c0;
            const std::int64_t n = std::min(page_size, keys - first);
            for (std::int64_t i = 0; i < n; ++i) {
                const float* v = page + i * stride;
                for (int k = 0; k < vectors; ++k)
                    o[k] = _mm512_fmadd_ps(_mm512_set1_ps(weight[k][first + i]), _mm512_loadu_ps(v + 16 * k), o[k]);
            }
        }
        for (int k = 0; k < vectors; ++k) {
            const __m512 inverse = _mm512_set1_ps(1.0f / total[(c0 + 16 * k) / D]);
            _mm512_storeu_ps(out + c0 + 16 * k, _mm512_mul_ps(o[k], inverse));
        }
    }
}
#endif

}  // namespace few_queries_detail

// Rows t in [0, count) are slot `slot`'s positions start + t of `layer`,
// whose keys and values the cache already holds (cache_keys_values ran): row
// t attends causally to positions [0, start + t]. q: the rows' queries, H
// heads of D, row stride ld_q; out: count rows of H * D. scores and pages: scratch.
inline void attend_few_queries(KvCache& cache, std::int64_t layer, std::int64_t slot, std::int64_t start,
                               const float* q, std::int64_t ld_q, std::int64_t count, std::int64_t H, std::int64_t D,
                               float* out, std::vector<float>& scores, std::vector<const float*>& pages) {
    const std::int64_t C = H * D;
    const std::span<const std::int32_t> table = cache.block_table(slot);
    pages.clear();
    for (const std::int32_t block : table) pages.push_back(cache.block_rows(layer, block));
    const float scale = kernels::attention_scale(D);  // the block kernels' own
#if defined(LOOM_GEMM_X86)
    const bool sixteen = kernels::host::sixteen_sums_on() && D % 16 == 0;
#endif
    for (std::int64_t t = 0; t < count; ++t) {
        const std::int64_t keys = start + t + 1;
        scores.resize(static_cast<std::size_t>(H * (keys + 1)));
#if defined(LOOM_GEMM_X86)
        if (sixteen) {
            few_queries_detail::attend_row_avx512(q + t * ld_q, pages.data(), cache.block_size(), cache.row_stride(),
                                                  C, keys, H, D, scale, scores.data(), out + t * C);
            continue;
        }
#endif
        few_queries_detail::attend_row(q + t * ld_q, pages.data(), cache.block_size(), cache.row_stride(), C, keys, H,
                                       D, scale, scores.data(), out + t * C);
    }
}

}  // namespace loom::infer
