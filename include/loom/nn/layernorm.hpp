// LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * gain + shift,
// the biased variance, as PyTorch's layer_norm.
//
// Optimus 2D (parallel/optimus2d.hpp cuts gain and shift by the grid column):
// rank (i, j) holds rows i and features j of the input, so each row's mean
// and variance are sums over the grid row (two passes, as the whole kernel
// does, so nothing cancels), and the gain and shift gradients, partial over
// the rows, are summed over the grid column.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/kernels/host/layernorm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/summa.hpp"

namespace loom::nn {

struct LayerNorm {
    Param gain;   // [C], ones
    Param shift;  // [C], zeros
    float eps = 1e-5f;

    [[nodiscard]] static LayerNorm make(std::int64_t features, float eps = 1e-5f) {
        LOOM_CHECK(features >= 1, "LayerNorm: ", features, " features; at least 1");
        return LayerNorm{Param{Shape{features}, Init::ones()}, Param{Shape{features}, Init::zeros()}, eps};
    }

    // The features this rank holds (all, or its grid column's).
    [[nodiscard]] std::int64_t features() const { return gain.shape.dim(0); }
    [[nodiscard]] bool grid() const { return gain.slice.sliced(); }

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
        if (grid()) {
            require_host(x, "LayerNorm on an Optimus 2D grid");
            forward_grid(grid_of(ctx, "LayerNorm"), saved, y, rows);
            return y;
        }
        kernels::layernorm_forward(x, gain.value, shift.value, y, saved.mean, saved.rstd, rows, features(), eps);
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        auto& saved = ctx.saved<Saved>(this);
        saved.dy = dy;
        const std::int64_t rows = dy.numel() / features();
        Tensor dx = ctx.alloc(dy.shape());
        if (grid()) {
            require_host(dy, "LayerNorm on an Optimus 2D grid");
            backward_input_grid(ctx, saved, dx, rows);
            return dx;
        }
        kernels::layernorm_backward_input(dy, saved.x, gain.value, saved.mean, saved.rstd, dx, rows, features());
        return dx;
    }

    void backward_weight(Context& ctx) {
        auto& saved = ctx.saved<Saved>(this);
        const std::int64_t rows = saved.dy.numel() / features();
        if (grid()) {
            require_host(saved.dy, "LayerNorm on an Optimus 2D grid");
            backward_weight_grid(grid_of(ctx, "LayerNorm"), saved, rows);
            return;
        }
        kernels::layernorm_backward_weight(saved.dy, saved.x, saved.mean, saved.rstd, gain.grad, shift.grad, rows,
                                           features());
    }

private:  // functions only: LayerNorm stays an aggregate
    [[nodiscard]] float inverse_whole_features() const {
        return 1.0f / static_cast<float>(gain.full_shape().dim(0));
    }

    void forward_grid(const TensorGrid& g, const Saved& saved, const Tensor& y, std::int64_t rows) const {
        const std::int64_t C = features();
        const float* x = saved.x.data<float>();
        float* mean = saved.mean.data<float>();
        float* rstd = saved.rstd.data<float>();
        for (std::int64_t r = 0; r < rows; ++r) {
            float sum = 0.0f;
            for (std::int64_t c = 0; c < C; ++c) sum += x[r * C + c];
            mean[r] = sum;
        }
        g.row->all_reduce_sum(saved.mean);
        for (std::int64_t r = 0; r < rows; ++r) {
            mean[r] *= inverse_whole_features();
            float sum = 0.0f;
            for (std::int64_t c = 0; c < C; ++c) sum += (x[r * C + c] - mean[r]) * (x[r * C + c] - mean[r]);
            rstd[r] = sum;
        }
        g.row->all_reduce_sum(saved.rstd);
        const float* pg = gain.value.data<float>();
        const float* ps = shift.value.data<float>();
        float* py = y.data<float>();
        for (std::int64_t r = 0; r < rows; ++r) {
            rstd[r] = 1.0f / std::sqrt(rstd[r] * inverse_whole_features() + eps);
            for (std::int64_t c = 0; c < C; ++c)
                py[r * C + c] = (x[r * C + c] - mean[r]) * rstd[r] * pg[c] + ps[c];
        }
    }

    // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gain: both means
    // over the whole row, in one all-reduce over the grid row.
    void backward_input_grid(Context& ctx, const Saved& saved, const Tensor& dx, std::int64_t rows) const {
        const TensorGrid& g = grid_of(ctx, "LayerNorm");
        const std::int64_t C = features();
        const float *dy = saved.dy.data<float>(), *x = saved.x.data<float>(), *pg = gain.value.data<float>();
        const float *mean = saved.mean.data<float>(), *rstd = saved.rstd.data<float>();
        Tensor sums = ctx.alloc(Shape{2, rows});
        float* g_sum = sums.data<float>();
        float* gx_sum = g_sum + rows;
        for (std::int64_t r = 0; r < rows; ++r) {
            float a = 0.0f, b = 0.0f;
            for (std::int64_t c = 0; c < C; ++c) {
                const float gc = dy[r * C + c] * pg[c];
                a += gc;
                b += gc * ((x[r * C + c] - mean[r]) * rstd[r]);
            }
            g_sum[r] = a;
            gx_sum[r] = b;
        }
        g.row->all_reduce_sum(sums);
        float* out = dx.data<float>();
        for (std::int64_t r = 0; r < rows; ++r) {
            const float g_mean = g_sum[r] * inverse_whole_features(), gx_mean = gx_sum[r] * inverse_whole_features();
            for (std::int64_t c = 0; c < C; ++c) {
                const float xhat = (x[r * C + c] - mean[r]) * rstd[r];
                out[r * C + c] = rstd[r] * (dy[r * C + c] * pg[c] - g_mean - xhat * gx_mean);
            }
        }
    }

    void backward_weight_grid(const TensorGrid& g, const Saved& saved, std::int64_t rows) {
        const std::int64_t C = features();
        Buffer<Host> partial(DType::f32, Shape{2 * C});
        float* dgain = partial.data<float>();
        std::fill_n(dgain, 2 * C, 0.0f);
        kernels::host::layernorm_backward_weight(saved.dy.data<float>(), saved.x.data<float>(),
                                                 saved.mean.data<float>(), saved.rstd.data<float>(), dgain,
                                                 dgain + C, rows, C);
        g.column->all_reduce_sum(Tensor::of(dgain, {2 * C}));
        kernels::host::accumulate(gain.grad.data<float>(), dgain, C);
        kernels::host::accumulate(shift.grad.data<float>(), dgain + C, C);
    }
};

}  // namespace loom::nn
