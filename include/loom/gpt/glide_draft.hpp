// GliDe's draft model (Du et al. 2024, arXiv 2402.02082): a small GPT whose
// blocks are self-attention (its own keys and values) -> cross-attention ->
// MLP, each a pre-LN residual. The cross-attention (nn/cross_attention.hpp)
// has only a query and an output projection: its keys and values are the
// TARGET's, draft block i reading target layer L_target - L_draft + i (a
// 1-layer draft reads the target's last layer), as the reference lines them up.
//
// Training: the target is frozen. Each forward first runs the target (a
// gpt::Model bound to its own Params) over the same tokens in a context of
// the draft's own, attaches each target layer's keys and values (the qkv its
// attention saved) to the draft's cross-attention layers, then runs the draft
// to its next-token cross-entropy. The cross-attention's stale-block mask
// (block 5 by default) makes a query at t see target positions s only when
// floor(s/5) < floor(t/5): the cache speculative decoding will give it.
// The draft is a loom model like any other: ParamArena binds only the
// draft's Params (loom_fields names them; the target is a pointer), so
// exec::SerialTrainer (AdamW, micro-batches) trains it with the target
// untouched:
//
//   auto draft = gpt::make_glide_draft(draft_config, target_config);
//   draft.target = &target_model;              // bound, loaded, frozen
//   exec::SerialTrainer trainer(draft, host_device, {.adamw = {.lr = 5e-4f}});
//   trainer.initialize(seed);
//   float loss = trainer.step(inputs, targets, lr);
//
// Inference: infer/cached_glide.hpp runs it on the target's KvCache.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/gpt/model.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/cross_attention.hpp"

namespace loom::gpt {

// How a draft's cross-attention scores the target's positions. `plain` is the
// reference's q.k / sqrt(D); its target's keys carry rotary positions, so a
// query there finds recent positions by their relative rotation. loom's GPT
// has learned absolute positions instead, and a plain draft must learn where
// "recent" is from the target's keys; `recency` subtracts ALiBi's per-head
// slope times the distance t - s (nn::recency_slope), so the freshest
// positions the cache holds score highest unless the query says otherwise.
enum class CrossScores : std::uint8_t { plain, recency };

[[nodiscard]] constexpr const char* name_of(CrossScores scores) noexcept {
    return scores == CrossScores::recency ? "recency" : "plain";
}

struct GlideBlock {
    nn::Residual<nn::LayerNorm, nn::CausalSelfAttention> attn;
    nn::Residual<nn::LayerNorm, nn::CrossAttention> cross;
    nn::Residual<nn::LayerNorm, nn::Linear, nn::Gelu, nn::Linear> mlp;
};

struct GlideDraft {
    nn::Embedding embed;
    std::vector<GlideBlock> blocks;
    nn::LayerNorm ln_f;
    nn::Linear head;
    nn::CrossEntropy loss;
    // The frozen target whose keys and values the cross-attention reads (its
    // Params bound by its own arena); set before training.
    Model* target = nullptr;
    std::unique_ptr<nn::Context> target_context = std::make_unique<nn::Context>();

    // Only the draft's layers: its Params, in this order, are what an arena binds.
    auto loom_fields() { return std::tie(embed, blocks, ln_f, head, loss); }

    [[nodiscard]] nn::CrossAttention& cross_attention(std::size_t block) { return std::get<1>(blocks[block].cross.layers); }
    [[nodiscard]] CrossScores cross_scores() {
        return !blocks.empty() && cross_attention(0).recency ? CrossScores::recency : CrossScores::plain;
    }
    // The target layer draft block `block` reads.
    [[nodiscard]] std::int64_t target_layer(std::size_t block) const {
        return target_layers - static_cast<std::int64_t>(blocks.size()) + static_cast<std::int64_t>(block);
    }

