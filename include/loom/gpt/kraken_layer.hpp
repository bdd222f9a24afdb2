// Kraken's layer (Prabhakar et al., NeurIPS 2024, arXiv 2408.07802): N
// independent sub-layers, one per device of a fixed tensor-parallel degree N,
// each with its own LayerNorms, heads / N attention heads and a 4C / N MLP,
// all reading the same residual stream; the layer adds the sum of their
// outputs to the residual. Its one all-reduce (the sum) can overlap the next
// layer's attention, because that attention reads each device's *local*
// stream: the residual plus its own sub-layer's output, before the sum.
//
// The dataflow loom builds, for layer l and sub-layer i (h: the reduced
// residual stream, local_i: device i's stream, h and every local_i equal to
// the embeddings before the first layer):
//
//   a_i     = Attention_i(LN1_i(local_i))        // needs no all-reduce: overlaps it
//   m_i     = Mlp_i(LN2_i(h + a_i))              // h: the previous layer's sum, arrived by now
//   o_i     = a_i + m_i
//   local_i <- h + o_i                           // the next layer's attention input
//   h       <- h + sum_i o_i                     // the one all-reduce per layer
//
// After the last layer, h goes to the final LayerNorm and the head.
//
// Between layers the activation is one tensor, the state [N + 1, B, T, C]:
// slice 0 is h, slice 1 + i is local_i (KrakenFanOut makes it from the
// embeddings, KrakenMerge takes h out of it), so a Kraken model is an
// ordinary chain of loom layers that every executor and strategy can run.
//
// Under a training tp axis of t ranks (t divides N) the layer places its own
// parts (nn::TensorCut::own): rank q keeps sub-layers [q N/t, (q+1) N/t),
// the others' Params are held elsewhere (Param::held_by), and the sum over
// sub-layers becomes a partial sum and one all-reduce over the group, forward
// (h) and backward (h's gradient). A rank's state still has every stream;
// the local streams of sub-layers it does not hold are zero.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/device_buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/gelu.hpp"
#include "loom/nn/layernorm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/tensor_cut.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::gpt {

// Slice `k` of a Kraken state [N + 1, B, T, C] as a [B, T, C] view.
[[nodiscard]] inline Tensor kraken_stream(const Tensor& state, std::int64_t k) {
    return state.slice(0, k, k + 1).reshape(Shape{state.dim(1), state.dim(2), state.dim(3)});
}

// A sub-layer's attention half: its own LayerNorm and heads / N heads. The
// attention is shaped as a Megatron shard of a whole one ([3C/N, C] qkv,
// [C, C/N] projection), so the head dimension stays C / heads.
struct KrakenAttention {
    nn::LayerNorm ln;
    nn::CausalSelfAttention attn;
};

// A sub-layer's MLP half: its own LayerNorm, C -> 4C / N -> C.
struct KrakenMlp {
    nn::LayerNorm ln;
    nn::Linear fc;
    nn::Gelu act;
    nn::Linear proj;
};

struct KrakenSubLayer {
    KrakenAttention attention;
    KrakenMlp mlp;

    // One of `degree` sub-layers of a width-C layer with `heads` heads in all.
    [[nodiscard]] static KrakenSubLayer make(std::int64_t width, std::int64_t heads, std::int64_t degree,
                                             float residual_std) {
        const std::int64_t local = width / degree;
        return {{nn::LayerNorm::make(width),
                 nn::CausalSelfAttention{nn::Linear::make(width, 3 * local, Init::normal(0.02f)),
                                         nn::Linear::make(local, width, Init::normal(residual_std)), heads}},
                {nn::LayerNorm::make(width), nn::Linear::make(width, 4 * local),
                 nn::Gelu{}, nn::Linear::make(4 * local, width, Init::normal(residual_std))}};
    }
};

// One Kraken layer: its N sub-layers over the state [N + 1, B, T, C].
struct KrakenLayer {
    std::vector<KrakenSubLayer> subs;

    // Tensor parallelism places sub-layers on ranks (see the header).
    static constexpr nn::TensorCut tensor_cut = nn::TensorCut::own;

    [[nodiscard]] std::int64_t degree() const { return static_cast<std::int64_t>(subs.size()); }

