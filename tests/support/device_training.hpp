// What the device training tests share, on the fenced test device
// (tests/nn/test_device_layers.cpp) and on a GPU
// (tests/cuda/test_device_training.cpp): seeded token batches, the executor's
// strategies run through run_ranks_on on any device, and the two ways
// their results are compared (equal bits, or a relative norm). Test code only.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/device_ranks.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/exec/executor.hpp"
#include "loom/exec/serial_trainer.hpp"
#include "loom/gpt/model.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/param_arena.hpp"

namespace loom_test {

// Random token ids and targets [rows, seq] in [0, vocab), on the host; the
// same for the same seed.
struct TokenBatch {
    std::int64_t rows = 0, seq = 0;
    std::vector<std::int32_t> inputs, targets;

    TokenBatch(std::int64_t rows_, std::int64_t seq_, std::int64_t vocab, std::uint32_t seed)
        : rows(rows_), seq(seq_), inputs(static_cast<std::size_t>(rows_ * seq_)), targets(inputs.size()) {
        std::mt19937 rng(seed);
        std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(vocab) - 1);
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            inputs[i] = id(rng);
            targets[i] = id(rng);
        }
    }
    [[nodiscard]] loom::Tensor input_tensor() const { return loom::Tensor::of(inputs.data(), {rows, seq}); }
    [[nodiscard]] loom::Tensor target_tensor() const { return loom::Tensor::of(targets.data(), {rows, seq}); }
};

// How many elements of two arrays differ in their bits (all, if the sizes differ).
inline std::size_t differing_bits(std::span<const float> a, std::span<const float> b) {
    if (a.size() != b.size()) return a.size() + b.size();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        bad += std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i]);
    return bad;
}

// ||a - b|| / ||b||.
inline double relative_difference(std::span<const float> a, std::span<const float> b) {
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
        diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        norm += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(diff / norm);
}

// One forward and backward pass of the GPT `config` (initialised with
// `seed`) on `where`: its loss, and the values and gradients copied back.
struct GradientRun {
    float loss = 0;
    std::vector<float> values, grads;
};

inline GradientRun forward_backward_on(loom::Device where, const loom::gpt::Config& config, std::uint64_t seed,
                                       const TokenBatch& batch) {
    auto model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model, where);
    arena.initialize(model, seed);
    loom::nn::Context ctx;
    ctx.set_device(where);
    GradientRun run;
    run.loss = loom::nn::forward_backward(model, ctx, batch.input_tensor(), batch.target_tensor());
    run.values = loom::to_host<float>(arena.values_tensor());
    run.grads = loom::to_host<float>(arena.grads_tensor());
    return run;
}

// A checkpoint's state from the host continued on `where`: one SerialTrainer
// step on the host from `seed` (`first`), its state loaded by a trainer on
// `where`, then `second` on both.
struct ResumedRun {
    std::vector<float> saved;            // the values the host's "checkpoint" held
    std::vector<float> loaded;           // the same read back from `where` before its step
    float host_loss = 0, device_loss = 0;  // of `second`
    std::vector<float> host_values, device_values;
    std::int64_t device_steps = 0;
};

