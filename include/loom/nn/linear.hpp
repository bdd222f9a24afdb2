// Linear: y = x W^T + b over the last dimension (PyTorch's layout: W is
// [out, in]), any leading dimensions being rows. Three GEMMs per step, each a
// single cblas_sgemm over all rows of the micro-batch.
#pragma once

#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "loom/nn/context.hpp"

namespace loom::nn {

struct Linear {
    Param weight;  // [out, in]
    Param bias;    // [out]; [0] when the layer has no bias

    [[nodiscard]] static Linear make(std::int64_t in, std::int64_t out, Init init = Init::normal(0.02f),
                                     bool with_bias = true) {
        LOOM_CHECK(in >= 1 && out >= 1, "Linear: ", in, " inputs and ", out, " outputs; both must be at least 1");
        return Linear{Param{Shape{out, in}, init}, Param{Shape{with_bias ? out : 0}, Init::zeros()}};
    }

    [[nodiscard]] std::int64_t in() const { return weight.shape.dim(1); }
    [[nodiscard]] std::int64_t out() const { return weight.shape.dim(0); }
    [[nodiscard]] bool has_bias() const { return bias.numel() != 0; }

    struct Saved {
        Tensor x;
        Tensor dy;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& x) {
        LOOM_CHECK(x.rank() >= 1 && x.dim(-1) == in(), "Linear: input of shape ", x.shape(), " does not end in ", in(),
                   " features");
        const std::int64_t rows = x.numel() / in();
        Shape shape = x.shape();
        shape[shape.rank() - 1] = out();
        Tensor y = ctx.alloc(shape);
        float beta = 0.0f;
        if (has_bias()) {
            // Bias rows first, then the GEMM accumulates onto them (beta = 1).
            float* py = y.data<float>();
            const float* pb = bias.value.data<float>();
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t j = 0; j < out(); ++j) py[r * out() + j] = pb[j];
            beta = 1.0f;
        }
        using kernels::host::Trans;
        kernels::host::gemm(Trans::no, Trans::yes, rows, out(), in(), 1.0f, x.data<float>(), in(),
                            weight.value.data<float>(), in(), beta, y.data<float>(), out());
        ctx.saved<Saved>(this).x = x;
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        auto& saved = ctx.saved<Saved>(this);
        saved.dy = dy;
        const std::int64_t rows = dy.numel() / out();
        Tensor dx = ctx.alloc(saved.x.shape());
        using kernels::host::Trans;
        kernels::host::gemm(Trans::no, Trans::no, rows, in(), out(), 1.0f, dy.data<float>(), out(),
                            weight.value.data<float>(), in(), 0.0f, dx.data<float>(), in());
        return dx;
    }

    void backward_weight(Context& ctx) {
        auto& saved = ctx.saved<Saved>(this);
        const std::int64_t rows = saved.dy.numel() / out();
        using kernels::host::Trans;
        kernels::host::gemm(Trans::yes, Trans::no, out(), in(), rows, 1.0f, saved.dy.data<float>(), out(),
                            saved.x.data<float>(), in(), 1.0f, weight.grad.data<float>(), in());
        if (has_bias()) kernels::host::bias_grad(saved.dy.data<float>(), bias.grad.data<float>(), rows, out());
    }
};

}  // namespace loom::nn
