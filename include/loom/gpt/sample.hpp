// Sampling text from a trained GPT: the prompt's bytes, then `count` tokens
// drawn one at a time from the softmax of the last position's logits
// (temperature 1), over a window of at most the model's sequence length.
// Deterministic in the seed: draw k uses RngStream(seed, k).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/rng.hpp"
#include "loom/gpt/model.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/nn/context.hpp"

namespace loom::gpt {

[[nodiscard]] inline std::string sample(Model& model, const Config& config, std::string_view prompt, std::int64_t count,
                                        std::uint64_t seed, float temperature = 1.0f) {
    std::vector<std::int32_t> tokens;
    for (char c : prompt) tokens.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c) % config.vocab));
    if (tokens.empty()) tokens.push_back(0);
    nn::Context ctx;
    std::vector<float> probabilities(static_cast<std::size_t>(config.vocab));
    for (std::int64_t k = 0; k < count; ++k) {
        const auto window = static_cast<std::int64_t>(std::min<std::size_t>(tokens.size(), static_cast<std::size_t>(config.seq)));
        std::vector<std::int32_t> input(tokens.end() - window, tokens.end());
        const Tensor logits = gpt::logits(model, ctx, Tensor::of(input.data(), {1, window}));
        const float* last = logits.data<float>() + (window - 1) * config.vocab;
        const float top = *std::max_element(last, last + config.vocab);
        double total = 0;
        for (std::int64_t v = 0; v < config.vocab; ++v) {
            probabilities[static_cast<std::size_t>(v)] = std::exp((last[v] - top) / temperature);
            total += probabilities[static_cast<std::size_t>(v)];
        }
        double u = RngStream{seed, static_cast<std::uint64_t>(k)}.uniform(0) * total;
        std::int32_t chosen = static_cast<std::int32_t>(config.vocab - 1);
        for (std::int64_t v = 0; v < config.vocab; ++v) {
            u -= probabilities[static_cast<std::size_t>(v)];
            if (u <= 0) {
                chosen = static_cast<std::int32_t>(v);
                break;
            }
        }
        tokens.push_back(chosen);
    }
    // Bytes as text; unprintable ones as '.', newlines kept.
    std::string text;
    for (std::int32_t t : tokens) {
        const auto c = static_cast<unsigned char>(t);
        text += (c == '\n' || (c >= 32 && c < 127)) ? static_cast<char>(c) : '.';
    }
    return text;
}

// The same from a model's flat values (a checkpoint's, or the whole state a
// run gathered), on a fresh host model of `config`: what a run learned,
// sampled without the training's communicators or devices.
[[nodiscard]] inline std::string sample(const Config& config, std::span<const float> values, std::string_view prompt,
                                        std::int64_t count, std::uint64_t seed) {
    Model model = make_model(config);
    nn::ParamArena arena(model);
    LOOM_CHECK(values.size() == arena.values().size(), "gpt::sample: ", values.size(), " values for a model of ",
               arena.values().size(), " parameters");
    std::copy(values.begin(), values.end(), arena.values().begin());
    return sample(model, config, prompt, count, seed);
}

}  // namespace loom::gpt
