// Cross-entropy on logits: fused log-softmax and negative log-likelihood,
// averaged over rows, as PyTorch's F.cross_entropy(logits, targets) (mean
// reduction, no ignore_index: every target must be a class). The forward keeps
// logsumexp per row, so the backward rebuilds softmax in one pass without
// storing [rows, V] probabilities.
//
// Vocabulary-parallel (Megatron): a rank holds columns [start, start + V) of
// each row of logits. The cross_entropy_slice_* kernels compute the per-rank
// pieces of the same logsumexp (a local max, then a local sum of exponentials
// against the group's max) and the target's logit where this rank holds it;
// the caller reduces them over the group in between.
#pragma once

#include <cmath>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/host/elementwise.hpp"

namespace loom::kernels::host {

namespace detail {

inline void check_cross_entropy(const std::int32_t* targets, std::int64_t rows, std::int64_t V) {
    LOOM_CHECK(rows >= 1, "cross_entropy: rows = ", rows, " has nothing to average; pass rows >= 1");
    LOOM_CHECK(V >= 1, "cross_entropy: V = ", V, " has no classes; pass V >= 1");
    for (std::int64_t r = 0; r < rows; ++r) {
        LOOM_CHECK(targets[r] >= 0 && targets[r] < V, "cross_entropy: target ", targets[r], " at row ", r,
                   " is outside the classes [0, ", V, ")");
    }
}

// logsumexp = max + log(sum_j e^(x_j - max)): every exponent is <= 0, nothing
// overflows, and the sum is >= 1 so its log is well conditioned. The per-row
// losses are summed in double: rows of them, once per step, so the mean does
// not drift with the batch size.
LOOM_KERNEL_DISPATCH inline double cross_entropy_loss_sum(const float* __restrict logits,
                                                          const std::int32_t* __restrict targets,
                                                          float* __restrict logsumexp, std::int64_t rows,
                                                          std::int64_t V) noexcept {
    double loss_sum = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* __restrict xr = logits + r * V;
        const float row_max = max_over(V, [&](std::int64_t j) { return xr[j]; });
        const float sum = sum_over(V, [&](std::int64_t j) { return fast_exp(xr[j] - row_max); });
        const float lse = row_max + std::log(sum);
        logsumexp[r] = lse;
        loss_sum += static_cast<double>(lse) - static_cast<double>(xr[targets[r]]);
    }
    return loss_sum;
}

LOOM_KERNEL_DISPATCH inline void cross_entropy_backward_rows(const float* __restrict logits,
                                                             const std::int32_t* __restrict targets,
                                                             const float* __restrict logsumexp, float scale,
                                                             float* __restrict dlogits, std::int64_t rows,
                                                             std::int64_t V) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* __restrict xr = logits + r * V;
        float* __restrict dr = dlogits + r * V;
        const float lse = logsumexp[r];
        for (std::int64_t j = 0; j < V; ++j) dr[j] = fast_exp(xr[j] - lse) * scale;
        // (p - 1) * scale rather than p * scale - scale: p - 1 is exact for
        // p >= 0.5, so a confident right answer keeps its small gradient.
        const std::int32_t t = targets[r];
        dr[t] = (fast_exp(xr[t] - lse) - 1.0f) * scale;
    }
}

// As cross_entropy_backward_rows, on columns [start, start + V) of a wider
// vocabulary: a target outside them has no one-hot term here.
LOOM_KERNEL_DISPATCH inline void cross_entropy_slice_backward_rows(const float* __restrict logits,
                                                                   const std::int32_t* __restrict targets,
                                                                   const float* __restrict logsumexp, float scale,
                                                                   float* __restrict dlogits, std::int64_t rows,
                                                                   std::int64_t V, std::int64_t start) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* __restrict xr = logits + r * V;
        float* __restrict dr = dlogits + r * V;
        const float lse = logsumexp[r];
        for (std::int64_t j = 0; j < V; ++j) dr[j] = fast_exp(xr[j] - lse) * scale;
        const std::int64_t t = targets[r] - start;
        if (t >= 0 && t < V) dr[t] = (fast_exp(xr[t] - lse) - 1.0f) * scale;
    }
}

}  // namespace detail

// logits: [rows, V]; targets: [rows]; logsumexp: [rows], written. Returns
// mean_r (logsumexp[r] - logits[r, targets[r]]). Targets are checked first, so
// a bad one throws before anything is written.
[[nodiscard]] inline float cross_entropy_forward(const float* logits, const std::int32_t* targets, float* logsumexp,
                                                 std::int64_t rows, std::int64_t V) {
    detail::check_cross_entropy(targets, rows, V);
    const double loss_sum = detail::cross_entropy_loss_sum(logits, targets, logsumexp, rows, V);
    return static_cast<float>(loss_sum / static_cast<double>(rows));
}

// dlogits = (softmax(logits) - onehot(targets)) * dloss / rows, written;
// softmax is e^(x - logsumexp), with the logsumexp the forward saved.
inline void cross_entropy_backward(const float* logits, const std::int32_t* targets, const float* logsumexp,
                                   float dloss, float* dlogits, std::int64_t rows, std::int64_t V) {
    detail::check_cross_entropy(targets, rows, V);
    detail::cross_entropy_backward_rows(logits, targets, logsumexp, dloss / static_cast<float>(rows), dlogits, rows,
                                        V);
}

// Vocabulary-parallel pieces. logits: [rows, V], columns [start, start + V)
// of `classes`; targets: [rows], in [0, classes), checked first.

// row_max[r] = max_j logits[r, j] over this slice, written (all-reduce-max it).
inline void cross_entropy_slice_max(const float* logits, const std::int32_t* targets, float* row_max,
                                    std::int64_t rows, std::int64_t V, std::int64_t classes) {
    detail::check_cross_entropy(targets, rows, classes);
    LOOM_CHECK(V >= 1, "cross_entropy: V = ", V, " has no classes; pass V >= 1");
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = logits + r * V;
        row_max[r] = max_over(V, [&](std::int64_t j) { return xr[j]; });
    }
}

// With row_max the whole row's max: sums[r] = sum_j e^(logits[r, j] - row_max[r])
// over this slice, and sums[rows + r] = logits[r, targets[r] - start] where this
// slice holds the target, else 0; written (all-reduce-sum both halves).
inline void cross_entropy_slice_sums(const float* logits, const std::int32_t* targets, const float* row_max,
                                     float* sums, std::int64_t rows, std::int64_t V, std::int64_t start) {
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* xr = logits + r * V;
        const float m = row_max[r];
        sums[r] = sum_over(V, [&](std::int64_t j) { return fast_exp(xr[j] - m); });
        const std::int64_t t = targets[r] - start;
        sums[rows + r] = t >= 0 && t < V ? xr[t] : 0.0f;
    }
}

// dlogits = (softmax(logits) - onehot(targets)) * dloss / rows on this slice,
// written, with the whole row's logsumexp; no communication.
inline void cross_entropy_slice_backward(const float* logits, const std::int32_t* targets, const float* logsumexp,
                                         float dloss, float* dlogits, std::int64_t rows, std::int64_t V,
                                         std::int64_t start, std::int64_t classes) {
    detail::check_cross_entropy(targets, rows, classes);
    detail::cross_entropy_slice_backward_rows(logits, targets, logsumexp, dloss / static_cast<float>(rows), dlogits,
                                              rows, V, start);
}

}  // namespace loom::kernels::host
