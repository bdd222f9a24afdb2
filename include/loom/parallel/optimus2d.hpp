// Optimus2D: tensor parallelism on a q x q grid (tp = q^2 ranks; Xu et al.,
// arXiv 2104.05343). Rank (i, j) holds block (i, j) of every matrix, weights
// and activations alike, so each takes 1/q^2 of both; the Linears are SUMMA
// products (nn/summa.hpp). This header holds the policy tag and the cutting:
//
//   activations [B, T, C]     -> [B/q, T, C/q]: sequences i, features j
//   Linear W [out, in]        -> [out/q, in/q]: outputs i, inputs j (Split::grid);
//                                bias [out/q]: outputs j, on every row of the grid
//   LayerNorm gain, shift [C] -> [C/q]: features j
//   attention                 -> qkv and proj cut as Linears (q, k, v each by
//                                blocks), heads/q heads of column j per rank
//   Embedding token [V, C]    -> [V/q, C/q]: tokens i, features j;
//                                position [S, C] -> [S, C/q]: features j
//   CrossEntropy              -> rows i, classes j, reduced over the grid row
//
// Vectors (biases, LayerNorm, positions) are cut q ways, not q^2: they are
// small, and each grid row holds the same copy, its gradient summed down the
// grid column. Every layer of the model must be one of these, elementwise
// (Gelu, Residual, or tp::keeps_features_sharded), or a composite of them:
// every activation is cut, so a layer that needs whole rows cannot run.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <type_traits>
#include <typeinfo>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layernorm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/grid2d.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_model.hpp"

namespace loom {

struct Optimus2D {
    static constexpr PolicyKind kind = PolicyKind::tensor_parallel;
    static constexpr bool grid = true;
    static void describe(std::ostream& out) { out << "Optimus2D"; }
};

namespace tp {

// Makes `layer` grid rank `at`'s block of a Linear; `groups` > 1 cuts each
// of that many output blocks alike (q, k, v).
inline void shard_grid(nn::Linear& layer, GridPosition at, std::int64_t groups = 1) {
    const auto what = loom::detail::concat("Linear ", layer.in(), " -> ", layer.out(), " (Optimus 2D)");
    split_param(layer.weight, 0, at.i, at.q, what + " weight outputs", groups, CutAxis::grid_row);
    split_param(layer.weight, 1, at.j, at.q, what + " weight inputs", 1, CutAxis::grid_column);
    if (layer.has_bias()) split_param(layer.bias, 0, at.j, at.q, what + " bias", groups, CutAxis::grid_column);
    layer.split = at.q == 1 ? nn::Split::none : nn::Split::grid;
}

inline void shard_grid(nn::LayerNorm& layer, GridPosition at) {
    const auto what = loom::detail::concat("LayerNorm of ", layer.features(), " features (Optimus 2D)");
    split_param(layer.gain, 0, at.j, at.q, what, 1, CutAxis::grid_column);
    split_param(layer.shift, 0, at.j, at.q, what, 1, CutAxis::grid_column);
}

inline void shard_grid(nn::CausalSelfAttention& layer, GridPosition at) {
    LOOM_CHECK(layer.heads % at.q == 0, "CausalSelfAttention: the ", layer.heads,
               " heads do not split over the q = ", at.q, " columns of the Optimus 2D grid; use a grid side that "
               "divides ", layer.heads);
    shard_grid(layer.qkv, at, 3);
    shard_grid(layer.proj, at);
}

inline void shard_grid(nn::Embedding& layer, GridPosition at) {
    const std::int64_t vocab = layer.token.full_shape().dim(0);
    LOOM_CHECK(vocab % at.q == 0, "Embedding: the grid side q = ", at.q, " does not divide the vocabulary of ",
               vocab, " tokens; use a q that divides ", vocab);
    split_param(layer.token, 0, at.i, at.q, "Embedding token table (Optimus 2D)", 1, CutAxis::grid_row);
    split_param(layer.token, 1, at.j, at.q, "Embedding token table (Optimus 2D)", 1, CutAxis::grid_column);
    split_param(layer.position, 1, at.j, at.q, "Embedding position table (Optimus 2D)", 1, CutAxis::grid_column);
}

inline void shard_grid(nn::CrossEntropy& loss, GridPosition at) {
    LOOM_CHECK(!loss.vocab_parallel(), "CrossEntropy: already vocabulary-parallel (from class ", loss.vocab_start,
               ", grid ", loss.grid, "); shard a loss once");
    loss.grid = at.q > 1;
}

namespace detail {

// Cuts every layer of a model for one grid position (see the header).
class GridWalker {
public:
    explicit GridWalker(GridPosition at) : at_(at) {}

    template <class F>
    void visit(F& field) {
        using T = std::remove_cvref_t<F>;
        if constexpr (reflect::ParamField<T> || reflect::is_config<T>()) {
            // not a layer
        } else if constexpr (std::is_same_v<T, nn::Linear> || std::is_same_v<T, nn::LayerNorm> ||
                             std::is_same_v<T, nn::CausalSelfAttention> || std::is_same_v<T, nn::Embedding> ||
                             std::is_same_v<T, nn::CrossEntropy>) {
            shard_grid(field, at_);
            ++layers_;
        } else if constexpr (keeps_features_sharded<T>) {
            // elementwise: any block of the activations will do
        } else if constexpr (reflect::LayerSequence<T>) {
            for (auto& element : field) visit(element);
        } else if constexpr ((!nn::Leaf<T> || is_residual<T>) &&
                             (reflect::has_custom_fields<T> || reflect::pfr_reflectable<T>)) {
            // a composite: its fields run in order (Residual adds its input)
            reflect::for_each_field(field, [&](auto& member, std::size_t) { visit(member); });
        } else {
            // A layer that computes itself (its forward sees a block of the
            // activations) and is none of the above: it could mix sequences
            // or features, so it cannot run on a block.
            LOOM_FAIL("Optimus 2D: layer ", typeid(T).name(), " has no 2D form; every activation is cut in q x q "
                      "blocks, so a model's layers must be loom's Linear, LayerNorm, CausalSelfAttention, Embedding, "
                      "CrossEntropy, elementwise (tp::keeps_features_sharded), or composites of them");
        }
    }

    [[nodiscard]] int layers() const noexcept { return layers_; }

private:
    GridPosition at_;
    int layers_ = 0;
};

}  // namespace detail

// Makes `model` tp rank `rank`'s block of itself on a grid of `ranks` = q^2
// ranks: every layer cut as the header says, by walking the model's own
// structure. Returns how many layers were cut. Call before the Params are
// bound (the executor does).
template <class Model>
int shard_model_grid(Model& model, int rank, int ranks) {
    const GridPosition at = GridPosition::of(rank, ranks);
    detail::GridWalker walker(at);
    walker.visit(model);
    return walker.layers();
}

}  // namespace tp
}  // namespace loom
