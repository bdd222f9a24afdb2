// Host top-k sparsification for gradient compression: the k elements of
// largest magnitude, as (index, value) pairs packed in 32-bit words, and
// their scatter back. Ties go to the lower index and NaN counts as the
// largest magnitude, so the selection is one exact, reproducible set: every
// rank that selects from the same values selects the same elements.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::kernels::host {

// k of n for a ratio in (0, 1]: at least one, at most n.
[[nodiscard]] inline std::int64_t top_k_count(std::int64_t n, double ratio) {
    LOOM_CHECK(ratio > 0 && ratio <= 1, "top-k ratio ", ratio, " is outside (0, 1]; use e.g. 0.01 for 1%");
    if (n <= 0) return 0;
    const auto k = static_cast<std::int64_t>(std::ceil(ratio * static_cast<double>(n) - 1e-9));
    return std::clamp<std::int64_t>(k, 1, n);
}

// k indices, then k values (float bits), in increasing index order.
[[nodiscard]] constexpr std::int64_t top_k_words(std::int64_t k) noexcept { return 2 * k; }

// Selects the k largest |x[i]| of x[0, n) into words; with `residual`, it gets
// x with the selected elements zeroed (what was not sent). `scratch` holds the
// candidate indices between calls, so a step allocates nothing.
inline void pack_top_k(const float* x, std::int64_t n, std::int64_t k, std::uint32_t* words,
                       std::vector<std::int32_t>& scratch, float* residual = nullptr) {
    LOOM_CHECK(k >= 0 && k <= n, "pack_top_k: k = ", k, " of ", n, " values; it must be in 0..", n);
    LOOM_CHECK(n <= std::numeric_limits<std::int32_t>::max(), "pack_top_k: ", n, " values do not fit 32-bit indices");
    scratch.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) scratch[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
    const auto magnitude = [x](std::int32_t i) {
        const float a = std::fabs(x[i]);
        return std::isnan(a) ? std::numeric_limits<float>::infinity() : a;
    };
    // A strict total order: larger magnitude first, then lower index.
    const auto before = [&](std::int32_t a, std::int32_t b) {
        const float ma = magnitude(a), mb = magnitude(b);
        return ma > mb || (ma == mb && a < b);
    };
    if (k < n) std::nth_element(scratch.begin(), scratch.begin() + k, scratch.end(), before);
    std::sort(scratch.begin(), scratch.begin() + k);
    if (residual != nullptr && residual != x) std::copy_n(x, n, residual);
    for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t i = scratch[static_cast<std::size_t>(j)];
        words[j] = static_cast<std::uint32_t>(i);
        words[k + j] = std::bit_cast<std::uint32_t>(x[i]);
        if (residual != nullptr) residual[i] = 0.0f;
    }
}

// out[index] += weight * value for each of the k pairs (out of n elements);
// an index outside [0, n) is a corrupted message and refused.
inline void unpack_top_k_add(const std::uint32_t* words, std::int64_t k, std::int64_t n, float* out,
                             float weight = 1.0f) {
    for (std::int64_t j = 0; j < k; ++j) {
        const auto i = static_cast<std::int64_t>(words[j]);
        LOOM_CHECK(i < n, "top-k: index ", i, " received for a chunk of ", n, " values");
        out[i] += weight * std::bit_cast<float>(words[k + j]);
    }
}

}  // namespace loom::kernels::host
