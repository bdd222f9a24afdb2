// A small GPT with random weights scaled up, for the inference tests: scaled
// by 8 its logits are far from uniform, so greedy choices are clear-cut and
// not decided by the rounding of a packed forward. The Params are bound to
// its own arena (the model does not move). Test code only.
#pragma once

#include <cstdint>

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

}  // namespace loom_test
