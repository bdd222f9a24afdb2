// LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * gain + shift,
// the biased variance, as PyTorch's layer_norm.
//
// Optimus 2D (parallel/optimus2d.hpp cuts gain and shift by the grid column):
// rank (i, j) holds rows i and features j of the input, so each row's mean
// and variance are sums over the grid row (two passes, as the whole kernel
// does, so nothing cancels), and the gain and shift gradients, partial over
// the rows, are summed over the grid column.
#pragma once

#include <cstdint>

#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/layernorm_grid_ops.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/summa.hpp"
#include "loom/nn/tensor_cut.hpp"

namespace loom::nn {

struct LayerNorm {
    // Its tensor-parallel cut (nn/tensor_cut.hpp): whole (1D), gain and shift by grid column (2D).
    static constexpr TensorCut tensor_cut = TensorCut::features;
    Param gain;   // [C], ones
    Param shift;  // [C], zeros
    float eps = 1e-5f;

    [[nodiscard]] static LayerNorm make(std::int64_t features, float eps = 1e-5f) {
        LOOM_CHECK(features >= 1, "LayerNorm: ", features, " features; at least 1");
        return LayerNorm{Param{Shape{features}, Init::ones()}, Param{Shape{features}, Init::zeros()}, eps};
    }

    // The features this rank holds (all, or its grid column's).
    [[nodiscard]] std::int64_t features() const { return gain.shape.dim(0); }
    [[nodiscard]] bool grid() const { return gain.slice.shard(); }

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

    // The row statistics over the whole row: each rank sums its features,
    // the grid row all-reduces, twice (mean, then variance).
    void forward_grid(const TensorGrid& g, const Saved& saved, const Tensor& y, std::int64_t rows) const {
        const std::int64_t C = features();
        kernels::layernorm_grid_row_sums(saved.x, saved.mean, rows, C);
        g.row->all_reduce_sum(saved.mean);
        kernels::layernorm_grid_centered_squares(saved.x, saved.mean, saved.rstd, rows, C, inverse_whole_features());
        g.row->all_reduce_sum(saved.rstd);
        kernels::layernorm_grid_normalize(saved.x, gain.value, shift.value, saved.mean, saved.rstd, y, rows, C,
                                          inverse_whole_features(), eps);
    }

    // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gain: both means
    // over the whole row, in one all-reduce over the grid row.
    void backward_input_grid(Context& ctx, const Saved& saved, const Tensor& dx, std::int64_t rows) const {
        const TensorGrid& g = grid_of(ctx, "LayerNorm");
        const std::int64_t C = features();
        Tensor sums = ctx.alloc(Shape{2, rows});
        kernels::layernorm_grid_backward_sums(saved.dy, saved.x, gain.value, saved.mean, saved.rstd, sums, rows, C);
        g.row->all_reduce_sum(sums);
        kernels::layernorm_grid_backward_apply(saved.dy, saved.x, gain.value, saved.mean, saved.rstd, sums, dx, rows,
                                               C, inverse_whole_features());
    }

    // This rank's rows' share of the weight gradients, summed down the grid column.
    void backward_weight_grid(const TensorGrid& g, const Saved& saved, std::int64_t rows) {
        const std::int64_t C = features();
        const DeviceBuffer partial(DType::f32, Shape{2 * C}, saved.dy.device());  // zero-filled
        const Tensor dgain = partial.tensor().slice(0, 0, C), dshift = partial.tensor().slice(0, C, 2 * C);
        kernels::layernorm_backward_weight(saved.dy, saved.x, saved.mean, saved.rstd, dgain, dshift, rows, C);
        g.column->all_reduce_sum(partial.tensor());
        kernels::accumulate(gain.grad, dgain, C);
        kernels::accumulate(shift.grad, dshift, C);
    }
};

}  // namespace loom::nn
