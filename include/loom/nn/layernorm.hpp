// LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * gain + shift,
// the biased variance, as PyTorch's layer_norm.
#pragma once

#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/layernorm.hpp"
#include "loom/nn/context.hpp"

namespace loom::nn {

struct LayerNorm {
    Param gain;   // [C], ones
    Param shift;  // [C], zeros
    float eps = 1e-5f;

    [[nodiscard]] static LayerNorm make(std::int64_t features, float eps = 1e-5f) {
        LOOM_CHECK(features >= 1, "LayerNorm: ", features, " features; at least 1");
        return LayerNorm{Param{Shape{features}, Init::ones()}, Param{Shape{features}, Init::zeros()}, eps};
    }

    [[nodiscard]] std::int64_t features() const { return gain.shape.dim(0); }

    struct Saved {
        Tensor x, mean, rstd, dy;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& x) {
        LOOM_CHECK(x.rank() >= 1 && x.dim(-1) == features(), "LayerNorm: input of shape ", x.shape(),
                   " does not end in ", features(), " features");
        const std::int64_t rows = x.numel() / features();
        auto& saved = ctx.saved<Saved>(this);
        saved.x = x;
        saved.mean = ctx.alloc(Shape{rows});
        saved.rstd = ctx.alloc(Shape{rows});
        Tensor y = ctx.alloc(x.shape());
        kernels::host::layernorm_forward(x.data<float>(), gain.value.data<float>(), shift.value.data<float>(),
                                         y.data<float>(), saved.mean.data<float>(), saved.rstd.data<float>(), rows,
                                         features(), eps);
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        auto& saved = ctx.saved<Saved>(this);
        saved.dy = dy;
        const std::int64_t rows = dy.numel() / features();
        Tensor dx = ctx.alloc(dy.shape());
        kernels::host::layernorm_backward_input(dy.data<float>(), saved.x.data<float>(), gain.value.data<float>(),
                                                saved.mean.data<float>(), saved.rstd.data<float>(), dx.data<float>(),
                                                rows, features());
        return dx;
    }

    void backward_weight(Context& ctx) {
        auto& saved = ctx.saved<Saved>(this);
        const std::int64_t rows = saved.dy.numel() / features();
        kernels::host::layernorm_backward_weight(saved.dy.data<float>(), saved.x.data<float>(),
                                                 saved.mean.data<float>(), saved.rstd.data<float>(),
                                                 gain.grad.data<float>(), shift.grad.data<float>(), rows, features());
    }
};

}  // namespace loom::nn
