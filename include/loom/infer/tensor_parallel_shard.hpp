// The cut of loom's GPT that tensor-parallel serving runs (Megatron's, as
// training cuts it): each of `degree` ranks holds, per block, its heads of
// attention (qkv by columns, in q, k and v blocks; the output projection by
// rows) and its slice of the MLP (fc by columns, fc's partner by rows), so a
// block needs one sum over the group after each row-cut Linear (Megatron's
// g). The token and position embeddings, the LayerNorms and the head stay
// whole on every rank. The cuts are parallel/tensor_parallel.hpp's own, so a
// shard's Params know their place in the whole tensors (Param::slice):
// ParamArena::initialize gives a shard the whole model's values there, and
// load_whole_values copies a whole checkpoint's in.
//
// Why the head stays whole in memory but is computed split: its logits are
// the widest product of a small model's step, so each rank computes the
// logits of its own run of vocabulary rows and the group all-gathers them.
// Gathered logits are the same bits on every rank (each logit is computed by
// one rank and copied), so ranks sampling with the same seed pick the same
// token whatever rounding a transport's all-reduce leaves on each rank, with
// no broadcast of tokens. Keeping the weights whole (as the token table, its
// size, already is) lets any vocabulary serve at any degree: GPT-2's 50,257
// tokens divide by no degree > 1, so the rows per rank are ceil(V / degree).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <tuple>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"
#include "loom/gpt/model.hpp"
#include "loom/parallel/tensor_parallel.hpp"

namespace loom::infer {

// Makes `model` (built by gpt::make_model, not yet bound to an arena) tp rank
// `rank`'s serving shard of `degree`. Bind it and initialise it
// (ParamArena::initialize: the whole model's values at the same seed) or
// fill it with load_whole_values.
inline void shard_for_serving(gpt::Model& model, int rank, int degree) {
    LOOM_CHECK(degree >= 1 && rank >= 0 && rank < degree, "shard_for_serving: rank ", rank,
               " is not in a tp group of ", degree, " ranks; give a degree >= 1 and a rank in [0, ", degree, ")");
    bool bound = false;  // a Param of no elements (a pipeline stage's absent embeddings) counts as bound
    reflect::visit_params(model, [&](const Param& p, std::string_view) { bound = bound || (p.numel() > 0 && p.bound()); });
    LOOM_CHECK(!bound, "shard_for_serving: the model is already bound to a ParamArena; cut it first, then bind it");
    for (gpt::Block& block : model.blocks) {
        tp::shard(std::get<1>(block.attn.layers), rank, degree);  // names a degree that does not divide the heads
        tp::shard(std::get<1>(block.mlp.layers), nn::Split::columns, rank, degree);
        tp::shard(std::get<3>(block.mlp.layers), nn::Split::rows, rank, degree);
    }
}

// Fills a bound shard from the whole model's values in serial order (a
// whole model's ParamArena::values(), or what gpt::load_checkpoint reads),
// each element from its place in the whole tensor.
inline void load_whole_values(gpt::Model& shard, std::span<const float> whole) {
    std::int64_t total = 0;
    reflect::visit_params(shard, [&](const Param& p, std::string_view) { total += p.full_shape().numel(); });
    LOOM_CHECK(total == static_cast<std::int64_t>(whole.size()), "load_whole_values: ", whole.size(),
               " values given but the whole model has ", total, "; give the whole model's values in serial order");
    std::int64_t offset = 0;
    reflect::visit_params(shard, [&](Param& p, std::string_view path) {
        LOOM_CHECK(p.bound(), "load_whole_values: parameter ", path, " is not bound; bind the shard to a ParamArena first");
        float* local = p.numel() > 0 ? p.value.data<float>() : nullptr;
        for (std::int64_t k = 0; k < p.numel(); ++k)
            local[k] = whole[static_cast<std::size_t>(offset + p.full_index(k))];
        offset += p.full_shape().numel();
    });
}

// The head rows (vocabulary ids) rank `rank` computes logits for:
// [first, first + count), each rank's run `per_rank` long but the last's.
struct VocabRows {
    std::int64_t first = 0, count = 0, per_rank = 0;
};

[[nodiscard]] inline VocabRows vocab_rows(std::int64_t vocab, int rank, int degree) {
    const std::int64_t per = (vocab + degree - 1) / degree;
    const std::int64_t first = std::min(vocab, rank * per);
    return {first, std::min(vocab, first + per) - first, per};
}

// Refuses a model that is not tp rank `rank`'s serving shard of `degree`
// for `config`, in one line naming what is cut otherwise.
inline void check_serving_shard(const gpt::Model& model, const gpt::Config& config, int rank, int degree) {
    LOOM_CHECK(config.heads % degree == 0, "CachedGpt: a tp group of ", degree, " ranks does not divide the ",
               config.heads, " heads; use a degree that divides ", config.heads);
    const std::int64_t C = config.width, heads = config.heads / degree;
    const auto cut_it = loom::detail::concat("; cut the model with infer::shard_for_serving(model, ", rank, ", ",
                                             degree, ") before binding it");
    LOOM_CHECK(!model.embed.token.slice.sliced() && !model.head.weight.slice.sliced(),
               "CachedGpt: the ", model.embed.token.slice.sliced() ? "token embedding" : "head",
               " is cut by vocabulary (training's cut); serving keeps the embeddings and the head whole on every rank",
               cut_it);
    for (std::size_t l = 0; l < model.blocks.size(); ++l) {
        const auto& attention = std::get<1>(model.blocks[l].attn.layers);
        const auto& fc = std::get<1>(model.blocks[l].mlp.layers);
        const auto& fc_out = std::get<3>(model.blocks[l].mlp.layers);
        LOOM_CHECK(attention.local_heads() == heads && attention.width() == C, "CachedGpt: block ", l, " holds ",
                   attention.local_heads(), " of the ", config.heads, " heads but rank ", rank, " of a tp group of ",
                   degree, " serves ", heads, cut_it);
        LOOM_CHECK(fc.out() == 4 * C / degree && fc_out.in() == 4 * C / degree, "CachedGpt: block ", l,
                   "'s MLP holds ", fc.out(), " of the ", 4 * C, " hidden features but rank ", rank,
                   " of a tp group of ", degree, " serves ", 4 * C / degree, cut_it);
        // A shard of another rank has the right shapes and the wrong weights: its heads' keys would be cached as ours.
        const std::int64_t start = degree == 1 ? 0 : attention.qkv.weight.slice.start();
        const std::int64_t fc_start = degree == 1 ? 0 : fc.weight.slice.start();
        LOOM_CHECK(start == rank * (C / degree) && fc_start == rank * (4 * C / degree), "CachedGpt: block ", l,
                   " is rank ", start / (C / degree), "'s shard but this is rank ", rank, " of the tp group",
                   cut_it);
    }
}

}  // namespace loom::infer
