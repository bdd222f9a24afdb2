// TensorParallel (Megatron 1D): each layer's weights cut over the tp axis,
// the f/g conjugate operators the only communication (nn/tensor_group.hpp).
// This header holds the policy tag and the cutting of Params: a shard keeps
// its place in the whole tensor (Param::slice), so it initialises to the
// serial run's values there and a checkpoint can be reassembled whole.
//
//   tp::shard(mlp.fc, nn::Split::columns, rank, t);   // W [4C/t, C], b [4C/t]
//   tp::shard(mlp.proj, nn::Split::rows, rank, t);    // W [C, 4C/t], b [C] whole
//   tp::shard(block.attn, rank, t);                    // heads/t heads per rank
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/gelu.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/tensor_group.hpp"
#include "loom/parallel/policy.hpp"

namespace loom {

struct TensorParallel {
    static constexpr PolicyKind kind = PolicyKind::tensor_parallel;
    static void describe(std::ostream& out) { out << "TensorParallel"; }
};

namespace tp {

// Cuts `p` to rank `rank`'s 1/degree along `dim`, which is `groups` equal
// blocks cut alike (3 for q, k, v); `what` names it in errors.
inline void split_param(Param& p, int dim, int rank, int degree, std::string_view what, std::int64_t groups = 1) {
    LOOM_CHECK(!p.slice.sliced(), what, " is already a shard (", p, "); cut a Param once");
    LOOM_CHECK(degree >= 1 && rank >= 0 && rank < degree, what, ": rank ", rank, " of a tp degree ", degree);
    LOOM_CHECK(dim >= 0 && dim < p.shape.rank(), what, ": dimension ", dim, " of ", p.shape, " does not exist");
    const std::int64_t n = p.shape[dim];
    LOOM_CHECK(groups >= 1 && n % groups == 0, what, ": dimension ", dim, " of ", p.shape, " is not ", groups,
               " equal blocks");
    const std::int64_t block = n / groups;
    LOOM_CHECK(block % degree == 0, what, ": tp degree ", degree, " does not divide dimension ", dim, " of ",
               p.shape, groups > 1 ? loom::detail::concat(" (", groups, " blocks of ", block, ")")
                                   : loom::detail::concat(" (", n, ")"),
               "; use a degree that divides ", block);
    if (degree == 1) return;
    p.slice = ParamSlice{p.shape, dim, rank * (block / degree), groups};
    p.shape[dim] = n / degree;
}

// Makes `layer` rank `rank`'s shard of a column- or row-parallel Linear;
// `groups` > 1 cuts each of that many output blocks alike (columns only).
inline void shard(nn::Linear& layer, nn::Split split, int rank, int degree, std::int64_t groups = 1) {
    LOOM_CHECK(split != nn::Split::none, "tp::shard: Linear ", layer.out(), " x ", layer.in(),
               " needs Split::columns or Split::rows");
    const bool columns = split == nn::Split::columns;
    const auto what = loom::detail::concat("Linear ", layer.in(), " -> ", layer.out(), columns ? " (columns)" : " (rows)");
    split_param(layer.weight, columns ? 0 : 1, rank, degree, what + " weight", columns ? groups : 1);
    if (columns && layer.has_bias()) split_param(layer.bias, 0, rank, degree, what + " bias", groups);
    layer.split = degree == 1 ? nn::Split::none : split;
}

// Attention with its heads split: q, k and v of this rank's heads (qkv by
// columns, in three blocks), the output projection by rows.
inline void shard(nn::CausalSelfAttention& layer, int rank, int degree) {
    LOOM_CHECK(degree >= 1 && layer.heads % degree == 0, "CausalSelfAttention: tp degree ", degree,
               " does not divide the ", layer.heads, " heads; use a degree that divides ", layer.heads);
    shard(layer.qkv, nn::Split::columns, rank, degree, 3);
    shard(layer.proj, nn::Split::rows, rank, degree);
}


// Layers that act on each feature alone, so a column-split Linear's slice of
// the features can pass through them to the row-split Linear that follows.
// Specialise to true for your own elementwise layers.
template <class L>
inline constexpr bool keeps_features_sharded = std::is_same_v<L, nn::Gelu>;

namespace detail {

// One chain of layers (a composite's fields in order): a Linear, then only
// elementwise layers, then a Linear make a column -> row pair; attention
// splits its heads; anything else runs whole and ends a pending pair.
class ShardWalker {
public:
    ShardWalker(int rank, int degree) : rank_(rank), degree_(degree) {}

    // A composite's fields form their own chain; a pair never crosses into
    // or out of it.
    template <class L>
    void chain(L& composite) {
        pending_ = nullptr;
        reflect::for_each_field(composite, [&](auto& field, std::size_t) { visit(field); });
        pending_ = nullptr;
    }

    template <class F>
    void visit(F& field) {
        using T = std::remove_cvref_t<F>;
        if constexpr (reflect::ParamField<T> || reflect::is_config<T>()) {
            // not a layer
        } else if constexpr (std::is_same_v<T, nn::Linear>) {
            if (pending_ != nullptr) {
                shard(*pending_, nn::Split::columns, rank_, degree_);
                shard(field, nn::Split::rows, rank_, degree_);
                ++pairs_;
                pending_ = nullptr;
            } else {
                pending_ = &field;
            }
        } else if constexpr (keeps_features_sharded<T>) {
            // the pair, if any, goes on through it
        } else if constexpr (std::is_same_v<T, nn::CausalSelfAttention>) {
            pending_ = nullptr;
            shard(field, rank_, degree_);
            ++attentions_;
        } else if constexpr (reflect::LayerSequence<T>) {
            pending_ = nullptr;
            for (auto& element : field) visit(element);
        } else if constexpr (reflect::has_custom_fields<T> || reflect::pfr_reflectable<T>) {
            pending_ = nullptr;
            chain(field);
        } else {
            pending_ = nullptr;  // an opaque layer: runs whole on every rank
        }
    }

    [[nodiscard]] int pairs() const noexcept { return pairs_; }
    [[nodiscard]] int attentions() const noexcept { return attentions_; }

private:
    int rank_, degree_;
    nn::Linear* pending_ = nullptr;
    int pairs_ = 0, attentions_ = 0;
};

}  // namespace detail

// What shard_model cut.
struct ShardSummary {
    int linear_pairs = 0;  // column -> row pairs (MLPs)
    int attentions = 0;    // attention layers with their heads split
};

// Makes `model` tp rank `rank`'s shard of itself over `degree` ranks: every
// column -> (elementwise) -> row pair of Linears and every attention, found
// by walking the model's own structure, so a user block written with loom's
// layers is cut the same way as the GPT. Layers outside those patterns
// (LayerNorm, a lone Linear) stay whole on every rank. Call before the
// model's Params are bound (the executor does).
template <class Model>
ShardSummary shard_model(Model& model, int rank, int degree) {
    LOOM_CHECK(degree >= 1 && rank >= 0 && rank < degree, "tp::shard_model: rank ", rank, " of a tp degree ", degree);
    detail::ShardWalker walker(rank, degree);
    walker.visit(model);
    return {walker.pairs(), walker.attentions()};
}

}  // namespace tp
}  // namespace loom
