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

namespace detail {

// The largest |x| of x[0, n) and whether every value is finite (x - x is NaN
// exactly for Inf and NaN), in 16 lanes so the loop vectorises.
inline void absmax_and_finite(const float* x, std::int64_t n, float& absmax, bool& finite) {
    constexpr std::int64_t L = 16;
    float largest[L] = {}, check[L] = {};
    std::int64_t i = 0;
    for (; i + L <= n; i += L)
        for (std::int64_t l = 0; l < L; ++l) {
            const float a = std::fabs(x[i + l]);
            largest[l] = a > largest[l] ? a : largest[l];
            check[l] += x[i + l] - x[i + l];
        }
    float m = 0, c = 0;
    for (; i < n; ++i) {
        const float a = std::fabs(x[i]);
        m = a > m ? a : m;
        c += x[i] - x[i];
    }
    for (std::int64_t l = 0; l < L; ++l) {
        m = largest[l] > m ? largest[l] : m;
        c += check[l];
    }
    absmax = m;
    finite = c == 0.0f;
}

// Round to nearest even for |v| <= 2^22 without SSE4.1's roundps: adding
// 1.5 x 2^23 leaves no fraction bits, so the add itself rounds (the default
// mode is to nearest even), and the subtraction is exact.
[[nodiscard]] inline float round_to_even(float v) noexcept {
    constexpr float magic = 12582912.0f;
    return (v + magic) - magic;
}

}  // namespace detail

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
        detail::absmax_and_finite(x + lo, hi - lo, absmax, finite);
        // A NaN or an Inf anywhere in the block makes its scale NaN: the
        // whole block decodes NaN, so a diverged gradient stays visible
        // (an infinite scale would turn 0 x inf into NaN for some values
        // and a wrong sign for others). Its values stay 0.
        const float scale = finite ? absmax / 127.0f : std::numeric_limits<float>::quiet_NaN();
        words[b] = std::bit_cast<std::uint32_t>(scale);
        if (finite) {
            const float inverse = scale > 0 ? 1.0f / scale : 0.0f;
            for (std::int64_t i = lo; i < hi; ++i) {
                // The clamp only catches 127.5 from the reciprocal's rounding.
                float q = detail::round_to_even(x[i] * inverse);
                q = q > 127.0f ? 127.0f : q;
                q = q < -127.0f ? -127.0f : q;
                values[i] = static_cast<std::int8_t>(static_cast<std::int32_t>(q));
            }
        }
        if (residual != nullptr)
            for (std::int64_t i = lo; i < hi; ++i) residual[i] = x[i] - static_cast<float>(values[i]) * scale;
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
    // Signs 32 at a time, branch-free: set for x >= 0 (and for NaN, whose
    // block's scale is NaN anyway).
    for (std::int64_t w = 0; w < (n + 31) / 32; ++w) {
        const std::int64_t lo = w * 32, count = lo + 32 < n ? 32 : n - lo;
        std::uint32_t bits = 0;
        for (std::int64_t b = 0; b < count; ++b) bits |= static_cast<std::uint32_t>(!(x[lo + b] < 0)) << b;
        signs[w] = bits;
    }
    for (std::int64_t b = 0; b < blocks; ++b) {
        const std::int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        // 16 lanes, in double: a block of 1e6 values must not lose its small ones.
        double lanes[16] = {};
        const std::int64_t whole = lo + (hi - lo) / 16 * 16;
        for (std::int64_t i = lo; i < whole; i += 16)
            for (int l = 0; l < 16; ++l) lanes[l] += std::fabs(x[i + l]);
        double sum = 0;
        for (std::int64_t i = whole; i < hi; ++i) sum += std::fabs(x[i]);
        for (double lane : lanes) sum += lane;
        const auto scale = static_cast<float>(sum / static_cast<double>(hi - lo));
        words[b] = std::bit_cast<std::uint32_t>(scale);
        if (residual != nullptr)
            for (std::int64_t i = lo; i < hi; ++i) residual[i] = x[i] - (x[i] < 0 ? -scale : scale);
    }
}

inline void unpack_signs(const std::uint32_t* words, std::int64_t n, std::int64_t block, float* out,
                         float weight = 1.0f, bool add = false) {
    const std::int64_t blocks = (n + block - 1) / block;
    const std::uint32_t* signs = words + blocks;
    for (std::int64_t b = 0; b < blocks; ++b) {
        const float scale = weight * std::bit_cast<float>(words[b]);
        const std::int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        // Branch-free: the bit picks +scale or -scale by arithmetic.
        if (add)
            for (std::int64_t i = lo; i < hi; ++i)
                out[i] += static_cast<float>(2 * static_cast<std::int32_t>((signs[i >> 5] >> (i & 31)) & 1u) - 1) * scale;
        else
            for (std::int64_t i = lo; i < hi; ++i)
                out[i] = static_cast<float>(2 * static_cast<std::int32_t>((signs[i >> 5] >> (i & 31)) & 1u) - 1) * scale;
    }
}

}  // namespace loom::kernels::host
