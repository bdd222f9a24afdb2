// ModelGradient: a model's loss and gradient at a point held in host memory,
// the model computing wherever it lives (the host or a device). It is the
// oracle for an optimizer that keeps its own state on the host and asks for
// gradients at points of its choosing: OptEx (optim/optex.hpp) evaluates each
// worker at a proxy point its estimator picked, and a GPU then does the
// forward and backward while the estimator, its history and AdamW's moments
// stay in host memory, as in the reference implementation.
//
// Per call, on a device: one copy of the point in, the forward and backward
// on the device, one copy of the gradient out (the copy out waits for the
// device, so the gradient is complete on return). The copies move 8 d bytes
// through pageable host memory, against the pass's 6 d flops per token: on a
// GPU they can be a large share of a small batch's step (not measured yet;
// staging through pinned memory, or overlapping the copy in with the data
// loading, is the next step if they show). The values the model sees are the
// point's bits, so a device run equals the host run's loss and gradient up
// to the device kernels' own tolerances (bit for bit on the fenced test
// device).
#pragma once

#include <cstdint>
#include <span>

#include "loom/core/device.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/param_arena.hpp"

namespace loom::exec {

template <class Model>
class ModelGradient {
public:
    // Binds `model`'s Params to a parameter arena on `where` (which must be
    // usable); `model` must outlive this object and not move.
    ModelGradient(Model& model, Device where,
                  kernels::MatmulPrecision matmul = kernels::MatmulPrecision::f32)
        : model_(&model), arena_(model, where) {
        ctx_.set_device(where);
        ctx_.set_matmul_precision(matmul);
    }

    ModelGradient(const ModelGradient&) = delete;
    ModelGradient& operator=(const ModelGradient&) = delete;

    [[nodiscard]] std::int64_t size() const noexcept { return arena_.size(); }
    [[nodiscard]] Device device() const noexcept { return arena_.device(); }
    [[nodiscard]] const nn::ParamArena& arena() const noexcept { return arena_; }
    // Bytes of activation memory the largest call needed so far.
    [[nodiscard]] std::size_t activation_bytes() const noexcept { return ctx_.peak_bytes(); }

    // The model's parameters become x (all of them, in the arena's order).
    void load(std::span<const float> x) {
        check_size("the point", x.size());
        // copy_tensor only reads its source; Tensor views are not const-qualified.
        copy_tensor(arena_.values_tensor(), Tensor::of(const_cast<float*>(x.data()), {size()}));
    }

    // The model's parameters, into x (host memory).
    void store(std::span<float> x) const {
        check_size("the output", x.size());
        copy_tensor(Tensor::of(x.data(), {size()}), arena_.values_tensor());
    }

    // The mean loss of the model at x on inputs and targets ([rows, T] token
    // ids, host memory), its gradient written into g (host memory).
    float operator()(std::span<const float> x, const Tensor& inputs, const Tensor& targets, std::span<float> g) {
        check_size("the gradient", g.size());
        load(x);
        arena_.zero_grads();
        const float loss = nn::forward_backward(*model_, ctx_, inputs, targets);
        copy_tensor(Tensor::of(g.data(), {size()}), arena_.grads_tensor());
        return loss;
    }

private:
    void check_size(const char* what, std::size_t n) const {
        LOOM_CHECK(static_cast<std::int64_t>(n) == size(), "ModelGradient: ", what, " has ", n,
                   " elements but the model has ", size(), " parameters");
    }

    Model* model_;
    nn::ParamArena arena_;
    nn::Context ctx_;
};

}  // namespace loom::exec
