// Ulysses attention (DeepSpeed-Ulysses, arXiv 2309.14509) over a group of u
// sp ranks: the ranks hold positions of every sequence for all heads; one
// all-to-all turns that into the group's tokens for heads/u heads each. Each
// rank then attends with its heads, and a second all-to-all returns every
// output to the rank that holds its position. The backward is the same three
// steps on the gradients. Heads must divide over the group.
//
// Plain Ulysses is one group of all sp ranks: its tokens are whole
// sequences, attended with the ordinary causal kernel. The hybrid (USP) has
// R groups on a ring: each group's tokens are two zigzag chunks, attended by
// ring attention across the groups (nn/ring_attention.hpp). The layout
// (nn/sequence_layout.hpp) says which piece of which chunk each member holds;
// the group's tokens are assembled chunk by chunk in position order. Rows
// move by copy_rows and attention runs through the kernel table, so all of it
// runs where the layer's tensors live.
#pragma once

#include <algorithm>
#include <cstdint>

#include "loom/core/device_buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/attention_block_ops.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/ring_attention.hpp"
#include "loom/nn/sequence_layout.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

// What the forward keeps for the backward: this rank's heads over whole
// sequences ([B, T, 3 Cg] q, k, v; [B, T, Cg] output; [B, Hg, T] lse).
struct UlyssesSaved {
    Tensor qkv, out, lse;
    RingSaved ring;  // the hybrid: the ring's state over the groups
    // The forward's matrix-product precision (its Context's), which the
    // whole-sequence backward repeats.
    kernels::MatmulPrecision precision = kernels::MatmulPrecision::f32;
};

namespace ulysses_detail {

// Moves rows between member p's local tokens ([B, Tl, width] at `col`) and
// their places among the group's tokens ([B, Tg, cols]): member p's piece of
// the group's chunk j is rows [j c + p piece, + piece) there.
// to_group: local -> group; otherwise group -> local.
inline void move_rows(float* local, std::int64_t width, std::int64_t col, float* group, std::int64_t cols,
                      std::int64_t B, std::int64_t T, const SequenceLayout& layout, int p, bool to_group,
                      Device where) {
    const std::int64_t Tl = layout.local_tokens(T), c = layout.chunk_length(T), piece = layout.piece_length(T);
    const std::int64_t Tg = Tl * layout.ulysses;
    for (int j = 0; j < layout.runs_per_rank(); ++j)
        for (std::int64_t b = 0; b < B; ++b) {
            float* l = local + (b * Tl + j * piece) * width + col;
            float* g = group + (b * Tg + j * c + p * piece) * cols;
            if (to_group) ring_detail::copy_float_rows(g, cols, l, width, cols, piece, where);
            else ring_detail::copy_float_rows(l, width, g, cols, cols, piece, where);
        }
}

// For each rank p, `parts` column blocks of `cols` at part * stride + p * cols
// of `local` ([B, Tl, width]) into block p of `blocks` ([B, Tl, parts * cols]
// each), or back (unpack).
inline void pack_heads(const float* local, std::int64_t width, std::int64_t stride, std::int64_t cols, int parts,
                       int ranks, std::int64_t rows, float* blocks, Device where) {
    const std::int64_t block = rows * parts * cols;
    for (int p = 0; p < ranks; ++p)
        for (int part = 0; part < parts; ++part)
            ring_detail::copy_float_rows(blocks + p * block + part * cols, parts * cols,
                                         local + part * stride + p * cols, width, cols, rows, where);
}
inline void unpack_heads(const float* blocks, std::int64_t width, std::int64_t stride, std::int64_t cols, int parts,
                         int ranks, std::int64_t rows, float* local, Device where) {
    const std::int64_t block = rows * parts * cols;
    for (int p = 0; p < ranks; ++p)
        for (int part = 0; part < parts; ++part)
            ring_detail::copy_float_rows(local + part * stride + p * cols, width, blocks + p * block + part * cols,
                                         parts * cols, cols, rows, where);
}

}  // namespace ulysses_detail