    // Runs the target over `tokens` [B, T] and attaches its layers' keys and
    // values to the cross-attention layers in `ctx` (valid until the next call).
    void attach_target(nn::Context& ctx, const Tensor& tokens) {
        LOOM_CHECK(target != nullptr, "GlideDraft: no target; set draft.target to the frozen gpt::Model whose keys "
                   "and values it reads");
        LOOM_CHECK(static_cast<std::int64_t>(target->blocks.size()) == target_layers, "GlideDraft: the target has ",
                   target->blocks.size(), " layers but the draft was made for ", target_layers);
        nn::Context& tctx = *target_context;
        tctx.reset();
        Tensor h = nn::forward(target->embed, tctx, tokens);
        for (auto& block : target->blocks) h = nn::forward(block, tctx, h);
        for (std::size_t i = 0; i < blocks.size(); ++i) {
            auto& attention = std::get<1>(target->blocks[static_cast<std::size_t>(target_layer(i))].attn.layers);
            cross_attention(i).attach(ctx, nn::CrossMemory::of_qkv(tctx.saved<nn::CausalSelfAttention::Saved>(&attention).qkv));
        }
    }

    // Logits [B, T, V] (no loss), the target's keys and values attached first; valid until ctx.reset().
    [[nodiscard]] Tensor logits(nn::Context& ctx, const Tensor& tokens) {
        ctx.reset();
        attach_target(ctx, tokens);
        Tensor h = nn::forward(embed, ctx, tokens);
        h = nn::forward(blocks, ctx, h);
        h = nn::forward(ln_f, ctx, h);
        return nn::forward(head, ctx, h);
    }

    // The training forward, to the loss (ctx's targets set): a leaf layer, so
    // nn::forward_backward and the trainers run it as one.
    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& tokens) {
        attach_target(ctx, tokens);
        Tensor h = tokens;
        std::apply([&](auto&... layer) { ((h = nn::forward(layer, ctx, h)), ...); }, loom_fields());
        return h;
    }

    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dloss) {
        Tensor g = dloss;
        nn::detail::for_each_reversed(loom_fields(), [&](auto& layer) { g = nn::backward_input(layer, ctx, g); });
        return g;
    }

    void backward_weight(nn::Context& ctx) {
        nn::detail::for_each_reversed(loom_fields(), [&](auto& layer) { nn::backward_weight(layer, ctx); });
    }

    std::int64_t target_layers = 1;
};

// A draft of `draft`'s shape reading a target of `target`'s: the same
// vocabulary, at most its layers; its cross-attention has the target's width
// and heads. `stale_block` is the training mask's block (0: none).
[[nodiscard]] inline GlideDraft make_glide_draft(const Config& draft, const Config& target,
                                                 std::int64_t stale_block = 5,
                                                 CrossScores scores = CrossScores::plain) {
    draft.validate();
    target.validate();
    LOOM_CHECK(draft.vocab == target.vocab, "GlideDraft: the draft's vocabulary of ", draft.vocab,
               " tokens is not the target's ", target.vocab, "; the draft must share the target's tokens");
    LOOM_CHECK(draft.layers <= target.layers, "GlideDraft: ", draft.layers, " draft layers read target layers ",
               target.layers, " - ", draft.layers, " + i, but the target has only ", target.layers,
               "; give the draft at most as many layers as the target");
    const std::int64_t C = draft.width;
    const float residual_std = 0.02f / std::sqrt(3.0f * static_cast<float>(draft.layers));
    GlideDraft model{nn::Embedding::make(draft.vocab, draft.seq, C), {}, nn::LayerNorm::make(C),
                     nn::Linear::make(C, draft.vocab, Init::normal(0.02f), /*with_bias=*/false), {}};
    model.target_layers = target.layers;
    model.blocks.reserve(static_cast<std::size_t>(draft.layers));
    for (std::int64_t i = 0; i < draft.layers; ++i)
        model.blocks.push_back(GlideBlock{
            {{nn::LayerNorm::make(C), nn::CausalSelfAttention::make(C, draft.heads, 0.02f, residual_std)}},
            {{nn::LayerNorm::make(C),
              nn::CrossAttention::make(C, target.width, target.heads, stale_block, 0.02f, residual_std)}},
            {{nn::LayerNorm::make(C), nn::Linear::make(C, 4 * C), nn::Gelu{},
              nn::Linear::make(4 * C, C, Init::normal(residual_std))}}});
    for (std::size_t i = 0; i < model.blocks.size(); ++i)
        model.cross_attention(i).recency = scores == CrossScores::recency;
    return model;
}

}  // namespace loom::gpt
