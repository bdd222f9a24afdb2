// CausalSelfAttention: qkv = Linear(x) [B, T, 3C], blockwise causal attention
// with online softmax per head (no T x T matrix; blocks above the diagonal
// are skipped), then an output projection. Input and output are [B, T, C].
#pragma once

#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/ring_attention.hpp"
#include "loom/nn/tensor_cut.hpp"
#include "loom/nn/ulysses_attention.hpp"

namespace loom::nn {

struct CausalSelfAttention {
    // Its tensor-parallel cut (nn/tensor_cut.hpp): heads split (1D), blocks (2D).
    static constexpr TensorCut tensor_cut = TensorCut::heads;
    Linear qkv;   // C -> 3C
    Linear proj;  // C -> C
    std::int64_t heads = 1;

    // `residual_std` initialises the output projection (GPT-2 scales it by
    // 1/sqrt(2 * layers) so the residual stream does not grow with depth).
    [[nodiscard]] static CausalSelfAttention make(std::int64_t width, std::int64_t heads, float std = 0.02f,
                                                  float residual_std = 0.02f) {
        LOOM_CHECK(heads >= 1 && width % heads == 0, "CausalSelfAttention: width ", width,
                   " does not split into ", heads, " heads; use a divisor of the width");
        return CausalSelfAttention{Linear::make(width, 3 * width, Init::normal(std)),
                                   Linear::make(width, width, Init::normal(residual_std)), heads};
    }

    // The whole model's width, and the features of the input this rank holds
    // (all of them, or a 2D grid column's).
    [[nodiscard]] std::int64_t width() const { return proj.weight.full_shape().dim(0); }
    [[nodiscard]] std::int64_t input_width() const { return qkv.in(); }
    // The heads this rank computes: all of them, or heads / t when the layer
    // is a tensor-parallel shard (tp::shard cuts qkv into q, k, v of its heads;
    // on a 2D grid the SUMMA product hands rank (i, j) the heads of column j).
    [[nodiscard]] std::int64_t head_dim() const { return width() / heads; }
    [[nodiscard]] std::int64_t local_width() const { return qkv.out() / 3; }
    [[nodiscard]] std::int64_t local_heads() const { return local_width() / head_dim(); }

    struct Saved {
        Tensor qkv, out, lse;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& x) {
        LOOM_CHECK(x.rank() == 3 && x.dim(2) == input_width(), "CausalSelfAttention: input of shape ", x.shape(),
                   " is not [batch, sequence, ", input_width(), "]");
        const std::int64_t B = x.dim(0), T = x.dim(1), D = head_dim(), H = local_heads();
        auto& saved = ctx.saved<Saved>(this);
        saved.qkv = qkv.forward(ctx, x);
        saved.out = ctx.alloc(Shape{B, T, local_width()});
        if (ctx.sequence().active()) {
            // Sequence parallel: this rank's T tokens are some positions of
            // each sequence; attention reaches the others across the sp axis.
            const SequenceParallelism& sp = ctx.sequence();
            if (sp.attention != SequenceAttention::ring)
                ulysses_attention_forward(ctx, ulysses_groups(sp), sp.layout(), /*causal=*/true, saved.qkv, B, T, H, D,
                                          saved.out,
                                          ctx.saved<UlyssesSaved>(this));
            else
                ring_attention_forward(ctx, *sp.group, sp.layout(), /*causal=*/true, saved.qkv, {B, T, H, D},
                                       saved.out, ctx.saved<RingSaved>(this));
            return proj.forward(ctx, saved.out);
        }
        saved.lse = ctx.alloc(Shape{B, H, T});
        kernels::attention_forward(saved.qkv, saved.out, saved.lse, B, T, H, D, ctx.matmul_precision());
        return proj.forward(ctx, saved.out);
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        auto& saved = ctx.saved<Saved>(this);
        const std::int64_t B = dy.dim(0), T = dy.dim(1), D = head_dim(), H = local_heads();
        Tensor dout = proj.backward_input(ctx, dy);
        Tensor dqkv = ctx.alloc(saved.qkv.shape());
        if (ctx.sequence().active()) {
            const SequenceParallelism& sp = ctx.sequence();
            if (sp.attention != SequenceAttention::ring)
                ulysses_attention_backward(ulysses_groups(sp), sp.layout(), /*causal=*/true,
                                           ctx.saved<UlyssesSaved>(this), dout, B, T, H, D, dqkv);
            else
                ring_attention_backward(*sp.group, sp.layout(), /*causal=*/true, saved.qkv, saved.out,
                                        ctx.saved<RingSaved>(this), dout, {B, T, H, D}, dqkv);
            return qkv.backward_input(ctx, dqkv);
        }
        kernels::attention_backward(saved.qkv, saved.out, dout, saved.lse, dqkv, B, T, H, D, ctx.matmul_precision());
        return qkv.backward_input(ctx, dqkv);
    }

    void backward_weight(Context& ctx) {
        proj.backward_weight(ctx);
        qkv.backward_weight(ctx);
    }

private:  // functions only: CausalSelfAttention stays an aggregate
    // Plain Ulysses: one group, every sp rank. The hybrid: its groups and ring.
    [[nodiscard]] static UlyssesGroups ulysses_groups(const SequenceParallelism& sp) {
        if (sp.attention == SequenceAttention::ulysses) return {sp.group, nullptr};
        LOOM_CHECK(sp.ulysses_group != nullptr && sp.ring_group != nullptr, "CausalSelfAttention: the hybrid "
                   "sequence parallelism needs its Ulysses groups and ring; run it through an executor with an sp axis");
        return {sp.ulysses_group, sp.ring_group};
    }
};

}  // namespace loom::nn
