// Host low-rank kernels for PowerSGD: Gram-Schmidt orthonormalisation of
// the columns of a tall matrix, in place. Modified Gram-Schmidt (each column
// made orthogonal to the finished ones one at a time), run twice per column
// ("twice is enough", Giraud et al. 2005), dot products in double, each
// column then divided by its own norm. A column that depended on the earlier
// ones (the matrix had lower rank) has only rounding noise left, and in
// float that noise may point along the earlier columns; it is replaced by the
// first unit basis vector with something left after the same projections.
// So the result always has orthonormal columns (while there are at most as
// many as rows), and PowerSGD's warm start keeps a real direction to grow,
// where PyTorch's hook (norm + epsilon) returns noise of length ~0.9.
#pragma once

#include <cmath>
#include <cstdint>

#include "loom/core/error.hpp"

namespace loom::kernels::host {

namespace detail {

// Column c of P minus its projections on columns [0, c), twice; returns the
// squared norm left.
inline double project_out_earlier(float* p, std::int64_t rows, std::int64_t cols, std::int64_t c) {
    for (int pass = 0; pass < 2; ++pass)
        for (std::int64_t prior = 0; prior < c; ++prior) {
            double dot = 0;
            for (std::int64_t r = 0; r < rows; ++r)
                dot += static_cast<double>(p[r * cols + c]) * static_cast<double>(p[r * cols + prior]);
            for (std::int64_t r = 0; r < rows; ++r)
                p[r * cols + c] = static_cast<float>(p[r * cols + c] - dot * p[r * cols + prior]);
        }
    double norm = 0;
    for (std::int64_t r = 0; r < rows; ++r) norm += static_cast<double>(p[r * cols + c]) * p[r * cols + c];
    return norm;
}

}  // namespace detail

// A column keeps its own direction while this much of its norm survives the
// projections; below, what survives is mostly rounding error.
inline constexpr double dependent_column_ratio = 1e-4;

// P is [rows, cols] row-major; its columns become orthonormal.
inline void orthonormalize_columns(float* p, std::int64_t rows, std::int64_t cols) {
    LOOM_CHECK(rows >= 0 && cols >= 0, "orthonormalize_columns: a ", rows, " x ", cols, " matrix");
    for (std::int64_t c = 0; c < cols; ++c) {
        double before = 0;
        for (std::int64_t r = 0; r < rows; ++r) before += static_cast<double>(p[r * cols + c]) * p[r * cols + c];
        double norm = detail::project_out_earlier(p, rows, cols, c);
        if (!(norm > dependent_column_ratio * dependent_column_ratio * before) || norm == 0) {
            norm = 0;
            for (std::int64_t k = 0; k < rows && norm < 0.25; ++k) {  // a unit vector keeps >= 1/2 of its length
                for (std::int64_t r = 0; r < rows; ++r) p[r * cols + c] = r == (c + k) % rows ? 1.0f : 0.0f;
                norm = detail::project_out_earlier(p, rows, cols, c);
            }
            if (norm < 0.25) norm = 0;  // more columns than rows: nothing orthogonal is left
        }
        const double scale = norm > 0 ? 1.0 / std::sqrt(norm) : 0.0;
        for (std::int64_t r = 0; r < rows; ++r) p[r * cols + c] = static_cast<float>(p[r * cols + c] * scale);
    }
}

}  // namespace loom::kernels::host
