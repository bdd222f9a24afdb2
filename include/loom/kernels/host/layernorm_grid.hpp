// Host kernels of LayerNorm on an Optimus 2D grid (nn/layernorm.hpp), where
// each rank holds C of a row's whole_C features and the row statistics are
// finished by all-reduces over the grid row between these steps:
//   forward   row_sums -> all-reduce -> centered_squares -> all-reduce -> normalize
//   backward  backward_sums -> all-reduce -> backward_apply
// `inverse_C` is 1 / whole_C. Plain loops in the layer's original order (not
// CPU-dispatched, so the bits do not depend on the CPU), and what a device's
// kernels must follow. Row-major [rows, C], f32.
#pragma once

#include <cmath>
#include <cstdint>

namespace loom::kernels::host {

// sums[r] = the sum of row r's C values.
inline void layernorm_grid_row_sums(const float* x, float* sums, std::int64_t rows, std::int64_t C) {
    for (std::int64_t r = 0; r < rows; ++r) {
        float sum = 0.0f;
        for (std::int64_t c = 0; c < C; ++c) sum += x[r * C + c];
        sums[r] = sum;
    }
}

// mean[r] (the whole row's sum on entry) becomes the mean; squares[r] = the
// sum of this rank's (x - mean)^2.
inline void layernorm_grid_centered_squares(const float* x, float* mean, float* squares, std::int64_t rows,
                                            std::int64_t C, float inverse_C) {
    for (std::int64_t r = 0; r < rows; ++r) {
        mean[r] *= inverse_C;
        float sum = 0.0f;
        for (std::int64_t c = 0; c < C; ++c) sum += (x[r * C + c] - mean[r]) * (x[r * C + c] - mean[r]);
        squares[r] = sum;
    }
}

// rstd[r] (the whole row's sum of squares on entry) becomes 1 / sqrt(var +
// eps); y = (x - mean) rstd gain + shift.
inline void layernorm_grid_normalize(const float* x, const float* gain, const float* shift, const float* mean,
                                     float* rstd, float* y, std::int64_t rows, std::int64_t C, float inverse_C,
                                     float eps) {
    for (std::int64_t r = 0; r < rows; ++r) {
        rstd[r] = 1.0f / std::sqrt(rstd[r] * inverse_C + eps);
        for (std::int64_t c = 0; c < C; ++c) y[r * C + c] = (x[r * C + c] - mean[r]) * rstd[r] * gain[c] + shift[c];
    }
}

// sums[r] = this rank's sum of g = dy gain, sums[rows + r] = of g xhat.
inline void layernorm_grid_backward_sums(const float* dy, const float* x, const float* gain, const float* mean,
                                         const float* rstd, float* sums, std::int64_t rows, std::int64_t C) {
    for (std::int64_t r = 0; r < rows; ++r) {
        float a = 0.0f, b = 0.0f;
        for (std::int64_t c = 0; c < C; ++c) {
            const float gc = dy[r * C + c] * gain[c];
            a += gc;
            b += gc * ((x[r * C + c] - mean[r]) * rstd[r]);
        }
        sums[r] = a;
        sums[rows + r] = b;
    }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), from the whole rows' sums.
inline void layernorm_grid_backward_apply(const float* dy, const float* x, const float* gain, const float* mean,
                                          const float* rstd, const float* sums, float* dx, std::int64_t rows,
                                          std::int64_t C, float inverse_C) {
    for (std::int64_t r = 0; r < rows; ++r) {
        const float g_mean = sums[r] * inverse_C, gx_mean = sums[rows + r] * inverse_C;
        for (std::int64_t c = 0; c < C; ++c) {
            const float xhat = (x[r * C + c] - mean[r]) * rstd[r];
            dx[r * C + c] = rstd[r] * (dy[r * C + c] * gain[c] - g_mean - xhat * gx_mean);
        }
    }
}

}  // namespace loom::kernels::host
