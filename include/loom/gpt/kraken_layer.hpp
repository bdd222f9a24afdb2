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
// Between layers the activation is one tensor, the state [N + 2, B, T, C]:
// slice 0 is h, slice 1 a partial sum p still to be reduced (so that the
// true stream is h + sum over ranks of p), slice 2 + i is local_i
// (KrakenFanOut makes it from the embeddings, KrakenMerge reduces the last
// p into h), so a Kraken model is an ordinary chain of loom layers that
// every executor and strategy can run.
//
// Whole (one rank), a layer adds its sub-layers' outputs into h itself and
// passes p = 0. Under a training tp axis of t ranks (t divides N) the layer
// places its own parts (nn::TensorCut::own): rank q keeps sub-layers
// [q N/t, (q+1) N/t), the others' Params are held elsewhere
// (Param::held_by), and the sum over sub-layers is one all-reduce per layer
// each way, overlapped as Kraken intends:
//   forward:  the layer passes its sub-layers' partial sum on as p; the next
//             layer all-reduces it in the background while its attentions
//             run (they read only the local streams), then adds it to h;
//   backward: the share of h's gradient from this rank's sub-layers is
//             all-reduced in the background while their attentions'
//             backward runs.
// The sum therefore crosses unit and pipeline-stage boundaries as data (p),
// never as a pending request. A rank's state still has every local stream;
// those of sub-layers it does not hold are zero.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/comm/communicator.hpp"
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

// Slice `k` of a Kraken state [N + 2, B, T, C] as a [B, T, C] view.
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

