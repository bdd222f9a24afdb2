// Ulysses attention (DeepSpeed-Ulysses, arXiv 2309.14509) over the sp axis:
// the ranks hold positions of every sequence for all heads; one all-to-all
// turns that into whole sequences for heads/sp heads each. Each rank then
// runs the ordinary causal attention kernel on its heads, and a second
// all-to-all returns every output to the rank that holds its position. The
// backward is the same three steps on the gradients. Heads must divide over
// the sp ranks.
//
// Whatever the layout (nn/sequence_layout.hpp), a rank's tokens are runs of
// positions: the gathered sequence is assembled run by run in position order,
// so the causal kernel sees the true order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/sequence_layout.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

// What the forward keeps for the backward: this rank's heads over whole
// sequences ([B, T, 3 Cg] q, k, v; [B, T, Cg] output; [B, Hg, T] lse).
struct UlyssesSaved {
    Tensor qkv, out, lse;
};

namespace ulysses_detail {

// Moves rows between a rank's local tokens ([B, Tl, width] at `col`) and
// their positions in whole sequences ([B, T, cols]), for `rank`'s runs.
// to_whole: local -> whole; otherwise whole -> local.
inline void move_rows(float* local, std::int64_t width, std::int64_t col, float* whole, std::int64_t cols,
                      std::int64_t B, std::int64_t T, const SequenceLayout& layout, int rank, bool to_whole) {
    const std::int64_t Tl = layout.local_tokens(T);
    for (const SequenceRun& run : layout.runs(T, rank))
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < run.length; ++t) {
                float* l = local + (b * Tl + run.local + t) * width + col;
                float* w = whole + (b * T + run.position + t) * cols;
                if (to_whole) std::copy_n(l, cols, w);
                else std::copy_n(w, cols, l);
            }
}

// For each rank p, `parts` column blocks of `cols` at part * stride + p * cols
// of `local` ([B, Tl, width]) into block p of `blocks` ([B, Tl, parts * cols]
// each), or back (unpack).
inline void pack_heads(const float* local, std::int64_t width, std::int64_t stride, std::int64_t cols, int parts,
                       int ranks, std::int64_t rows, float* blocks) {
    const std::int64_t block = rows * parts * cols;
    for (int p = 0; p < ranks; ++p)
        for (std::int64_t r = 0; r < rows; ++r)
            for (int part = 0; part < parts; ++part)
                std::copy_n(local + r * width + part * stride + p * cols, cols,
                            blocks + p * block + (r * parts + part) * cols);
}
inline void unpack_heads(const float* blocks, std::int64_t width, std::int64_t stride, std::int64_t cols, int parts,
                         int ranks, std::int64_t rows, float* local) {
    const std::int64_t block = rows * parts * cols;
    for (int p = 0; p < ranks; ++p)
        for (std::int64_t r = 0; r < rows; ++r)
            for (int part = 0; part < parts; ++part)
                std::copy_n(blocks + p * block + (r * parts + part) * cols, cols,
                            local + r * width + part * stride + p * cols);
}

}  // namespace ulysses_detail

// One line when the heads do not divide over the sp ranks.
inline void check_ulysses_heads(std::int64_t heads, int ranks) {
    LOOM_CHECK(heads % ranks == 0, "Ulysses: the ", heads, " attention heads (on this rank) do not split over the ",
               ranks, " sp ranks; use an sp degree that divides ", heads, " or RingAttention");
}

