// A small GPT with random weights scaled up, for the inference tests: scaled
// by 8 its logits are far from uniform, so greedy choices are clear-cut and
// not decided by the rounding of a packed forward. The Params are bound to
// its own arena (the model does not move). Test code only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/gpt/model.hpp"
#include "loom/nn/param_arena.hpp"

namespace loom_test {

struct ScaledGpt {
    loom::gpt::Config config;
    loom::gpt::Model model;
    loom::nn::ParamArena arena;

    ScaledGpt(const loom::gpt::Config& shape, std::uint64_t seed, float scale)
        : config(shape), model(loom::gpt::make_model(config)), arena(model) {
        arena.initialize(model, seed);
        for (float& v : arena.values()) v *= scale;
    }
    ScaledGpt(const ScaledGpt&) = delete;
    ScaledGpt& operator=(const ScaledGpt&) = delete;
};

// A prompt of `length` tokens below `vocab`, different for each `salt`.
inline std::vector<std::int32_t> prompt_of(std::int64_t length, std::int32_t vocab, std::int32_t salt) {
    std::vector<std::int32_t> tokens;
    for (std::int64_t i = 0; i < length; ++i)
        tokens.push_back(static_cast<std::int32_t>((i * 5 + salt * 3 + 2) % vocab));
    return tokens;
}

// max |a - b| / max |b|: logits compared at the scale of the reference.
inline double max_relative_difference(std::span<const float> a, std::span<const float> b) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    }
    return diff / scale;
}

}  // namespace loom_test
