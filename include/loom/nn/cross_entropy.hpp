// CrossEntropy: the loss layer. Takes logits [..., V] and the context's
// targets (one i32 per row), returns the mean negative log-likelihood as a
// one-element tensor (also in ctx.loss()). Fused log-softmax: only one
// log-sum-exp per row is kept for backward. Its backward_input takes dloss
// (a one-element tensor, 1 to start backpropagation) and returns dlogits.
//
// Vocabulary-parallel (vocab_start >= 0, set by tp::shard_vocab_head): the
// logits are this tp rank's slice [vocab_start, vocab_start + V) of a
// vocabulary of V * t classes, from a head Linear split by columns, so no
// rank ever holds a whole row. The forward reduces three numbers per row over
// the group (the max, the sum of exponentials, the target's logit) and every
// rank gets the same loss; the backward is local, as softmax - onehot on this
// slice, and the head's f sums the input gradient.
//
// Optimus 2D (grid, set by tp::shard_grid_head): rank (i, j) holds rows i
// and classes j of the logits, from a head Linear cut in 2D. The row
// statistics are reduced over the grid row as above, with the rows' targets
// taken from the whole micro-batch's; the loss, a mean over rows i, is
// averaged over the grid column, so every rank reports the whole loss.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/kernels/host/cross_entropy.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/summa.hpp"
#include "loom/nn/tensor_cut.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

struct CrossEntropy {
    // Its tensor-parallel cut (nn/tensor_cut.hpp): vocabulary-parallel after the head (1D), the grid (2D).
    static constexpr TensorCut tensor_cut = TensorCut::loss;
    std::int64_t vocab_start = -1;  // the first class of this rank's logits; -1: the logits are whole
    bool grid = false;              // rows and classes cut over an Optimus 2D grid

    [[nodiscard]] bool vocab_parallel() const noexcept { return vocab_start >= 0 || grid; }

    struct Saved {
        Tensor logits, logsumexp;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& logits) {
        const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
        const Tensor targets = local_targets(ctx, rows, V);
        auto& saved = ctx.saved<Saved>(this);
        saved.logits = logits;
        saved.logsumexp = ctx.alloc(Shape{rows});
        float loss = vocab_parallel() ? forward_vocab_parallel(ctx, logits, targets, saved.logsumexp)
                                      : kernels::cross_entropy_forward(logits, targets, saved.logsumexp, rows, V);
        if (grid) {
            // Each grid row's mean over its rows; the rows blocks are equal, so
            // the whole mean is their average.
            const TensorGrid& g = grid_of(ctx, "CrossEntropy");
            Tensor mean = ctx.alloc(Shape{1});
            write_scalar(mean, loss);
            g.column->all_reduce_sum(mean);
            loss = read_scalar<float>(mean) / static_cast<float>(g.q);
        }
        ctx.set_loss(loss);
        Tensor out = ctx.alloc(Shape{1});
        write_scalar(out, loss);
        return out;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dloss) {
        auto& saved = ctx.saved<Saved>(this);
        const std::int64_t V = saved.logits.dim(-1), rows = saved.logits.numel() / V;
        Tensor dlogits = ctx.alloc(saved.logits.shape());
        const Tensor targets = local_targets(ctx, rows, V);
        if (vocab_parallel()) {
            // On a grid this rank's rows are 1/q of the mean.
            const float scale = grid ? 1.0f / static_cast<float>(grid_of(ctx, "CrossEntropy").q) : 1.0f;
            kernels::cross_entropy_slice_backward(saved.logits, targets, saved.logsumexp,
                                                  read_scalar<float>(dloss) * scale, dlogits, rows, V,
                                                  first_class(ctx, V), V * group(ctx).size());
            return dlogits;
        }
        kernels::cross_entropy_backward(saved.logits, targets, saved.logsumexp, read_scalar<float>(dloss), dlogits,
                                        rows, V);
        return dlogits;
    }

private:  // functions only: CrossEntropy stays an aggregate
    // The targets of this rank's rows: all of the context's, or on a grid
    // the block of grid row i.
    [[nodiscard]] Tensor local_targets(const Context& ctx, std::int64_t rows, std::int64_t V) const {
        const Tensor& targets = ctx.targets();
        const std::int64_t blocks = grid ? grid_of(ctx, "CrossEntropy").q : 1;
        LOOM_CHECK(targets.dtype() == DType::i32 && targets.numel() == rows * blocks, "CrossEntropy: ", rows * blocks,
                   " rows of logits need as many i32 targets; the context has ", targets.numel(), " x ",
                   targets.dtype(), " (call ctx.set_targets)");
        if (!grid) return targets;
        // Every rank checks every row's target (named by its whole row), so a
        // bad one throws on all of them before any collective; a device's
        // targets are checked through a host copy.
        if (targets.device().kind == DeviceKind::host)
            kernels::host::detail::check_cross_entropy(targets.data<std::int32_t>(), rows * blocks, V * blocks);
        else
            kernels::host::detail::check_cross_entropy(to_host<std::int32_t>(targets).data(), rows * blocks, V * blocks);
        return Tensor(targets.data<std::int32_t>() + grid_of(ctx, "CrossEntropy").i * rows, DType::i32, Shape{rows},
                      targets.device());
    }

