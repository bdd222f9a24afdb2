// Host quantisation kernels for gradient compression: each packs n floats
// into 32-bit words that travel as they are, and unpacks them, so that a
// compressed collective moves exactly the bytes counted here.
//   casts:  two bf16 or f16 per word, rounded to nearest even (core/dtype.hpp)
//   int8:   blockwise absmax, one f32 scale per `block` values, then the
//           values as int8 (four per word): |x - q * scale| <= scale / 2
//   signs:  1 bit per value (set: x >= 0) and one f32 scale per block, the
//           block's mean |x|: the scale that minimises |x - s * sign(x)|^2
// Every packer can leave the error it made in `residual` (x - unpack(pack(x)),
// element by element), which error feedback adds to the next step's input.
// NaN (and, for int8, Inf) is not hidden: it propagates into its block's scale.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::host {

enum class Cast : std::uint8_t { bf16, f16 };

[[nodiscard]] constexpr std::int64_t cast_words(std::int64_t n) noexcept { return (n + 1) / 2; }

namespace detail {
[[nodiscard]] inline std::uint16_t cast_bits(Cast to, float x) noexcept {
    return to == Cast::bf16 ? loom::detail::float_to_bf16_bits(x) : loom::detail::float_to_f16_bits(x);
}
[[nodiscard]] inline float uncast_bits(Cast from, std::uint16_t bits) noexcept {
    return from == Cast::bf16 ? loom::detail::bf16_bits_to_float(bits) : loom::detail::f16_bits_to_float(bits);
}
}  // namespace detail

// Element i in the low half of word i / 2 when i is even, the high half when odd.
inline void pack_cast(Cast to, const float* x, std::int64_t n, std::uint32_t* words, float* residual = nullptr) {
    for (std::int64_t i = 0; i < n; i += 2) {
        const std::uint16_t lo = detail::cast_bits(to, x[i]);
        const std::uint16_t hi = i + 1 < n ? detail::cast_bits(to, x[i + 1]) : std::uint16_t{0};
        words[i / 2] = static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
        if (residual != nullptr) {
            residual[i] = x[i] - detail::uncast_bits(to, lo);
            if (i + 1 < n) residual[i + 1] = x[i + 1] - detail::uncast_bits(to, hi);
        }
    }
}

// out[i] = weight * x[i] (add: out[i] += weight * x[i]).
inline void unpack_cast(Cast from, const std::uint32_t* words, std::int64_t n, float* out, float weight = 1.0f,
                        bool add = false) {
    for (std::int64_t i = 0; i < n; ++i) {
        const auto bits = static_cast<std::uint16_t>(words[i / 2] >> ((i & 1) * 16));
        const float x = weight * detail::uncast_bits(from, bits);
        out[i] = add ? out[i] + x : x;
    }
}

// Scales first (one per block), then the int8 values, four per word.
[[nodiscard]] constexpr std::int64_t int8_words(std::int64_t n, std::int64_t block) noexcept {
    return (n + block - 1) / block + (n + 3) / 4;
}

inline void pack_int8(const float* x, std::int64_t n, std::int64_t block, std::uint32_t* words,
                      float* residual = nullptr) {
    LOOM_CHECK(block >= 1, "pack_int8: a block of ", block, " values; it must hold at least 1");
    const std::int64_t blocks = (n + block - 1) / block;
    auto* values = reinterpret_cast<std::int8_t*>(words + blocks);
    std::memset(values, 0, static_cast<std::size_t>((n + 3) / 4 * 4));
    for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        float absmax = 0;
        bool finite = true;
        for (std::int64_t i = lo; i < hi; ++i) {
            absmax = std::fmax(absmax, std::fabs(x[i]));  // fmax skips NaN, hence `finite`
            finite = finite && std::isfinite(x[i]);
        }
        // A NaN or an Inf anywhere in the block makes its scale NaN: the
        // whole block decodes NaN, so a diverged gradient stays visible
        // (an infinite scale would turn 0 x inf into NaN for some values
        // and a wrong sign for others).
        const float scale = finite ? absmax / 127.0f : std::numeric_limits<float>::quiet_NaN();
        words[b] = std::bit_cast<std::uint32_t>(scale);
        const float inverse = scale > 0 ? 1.0f / scale : 0.0f;  // 0 for NaN: values 0, decoded NaN
        for (std::int64_t i = lo; i < hi; ++i) {
            // nearbyint rounds to nearest even in the default rounding mode;
            // the clamp only catches 127.5 from the reciprocal's rounding.
            const float q = std::fmin(127.0f, std::fmax(-127.0f, std::nearbyint(x[i] * inverse)));
            values[i] = static_cast<std::int8_t>(q);
            if (residual != nullptr) residual[i] = x[i] - static_cast<float>(values[i]) * scale;
        }
    }
}

inline void unpack_int8(const std::uint32_t* words, std::int64_t n, std::int64_t block, float* out,
                        float weight = 1.0f, bool add = false) {
    const std::int64_t blocks = (n + block - 1) / block;
    const auto* values = reinterpret_cast<const std::int8_t*>(words + blocks);
    for (std::int64_t b = 0; b < blocks; ++b) {
        const float scale = weight * std::bit_cast<float>(words[b]);
        const std::int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        for (std::int64_t i = lo; i < hi; ++i) {
            const float x = static_cast<float>(values[i]) * scale;
            out[i] = add ? out[i] + x : x;
        }
    }
}

// Scales first (one per block), then the signs, 32 per word (bit i % 32 of
// word i / 32 of the sign area).
[[nodiscard]] constexpr std::int64_t sign_words(std::int64_t n, std::int64_t block) noexcept {
    return (n + block - 1) / block + (n + 31) / 32;
}

inline void pack_signs(const float* x, std::int64_t n, std::int64_t block, std::uint32_t* words,
                       float* residual = nullptr) {
    LOOM_CHECK(block >= 1, "pack_signs: a block of ", block, " values; it must hold at least 1");
    const std::int64_t blocks = (n + block - 1) / block;
    std::uint32_t* signs = words + blocks;
    std::memset(signs, 0, static_cast<std::size_t>((n + 31) / 32) * 4);
    for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        double sum = 0;  // in double: a block of 1e6 values must not lose its small ones
        for (std::int64_t i = lo; i < hi; ++i) sum += std::fabs(x[i]);
        const auto scale = static_cast<float>(sum / static_cast<double>(hi - lo));
        words[b] = std::bit_cast<std::uint32_t>(scale);
        for (std::int64_t i = lo; i < hi; ++i) {
            const bool positive = !(x[i] < 0);
            if (positive) signs[i / 32] |= std::uint32_t{1} << (i % 32);
            if (residual != nullptr) residual[i] = x[i] - (positive ? scale : -scale);
        }
    }
}

inline void unpack_signs(const std::uint32_t* words, std::int64_t n, std::int64_t block, float* out,
                         float weight = 1.0f, bool add = false) {
    const std::int64_t blocks = (n + block - 1) / block;
    const std::uint32_t* signs = words + blocks;
    for (std::int64_t b = 0; b < blocks; ++b) {
        const float scale = weight * std::bit_cast<float>(words[b]);
        const std::int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        for (std::int64_t i = lo; i < hi; ++i) {
            const float x = ((signs[i / 32] >> (i % 32)) & 1u) != 0 ? scale : -scale;
            out[i] = add ? out[i] + x : x;
        }
    }
}

}  // namespace loom::kernels::host
