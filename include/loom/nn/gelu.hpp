// GELU, tanh form (PyTorch's gelu(approximate="tanh")). No parameters.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/host/gelu.hpp"
#include "loom/nn/context.hpp"

namespace loom::nn {

struct Gelu {
    struct Saved {
        Tensor x;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& x) {
        ctx.saved<Saved>(this).x = x;
        Tensor y = ctx.alloc(x.shape());
        kernels::host::gelu_forward(x.data<float>(), y.data<float>(), x.numel());
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        const Tensor& x = ctx.saved<Saved>(this).x;
        Tensor dx = ctx.alloc(dy.shape());
        kernels::host::gelu_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), dy.numel());
        return dx;
    }
};

}  // namespace loom::nn
