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

namespace loom::infer {

// Segments of at most this many new rows take this path (a decode step's
// one row, a speculative round's few); longer ones (prompts) keep the block
// kernels, whose GEMMs are then wide enough to pay for their packing.
inline constexpr std::int64_t few_queries = 8;

namespace few_queries_detail {

// One query row and head over `keys` cached positions: out (D floats) =
// softmax(scale q.k) v. Position p's K is at pages[p / page_size] +
// (p % page_size) * stride + offset, its V `v_offset` floats further on.
// scores: `keys` floats of scratch.
LOOM_KERNEL_DISPATCH inline void attend_row(const float* __restrict q, const float* const* pages,
                                            std::int64_t page_size, std::int64_t stride, std::int64_t offset,
                                            std::int64_t v_offset, std::int64_t keys, std::int64_t D, float scale,
                                            float* __restrict scores, float* __restrict out) {
    // Page by page, so a position's place costs no division.
    for (std::int64_t first = 0, b = 0; first < keys; first += page_size, ++b) {
        const float* __restrict page = pages[b] + offset;
        const std::int64_t n = std::min(page_size, keys - first);
        for (std::int64_t i = 0; i < n; ++i) {
            const float* __restrict k = page + i * stride;
            scores[first + i] = scale * kernels::host::sum_over(D, [&](std::int64_t d) { return q[d] * k[d]; });
        }
    }
    const float top = kernels::host::max_over(keys, [&](std::int64_t p) { return scores[p]; });
    for (std::int64_t p = 0; p < keys; ++p) scores[p] = kernels::host::attention_detail::exp_approx(scores[p] - top);
    const float total = kernels::host::sum_over(keys, [&](std::int64_t p) { return scores[p]; });
    for (std::int64_t d = 0; d < D; ++d) out[d] = 0.0f;
    for (std::int64_t first = 0, b = 0; first < keys; first += page_size, ++b) {
        const float* __restrict page = pages[b] + offset + v_offset;
        const std::int64_t n = std::min(page_size, keys - first);
        for (std::int64_t i = 0; i < n; ++i) {
            const float* __restrict v = page + i * stride;
            const float w = scores[first + i];
            for (std::int64_t d = 0; d < D; ++d) out[d] += w * v[d];
        }
    }
    const float inverse = 1.0f / total;
    for (std::int64_t d = 0; d < D; ++d) out[d] *= inverse;
}

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
    scores.resize(static_cast<std::size_t>(start + count));
    const float scale = kernels::attention_scale(D);  // the block kernels' own
    for (std::int64_t t = 0; t < count; ++t)
        for (std::int64_t h = 0; h < H; ++h)
            few_queries_detail::attend_row(q + t * ld_q + h * D, pages.data(), cache.block_size(), cache.row_stride(),
                                           h * D, C, start + t + 1, D, scale, scores.data(), out + t * C + h * D);
}

}  // namespace loom::infer
