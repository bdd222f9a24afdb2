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
#include <functional>
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
// x with the selected elements zeroed (what was not sent). `scratch` holds
// the magnitudes between calls, so a step allocates nothing. The magnitudes
// are compared as the bits of |x| (NaN as +Inf's): for non-negative floats
// the integer order is the float order, so nth_element finds the k-th
// largest among plain integers, and one pass in index order takes every
// element above it and the first ones equal to it (ties to the lower index).
inline void pack_top_k(const float* x, std::int64_t n, std::int64_t k, std::uint32_t* words,
                       std::vector<std::int32_t>& scratch, float* residual = nullptr) {
    LOOM_CHECK(k >= 0 && k <= n, "pack_top_k: k = ", k, " of ", n, " values; it must be in 0..", n);
    LOOM_CHECK(n <= std::numeric_limits<std::int32_t>::max(), "pack_top_k: ", n, " values do not fit 32-bit indices");
    const auto magnitude_bits = [x](std::int64_t i) {
        const auto bits = static_cast<std::int32_t>(std::bit_cast<std::uint32_t>(x[i]) & 0x7fff'ffffu);
        return bits > 0x7f80'0000 ? 0x7f80'0000 : bits;  // NaN counts as Inf
    };
    if (residual != nullptr && residual != x) std::copy_n(x, n, residual);
    if (k == 0) return;
    scratch.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) scratch[static_cast<std::size_t>(i)] = magnitude_bits(i);
    std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<>());
    const std::int32_t threshold = scratch[static_cast<std::size_t>(k - 1)];
    std::int64_t above = 0;
    for (std::int64_t i = 0; i < n; ++i) above += magnitude_bits(i) > threshold;
    std::int64_t ties = k - above, taken = 0;
    for (std::int64_t i = 0; i < n && taken < k; ++i) {
        const std::int32_t bits = magnitude_bits(i);
        if (bits < threshold || (bits == threshold && ties == 0)) continue;
        if (bits == threshold) --ties;
        words[taken] = static_cast<std::uint32_t>(i);
        words[k + taken] = std::bit_cast<std::uint32_t>(x[i]);
        ++taken;
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