namespace ulysses_detail {

// Non-causal attention's gradients over the group's whole sequences (the
// block kernel adds into dqkv, so it starts from zero).
inline void whole_sequence_backward_full(const UlyssesSaved& saved, const Tensor& dout, const Tensor& dqkv,
                                         std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) {
    const std::int64_t C = H * D;
    const Device where = dqkv.device();
    fill_zero_bytes(dqkv.raw(), where, static_cast<std::size_t>(B * T * 3 * C) * sizeof(float));
    const float* q = saved.qkv.data<float>();
    float* d = dqkv.data<float>();
    kernels::attention_block_backward(where, q, 3 * C, q + C, q + 2 * C, 3 * C, saved.out.data<float>(),
                                      dout.data<float>(), saved.lse.data<float>(), d, d + C, d + 2 * C, B, T, T, H, D,
                                      kernels::BlockMask::full, saved.precision);
}

}  // namespace ulysses_detail

// One line when the heads do not divide over the Ulysses group (every sp
// rank, or the hybrid's group of `ranks`).
inline void check_ulysses_heads(std::int64_t heads, int ranks) {
    LOOM_CHECK(heads % ranks == 0, "Ulysses: the ", heads, " attention heads (on this rank) do not split over the ",
               ranks, " sp ranks of a Ulysses group; use a group size that divides ", heads, " or RingAttention");
}

// The groups Ulysses talks to: its own (u ranks) and, for the hybrid, the
// ring of groups (null when the group is every sp rank).
struct UlyssesGroups {
    const TensorGroup* ulysses = nullptr;
    const TensorGroup* ring = nullptr;
};

// out ([B, Tl, C]) = attention of this rank's tokens in qkv ([B, Tl, 3C], H
// heads of D), causal or not.
inline void ulysses_attention_forward(Context& ctx, const UlyssesGroups& groups, const SequenceLayout& layout,
                                      bool causal, const Tensor& qkv, std::int64_t B, std::int64_t Tl, std::int64_t H,
                                      std::int64_t D, const Tensor& out, UlyssesSaved& saved) {
    using namespace ulysses_detail;
    const int n = layout.ulysses;
    check_ulysses_heads(H, n);
    LOOM_CHECK(groups.ulysses != nullptr && groups.ulysses->size() == n &&
                   (layout.ring_ranks() == 1 || (groups.ring != nullptr && groups.ring->size() == layout.ring_ranks())),
               "Ulysses: groups of ", groups.ulysses ? groups.ulysses->size() : 0, " (and a ring of ",
               groups.ring ? groups.ring->size() : 0, ") for a layout of ", n, " x ", layout.ring_ranks(),
               "; pass the groups the layout describes");
    const std::int64_t T = Tl * layout.ranks, Tg = Tl * n;
    const std::int64_t C = H * D, Hg = H / n, Cg = Hg * D, rows = B * Tl;
    // My tokens' q, k, v, head group by head group -> the group's tokens for
    // my heads. The all-to-all buffers are scratch of the call; what the
    // backward needs (the group's q, k, v and output) stays in the context.
    using ring_detail::scratch;
    using ring_detail::whole;
    const Device where = qkv.device();
    const DeviceBuffer send_buffer = scratch(n * rows * 3 * Cg, where), recv_buffer = scratch(n * rows * 3 * Cg, where);
    const Tensor send = whole(send_buffer), recv = whole(recv_buffer);
    pack_heads(qkv.data<float>(), 3 * C, C, Cg, 3, n, rows, send.data<float>(), where);
    groups.ulysses->all_to_all(send, recv);
    saved.qkv = ctx.alloc(Shape{B, Tg, 3 * Cg});
    for (int p = 0; p < n; ++p)
        move_rows(recv.data<float>() + p * rows * 3 * Cg, 3 * Cg, 0, saved.qkv.data<float>(), 3 * Cg, B, T, layout, p,
                  /*to_group=*/true, where);
    saved.out = ctx.alloc(Shape{B, Tg, Cg});
    saved.precision = ctx.matmul_precision();
    if (layout.ring_ranks() > 1) {
        ring_attention_forward(ctx, *groups.ring, layout.ring(), causal, saved.qkv, {B, Tg, Hg, D}, saved.out,
                               saved.ring);
    } else if (causal) {
        saved.lse = ctx.alloc(Shape{B, Hg, Tg});
        kernels::attention_forward(saved.qkv, saved.out, saved.lse, B, Tg, Hg, D, ctx.matmul_precision());
    } else {
        saved.lse = ctx.alloc(Shape{B, Hg, Tg});
        const float* q = saved.qkv.data<float>();
        kernels::attention_block_forward(where, q, 3 * Cg, q + Cg, q + 2 * Cg, 3 * Cg, saved.out.data<float>(),
                                         saved.lse.data<float>(), B, Tg, Tg, Hg, D, kernels::BlockMask::full,
                                         saved.precision);
    }
    // Every member's tokens of my heads' output back to it.
    const DeviceBuffer back_buffer = scratch(n * rows * Cg, where), mine_buffer = scratch(n * rows * Cg, where);
    const Tensor back = whole(back_buffer), mine = whole(mine_buffer);
    for (int p = 0; p < n; ++p)
        move_rows(back.data<float>() + p * rows * Cg, Cg, 0, saved.out.data<float>(), Cg, B, T, layout, p,
                  /*to_group=*/false, where);
    groups.ulysses->all_to_all(back, mine);
    unpack_heads(mine.data<float>(), C, 0, Cg, 1, n, rows, out.data<float>(), where);
}

