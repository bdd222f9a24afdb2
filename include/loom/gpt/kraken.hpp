// The Kraken GPT: loom's GPT with every block replaced by a Kraken layer of
// a fixed degree N (gpt/kraken_layer.hpp says what the layer computes and
// why). Same embeddings, final LayerNorm and untied head; at equal layers,
// width and heads it has the GPT's matrix weights exactly (each sub-layer
// holds 1/N of a block's 12 C^2) plus N - 1 extra LayerNorm pairs and
// projection biases per layer, so "the same parameter budget" is the same
// Config with a degree.
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/gpt/kraken_layer.hpp"
#include "loom/gpt/model.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layernorm.hpp"
#include "loom/nn/linear.hpp"

namespace loom::gpt {

struct KrakenConfig {
    std::int64_t layers = 4;
    std::int64_t width = 256;
    std::int64_t heads = 4;   // in all: each sub-layer has heads / degree of them
    std::int64_t seq = 128;
    std::int64_t vocab = 256;
    std::int64_t degree = 2;  // sub-layers per layer: the tensor-parallel degree it is built for

    // The GPT of the same shape (what validate() and the engines share).
    [[nodiscard]] Config gpt() const { return {layers, width, heads, seq, vocab}; }

    void validate() const {
        gpt().validate();
        LOOM_CHECK(degree >= 1 && heads % degree == 0, "Kraken: degree ", degree, " does not divide the ", heads,
                   " heads; use a divisor of the heads");
    }

    [[nodiscard]] std::int64_t parameters() const {
        const std::int64_t C = width, N = degree, local = width / degree;
        const std::int64_t sub = 4 * C + (C * 3 * local + 3 * local) + (local * C + C) + (C * 4 * local + 4 * local) +
                                 (4 * local * C + C);
        return vocab * C + seq * C + layers * N * sub + 2 * C + vocab * C;
    }

    friend std::ostream& operator<<(std::ostream& out, const KrakenConfig& c) {
        return out << "Kraken(layers=" << c.layers << ", width=" << c.width << ", heads=" << c.heads
                   << ", seq=" << c.seq << ", vocab=" << c.vocab << ", degree=" << c.degree << ")";
    }
};

struct KrakenModel {
    nn::Embedding embed;
    KrakenFanOut fan_out;
    std::vector<KrakenLayer> layers;
    KrakenMerge merge;
    nn::LayerNorm ln_f;
    nn::Linear head;
    nn::CrossEntropy loss;
};

// The top-level field names (Executor options' field_names).
inline const std::vector<std::string> kraken_field_names{"embed", "fan_out", "layers", "merge",
                                                         "ln_f",  "head",    "loss"};

[[nodiscard]] inline KrakenModel make_kraken(const KrakenConfig& config) {
    config.validate();
    const std::int64_t C = config.width;
    // GPT-2's smaller residual projections; each sub-layer's sum of N outputs of
    // fan-in C / N has the variance of one whole block's.
    const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config.layers));
    KrakenModel model{nn::Embedding::make(config.vocab, config.seq, C), KrakenFanOut{config.degree}, {}, {},
                      nn::LayerNorm::make(C), nn::Linear::make(C, config.vocab, Init::normal(0.02f), false), {}};
    model.layers.resize(static_cast<std::size_t>(config.layers));
    for (KrakenLayer& layer : model.layers)
        for (std::int64_t i = 0; i < config.degree; ++i)
            layer.subs.push_back(KrakenSubLayer::make(C, config.heads, config.degree, residual_std));
    return model;
}

// Logits [B, T, V] for the given tokens, valid until ctx.reset().
inline Tensor logits(KrakenModel& model, nn::Context& ctx, const Tensor& tokens) {
    ctx.reset();
    Tensor h = nn::forward(model.embed, ctx, tokens);
    h = nn::forward(model.fan_out, ctx, h);
    h = nn::forward(model.layers, ctx, h);
    h = nn::forward(model.merge, ctx, h);
    h = nn::forward(model.ln_f, ctx, h);
    return nn::forward(model.head, ctx, h);
}

}  // namespace loom::gpt