inline ResumedRun resume_on(loom::Device where, const loom::gpt::Config& config, std::uint64_t seed,
                            const TokenBatch& first, const TokenBatch& second) {
    const loom::optim::AdamWConfig adamw{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
    auto host_model = loom::gpt::make_model(config);
    loom::exec::SerialTrainer host(host_model, loom::host_device, {.adamw = adamw});
    host.initialize(seed);
    (void)host.step(first.input_tensor(), first.target_tensor(), 1e-3f);
    const auto n = static_cast<std::size_t>(host.parameter_count());
    ResumedRun run;
    run.saved.resize(n);
    std::vector<float> m(n), v(n);
    host.gather_state(run.saved, m, v);

    auto device_model = loom::gpt::make_model(config);
    loom::exec::SerialTrainer on_device(device_model, where, {.adamw = adamw});
    on_device.load_state(run.saved, m, v, host.optimizer_steps());
    run.loaded.resize(n);
    std::vector<float> scratch_m(n), scratch_v(n);
    on_device.gather_state(run.loaded, scratch_m, scratch_v);
    run.host_loss = host.step(second.input_tensor(), second.target_tensor(), 1e-3f);
    run.device_loss = on_device.step(second.input_tensor(), second.target_tensor(), 1e-3f);
    run.host_values.resize(n);
    run.device_values.resize(n);
    host.gather_state(run.host_values, m, v);
    on_device.gather_state(run.device_values, m, v);
    run.device_steps = on_device.optimizer_steps();
    return run;
}

struct StrategyRun {
    std::vector<float> losses;     // rank 0's, one per step
    std::vector<float> values, m, v;  // the gathered state after the last step
    std::vector<float> compression;   // rank 0's dp compressor state (empty without one)
};

// A strategy's ranks: `dp` x `pp` x `tp` x `sp` rank threads (an axis of 1 is left out).
struct RankGrid {
    int dp = 1, pp = 1, tp = 1, sp = 1;
};

// `steps` steps of the GPT `config` under `plan` with 2 micro-batches on
// `where`, ranks from run_ranks_on (ThreadWorld on the host, the registered
// runner on a device), as train_gpt runs them: each dp rank trains on its
// share of every global batch of `rows` sequences (every stage of a pipeline,
// tp rank and sp rank on the same share), batch s drawn with seed `seed` + s;
// the layers' matrix products at `matmul`.
inline StrategyRun train_strategy(loom::Device where, const loom::gpt::Config& config,
                                  const loom::exec::ExecutionPlan& plan, RankGrid grid, std::int64_t rows, int steps,
                                  std::uint32_t seed,
                                  loom::kernels::MatmulPrecision matmul = loom::kernels::MatmulPrecision::f32) {
    StrategyRun run;
    loom::comm::run_ranks_on(where, grid.dp * grid.pp * grid.tp * grid.sp, [&](loom::comm::AnyComm& world) {
        loom::comm::Mesh<loom::comm::AnyComm> mesh(
            world, {{"dp", grid.dp}, {"pp", grid.pp}, {"tp", grid.tp}, {"sp", grid.sp}});
        auto& dp = mesh.axis("dp");
        // Sequence-parallel ranks reduce gradients with the data-parallel ones.
        auto& gradients = grid.sp > 1 ? mesh.combined({"dp", "sp"}) : dp;
        auto model = loom::gpt::make_model(config);
        loom::exec::Executor<loom::comm::AnyComm> exec(
            model, gradients, grid.pp > 1 ? &mesh.axis("pp") : nullptr, grid.tp > 1 ? &mesh.axis("tp") : nullptr,
            grid.sp > 1 ? &mesh.axis("sp") : nullptr, plan,
            {.micro_batches = 2,
             .adamw = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0},
             .field_names = {"embed", "blocks", "ln_f", "head", "loss"},
             .device = where,
             .matmul = matmul});
        exec.initialize(9);
        std::vector<float> losses;
        const std::int64_t share = rows / grid.dp, first = dp.rank() * share;
        for (int s = 0; s < steps; ++s) {
            const TokenBatch b(rows, config.seq, config.vocab, seed + static_cast<std::uint32_t>(s));
            losses.push_back(exec.step(b.input_tensor().slice(0, first, first + share),
                                       b.target_tensor().slice(0, first, first + share), 1e-3f));
        }
        std::vector<float> values(static_cast<std::size_t>(exec.parameter_count())), m(values.size()), v(values.size());
        exec.gather_state(values, m, v);
        std::vector<float> compression(static_cast<std::size_t>(exec.gradient_exchange().state_size()));
        exec.gradient_exchange().save_state(compression);
        if (world.rank() == 0) run = {losses, values, m, v, compression};
    });
    return run;
}

}  // namespace loom_test
