// Values for the host compression tests (tests/kernels/test_compression_*.cpp):
// random normals whose scale spans many decades, word buffers ending in a
// sentinel that an encoding must not touch, the scalar 16-bit round trip the
// packed casts must agree with (and its name), powers of two, and the
// reference top-k. With it come comparisons.hpp's bits_of, from_bits and
// normal_values, which these tests use too. Test code only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "support/comparisons.hpp"

namespace loom_test {

inline constexpr std::uint32_t sentinel = 0xdeadbeefu;
inline const float nan_f = std::numeric_limits<float>::quiet_NaN();
inline const float inf_f = std::numeric_limits<float>::infinity();

inline float pow2(int e) { return std::ldexp(1.0f, e); }

inline std::int64_t size_of(const std::vector<float>& v) { return static_cast<std::int64_t>(v.size()); }

// The scalar conversion the packed one must agree with.
inline float scalar_round_trip(loom::kernels::host::Cast c, float x) {
    return c == loom::kernels::host::Cast::bf16 ? static_cast<float>(loom::bf16(x))
                                                : static_cast<float>(loom::f16(x));
}

inline const char* cast_name(loom::kernels::host::Cast c) {
    return c == loom::kernels::host::Cast::bf16 ? "bf16" : "f16";
}

// Normal values whose scale varies over many decades, from `lo` to `hi`.
inline std::vector<float> spread_normals(std::mt19937& rng, std::size_t n, float lo, float hi) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(std::log(lo), std::log(hi));
    std::vector<float> x(n);
    for (auto& v : x) v = normal(rng) * std::exp(exponent(rng));
    return x;
}

// Words with a sentinel after the `count` the encoding may use.
inline std::vector<std::uint32_t> words_with_sentinel(std::int64_t count) {
    std::vector<std::uint32_t> w(static_cast<std::size_t>(count) + 1, 0x5a5a5a5au);
    w.back() = sentinel;
    return w;
}

// The reference top-k: indices sorted by |x| descending (NaN as the largest),
// then index ascending; the first k, in increasing index order.
inline std::vector<std::int32_t> reference_top_k(const std::vector<float>& x, std::int64_t k) {
    std::vector<std::int32_t> order(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) order[i] = static_cast<std::int32_t>(i);
    const auto magnitude = [&](std::int32_t i) {
        const float a = std::fabs(x[static_cast<std::size_t>(i)]);
        return std::isnan(a) ? inf_f : a;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int32_t a, std::int32_t b) { return magnitude(a) > magnitude(b); });
    order.resize(static_cast<std::size_t>(k));
    std::sort(order.begin(), order.end());
    return order;
}

}  // namespace loom_test
