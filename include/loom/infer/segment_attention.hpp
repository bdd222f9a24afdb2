// Causal attention of a forward's segments, each segment's new rows over
// their slot's cached keys and values in a given layer of the cache: the new
// keys and values are appended, then each new row attends to the cached
// prefix and to the new rows before it (a chain) or to its ancestors (a
// tree). One copy for every engine that caches a loom CausalSelfAttention
// (infer/cached_gpt.hpp, infer/cached_model.hpp, infer/cached_kraken.hpp,
// infer/cached_glide.hpp), so all compute a layer the same way, bit for bit.
//
// The paths: a decode step's few rows go straight over the pages
// (infer/few_queries_attention.hpp says why), the sequences split between
// the GEMM threads; longer chains run the new rows among themselves through
// the training forward's block kernels (for a fresh prompt, exactly
// kernels::attention_forward's tiles), then fold in each cached page as a
// full block by log-sum-exp (ring attention's rule); a tree runs its own mask
// (infer/tree_attention.hpp) and then the same pages.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/infer/cached_rows.hpp"
#include "loom/infer/engine.hpp"
#include "loom/infer/few_queries_attention.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/tree_attention.hpp"
#include "loom/kernels/attention_block_ops.hpp"
#include "loom/kernels/host/gemm_dispatch.hpp"
#include "loom/kernels/host/gemm_threads.hpp"

namespace loom::infer {

// body(scratch, i) for each of a step's `count` sequences, split between the
// GEMM threads in ranges worth waking a thread for (`macs` in all against the
// GEMM's threshold a part), each range with its part's entry of `scratch`
// (grown to gemm_threads() entries): for per-sequence work too small to split
// inside, whose results do not depend on which thread runs it.
template <class Scratch, class Body>
void for_each_sequence(std::vector<Scratch>& scratch, std::int64_t count, std::int64_t macs, Body&& body) {
    if (count <= 0) return;
    const std::int64_t per_sequence = std::max<std::int64_t>(1, macs / count);
    const std::int64_t grain = std::max<std::int64_t>(1, kernels::host::gemm_detail::min_threaded_macs / per_sequence);
    const auto parts = static_cast<std::size_t>(std::max(1, kernels::host::gemm_threads()));
    if (scratch.size() < parts) scratch.resize(parts);
    kernels::host::run_in_parts(
        count,
        [&](int part, std::int64_t begin, std::int64_t end) {
            Scratch& mine = scratch[static_cast<std::size_t>(part)];
            for (std::int64_t i = begin; i < end; ++i) body(mine, i);
        },
        grain);
}

class SegmentAttention {
public:
    // Every segment of a forward, their rows packed one after another from
    // row 0 of qkv (row stride ld) and of out (H * D floats a row); starts[i]:
    // segment i's first position. As run_one() for each, with the same bits: the
    // long ones (prompts, trees) in turn, each splitting its heads between the
    // GEMM threads inside the block kernels; then the decode-sized ones split
    // between the GEMM threads by sequence, each part with scratch of its own.
    // Why: a decode step's attention is a loop over its sequences, each too
    // small to split by heads, and it ran on one thread while the step's
    // Linears ran on all of them.
    void run(KvCache& cache, std::int64_t layer, std::span<const Segment> segments, std::span<const std::int64_t> starts,
             const float* qkv, std::int64_t ld, std::int64_t H, std::int64_t D, float* out, WorkCount* work) {
        const std::int64_t C = H * D;
        first_rows_.clear();
        few_.clear();
        std::int64_t row = 0, few_keys = 0;
        for (std::size_t i = 0; i < segments.size(); ++i) {
            const Segment& s = segments[i];
            const auto count = static_cast<std::int64_t>(s.tokens.size());
            first_rows_.push_back(row);
            if (s.parents.empty() && count <= few_queries) {
                few_.push_back(i);
                few_keys += count * (starts[i] + count);
                add_work(work, chain_pairs(starts[i], count), H, D);
            } else {
                run_one(cache, layer, s.slot, starts[i], count, s.parents, qkv + row * ld, ld, H, D, out + row * C,
                        work);
            }
            row += count;
        }
        for_each_sequence(parts_, static_cast<std::int64_t>(few_.size()), 2 * C * few_keys,
                          [&](FewScratch& scratch, std::int64_t k) {
                              const std::size_t i = few_[static_cast<std::size_t>(k)];
                              const auto count = static_cast<std::int64_t>(segments[i].tokens.size());
                              const float* q = qkv + first_rows_[i] * ld;
                              cache_keys_values(cache, layer, segments[i].slot, starts[i], count, q + C, ld);
                              attend_few_queries(cache, layer, segments[i].slot, starts[i], q, ld, count, H, D,
                                                 out + first_rows_[i] * C, scratch.scores, scratch.pages);
                          });
    }

private:
    // Pairs a causal chain of `count` new rows after `start` cached ones uses:
    // each new row sees the cached ones, those before it and itself.
    [[nodiscard]] static std::int64_t chain_pairs(std::int64_t start, std::int64_t count) noexcept {
        return count * start + count * (count + 1) / 2;
    }
    static void add_work(WorkCount* work, std::int64_t pairs, std::int64_t H, std::int64_t D) noexcept {
        if (work == nullptr) return;
        work->attention_pairs += pairs;
        work->attention_flops += 4 * D * H * pairs;
    }

