// The reference GPT: a pre-LN decoder built only from loom's layers, by the
// same composition a user's model gets. Token + learned position embeddings,
// L blocks of (LayerNorm -> causal attention -> residual, LayerNorm -> Linear
// 4C -> GELU -> Linear -> residual), a final LayerNorm and an untied head.
// Every parallel policy is checked against this model on one rank.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/gelu.hpp"
#include "loom/nn/layernorm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/residual.hpp"

namespace loom::gpt {

struct Config {
    std::int64_t layers = 4;
    std::int64_t width = 256;
    std::int64_t heads = 4;
    std::int64_t seq = 128;  // the longest sequence (positions)
    std::int64_t vocab = 256;

    void validate() const {
        LOOM_CHECK(layers >= 1 && layers <= 1024, "GPT: layers ", layers, " is not in 1..1024");
        LOOM_CHECK(width >= 1 && width <= 65536, "GPT: width ", width, " is not in 1..65536");
        LOOM_CHECK(heads >= 1 && width % heads == 0, "GPT: heads ", heads, " does not divide the width ", width);
        LOOM_CHECK(seq >= 1 && seq <= 1 << 20, "GPT: seq ", seq, " is not in 1..1048576");
        LOOM_CHECK(vocab >= 2 && vocab <= 1 << 24, "GPT: vocab ", vocab, " is not in 2..16777216");
    }

    // Parameters, and training FLOPs per token (6 per weight for the
    // matmuls forward and backward, plus the causal attention's own).
    [[nodiscard]] std::int64_t parameters() const {
        return vocab * width + seq * width + layers * (12 * width * width + 13 * width) + 2 * width + vocab * width;
    }
    [[nodiscard]] double flops_per_token(std::int64_t sequence) const {
        const auto L = static_cast<double>(layers), C = static_cast<double>(width), V = static_cast<double>(vocab);
        const double matmul_weights = L * 12.0 * C * C + V * C;
        // QK^T and PV, causal (half the T x T), forward 2 and backward 4 matmuls' worth: 6 * 2 * T/2 * C per layer.
        const double attention = 6.0 * L * static_cast<double>(sequence) * C;
        return 6.0 * matmul_weights + attention;
    }

    friend bool operator==(const Config&, const Config&) = default;

    friend std::ostream& operator<<(std::ostream& out, const Config& c) {
        return out << "GPT(layers=" << c.layers << ", width=" << c.width << ", heads=" << c.heads
                   << ", seq=" << c.seq << ", vocab=" << c.vocab << ")";
    }
};

struct Block {
    nn::Residual<nn::LayerNorm, nn::CausalSelfAttention> attn;
    nn::Residual<nn::LayerNorm, nn::Linear, nn::Gelu, nn::Linear> mlp;
};

struct Model {
    nn::Embedding embed;
    std::vector<Block> blocks;
    nn::LayerNorm ln_f;
    nn::Linear head;
    nn::CrossEntropy loss;
};

[[nodiscard]] inline Model make_model(const Config& config) {
    config.validate();
    const std::int64_t C = config.width;
    // GPT-2: residual projections start smaller, so the residual stream's
    // variance does not grow with depth.
    const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config.layers));
    Model model{nn::Embedding::make(config.vocab, config.seq, C), {}, nn::LayerNorm::make(C),
                nn::Linear::make(C, config.vocab, Init::normal(0.02f), /*with_bias=*/false), {}};
    model.blocks.reserve(static_cast<std::size_t>(config.layers));
    for (std::int64_t i = 0; i < config.layers; ++i) {
        model.blocks.push_back(Block{
            {{nn::LayerNorm::make(C), nn::CausalSelfAttention::make(C, config.heads, 0.02f, residual_std)}},
            {{nn::LayerNorm::make(C), nn::Linear::make(C, 4 * C), nn::Gelu{},
              nn::Linear::make(4 * C, C, Init::normal(residual_std))}}});
    }
    return model;
}

// Readable names of the model's Params, in reflection (= arena) order, as in
// checkpoints: "embed.token", "blocks.0.attn.qkv.weight", ..., "head.weight".
// Params with no elements (the head's absent bias) are named too.
[[nodiscard]] inline std::vector<std::string> parameter_names(const Config& config) {
    std::vector<std::string> names{"embed.token", "embed.position"};
    for (std::int64_t i = 0; i < config.layers; ++i) {
        const std::string b = "blocks." + std::to_string(i) + ".";
        for (const char* leaf : {"ln1.gain", "ln1.shift", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                                 "attn.proj.bias", "ln2.gain", "ln2.shift", "mlp.fc.weight", "mlp.fc.bias",
                                 "mlp.proj.weight", "mlp.proj.bias"})
            names.push_back(b + leaf);
    }
    for (const char* leaf : {"ln_f.gain", "ln_f.shift", "head.weight", "head.bias"}) names.emplace_back(leaf);
    return names;
}

// Training and evaluation use nn::forward_backward / nn::evaluate: the model
// ends in its loss layer, like any user model.

// Logits [B, T, V] for the given tokens, valid until ctx.reset().
inline Tensor logits(Model& model, nn::Context& ctx, const Tensor& tokens) {
    ctx.reset();
    Tensor h = nn::forward(model.embed, ctx, tokens);
    h = nn::forward(model.blocks, ctx, h);
    h = nn::forward(model.ln_f, ctx, h);
    return nn::forward(model.head, ctx, h);
}

}  // namespace loom::gpt
