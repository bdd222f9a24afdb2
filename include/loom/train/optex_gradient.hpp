// The gradient an OptEx worker (optim/optex.hpp) asks for at the points its
// estimator picks: one worker is a group of dp ranks, and each gets the
// worker's loss and gradient averaged over the group.
//
//   train::OptExGradient<gpt::Model, C> gradient_at(model, dp, strategy, {.device = where});
//   gradient_at.initial_values(seed, values);            // the serial run's parameters
//   optex.iterate([&](auto x, auto g) { return gradient_at(x, inputs, targets, g); });
//
// On the host an executor over the dp axis runs the strategy's step program
// without its optimizer step (Executor::gradient), so Recompute<...> and any
// custom policy apply as in any other run and the dp average is the
// executor's exchange. On a device the executor would need a communicator
// that moves the device's memory, and OptEx's collectives are host ones:
// there the model's gradient comes from exec::ModelGradient and the copy
// brought back to the host is averaged over dp here, and a strategy that
// recomputes is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/init.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/executor.hpp"
#include "loom/exec/model_gradient.hpp"

namespace loom::train {

template <class Model, comm::Communicator C>
class OptExGradient {
public:
    // `strategy` may only use what Executor::gradient allows (dp at ZeRO 0,
    // Recompute<...>, custom policies); `model` and `dp` must outlive this.
    OptExGradient(Model& model, C& dp, const exec::ExecutionPlan& strategy, const exec::ExecutorOptions& options)
        : model_(&model), dp_(&dp) {
        if (options.device.kind == DeviceKind::host) {
            // OptEx keeps its own moments: the executor holds none.
            exec::ExecutorOptions gradient_only = options;
            gradient_only.optimizer_state = false;
            executor_.emplace(model, dp, strategy, gradient_only);
            return;
        }
        LOOM_CHECK(!strategy.recompute.on(), "OptExGradient: Recompute<", strategy.recompute.describe(),
                   "> on ", options.device, ": OptEx recomputes on the host only (its executor there would need a "
                   "communicator that moves the device's memory); drop the recomputation or run on the host");
        on_device_.emplace(model, options.device, options.matmul);
    }

    [[nodiscard]] std::int64_t size() const { return executor_ ? executor_->parameter_count() : on_device_->size(); }

    // The serial run's initial parameters for `seed`, into values.
    void initial_values(std::uint64_t seed, std::span<float> values) {
        if (!executor_) {
            on_device_->arena().initialize(*model_, seed);
            on_device_->store(values);
            return;
        }
        // Every array is whole here (what Executor::gradient needs), so the
        // serial run's values are the initializer's, in the same order.
        loom::initialize_range(*model_, seed, values, 0);
    }

    // The worker's mean loss at x on this rank's rows (inputs and targets
    // [rows, T]), its gradient averaged over the dp ranks into g.
    float operator()(std::span<const float> x, const Tensor& inputs, const Tensor& targets, std::span<float> g) {
        if (executor_) {
            executor_->set_parameters(x);
            return executor_->gradient(inputs, targets, g);
        }
        float loss = (*on_device_)(x, inputs, targets, g);
        if (dp_->size() > 1) {
            const auto grads = Tensor::of(g.data(), {static_cast<std::int64_t>(g.size())});
            dp_->all_reduce(grads, grads, comm::ReduceOp::avg);
            const auto l = Tensor::of(&loss, {1});
            dp_->all_reduce(l, l, comm::ReduceOp::avg);
        }
        return loss;
    }

private:
    Model* model_;
    C* dp_;
    std::optional<exec::Executor<C>> executor_;
    std::optional<exec::ModelGradient<Model>> on_device_;
};

}  // namespace loom::train
