// Embedding: token ids [B, T] (i32) -> token vectors + learned position
// vectors, [B, T, C]. The first layer of a language model: its input has no
// gradient, so backward_input returns an empty tensor.
//
// Tensor parallelism (vocabulary-parallel, parallel/tensor_parallel_vocab.hpp
// cuts the table): a token table that is a shard by rows holds tokens
// [start, start + V/t) of the vocabulary. Each rank looks up only its own
// tokens (zeros for the rest) and the group sums the partial outputs, so no
// rank holds the whole table; exactly one rank contributed each token's row,
// so the sum is the whole layer's row bit for bit. The position table stays
// whole and replicated: it is added after the sum, by every rank alike.
//
// Optimus 2D (parallel/optimus2d.hpp cuts both tables): rank (i, j) holds
// tokens block i and features block j of the token table, features j of the
// position table, and its output is the activations' block (sequences i,
// features j). Each rank looks up the whole batch's tokens in its rows, and a
// reduce-scatter over the grid column sums the partial lookups and hands grid
// row i its sequences. Backward all-gathers the output gradient over the
// column, so each rank finds every use of its tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/tensor.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/summa.hpp"
#include "loom/nn/tensor_cut.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

struct Embedding {
    // Its tensor-parallel cut (nn/tensor_cut.hpp): token rows by vocabulary (1D), a block (2D).
    static constexpr TensorCut tensor_cut = TensorCut::vocabulary;
    // Its only activation is its output: recomputing it alone saves nothing (Recompute<...>).
    static constexpr bool worth_recomputing = false;
    Param token;     // [vocab, C]; a tp shard: [vocab/t, C], rows from token.slice.start
    Param position;  // [max sequence, C]; whole on every tp rank

    [[nodiscard]] static Embedding make(std::int64_t vocab, std::int64_t max_sequence, std::int64_t width,
                                        float std = 0.02f) {
        LOOM_CHECK(vocab >= 1 && max_sequence >= 1 && width >= 1, "Embedding: vocab ", vocab, ", sequence ",
                   max_sequence, ", width ", width, "; all must be at least 1");
        return Embedding{Param{Shape{vocab, width}, Init::normal(std)},
                         Param{Shape{max_sequence, width}, Init::normal(std)}};
    }

    // The rows this layer holds: the whole vocabulary, or its shard's.
    [[nodiscard]] std::int64_t vocab() const { return token.shape.dim(0); }
    [[nodiscard]] std::int64_t max_sequence() const { return position.shape.dim(0); }
    [[nodiscard]] std::int64_t width() const { return token.shape.dim(1); }
    // The token table is this rank's rows of a vocabulary split over the tp group.
    [[nodiscard]] bool vocab_parallel() const { return token.slice.shard(); }
    // The token table is cut by rows and features over an Optimus 2D grid.
    [[nodiscard]] bool grid() const { return token.slice.along(1) != nullptr; }

    struct Saved {
        Tensor tokens, dy;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& tokens) {
        LOOM_CHECK(tokens.rank() == 2 && tokens.dtype() == DType::i32, "Embedding: tokens must be i32 [batch, sequence], got ",
                   tokens.dtype(), " ", tokens.shape());
        const std::int64_t B = tokens.dim(0), T = tokens.dim(1);
        const std::int64_t whole_T = T * ctx.sequence().layout().ranks;  // sp: this rank holds T of each sequence
        LOOM_CHECK(whole_T <= max_sequence(), "Embedding: sequence of ", whole_T, " tokens is longer than the ",
                   max_sequence(), " positions the model has");
        ctx.saved<Saved>(this).tokens = tokens;
        if (grid()) {
            LOOM_CHECK(!ctx.sequence().active(), "Embedding: Optimus 2D with sequence parallelism is not supported; "
                                                 "use TensorParallel (1D) with an sp axis");
            return forward_grid(ctx, tokens);
        }
        Tensor y = ctx.alloc(Shape{B, T, width()});
        if (vocab_parallel() || ctx.sequence().active()) {
            forward_by_rows(ctx, tokens, y);
            return y;
        }
        kernels::embedding_forward(tokens, token.value, position.value, y, B, T, width(), vocab());
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        ctx.saved<Saved>(this).dy = dy;
        return Tensor();
    }

    void backward_weight(Context& ctx) {
        auto& saved = ctx.saved<Saved>(this);
        if (grid()) {
            backward_weight_grid(grid_of(ctx, "Embedding"), saved);
            return;
        }
        if (vocab_parallel() || ctx.sequence().active()) {
            backward_weight_by_rows(ctx, saved);
            return;
        }
        kernels::embedding_backward(saved.tokens, saved.dy, token.grad, position.grad, saved.tokens.dim(0),
                                    saved.tokens.dim(1), width());
    }

private:  // functions only: Embedding stays an aggregate
    // This rank's tokens: [start, start + vocab()) of the whole vocabulary.
    [[nodiscard]] std::int64_t vocab_start() const {
        return token.slice.along(0) != nullptr ? token.slice.along(0)->start : 0;
    }