    // Rank `rank` of a tp group of `group` ranks keeps its N / group sub-layers;
    // every other sub-layer's Params become empty here, held by their rank.
    void place_on_tensor_group(int rank, int group) {
        LOOM_CHECK(group >= 1 && degree() % group == 0, "KrakenLayer: a tp group of ", group, " ranks for a layer of ",
                   degree(), " sub-layers; use a tp degree that divides ", degree());
        const std::int64_t per_rank = degree() / group;
        for (std::int64_t i = 0; i < degree(); ++i)
            reflect::visit_params(subs[static_cast<std::size_t>(i)], [&](Param& p, std::string_view) {
                LOOM_CHECK(!p.slice.sliced(), "KrakenLayer: placed on a tp group twice");
                p = p.held_by(static_cast<int>(i / per_rank), rank);
            });
    }

    // Whether this rank holds sub-layer i (always, unless placed on a group).
    [[nodiscard]] bool holds(std::int64_t i) const {
        return subs[static_cast<std::size_t>(i)].attention.ln.gain.numel() > 0;
    }

    // Placed on a group, the sum over sub-layers is this rank's partial sum
    // (of the sub-layers it holds; the others' local streams are zero here)
    // and one all-reduce; whole, it is summed into h in sub-layer order.
    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& state) {
        check_state(state, "input");
        const nn::TensorGroup* group = placed() ? &group_of(ctx) : nullptr;
        const Tensor h = kraken_stream(state, 0);
        Tensor out = ctx.alloc(state.shape());
        const Tensor h_out = kraken_stream(out, 0);
        const Tensor sum = group != nullptr ? zeroed(ctx, h.shape()) : h_out;
        if (group == nullptr) copy_tensor(h_out, h);
        for (std::int64_t i = 0; i < degree(); ++i) {
            const Tensor local_out = kraken_stream(out, 1 + i);
            if (!holds(i)) {
                fill_zero_bytes(local_out.raw(), local_out.device(), local_out.nbytes());
                continue;
            }
            KrakenSubLayer& sub = subs[static_cast<std::size_t>(i)];
            const Tensor a = nn::forward(sub.attention, ctx, kraken_stream(state, 1 + i));
            Tensor u = ctx.alloc(h.shape());
            kernels::add(h, a, u);
            const Tensor m = nn::forward(sub.mlp, ctx, u);
            Tensor o = ctx.alloc(h.shape());
            kernels::add(a, m, o);
            kernels::add(h, o, local_out);
            kernels::add(sum, o, sum);  // the all-reduce, summed in sub-layer order
        }
        if (group != nullptr) {
            group->all_reduce_activations(sum);
            kernels::add(h, sum, h_out);
        }
        return out;
    }

    // dh_out reaches h directly and through every local stream (local_i = h + o_i);
    // d o_i = dh_out + dlocal_i feeds both a_i and m_i, and m_i's input gradient
    // goes to h and (through u_i = h + a_i) to a_i. Placed on a group, h's
    // gradient is dh_out + the all-reduce of each rank's sub-layers' shares.
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dstate) {
        check_state(dstate, "gradient");
        const nn::TensorGroup* group = placed() ? &group_of(ctx) : nullptr;
        const Tensor dh_out = kraken_stream(dstate, 0);
        Tensor dstate_in = ctx.alloc(dstate.shape());
        const Tensor dh = kraken_stream(dstate_in, 0);
        const Tensor shares = group != nullptr ? zeroed(ctx, dh_out.shape()) : dh;
        if (group == nullptr) copy_tensor(dh, dh_out);
        for (std::int64_t i = degree() - 1; i >= 0; --i) {
            const Tensor dlocal_in = kraken_stream(dstate_in, 1 + i);
            if (!holds(i)) {
                fill_zero_bytes(dlocal_in.raw(), dlocal_in.device(), dlocal_in.nbytes());
                continue;
            }
            KrakenSubLayer& sub = subs[static_cast<std::size_t>(i)];
            const Tensor dlocal_out = kraken_stream(dstate, 1 + i);
            kernels::add(shares, dlocal_out, shares);
            Tensor d_o = ctx.alloc(dh_out.shape());
            kernels::add(dh_out, dlocal_out, d_o);
            const Tensor du = nn::backward_input(sub.mlp, ctx, d_o);
            kernels::add(shares, du, shares);
            Tensor da = ctx.alloc(dh_out.shape());
            kernels::add(d_o, du, da);
            copy_tensor(dlocal_in, nn::backward_input(sub.attention, ctx, da));
        }
        if (group != nullptr) {
            group->all_reduce_activations(shares);
            kernels::add(dh_out, shares, dh);
        }
        return dstate_in;
    }

    void backward_weight(nn::Context& ctx) {
        for (std::int64_t i = degree() - 1; i >= 0; --i) {
            if (!holds(i)) continue;
            KrakenSubLayer& sub = subs[static_cast<std::size_t>(i)];
            nn::backward_weight(sub.mlp, ctx);
            nn::backward_weight(sub.attention, ctx);
        }
    }

