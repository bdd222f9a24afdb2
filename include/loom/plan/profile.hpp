// The short profiling pass behind balanced pipeline partitions: each unit of
// a model (nn/units.hpp) timed on one micro-batch, forward plus backward, on
// this machine, on the host or on the device the model will train on (the
// clock waits for the device after each unit). The times are what schedule::balance splits (measured costs; a
// user with a cost model passes its own numbers instead).
//
//   auto probe = gpt::make_model(config);   // a model of the same shape, not the training one
//   auto costs = plan::profile_units(probe, seed, inputs, targets);  // seconds per unit
//
// Rank threads profiling at once would disturb each other and different
// processes would time differently, so one rank profiles and broadcasts
// (train_gpt does): every rank must split the model the same way.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/nn/units.hpp"

namespace loom::plan {

// Seconds per unit (forward + backward of one micro-batch of `inputs`), the
// median of `repeats` passes after one warm-up pass, on `where`, with the
// run's matrix-product precision (bf16 costs differ from f32's both ways:
// tensor cores on a GPU, an emulation on the host). Binds `model` to a
// parameter arena of its own there, initialised from `seed`.
template <class Model>
[[nodiscard]] std::vector<double> profile_units(Model& model, std::uint64_t seed, const Tensor& inputs,
                                                const Tensor& targets, int repeats = 3,
                                                loom::Device where = host_device,
                                                kernels::MatmulPrecision matmul = kernels::MatmulPrecision::f32) {
    LOOM_CHECK(repeats >= 1, "profile_units: ", repeats, " repeats; give at least 1");
    nn::ParamArena arena(model, where);
    arena.initialize(model, seed);
    std::vector<nn::Unit> units = nn::units_of(model);
    LOOM_CHECK(!units.empty(), "profile_units: the model has no units to time");
    const std::size_t n = units.size();
    std::vector<std::vector<double>> seconds(n);
    nn::Context ctx;
    ctx.set_device(where);
    ctx.set_matmul_precision(matmul);
    using clock = std::chrono::steady_clock;
    for (int pass = 0; pass <= repeats; ++pass) {
        arena.zero_grads();
        ctx.reset();
        ctx.set_targets(ctx.on_device(targets));
        std::vector<double> took(n, 0.0);
        Tensor x = ctx.on_device(inputs);
        synchronize_device(where);
        for (std::size_t u = 0; u < n; ++u) {
            const auto t0 = clock::now();
            x = units[u].forward(ctx, x);
            synchronize_device(where);
            took[u] += std::chrono::duration<double>(clock::now() - t0).count();
        }
        float seed_gradient = 1.0f;
        Tensor g = Tensor::of(&seed_gradient, {1});
        for (std::size_t u = n; u-- > 0;) {
            const auto t0 = clock::now();
            g = units[u].backward_input(ctx, g);
            units[u].backward_weight(ctx);
            synchronize_device(where);
            took[u] += std::chrono::duration<double>(clock::now() - t0).count();
        }
        if (pass == 0) continue;  // warm-up: first-touch of activation memory and caches
        for (std::size_t u = 0; u < n; ++u) seconds[u].push_back(took[u]);
    }
    std::vector<double> median(n);
    for (std::size_t u = 0; u < n; ++u) {
        auto& s = seconds[u];
        std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(s.size() / 2), s.end());
        median[u] = s[s.size() / 2];
    }
    return median;
}

}  // namespace loom::plan