// dqkv ([B, Tl, 3C], written) from dout ([B, Tl, C]).
inline void ulysses_attention_backward(const UlyssesGroups& groups, const SequenceLayout& layout, bool causal,
                                       const UlyssesSaved& saved, const Tensor& dout, std::int64_t B, std::int64_t Tl,
                                       std::int64_t H, std::int64_t D, const Tensor& dqkv) {
    using namespace ulysses_detail;
    const int n = layout.ulysses;
    const std::int64_t T = Tl * layout.ranks, Tg = Tl * n;
    const std::int64_t C = H * D, Hg = H / n, Cg = Hg * D, rows = B * Tl;
    // Everything here is scratch of the call: nothing outlives the backward.
    using ring_detail::scratch;
    using ring_detail::whole;
    const Device where = dout.device();
    const DeviceBuffer send_buffer = scratch(n * rows * Cg, where), recv_buffer = scratch(n * rows * Cg, where);
    const Tensor send = whole(send_buffer), recv = whole(recv_buffer);
    pack_heads(dout.data<float>(), C, 0, Cg, 1, n, rows, send.data<float>(), where);
    groups.ulysses->all_to_all(send, recv);
    const DeviceBuffer dout_buffer = scratch(B * Tg * Cg, where);
    const Tensor dout_group = Tensor(dout_buffer.raw(), DType::f32, Shape{B, Tg, Cg}, where);
    for (int p = 0; p < n; ++p)
        move_rows(recv.data<float>() + p * rows * Cg, Cg, 0, dout_group.data<float>(), Cg, B, T, layout, p,
                  /*to_group=*/true, where);
    const DeviceBuffer dqkv_buffer = scratch(B * Tg * 3 * Cg, where);
    const Tensor dqkv_group = Tensor(dqkv_buffer.raw(), DType::f32, Shape{B, Tg, 3 * Cg}, where);
    if (layout.ring_ranks() > 1)
        ring_attention_backward(*groups.ring, layout.ring(), causal, saved.qkv, saved.out, saved.ring, dout_group,
                                {B, Tg, Hg, D}, dqkv_group);
    else if (!causal)
        whole_sequence_backward_full(saved, dout_group, dqkv_group, B, Tg, Hg, D);
    else
        kernels::attention_backward(saved.qkv, saved.out, dout_group, saved.lse, dqkv_group, B, Tg, Hg, D,
                                    saved.precision);
    const DeviceBuffer back_buffer = scratch(n * rows * 3 * Cg, where), mine_buffer = scratch(n * rows * 3 * Cg, where);
    const Tensor back = whole(back_buffer), mine = whole(mine_buffer);
    for (int p = 0; p < n; ++p)
        move_rows(back.data<float>() + p * rows * 3 * Cg, 3 * Cg, 0, dqkv_group.data<float>(), 3 * Cg, B, T, layout,
                  p, /*to_group=*/false, where);
    groups.ulysses->all_to_all(back, mine);
    unpack_heads(mine.data<float>(), 3 * C, C, Cg, 3, n, rows, dqkv.data<float>(), where);
}

}  // namespace loom::nn