// out ([B, Tl, C]) = causal attention of this rank's tokens in qkv ([B, Tl, 3C], H heads of D).
inline void ulysses_attention_forward(Context& ctx, const TensorGroup& group, const SequenceLayout& layout,
                                      const Tensor& qkv, std::int64_t B, std::int64_t Tl, std::int64_t H,
                                      std::int64_t D, const Tensor& out, UlyssesSaved& saved) {
    using namespace ulysses_detail;
    const int n = layout.ranks;
    check_ulysses_heads(H, n);
    const std::int64_t C = H * D, Hg = H / n, Cg = Hg * D, T = Tl * n, rows = B * Tl;
    // My tokens' q, k, v, head group by head group -> every rank's tokens for my heads.
    Tensor send = ctx.alloc(Shape{n * rows * 3 * Cg}), recv = ctx.alloc(Shape{n * rows * 3 * Cg});
    pack_heads(qkv.data<float>(), 3 * C, C, Cg, 3, n, rows, send.data<float>());
    group.all_to_all(send, recv);
    saved.qkv = ctx.alloc(Shape{B, T, 3 * Cg});
    for (int p = 0; p < n; ++p)
        move_rows(recv.data<float>() + p * rows * 3 * Cg, 3 * Cg, 0, saved.qkv.data<float>(), 3 * Cg, B, T, layout, p,
                  /*to_whole=*/true);
    saved.out = ctx.alloc(Shape{B, T, Cg});
    saved.lse = ctx.alloc(Shape{B, Hg, T});
    kernels::host::attention_forward(saved.qkv.data<float>(), saved.out.data<float>(), saved.lse.data<float>(), B, T,
                                     Hg, D);
    // Every rank's positions of my heads' output back to it.
    Tensor back = ctx.alloc(Shape{n * rows * Cg}), mine = ctx.alloc(Shape{n * rows * Cg});
    for (int p = 0; p < n; ++p)
        move_rows(back.data<float>() + p * rows * Cg, Cg, 0, saved.out.data<float>(), Cg, B, T, layout, p,
                  /*to_whole=*/false);
    group.all_to_all(back, mine);
    unpack_heads(mine.data<float>(), C, 0, Cg, 1, n, rows, out.data<float>());
}

// dqkv ([B, Tl, 3C], written) from dout ([B, Tl, C]).
inline void ulysses_attention_backward(Context& ctx, const TensorGroup& group, const SequenceLayout& layout,
                                       const UlyssesSaved& saved, const Tensor& dout, std::int64_t B, std::int64_t Tl,
                                       std::int64_t H, std::int64_t D, const Tensor& dqkv) {
    using namespace ulysses_detail;
    const int n = layout.ranks;
    const std::int64_t C = H * D, Hg = H / n, Cg = Hg * D, T = Tl * n, rows = B * Tl;
    Tensor send = ctx.alloc(Shape{n * rows * Cg}), recv = ctx.alloc(Shape{n * rows * Cg});
    pack_heads(dout.data<float>(), C, 0, Cg, 1, n, rows, send.data<float>());
    group.all_to_all(send, recv);
    Tensor dout_whole = ctx.alloc(Shape{B, T, Cg});
    for (int p = 0; p < n; ++p)
        move_rows(recv.data<float>() + p * rows * Cg, Cg, 0, dout_whole.data<float>(), Cg, B, T, layout, p,
                  /*to_whole=*/true);
    Tensor dqkv_whole = ctx.alloc(Shape{B, T, 3 * Cg});
    kernels::host::attention_backward(saved.qkv.data<float>(), saved.out.data<float>(), dout_whole.data<float>(),
                                      saved.lse.data<float>(), dqkv_whole.data<float>(), B, T, Hg, D);
    Tensor back = ctx.alloc(Shape{n * rows * 3 * Cg}), mine = ctx.alloc(Shape{n * rows * 3 * Cg});
    for (int p = 0; p < n; ++p)
        move_rows(back.data<float>() + p * rows * 3 * Cg, 3 * Cg, 0, dqkv_whole.data<float>(), 3 * Cg, B, T, layout, p,
                  /*to_whole=*/false);
    group.all_to_all(back, mine);
    unpack_heads(mine.data<float>(), 3 * C, C, Cg, 3, n, rows, dqkv.data<float>());
}

}  // namespace loom::nn
