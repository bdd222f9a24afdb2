// GELU, tanh form (PyTorch's gelu(approximate="tanh")). No parameters.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/tensor_cut.hpp"

namespace loom::nn {

struct Gelu {
    // Its tensor-parallel cut (nn/tensor_cut.hpp): a sharded feature axis passes through.
    static constexpr TensorCut tensor_cut = TensorCut::elementwise;
    // Its only activation is its output: recomputing it alone saves nothing (Recompute<...>).
    static constexpr bool worth_recomputing = false;
    struct Saved {
        Tensor x;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& x) {
        ctx.saved<Saved>(this).x = x;
        Tensor y = ctx.alloc(x.shape());
        kernels::gelu_forward(x, y);
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        const Tensor& x = ctx.saved<Saved>(this).x;
        Tensor dx = ctx.alloc(dy.shape());
        kernels::gelu_backward(x, dy, dx);
        return dx;
    }
};

}  // namespace loom::nn