    // Row by row: a vocabulary shard's rows (zeros for others' tokens, then
    // summed over the tp group), plus each row's position: 0..T-1, or under
    // sequence parallelism this rank's runs of positions (sequence_layout.hpp).
    void forward_by_rows(Context& ctx, const Tensor& tokens, const Tensor& y) const {
        const std::int64_t T = tokens.dim(1), C = width();
        kernels::embedding_slice_lookup(tokens, token.value, y, T, C, vocab_start(), vocab_start() + vocab(),
                                        token.full_shape()[0]);
        if (vocab_parallel()) {
            const TensorGroup* group = ctx.tensor_group();
            LOOM_CHECK(group != nullptr, "Embedding: its token table is a vocabulary shard but the context has no "
                                         "tensor-parallel group; run it through an executor with a tp axis");
            group->all_reduce_activations(y);
        }
        if (!ctx.sequence().active()) {
            kernels::add_bias(y, position.value.slice(0, 0, T), tokens.dim(0), T * C);
            return;
        }
        const Tensor local = ctx.alloc(Shape{T, C});
        move_local_positions(ctx.sequence(), T, position.value, local, /*to_local=*/true);
        kernels::add_bias(y, local, tokens.dim(0), T * C);
    }

    // Rows of the position table `table` and this rank's local positions
    // [T, C] (row t: the position of its local token t), one copy per run.
    void move_local_positions(const SequenceParallelism& sp, std::int64_t T, const Tensor& table, const Tensor& local,
                              bool to_local) const {
        const std::int64_t C = width();
        const auto bytes = [&](std::int64_t rows) { return static_cast<std::size_t>(rows * C) * sizeof(float); };
        const SequenceLayout layout = sp.layout();
        for (const SequenceRun& run : layout.runs(T * layout.ranks)) {
            float* at_table = table.data<float>() + run.position * C;
            float* at_local = local.data<float>() + run.local * C;
            if (to_local) copy_bytes(at_local, local.device(), at_table, table.device(), bytes(run.length));
            else copy_bytes(at_table, table.device(), at_local, local.device(), bytes(run.length));
        }
    }

    [[nodiscard]] Tensor forward_grid(Context& ctx, const Tensor& tokens) const {
        const TensorGrid& g = grid_of(ctx, "Embedding");
        const std::int64_t B = tokens.dim(0), T = tokens.dim(1), C = width();
        LOOM_CHECK(B % g.q == 0, "Embedding: a batch of ", B, " sequences does not split over the ", g.q,
                   " rows of the Optimus 2D grid; use a batch that is a multiple of ", g.q);
        const DeviceBuffer partial(DType::f32, Shape{B * T * C}, token.value.device());
        kernels::embedding_slice_lookup(tokens, token.value, partial.tensor(), T, C, vocab_start(),
                                        vocab_start() + vocab(), token.full_shape()[0]);
        Tensor y = ctx.alloc(Shape{B / g.q, T, C});
        g.column->reduce_scatter_sum(partial.tensor(), y);
        kernels::add_bias(y, position.value.slice(0, 0, T), B / g.q, T * C);
        return y;
    }

    // The output gradient of every sequence (gathered down the grid column):
    // this rank's tokens take their rows, and the position gradient sums all
    // sequences in order, as the whole layer does, on every rank alike.
    void backward_weight_grid(const TensorGrid& g, const Saved& saved) {
        const std::int64_t rows = saved.tokens.numel(), C = width();
        const DeviceBuffer whole(DType::f32, Shape{rows * C}, token.grad.device());
        g.column->all_gather(saved.dy, whole.tensor());
        kernels::embedding_slice_backward(saved.tokens, whole.tensor(), token.grad, position.grad, saved.tokens.dim(1),
                                          C, vocab_start(), vocab_start() + vocab());
    }

    // Under tp, dy is whole and the same on every rank (the layers after this
    // one are replicated, or all-reduce their input gradient): each rank keeps
    // its own tokens' rows, and the whole position gradient, as the unsplit
    // layer does. Under sp, the rows are this rank's positions: their
    // gradient rows are gathered into local order, added to there (row by
    // row, in the host order), and put back.
    void backward_weight_by_rows(Context& ctx, const Saved& saved) {
        const std::int64_t T = saved.tokens.dim(1), C = width();
        const std::int64_t start = vocab_start(), stop = start + vocab();
        if (!ctx.sequence().active()) {
            kernels::embedding_slice_backward(saved.tokens, saved.dy, token.grad, position.grad, T, C, start, stop);
            return;
        }
        const Tensor local = ctx.alloc(Shape{T, C});
        move_local_positions(ctx.sequence(), T, position.grad, local, /*to_local=*/true);
        kernels::embedding_slice_backward(saved.tokens, saved.dy, token.grad, local, T, C, start, stop);
        move_local_positions(ctx.sequence(), T, position.grad, local, /*to_local=*/false);
    }
};

}  // namespace loom::nn
