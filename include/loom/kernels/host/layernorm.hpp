// LayerNorm over the last dimension, as PyTorch's nn.LayerNorm: per row of C
// values, y = (x - mean) * rstd * gain + shift, rstd = 1 / sqrt(var + eps), var
// biased (divided by C). The forward saves mean and rstd per row; the backward
// reads them instead of recomputing. All sums are lane-split float sums
// (sum_over): vectorised, and more accurate than one running float sum.
#pragma once

#include <cmath>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/gemm_threads.hpp"

namespace loom::kernels::host {

namespace detail {

inline void check_layernorm_sizes(std::int64_t rows, std::int64_t C) {
    LOOM_CHECK(rows >= 0, "layernorm: rows = ", rows, " is negative; pass rows >= 0");
    LOOM_CHECK(C >= 1, "layernorm: C = ", C, " normalises nothing; pass C >= 1");
}

// Rows per thread's range: at least 16 K elements, below which waking a
// second thread costs more than it saves.
[[nodiscard]] inline std::int64_t rows_per_range(std::int64_t C) {
    return std::max<std::int64_t>(1, (std::int64_t{1} << 14) / C);
}

// The variance is a second pass over the row, sum((x - mean)^2) / C, not
// E[x^2] - mean^2, which cancels catastrophically when |mean| >> std.
LOOM_KERNEL_DISPATCH inline void layernorm_forward_rows(const float* __restrict x, const float* __restrict gain,
                                                        const float* __restrict shift, float* __restrict y,
                                                        float* __restrict mean, float* __restrict rstd,
                                                        std::int64_t rows, std::int64_t C, float eps) noexcept {
    const float inv_C = 1.0f / static_cast<float>(C);
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* __restrict xr = x + r * C;
        float* __restrict yr = y + r * C;
        const float m = sum_over(C, [&](std::int64_t j) { return xr[j]; }) * inv_C;
        const float var = sum_over(C, [&](std::int64_t j) {
                              const float d = xr[j] - m;
                              return d * d;
                          }) * inv_C;
        const float rs = 1.0f / std::sqrt(var + eps);
        for (std::int64_t j = 0; j < C; ++j) yr[j] = (xr[j] - m) * rs * gain[j] + shift[j];
        mean[r] = m;
        rstd[r] = rs;
    }
}

LOOM_KERNEL_DISPATCH inline void layernorm_backward_input_rows(const float* __restrict dy, const float* __restrict x,
                                                               const float* __restrict gain,
                                                               const float* __restrict mean,
                                                               const float* __restrict rstd, float* __restrict dx,
                                                               std::int64_t rows, std::int64_t C) noexcept {
    const float inv_C = 1.0f / static_cast<float>(C);
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* __restrict dyr = dy + r * C;
        const float* __restrict xr = x + r * C;
        float* __restrict dxr = dx + r * C;
        const float m = mean[r];
        const float rs = rstd[r];
        const float g_mean = sum_over(C, [&](std::int64_t j) { return dyr[j] * gain[j]; }) * inv_C;
        const float gx_mean =
            sum_over(C, [&](std::int64_t j) { return dyr[j] * gain[j] * ((xr[j] - m) * rs); }) * inv_C;
        for (std::int64_t j = 0; j < C; ++j) {
            const float xhat = (xr[j] - m) * rs;
            dxr[j] = rs * (dyr[j] * gain[j] - g_mean - xhat * gx_mean);
        }
    }
}

// Row after row into the C-long accumulators (they stay in L1), so the inner
// loop runs along j and vectorises.
LOOM_KERNEL_DISPATCH inline void layernorm_backward_weight_rows(const float* __restrict dy, const float* __restrict x,
                                                                const float* __restrict mean,
                                                                const float* __restrict rstd, float* __restrict dgain,
                                                                float* __restrict dshift, std::int64_t rows,
                                                                std::int64_t C) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
        const float* __restrict dyr = dy + r * C;
        const float* __restrict xr = x + r * C;
        const float m = mean[r];
        const float rs = rstd[r];
        for (std::int64_t j = 0; j < C; ++j) {
            dgain[j] += dyr[j] * ((xr[j] - m) * rs);
            dshift[j] += dyr[j];
        }
    }
}

}  // namespace detail

// x, y: [rows, C]; gain, shift: [C]; mean, rstd: [rows], written. eps >= 0.
// Outputs must not overlap inputs (here and in the backwards).
inline void layernorm_forward(const float* x, const float* gain, const float* shift, float* y, float* mean,
                              float* rstd, std::int64_t rows, std::int64_t C, float eps) {
    detail::check_layernorm_sizes(rows, C);
    LOOM_CHECK(eps >= 0.0f, "layernorm: eps = ", eps, " is negative (or NaN); pass eps >= 0, e.g. 1e-5");
    // Rows are independent: a rank with GEMM threads normalises ranges of them side by side.
    run_in_ranges(rows, [&](std::int64_t first, std::int64_t end) {
        detail::layernorm_forward_rows(x + first * C, gain, shift, y + first * C, mean + first, rstd + first, end - first,
                                       C, eps);
    }, detail::rows_per_range(C));
}

// dx = d loss / d x, written. With xhat = (x - mean) * rstd and g = dy * gain:
//   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)).
inline void layernorm_backward_input(const float* dy, const float* x, const float* gain, const float* mean,
                                     const float* rstd, float* dx, std::int64_t rows, std::int64_t C) {
    detail::check_layernorm_sizes(rows, C);
    run_in_ranges(rows, [&](std::int64_t first, std::int64_t end) {
        detail::layernorm_backward_input_rows(dy + first * C, x + first * C, gain, mean + first, rstd + first,
                                              dx + first * C, end - first, C);
    }, detail::rows_per_range(C));
}

// dgain[j] += sum_r dy[r, j] * xhat[r, j];  dshift[j] += sum_r dy[r, j].
// On one thread: a split over rows would change the order of the sums.
inline void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd,
                                      float* dgain, float* dshift, std::int64_t rows, std::int64_t C) {
    detail::check_layernorm_sizes(rows, C);
    detail::layernorm_backward_weight_rows(dy, x, mean, rstd, dgain, dshift, rows, C);
}

}  // namespace loom::kernels::host