// One Kraken layer: its N sub-layers over the state [N + 2, B, T, C].
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

    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& state) {
        check_state(state, "input");
        return placed() ? forward_placed(ctx, state) : forward_whole(ctx, state);
    }

    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dstate) {
        check_state(dstate, "gradient");
        return placed() ? backward_placed(ctx, dstate) : backward_whole(ctx, dstate);
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

    // Every sub-layer here: H = h + p, then h_out = H + sum_i o_i in
    // sub-layer order, p_out = 0.
    [[nodiscard]] Tensor forward_whole(nn::Context& ctx, const Tensor& state) {
        Tensor out = ctx.alloc(state.shape());
        const Tensor H = ctx.alloc(kraken_stream(state, 0).shape());
        kernels::add(kraken_stream(state, 0), kraken_stream(state, 1), H);
        const Tensor h_out = kraken_stream(out, 0);
        copy_tensor(h_out, H);
        const Tensor p_out = kraken_stream(out, 1);
        fill_zero_bytes(p_out.raw(), p_out.device(), p_out.nbytes());
        for (std::int64_t i = 0; i < degree(); ++i) {
            const Tensor a = attention_of(ctx, i, state);
            kernels::add(h_out, mlp_of(ctx, i, H, a, kraken_stream(out, 2 + i)), h_out);
        }
        return out;
    }

    // This rank's sub-layers: the incoming p is all-reduced while their
    // attentions run; then H = h + the sum, h_out = H and p_out = the sum of
    // this rank's outputs, reduced by the next layer (or KrakenMerge).
    [[nodiscard]] Tensor forward_placed(nn::Context& ctx, const Tensor& state) {
        const nn::TensorGroup& group = group_of(ctx);
        Tensor out = ctx.alloc(state.shape());
        const Tensor H = kraken_stream(out, 0);
        comm::Request sum = group.all_reduce_sum_async(kraken_stream(state, 1), H);
        std::vector<Tensor> attention(static_cast<std::size_t>(degree()));
        for (std::int64_t i = 0; i < degree(); ++i)
            if (holds(i)) attention[static_cast<std::size_t>(i)] = attention_of(ctx, i, state);
        sum.wait();
        kernels::add(kraken_stream(state, 0), H, H);
        const Tensor p_out = kraken_stream(out, 1);
        fill_zero_bytes(p_out.raw(), p_out.device(), p_out.nbytes());
        for (std::int64_t i = 0; i < degree(); ++i) {
            const Tensor local_out = kraken_stream(out, 2 + i);
            if (!holds(i)) fill_zero_bytes(local_out.raw(), local_out.device(), local_out.nbytes());
            else kernels::add(p_out, mlp_of(ctx, i, H, attention[static_cast<std::size_t>(i)], local_out), p_out);
        }
        return out;
    }

    // Sub-layer i's attention a_i on its local stream.
    [[nodiscard]] Tensor attention_of(nn::Context& ctx, std::int64_t i, const Tensor& state) {
        return nn::forward(subs[static_cast<std::size_t>(i)].attention, ctx, kraken_stream(state, 2 + i));
    }

    // Sub-layer i's output o_i = a_i + Mlp_i(H + a_i); writes local_i = H + o_i.
    [[nodiscard]] Tensor mlp_of(nn::Context& ctx, std::int64_t i, const Tensor& H, const Tensor& a,
                                const Tensor& local_out) {
        Tensor u = ctx.alloc(H.shape());
        kernels::add(H, a, u);
        const Tensor m = nn::forward(subs[static_cast<std::size_t>(i)].mlp, ctx, u);
        Tensor o = ctx.alloc(H.shape());
        kernels::add(a, m, o);
        kernels::add(H, o, local_out);
        return o;
    }

    // H's gradient dH reaches h and p alike (H = h + p). dh_out reaches H
    // directly and through every local stream (local_i = H + o_i); d o_i =
    // dh_out + dlocal_i feeds both a_i and m_i, and m_i's input gradient goes
    // to H and (through u_i = H + a_i) to a_i. p_out is 0 here: its gradient
    // goes nowhere.
    [[nodiscard]] Tensor backward_whole(nn::Context& ctx, const Tensor& dstate) {
        const Tensor dh_out = kraken_stream(dstate, 0);
        Tensor dstate_in = ctx.alloc(dstate.shape());
        const Tensor dH = kraken_stream(dstate_in, 0);
        copy_tensor(dH, dh_out);
        for (std::int64_t i = degree() - 1; i >= 0; --i) {
            const Tensor da = mlp_backward(ctx, i, dh_out, kraken_stream(dstate, 2 + i), dH);
            const Tensor dlocal_in = nn::backward_input(subs[static_cast<std::size_t>(i)].attention, ctx, da);
            copy_tensor(kraken_stream(dstate_in, 2 + i), dlocal_in);
        }
        copy_tensor(kraken_stream(dstate_in, 1), dH);
        return dstate_in;
    }

    // This rank's sub-layers: d o_i = dp_out + dlocal_i (p_out is their sum);
    // their shares of dH are all-reduced while their attentions' backward
    // runs, then dH = dh_out + the sum (the same on every rank).
    [[nodiscard]] Tensor backward_placed(nn::Context& ctx, const Tensor& dstate) {
        const nn::TensorGroup& group = group_of(ctx);
        Tensor dstate_in = ctx.alloc(dstate.shape());
        const Tensor shares = zeroed(ctx, kraken_stream(dstate, 0).shape());
        std::vector<Tensor> da(static_cast<std::size_t>(degree()));
        for (std::int64_t i = degree() - 1; i >= 0; --i)
            if (holds(i))
                da[static_cast<std::size_t>(i)] =
                    mlp_backward(ctx, i, kraken_stream(dstate, 1), kraken_stream(dstate, 2 + i), shares);
        const Tensor dH = kraken_stream(dstate_in, 0);
        comm::Request sum = group.all_reduce_sum_async(shares, dH);
        for (std::int64_t i = degree() - 1; i >= 0; --i) {
            const Tensor dlocal_in = kraken_stream(dstate_in, 2 + i);
            if (!holds(i)) fill_zero_bytes(dlocal_in.raw(), dlocal_in.device(), dlocal_in.nbytes());
            else copy_tensor(dlocal_in, nn::backward_input(subs[static_cast<std::size_t>(i)].attention, ctx,
                                                           da[static_cast<std::size_t>(i)]));
        }
        sum.wait();
        kernels::add(kraken_stream(dstate, 0), dH, dH);
        copy_tensor(kraken_stream(dstate_in, 1), dH);
        return dstate_in;
    }

    // Sub-layer i's MLP backward from d o_i = d_sum + dlocal_out: adds its
    // share of H's gradient (dlocal_out, then u's gradient) to `dH` and
    // returns a_i's gradient d o_i + du.
    [[nodiscard]] Tensor mlp_backward(nn::Context& ctx, std::int64_t i, const Tensor& d_sum, const Tensor& dlocal_out,
                                      const Tensor& dH) {
        kernels::add(dH, dlocal_out, dH);
        Tensor d_o = ctx.alloc(dH.shape());
        kernels::add(d_sum, dlocal_out, d_o);
        const Tensor du = nn::backward_input(subs[static_cast<std::size_t>(i)].mlp, ctx, d_o);
        kernels::add(dH, du, dH);
        Tensor da = ctx.alloc(dH.shape());
        kernels::add(d_o, du, da);
        return da;
    }

    [[nodiscard]] static Tensor zeroed(nn::Context& ctx, const Shape& shape) {
        Tensor t = ctx.alloc(shape);
        fill_zero_bytes(t.raw(), t.device(), t.nbytes());
        return t;
    }

    void check_state(const Tensor& state, const char* what) const {
        LOOM_CHECK(state.rank() == 4 && state.dim(0) == degree() + 2, "KrakenLayer: ", what, " of shape ",
                   state.shape(), " is not a Kraken state [", degree() + 2, ", batch, sequence, width] of degree ",
                   degree());
    }
};