    // A segment too long for the decode path (a prompt, a long chain) or a
    // tree: `count` new rows of `slot` at positions [start, start + count);
    // row t's q, k and v (H heads of D features each, one after another)
    // start at qkv + t * ld. Their keys and values go to `layer` of the
    // cache, their attention output to out ([count, H * D]). With `parents`
    // (one per row), the rows are a tree's nodes.
    void run_one(KvCache& cache, std::int64_t layer, std::int64_t slot, std::int64_t start, std::int64_t count,
                 std::span<const std::int32_t> parents, const float* qkv, std::int64_t ld, std::int64_t H,
                 std::int64_t D, float* out, WorkCount* work) {
        const std::int64_t C = H * D;
        cache_keys_values(cache, layer, slot, start, count, qkv + C, ld);
        using kernels::BlockMask;
        if (parents.empty()) {
            add_work(work, chain_pairs(start, count), H, D);
        } else {  // a tree's node sees the cache, its ancestors (depth of them) and itself
            tree_depths(parents, depths_);
            std::int64_t pairs = count * start;
            for (std::int64_t t = 0; t < count; ++t) pairs += depths_[static_cast<std::size_t>(t)] + 1;
            add_work(work, pairs, H, D);
        }
        lse_.resize(static_cast<std::size_t>(count * H));
        lse_page_.resize(lse_.size());
        out_page_.resize(static_cast<std::size_t>(count * C));
        if (parents.empty())
            kernels::attention_block_forward(host_device, qkv, ld, qkv + C, qkv + 2 * C, ld, out, lse_.data(), 1,
                                             count, count, H, D, BlockMask::causal);
        else
            tree_attention_forward(qkv, ld, qkv + C, qkv + 2 * C, ld, parents, out, lse_.data(), H, D, ancestors_,
                                   tree_weights_);
        attend_cached_pages(cache, layer, slot, start, qkv, ld, count, H, D, out, lse_.data(), out_page_.data(),
                            lse_page_.data());
    }

    struct FewScratch {  // attend_few_queries' scratch, one per part of run()
        std::vector<float> scores;
        std::vector<const float*> pages;
    };

    // Scratch kept between calls, so that a decode step allocates nothing.
    std::vector<std::int64_t> depths_, ancestors_;  // a tree's
    std::vector<float> tree_weights_;
    std::vector<float> lse_, lse_page_, out_page_;
    std::vector<std::int64_t> first_rows_;  // run()'s: each segment's first row
    std::vector<std::size_t> few_;          // its decode-sized segments
    std::vector<FewScratch> parts_;
};

}  // namespace loom::infer