private:  // functions only: KrakenLayer stays an aggregate
    [[nodiscard]] bool placed() const {
        for (std::int64_t i = 0; i < degree(); ++i)
            if (!holds(i)) return true;
        return false;
    }

    [[nodiscard]] static const nn::TensorGroup& group_of(nn::Context& ctx) {
        const nn::TensorGroup* group = ctx.tensor_group();
        LOOM_CHECK(group != nullptr, "KrakenLayer: placed on a tp group but run without one (the Context has no "
                                     "TensorGroup)");
        return *group;
    }

    [[nodiscard]] static Tensor zeroed(nn::Context& ctx, const Shape& shape) {
        Tensor t = ctx.alloc(shape);
        fill_zero_bytes(t.raw(), t.device(), t.nbytes());
        return t;
    }

    void check_state(const Tensor& state, const char* what) const {
        LOOM_CHECK(state.rank() == 4 && state.dim(0) == degree() + 1, "KrakenLayer: ", what, " of shape ",
                   state.shape(), " is not a Kraken state [", degree() + 1, ", batch, sequence, width] of degree ",
                   degree());
    }
};

// The embeddings [B, T, C] as the first layer's state: h and every local
// stream start equal.
struct KrakenFanOut {
    std::int64_t degree = 1;

    // Whole on every tp rank (its input is the embeddings, the same on each).
    static constexpr nn::TensorCut tensor_cut = nn::TensorCut::replicated;

    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& x) {
        LOOM_CHECK(x.rank() == 3, "KrakenFanOut: input of shape ", x.shape(), " is not [batch, sequence, width]");
        Tensor state = ctx.alloc(Shape{degree + 1, x.dim(0), x.dim(1), x.dim(2)});
        for (std::int64_t k = 0; k <= degree; ++k) copy_tensor(kraken_stream(state, k), x);
        return state;
    }

    // Under a tp group each rank has the gradients of its own sub-layers'
    // streams (the others are zero there): their sum is reduced over the
    // group before h's is added.
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dstate) {
        Tensor dx = ctx.alloc(Shape{dstate.dim(1), dstate.dim(2), dstate.dim(3)});
        const nn::TensorGroup* group = ctx.tensor_group();
        if (group == nullptr || group->size() == 1) {
            copy_tensor(dx, kraken_stream(dstate, 0));
            for (std::int64_t k = 1; k <= degree; ++k) kernels::add(dx, kraken_stream(dstate, k), dx);
            return dx;
        }
        copy_tensor(dx, kraken_stream(dstate, 1));
        for (std::int64_t k = 2; k <= degree; ++k) kernels::add(dx, kraken_stream(dstate, k), dx);
        group->all_reduce_activations(dx);
        kernels::add(kraken_stream(dstate, 0), dx, dx);
        return dx;
    }
};

// The last layer's reduced stream h, for the final LayerNorm; the local
// streams end here (their gradient is zero).
struct KrakenMerge {
    // Whole on every tp rank: h is the same on each after a layer's all-reduce.
    static constexpr nn::TensorCut tensor_cut = nn::TensorCut::replicated;

    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& state) {
        LOOM_CHECK(state.rank() == 4, "KrakenMerge: input of shape ", state.shape(),
                   " is not a Kraken state [degree + 1, batch, sequence, width]");
        ctx.saved<Saved>(this).degree = state.dim(0) - 1;
        return kraken_stream(state, 0);
    }

    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dy) {
        const std::int64_t degree = ctx.saved<Saved>(this).degree;
        Tensor dstate = ctx.alloc(Shape{degree + 1, dy.dim(0), dy.dim(1), dy.dim(2)});
        fill_zero_bytes(dstate.raw(), dstate.device(), dstate.nbytes());
        copy_tensor(kraken_stream(dstate, 0), dy);
        return dstate;
    }

private:  // KrakenMerge stays an aggregate with no fields to reflect
    struct Saved {
        std::int64_t degree = 0;
    };
};

}  // namespace loom::gpt
