// SerialTrainer: one rank trains a whole model on the host or on a device,
// with AdamW, micro-batches and checkpoints, and no communicator: the serial
// run that every strategy is compared with, and the GPU benchmark's trainer.
// The parameters, gradients and moments live on `device` (nn::ParamArena);
// the data loader's batches arrive on the host and are copied over per
// micro-batch. The arithmetic is the Executor's with one rank and no
// policies: gradients seeded with 1/M per micro-batch and accumulated in
// order, the loss averaged over the micro-batches, AdamW over the whole arena;
// on the host the two agree bit for bit (tests/nn/test_device_layers.cpp).
//
//   loom::exec::SerialTrainer trainer(model, loom::cuda_device(0), {.micro_batches = 2, .adamw = config});
//   trainer.initialize(seed);
//   float loss = trainer.step(inputs, targets, lr);   // host tensors [rows, T]
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/optim/adamw.hpp"

namespace loom::exec {

struct SerialTrainerOptions {
    int micro_batches = 1;
    optim::AdamWConfig adamw{};
    // As ExecutorOptions::matmul: f32, or bf16 operands with f32 sums.
    kernels::MatmulPrecision matmul = kernels::MatmulPrecision::f32;
};

class SerialTrainer {
public:
    // `model` must outlive the trainer and not move; its Params are bound to
    // memory on `device`, which must be usable (its backend built in, the
    // device present), else this throws naming why.
    template <class Model>
    SerialTrainer(Model& model, Device device, const SerialTrainerOptions& options = {})
        : arena_(model, device),
          options_(checked(options)),
          m_(DType::f32, Shape{arena_.size()}, device),
          v_(DType::f32, Shape{arena_.size()}, device),
          forward_backward_([&model](nn::Context& ctx, const Tensor& inputs, const Tensor& targets, float dloss) {
              return nn::forward_backward(model, ctx, inputs, targets, dloss);
          }),
          initialize_([&model](const nn::ParamArena& arena, std::uint64_t seed) { arena.initialize(model, seed); }) {
        ctx_.set_device(device);
        ctx_.set_matmul_precision(options.matmul);
    }

    SerialTrainer(const SerialTrainer&) = delete;
    SerialTrainer& operator=(const SerialTrainer&) = delete;

    [[nodiscard]] Device device() const noexcept { return arena_.device(); }
    [[nodiscard]] std::int64_t parameter_count() const noexcept { return arena_.size(); }
    [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return steps_; }
    [[nodiscard]] const nn::ParamArena& arena() const noexcept { return arena_; }
    // Bytes of activation memory the largest micro-batch needed so far.
    [[nodiscard]] std::size_t activation_bytes() const noexcept { return ctx_.peak_bytes(); }

    // The serial run's initial values (the counter-based RNG), moments zero.
    void initialize(std::uint64_t seed) {
        initialize_(arena_, seed);
        fill_zero_bytes(m_.raw(), m_.device(), m_.nbytes());
        fill_zero_bytes(v_.raw(), v_.device(), v_.nbytes());
        steps_ = 0;
    }

    // One optimizer step on inputs and targets [rows, T] (i32, any device;
    // rows divisible by the micro-batches). Returns the mean loss.
    float step(const Tensor& inputs, const Tensor& targets, float lr) {
        LOOM_CHECK(inputs.rank() == 2 && targets.shape() == inputs.shape(), "SerialTrainer::step: inputs ",
                   inputs.shape(), " and targets ", targets.shape(), " must both be [rows, T]");
        const std::int64_t rows = inputs.dim(0), M = options_.micro_batches;
        LOOM_CHECK(rows % M == 0, "SerialTrainer::step: ", rows, " rows do not split into ", M,
                   " micro-batches; use a multiple of ", M, " rows");
        optim::AdamWConfig config = options_.adamw;
        config.lr = lr;
        optim::check_config(config);
        arena_.zero_grads();
        const std::int64_t per = rows / M;
        float loss_sum = 0;
        for (std::int64_t mb = 0; mb < M; ++mb)
            loss_sum += forward_backward_(ctx_, inputs.slice(0, mb * per, (mb + 1) * per),
                                          targets.slice(0, mb * per, (mb + 1) * per), 1.0f / static_cast<float>(M));
        optim::adamw_step(arena_.values_tensor(), arena_.grads_tensor(), m_.tensor(), v_.tensor(), steps_ + 1, config);
        ++steps_;  // only after a step that happened
        return loss_sum / static_cast<float>(M);
    }

    // The parameters and moments in the serial (reflection) order, copied to
    // the host: what a checkpoint holds, as Executor::gather_state.
    void gather_state(std::span<float> values, std::span<float> m, std::span<float> v) const {
        check_sizes("gather_state", values.size(), m.size(), v.size());
        copy_tensor(host_view(values), arena_.values_tensor());
        copy_tensor(host_view(m), m_.tensor());
        copy_tensor(host_view(v), v_.tensor());
    }

    // Sets them from host arrays (a checkpoint saved by any strategy, on any
    // device); the next step is optimizer step `optimizer_steps` + 1.
    void load_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                    std::int64_t optimizer_steps) {
        check_sizes("load_state", values.size(), m.size(), v.size());
        LOOM_CHECK(optimizer_steps >= 0, "SerialTrainer::load_state: optimizer_steps = ", optimizer_steps,
                   " is invalid; it must be >= 0");
        copy_tensor(arena_.values_tensor(), host_view(values));
        copy_tensor(m_.tensor(), host_view(m));
        copy_tensor(v_.tensor(), host_view(v));
        steps_ = optimizer_steps;
    }

private:
    static SerialTrainerOptions checked(const SerialTrainerOptions& options) {
        LOOM_CHECK(options.micro_batches >= 1, "SerialTrainer: micro_batches = ", options.micro_batches,
                   " is invalid; use 1 or more");
        optim::check_config(options.adamw);
        return options;
    }

    void check_sizes(const char* what, std::size_t values, std::size_t m, std::size_t v) const {
        const auto n = static_cast<std::size_t>(arena_.size());
        LOOM_CHECK(values == n && m == n && v == n, "SerialTrainer::", what, ": arrays of ", values, ", ", m, " and ",
                   v, " elements; the model has ", n, " parameters");
    }

    template <class T>
    [[nodiscard]] Tensor host_view(std::span<T> values) const {
        return Tensor::of(values.data(), {static_cast<std::int64_t>(values.size())});
    }

    nn::ParamArena arena_;
    SerialTrainerOptions options_;
    DeviceBuffer m_, v_;
    nn::Context ctx_;
    std::function<float(nn::Context&, const Tensor&, const Tensor&, float)> forward_backward_;
    std::function<void(const nn::ParamArena&, std::uint64_t)> initialize_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::exec