    // This rank's first class: on a grid, column j holds classes block j.
    [[nodiscard]] std::int64_t first_class(const Context& ctx, std::int64_t V) const {
        return grid ? grid_of(ctx, "CrossEntropy").j * V : vocab_start;
    }

    // The ranks that share each row's classes: the tp group, or the grid row.
    [[nodiscard]] const TensorGroup& group(const Context& ctx) const {
        if (grid) return *grid_of(ctx, "CrossEntropy").row;
        const TensorGroup* g = ctx.tensor_group();
        LOOM_CHECK(g != nullptr, "CrossEntropy: vocabulary-parallel from class ", vocab_start,
                   " but the context has no tensor-parallel group; run it through an executor with a tp axis");
        return *g;
    }

    // logsumexp = max + log(sum e^(x - max)) over the whole row, from each
    // rank's slice: the max first (so every rank exponentiates against the
    // same one and nothing overflows), then the sums and the target's logit in
    // one all-reduce. Every rank then holds the same row statistics, so the
    // same loss, summed in double as the whole kernel does.
    [[nodiscard]] float forward_vocab_parallel(Context& ctx, const Tensor& logits, const Tensor& targets,
                                               const Tensor& logsumexp) const {
        const TensorGroup& g = group(ctx);
        const std::int64_t V = logits.dim(-1), rows = logits.numel() / V, classes = V * g.size();
        const std::int64_t start = first_class(ctx, V);
        LOOM_CHECK(grid || vocab_start == g.rank() * V, "CrossEntropy: logits of classes [", vocab_start, ", ",
                   vocab_start + V, ") are not tp rank ", g.rank(), "'s slice of the ", classes,
                   " classes; shard the head and the loss with the group's rank (classes [", g.rank() * V, ", ",
                   (g.rank() + 1) * V, "))");
        kernels::cross_entropy_slice_max(logits, targets, logsumexp, rows, V, classes);  // the max until below
        g.all_reduce_max(logsumexp);
        Tensor sums = ctx.alloc(Shape{2, rows});
        kernels::cross_entropy_slice_sums(logits, targets, logsumexp, sums, rows, V, start);
        g.all_reduce_sum(sums);
        // The row statistics are finished on the host (three floats a row,
        // copied from a device), in double as the whole kernel sums.
        const std::vector<float> row_sums = to_host<float>(sums);
        std::vector<float> lse = to_host<float>(logsumexp);
        const float* target_logit = row_sums.data() + rows;
        double loss_sum = 0.0;
        for (std::int64_t r = 0; r < rows; ++r) {
            auto& l = lse[static_cast<std::size_t>(r)];
            l += std::log(row_sums[static_cast<std::size_t>(r)]);
            loss_sum += static_cast<double>(l) - static_cast<double>(target_logit[r]);
        }
        copy_tensor(logsumexp, Tensor::of(lse.data(), {rows}));
        return static_cast<float>(loss_sum / static_cast<double>(rows));
    }
};

}  // namespace loom::nn
