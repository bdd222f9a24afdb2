// Tensors for the host block-kernel tests (tests/kernels/test_attention_blocks*.cpp):
// seeded normal values, errors at a tensor's scale (the largest, and the
// mean), and copies of row ranges between a whole sequence's tensor and a
// chunk's (cut, copy_rows over Rows), with the NaN and -infinity they fill
// with and I, their index type. Test code only, all inline.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "loom/core/rng.hpp"

namespace loom_test::attention_blocks {

using I = std::int64_t;

inline constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();
inline constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

inline std::vector<float> random_normal(I n, std::uint64_t stream) {
    std::vector<float> v(static_cast<std::size_t>(n));
    loom::RngStream{17, stream}.fill_normal(v, 0);
    return v;
}

// max |got - want| over max |want| (a tensor-scale error: elementwise ratios
// blow up near 0); `floor` stands in for a want that is 0 in exact arithmetic.
// A non-finite entry in got is an infinite error.
template <class Want>
inline double scaled_error(std::span<const float> got, std::span<const Want> want, double floor = 0.0) {
    REQUIRE(got.size() == want.size());
    double worst = 0.0, scale = floor;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
        scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    return worst / std::max(scale, std::numeric_limits<double>::min());
}

// mean |got - want| over max |want|: where scaled_error sees the one element
// a bf16 rounding moved, this sees how close two tensors are overall.
inline double mean_scaled_error(std::span<const float> got, std::span<const float> want) {
    REQUIRE(got.size() == want.size());
    double total = 0.0, scale = std::numeric_limits<double>::min();
    for (std::size_t i = 0; i < got.size(); ++i) {
        total += std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
        scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    return total / static_cast<double>(got.size()) / scale;
}

// Rows [from_row, from_row + rows) x columns [from_col, from_col + width) of
// every sequence b < B of a [B, from_T, from_ld] tensor, to rows starting at
// to_row and columns at to_col of a [B, to_T, to_ld] tensor. Cuts chunks out of
// a whole tensor and puts results back (lse [B, H, T] is [B*H, T, 1]).
struct Rows {
    I T, ld, row, col;
};
inline void copy_rows(const float* from, Rows f, float* to, Rows t, I B, I rows, I width) {
    for (I b = 0; b < B; ++b)
        for (I r = 0; r < rows; ++r)
            std::copy_n(from + (b * f.T + f.row + r) * f.ld + f.col, width, to + (b * t.T + t.row + r) * t.ld + t.col);
}

inline std::vector<float> cut(const std::vector<float>& whole, I T, I ld, I row0, I col, I B, I rows, I width, I chunk_ld,
                              float fill = 0.0f) {
    std::vector<float> chunk(static_cast<std::size_t>(B * rows * chunk_ld), fill);
    copy_rows(whole.data(), {T, ld, row0, col}, chunk.data(), {rows, chunk_ld, 0, 0}, B, rows, width);
    return chunk;
}

}  // namespace loom_test::attention_blocks
