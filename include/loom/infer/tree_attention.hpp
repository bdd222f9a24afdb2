// Attention among the nodes of a token tree, verified in one forward
// (infer/cape.hpp): node j's query sees the keys of its ancestors and itself
// only, not its siblings or their subtrees. The nodes are linearised in an
// order where every parent comes before its children (parents[j] < j; -1 for
// a node whose parent is the cached prefix), so a chain (parents[j] = j - 1)
// is ordinary causal attention.
//
// The output is what kernels::attention_block_forward writes for one block:
// out [count, H*D] normalised over these keys alone, and lse [H, count], the
// natural log-sum-exp of the scaled scores (scale 1/sqrt(D), the kernels'),
// so the caller folds the cached prefix's blocks in with attention_merge
// exactly as for a chain (infer/cached_gpt.hpp). A node sees at most its
// depth + 1 keys, so this is a plain loop per node and head (no GEMM): a
// tree has tens of nodes, and only CaPE's verification runs it; the chain
// paths keep the FlashAttention tiles.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/attention_shape.hpp"

namespace loom::infer {

// Depth of each node below the prefix (a root, parent -1, has depth 0);
// checks that every parent precedes its child.
inline void tree_depths(std::span<const std::int32_t> parents, std::vector<std::int64_t>& depths) {
    depths.resize(parents.size());
    for (std::size_t j = 0; j < parents.size(); ++j) {
        const std::int32_t p = parents[j];
        LOOM_CHECK(p >= -1 && p < static_cast<std::int32_t>(j), "tree: node ", j, " has parent ", p,
                   "; a parent must be an earlier node, in [-1, ", j, ") (-1: the cached prefix)");
        depths[j] = p < 0 ? 0 : depths[static_cast<std::size_t>(p)] + 1;
    }
}

// q: row j at q + j*ld_q (head h at column h*D); k, v likewise at stride
// ld_kv; `count` nodes with `parents`. `ancestors` is scratch.
inline void tree_attention_forward(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                   std::int64_t ld_kv, std::span<const std::int32_t> parents, float* out, float* lse,
                                   std::int64_t H, std::int64_t D, std::vector<std::int64_t>& ancestors,
                                   std::vector<float>& weights) {
    const auto count = static_cast<std::int64_t>(parents.size());
    const std::int64_t C = H * D;
    const float scale = kernels::attention_scale(D);
    for (std::int64_t j = 0; j < count; ++j) {
        ancestors.clear();  // root first, j last: the order of a causal row's keys
        for (std::int64_t a = j; a >= 0; a = parents[static_cast<std::size_t>(a)]) ancestors.push_back(a);
        std::reverse(ancestors.begin(), ancestors.end());
        weights.resize(ancestors.size());
        for (std::int64_t h = 0; h < H; ++h) {
            const float* qj = q + j * ld_q + h * D;
            float best = -INFINITY;
            for (std::size_t i = 0; i < ancestors.size(); ++i) {
                const float* ka = k + ancestors[i] * ld_kv + h * D;
                float s = 0;
                for (std::int64_t d = 0; d < D; ++d) s += qj[d] * ka[d];
                weights[i] = s * scale;
                best = std::max(best, weights[i]);
            }
            float total = 0;
            for (float& w : weights) {
                w = std::exp(w - best);
                total += w;
            }
            float* o = out + j * C + h * D;
            std::fill(o, o + D, 0.0f);
            for (std::size_t i = 0; i < ancestors.size(); ++i) {
                const float* va = v + ancestors[i] * ld_kv + h * D;
                const float w = weights[i] / total;
                for (std::int64_t d = 0; d < D; ++d) o[d] += w * va[d];
            }
            lse[h * count + j] = best + std::log(total);
        }
    }
}

}  // namespace loom::infer
