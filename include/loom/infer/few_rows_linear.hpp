// y = x W^T + b for the few rows a decode step has (one per running
// sequence), without packing W.
//
// Why: loom's host GEMM (kernels/host/gemm_blocked.hpp) packs panels of B for
// its micro-kernel on every call. Over a prompt or a training batch the
// packing is paid once for many rows; for one row it is as much work as the
// product: before this path, packing was 46% of bench/generate.cpp's cycles
// (perf; its batch-1 decode and the re-running baseline together) and the
// cached decode ran 3.3x faster than re-running instead of ~9x. W is [out, in] row-major (PyTorch's layout), so each
// output is a dot product of a contiguous weight row with the input: a
// streaming matrix-vector product that reads every weight once per step and
// keeps the row in cache for the other rows of the step.
//
// Numerics: each dot product is kernels/host/elementwise.hpp's sum_over (16
// partial sums, combined pairwise) instead of the GEMM's order, so results
// differ from nn::Linear's forward by float rounding (the tests compare
// logits to 1e-5 relative and greedy tokens exactly).
#pragma once

#include <cstdint>

#include "loom/kernels/host/elementwise.hpp"

namespace loom::infer {

// Rows at or below which a decode step takes this path; above, the packed
// GEMM's reuse of each panel across rows wins.
inline constexpr std::int64_t few_rows = 8;

namespace few_rows_detail {

LOOM_KERNEL_DISPATCH inline void multiply(const float* __restrict x, const float* __restrict w,
                                          const float* __restrict bias, float* __restrict y, std::int64_t rows,
                                          std::int64_t in, std::int64_t out) noexcept {
    for (std::int64_t o = 0; o < out; ++o) {
        const float* __restrict row = w + o * in;
        const float b = bias != nullptr ? bias[o] : 0.0f;
        for (std::int64_t r = 0; r < rows; ++r) {
            const float* __restrict xr = x + r * in;
            y[r * out + o] = b + kernels::host::sum_over(in, [&](std::int64_t i) { return xr[i] * row[i]; });
        }
    }
}

}  // namespace few_rows_detail

// x [rows, in], w [out, in], bias [out] or null, y [rows, out] (not overlapping x).
inline void few_rows_linear(const float* x, const float* w, const float* bias, float* y, std::int64_t rows,
                            std::int64_t in, std::int64_t out) noexcept {
    few_rows_detail::multiply(x, w, bias, y, rows, in, out);
}

}  // namespace loom::infer
