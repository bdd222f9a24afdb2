// The OptEx runs that exec::ModelGradient's tests compare between the host
// and a device (the fenced test device in tests/nn/test_model_gradient.cpp,
// a real GPU in tests/cuda/test_device_optex.cpp): the point a gradient is
// taken at, and OptEx<AdamW> with 2 workers whose gradients come from a
// ModelGradient on a given device.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loom/comm/thread_world.hpp"
#include "loom/core/device.hpp"
#include "loom/core/rng.hpp"
#include "loom/exec/model_gradient.hpp"
#include "loom/gpt/model.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/optex.hpp"
#include "support/device_training.hpp"

namespace loom_test::optex_runs {

// The model's initial values from seed 5, each nudged so the point is not
// one any initialisation would give.
inline std::vector<float> start_point(const loom::gpt::Config& config, std::int64_t n) {
    auto model = loom::gpt::make_model(config);
    loom::exec::ModelGradient<loom::gpt::Model> host(model, loom::host_device);
    host.arena().initialize(model, 5);
    std::vector<float> x(static_cast<std::size_t>(n)), noise(x.size());
    host.store(x);
    loom::RngStream(5, 1).fill_normal(noise, 0, 0.0f, 1e-3f);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += noise[i];
    return x;
}

// OptEx<AdamW> with 2 workers on rank threads, from start_point, gradients
// from a ModelGradient on `where`, 3 iterations of batches of 4: the
// parameters, then the 3 losses.
inline std::vector<float> run(const loom::gpt::Config& config, loom::Device where) {
    std::vector<float> result, losses;
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        auto model = loom::gpt::make_model(config);
        loom::exec::ModelGradient<loom::gpt::Model> gradient_at(model, where);
        loom::optim::OptEx<loom::optim::AdamW, loom::comm::ThreadComm> optex(
            comm, start_point(config, gradient_at.size()),
            [](std::int64_t n) { return loom::optim::AdamW(n, {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}); },
            loom::optim::OptExConfig{.workers = 2});
        std::vector<float> mine;
        for (int t = 0; t < 3; ++t) {
            const auto step = optex.iterate([&](std::span<const float> x, std::span<float> g) {
                const TokenBatch batch(4, config.seq, config.vocab, static_cast<std::uint32_t>(10 * t + comm.rank()));
                return gradient_at(x, batch.input_tensor(), batch.target_tensor(), g);
            });
            mine.push_back(step.loss);
        }
        std::vector<float> whole(static_cast<std::size_t>(gradient_at.size()));
        optex.gather_params(whole);
        if (comm.rank() == 0) {
            result = whole;
            losses = mine;
        }
    });
    result.insert(result.end(), losses.begin(), losses.end());
    return result;
}

}  // namespace loom_test::optex_runs