// The embeddings [B, T, C] as the first layer's state: h and every local
// stream start equal, p is zero.
struct KrakenFanOut {
    std::int64_t degree = 1;

    // Whole on every tp rank (its input is the embeddings, the same on each).
    static constexpr nn::TensorCut tensor_cut = nn::TensorCut::replicated;

    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& x) {
        LOOM_CHECK(x.rank() == 3, "KrakenFanOut: input of shape ", x.shape(), " is not [batch, sequence, width]");
        Tensor state = ctx.alloc(Shape{degree + 2, x.dim(0), x.dim(1), x.dim(2)});
        copy_tensor(kraken_stream(state, 0), x);
        const Tensor p = kraken_stream(state, 1);
        fill_zero_bytes(p.raw(), p.device(), p.nbytes());
        for (std::int64_t k = 0; k < degree; ++k) copy_tensor(kraken_stream(state, 2 + k), x);
        return state;
    }

    // x's gradient: h's plus every local stream's (p is a constant). Under a
    // tp group each rank has the gradients of its own sub-layers' streams
    // (the others are zero there): their sum is reduced over the group
    // before h's, the same on every rank, is added.
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dstate) {
        Tensor dx = ctx.alloc(Shape{dstate.dim(1), dstate.dim(2), dstate.dim(3)});
        const nn::TensorGroup* group = ctx.tensor_group();
        if (group == nullptr || group->size() == 1) {
            copy_tensor(dx, kraken_stream(dstate, 0));
            for (std::int64_t k = 0; k < degree; ++k) kernels::add(dx, kraken_stream(dstate, 2 + k), dx);
            return dx;
        }
        copy_tensor(dx, kraken_stream(dstate, 2));
        for (std::int64_t k = 1; k < degree; ++k) kernels::add(dx, kraken_stream(dstate, 2 + k), dx);
        group->all_reduce_activations(dx);
        kernels::add(kraken_stream(dstate, 0), dx, dx);
        return dx;
    }
};

// The last layer's stream h + p (p all-reduced over a tp group), for the
// final LayerNorm; the local streams end here (their gradient is zero).
struct KrakenMerge {
    // Whole on every tp rank: h + the reduced p is the same on each.
    static constexpr nn::TensorCut tensor_cut = nn::TensorCut::replicated;

    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& state) {
        LOOM_CHECK(state.rank() == 4 && state.dim(0) >= 3, "KrakenMerge: input of shape ", state.shape(),
                   " is not a Kraken state [degree + 2, batch, sequence, width]");
        ctx.saved<Saved>(this).streams = state.dim(0);
        Tensor y = ctx.alloc(kraken_stream(state, 0).shape());
        copy_tensor(y, kraken_stream(state, 1));
        const nn::TensorGroup* group = ctx.tensor_group();
        if (group != nullptr && group->size() > 1) group->all_reduce_sum(y);
        kernels::add(kraken_stream(state, 0), y, y);
        return y;
    }

    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dy) {
        const std::int64_t streams = ctx.saved<Saved>(this).streams;
        Tensor dstate = ctx.alloc(Shape{streams, dy.dim(0), dy.dim(1), dy.dim(2)});
        fill_zero_bytes(dstate.raw(), dstate.device(), dstate.nbytes());
        copy_tensor(kraken_stream(dstate, 0), dy);
        copy_tensor(kraken_stream(dstate, 1), dy);
        return dstate;
    }

private:  // KrakenMerge stays an aggregate with no fields to reflect
    struct Saved {
        std::int64_t streams = 0;
    };
};

}  // namespace loom::gpt
