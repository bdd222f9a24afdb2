// Linear: y = x W^T + b over the last dimension (PyTorch's layout: W is
// [out, in]), any leading dimensions being rows. Three GEMMs per step, each a
// single product over all rows of the micro-batch, at the context's
// MatmulPrecision (f32, or bf16 operands with f32 sums and outputs).
//
// Tensor parallelism (Megatron 1D, parallel/tensor_parallel.hpp cuts the
// Params): `split` says which half of a column -> row pair this layer is.
// Columns: the input is whole on every tp rank and the output is this rank's
// slice of the features; the input gradient is summed over the group (f).
// Rows: the input is this rank's slice, the partial outputs are summed over
// the group before the (whole, replicated) bias is added (g).
//
// Optimus 2D (Split::grid, parallel/optimus2d.hpp cuts the Params): rank
// (i, j) of a q x q grid holds W's block (i, j) (output rows i, input
// columns j), the activations' block (rows i, features j), and the bias's
// features j. The three GEMMs become SUMMA's A B^T, A B and A^T B
// (nn/summa.hpp); the bias gradient, partial over the rows, is summed over
// the grid column.
#pragma once

#include <cstdint>

#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/summa.hpp"
#include "loom/nn/tensor_cut.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

struct Linear {
    // Its tensor-parallel cut (nn/tensor_cut.hpp): column- or row-parallel by its place (1D), a SUMMA block (2D).
    static constexpr TensorCut tensor_cut = TensorCut::linear;
    // Its only activation is its output: recomputing it alone saves nothing (Recompute<...>).
    static constexpr bool worth_recomputing = false;
    Param weight;  // [out, in]; a tp shard: [out/t, in] (columns) or [out, in/t] (rows)
    Param bias;    // [out]; [0] when the layer has no bias; [out/t] when split by columns
    Split split = Split::none;

    [[nodiscard]] static Linear make(std::int64_t in, std::int64_t out, Init init = Init::normal(0.02f),
                                     bool with_bias = true) {
        LOOM_CHECK(in >= 1 && out >= 1, "Linear: ", in, " inputs and ", out, " outputs; both must be at least 1");
        return Linear{Param{Shape{out, in}, init}, Param{Shape{with_bias ? out : 0}, Init::zeros()}, Split::none};
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
        Shape shape = x.shape();
        shape[shape.rank() - 1] = out();
        // A product (Context::product): Recompute<Selective> keeps it and replays it.
        Tensor y = ctx.product(this, shape, [&](const Tensor& into) { multiply(ctx, x, into); });
        ctx.saved<Saved>(this).x = x;
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        auto& saved = ctx.saved<Saved>(this);
        saved.dy = dy;
        const std::int64_t rows = dy.numel() / out();
        Tensor dx = ctx.alloc(saved.x.shape());
        if (split == Split::grid) {
            summa_ab(grid_of(ctx, "Linear"), dy, weight.value, dx, rows, out(), in(), ctx.matmul_precision());
            return dx;
        }
        using kernels::Trans;
        kernels::gemm(ctx.matmul_precision(), Trans::no, Trans::no, rows, in(), out(), 1.0f, dy, out(), weight.value,
                      in(), 0.0f, dx, in());
        // f: each rank's slice of the features contributed to the whole input's gradient.
        if (split == Split::columns) group(ctx).all_reduce_activations(dx);
        return dx;
    }

    [[nodiscard]] const TensorGroup& group(const Context& ctx) const {
        const TensorGroup* g = ctx.tensor_group();
        LOOM_CHECK(g != nullptr, "Linear: split by ", split == Split::columns ? "columns" : "rows",
                   " but the context has no tensor-parallel group; run it through an executor with a tp axis");
        return *g;
    }

    void backward_weight(Context& ctx) {
        auto& saved = ctx.saved<Saved>(this);
        const std::int64_t rows = saved.dy.numel() / out();
        if (split == Split::grid) {
            backward_weight_grid(grid_of(ctx, "Linear"), saved, rows, ctx.matmul_precision());
            return;
        }
        using kernels::Trans;
        kernels::gemm(ctx.matmul_precision(), Trans::yes, Trans::no, out(), in(), rows, 1.0f, saved.dy, out(), saved.x,
                      in(), 1.0f, weight.grad, in());
        if (has_bias()) kernels::bias_grad(saved.dy, bias.grad, rows, out());
    }

private:  // functions only: Linear stays an aggregate
    // y = x W^T + b, with the tensor-parallel group's or grid's traffic.
    void multiply(const Context& ctx, const Tensor& x, const Tensor& y) const {
        const std::int64_t rows = x.numel() / in();
        const kernels::MatmulPrecision precision = ctx.matmul_precision();
        using kernels::Trans;
        if (split == Split::grid) {
            summa_abt(grid_of(ctx, "Linear"), x, weight.value, y, rows, in(), out(), precision);
            if (has_bias()) add_bias(y, rows);
            return;
        }
        if (split == Split::rows) {
            // g: the partial products are summed over the group, then the bias added once.
            kernels::gemm(precision, Trans::no, Trans::yes, rows, out(), in(), 1.0f, x, in(), weight.value, in(), 0.0f, y,
                          out());
            group(ctx).all_reduce_activations(y);
            if (has_bias()) add_bias(y, rows);
            return;
        }
        if (has_bias())  // the host writes the bias rows and accumulates onto them; CUDA adds it in the GEMM
            kernels::gemm_bias(precision, Trans::no, Trans::yes, rows, out(), in(), x, in(), weight.value, in(),
                               bias.value, y);
        else
            kernels::gemm(precision, Trans::no, Trans::yes, rows, out(), in(), 1.0f, x, in(), weight.value, in(), 0.0f,
                          y, out());
    }

    void add_bias(const Tensor& y, std::int64_t rows) const {
        kernels::add_bias(y, bias.value, rows, out());
    }

    // dW(i,j) = sum over l of dY(l,i)^T X(l,j); this micro-batch's share is
    // added to the gradient. The bias's rows are summed down the grid column.
    void backward_weight_grid(const TensorGrid& g, const Saved& saved, std::int64_t rows,
                              kernels::MatmulPrecision precision) {
        const Device where = saved.dy.device();
        const DeviceBuffer dw(DType::f32, Shape{out() * in()}, where);
        summa_atb(g, saved.dy, saved.x, dw.tensor(), out(), rows, in(), precision);
        kernels::accumulate(weight.grad, dw.tensor(), out() * in());
        if (!has_bias()) return;
        const DeviceBuffer db(DType::f32, Shape{out()}, where);  // zero-filled
        kernels::bias_grad(saved.dy, db.tensor(), rows, out());
        g.column->all_reduce_sum(db.tensor());
        kernels::accumulate(bias.grad, db.tensor(), out());
    }
};

}  // namespace loom::nn
