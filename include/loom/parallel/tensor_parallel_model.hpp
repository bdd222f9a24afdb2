// tp::shard_model: tensor parallelism for a whole model, by walking its
// structure as reflection sees it and cutting Megatron's patterns with the
// functions of tensor_parallel.hpp and tensor_parallel_vocab.hpp.
#pragma once

#include <type_traits>

#include "loom/core/error.hpp"
#include "loom/core/reflect.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/gelu.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/residual.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_vocab.hpp"

namespace loom::tp {

// Layers that act on each element alone, so a column-split Linear's slice of
// the features can pass through them to the row-split Linear that follows
// (1D), and a q x q block of sequences and features can pass through them
// (Optimus 2D): no mixing of features, nor of sequences. Specialise to true
// for your own elementwise layers.
template <class L>
inline constexpr bool keeps_features_sharded = std::is_same_v<L, nn::Gelu>;

// nn::Residual computes itself but runs its fields in order and adds its
// input: the walkers go through it as through a composite.
template <class L>
inline constexpr bool is_residual = false;
template <class... Layers>
inline constexpr bool is_residual<nn::Residual<Layers...>> = true;

namespace detail {

// One chain of layers (a composite's fields in order): a Linear, then only
// elementwise layers, then a Linear make a column -> row pair; a Linear then
// the loss make the vocabulary head; attention splits its heads, an embedding
// its vocabulary; anything else runs whole and ends a pending pair.
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
        } else if constexpr (std::is_same_v<T, nn::Embedding>) {
            pending_ = nullptr;
            shard(field, rank_, degree_);
            ++embeddings_;
        } else if constexpr (std::is_same_v<T, nn::CrossEntropy>) {
            // A Linear straight into the loss is the vocabulary head: its
            // logits stay cut, the loss reduces across the group.
            if (pending_ != nullptr) {
                shard_vocab_head(*pending_, field, rank_, degree_);
                ++vocab_heads_;
            }
            pending_ = nullptr;
        } else if constexpr (std::is_same_v<T, nn::CausalSelfAttention>) {
            pending_ = nullptr;
            shard(field, rank_, degree_);
            ++attentions_;
        } else if constexpr (reflect::LayerSequence<T>) {
            pending_ = nullptr;
            for (auto& element : field) visit(element);
        } else if constexpr (nn::Leaf<T> && !is_residual<T>) {
            // A layer that computes itself in its own way: its Linears may not
            // run as a chain, so it runs whole on every rank, inputs and all.
            pending_ = nullptr;
        } else if constexpr (reflect::has_custom_fields<T> || reflect::pfr_reflectable<T>) {
            pending_ = nullptr;
            chain(field);
        } else {
            pending_ = nullptr;  // an opaque layer: runs whole on every rank
        }
    }

    [[nodiscard]] int pairs() const noexcept { return pairs_; }
    [[nodiscard]] int attentions() const noexcept { return attentions_; }
    [[nodiscard]] int embeddings() const noexcept { return embeddings_; }
    [[nodiscard]] int vocab_heads() const noexcept { return vocab_heads_; }

private:
    int rank_, degree_;
    nn::Linear* pending_ = nullptr;
    int pairs_ = 0, attentions_ = 0, embeddings_ = 0, vocab_heads_ = 0;
};

}  // namespace detail

// What shard_model cut.
struct ShardSummary {
    int linear_pairs = 0;  // column -> row pairs (MLPs)
    int attentions = 0;    // attention layers with their heads split
    int embeddings = 0;    // token tables cut by vocabulary
    int vocab_heads = 0;   // Linear -> CrossEntropy ends cut by vocabulary
};

// Makes `model` tp rank `rank`'s shard of itself over `degree` ranks: every
// column -> (elementwise) -> row pair of Linears, every attention, every
// embedding and the Linear that feeds the loss, found by walking the model's
// own structure, so a user block written with loom's layers is cut the same
// way as the GPT. Layers outside those patterns (LayerNorm, a lone Linear)
// stay whole on every rank. Call before the model's Params are bound (the
// executor does).
template <class Model>
ShardSummary shard_model(Model& model, int rank, int degree) {
    LOOM_CHECK(degree >= 1 && rank >= 0 && rank < degree, "tp::shard_model: rank ", rank, " of a tp degree ", degree);
    detail::ShardWalker walker(rank, degree);
    walker.visit(model);
    return {walker.pairs(), walker.attentions(), walker.embeddings(), walker.vocab_heads()};
}

}  // namespace loom::tp
