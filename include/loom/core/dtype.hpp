// DType, the element types loom tensors hold, and the bf16/f16 storage types
// with their exactly specified float conversions, shared by host and device code.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#include "loom/core/error.hpp"
#include "loom/core/host_device.hpp"

namespace loom {

enum class DType : std::uint8_t { f32, bf16, f16, i32, i64 };

// Every DType in declaration order; parse_dtype and its error message read
// this list, so adding a dtype here is enough for both to know it.
inline constexpr std::array<DType, 5> all_dtypes{DType::f32, DType::bf16, DType::f16, DType::i32,
                                                 DType::i64};

namespace detail {

// std::bit_cast is a host-only constexpr function to nvcc (it warns without
// --expt-relaxed-constexpr); the builtin behind it works on both sides.
template <class To, class From>
LOOM_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
    static_assert(sizeof(To) == sizeof(From), "bit_cast needs types of the same size.");
    return __builtin_bit_cast(To, from);
}

// Round-to-nearest-even by adding just under half an ulp of the result, plus
// one when the kept part is odd; a carry out of the mantissa bumps the
// exponent, which is the correct result, up to Inf at the top.
LOOM_HOST_DEVICE constexpr std::uint16_t float_to_bf16_bits(float value) noexcept {
    const std::uint32_t u = bit_cast<std::uint32_t>(value);
    // Truncating a NaN whose payload sits in the low 16 bits would give Inf;
    // setting the quiet bit keeps it a NaN with its sign.
    if ((u & 0x7fff'ffffu) > 0x7f80'0000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(rounded >> 16);
}

LOOM_HOST_DEVICE constexpr float bf16_bits_to_float(std::uint16_t bits) noexcept {
    return bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// Integer-only so the result does not depend on the device's flush-to-zero
// mode or the host's rounding mode.
LOOM_HOST_DEVICE constexpr std::uint16_t float_to_f16_bits(float value) noexcept {
    const std::uint32_t u = bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t a = u & 0x7fff'ffffu;
    if (a > 0x7f80'0000u)  // NaN: keep the top payload bits, force quiet
        return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
    // 65520 (0x477ff000) is the midpoint between 65504, the largest f16, and
    // the next step 65536; it ties to the even neighbour, which is Inf.
    if (a >= 0x477f'f000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (a >= 0x3880'0000u) {  // normal f16: rebias the exponent 127 -> 15 and round
        const std::uint32_t rebiased = a - (112u << 23);
        const std::uint32_t rounded = rebiased + 0x0fffu + ((rebiased >> 13) & 1u);
        return static_cast<std::uint16_t>(sign | (rounded >> 13));
    }
    // 2^-25 is half the smallest subnormal; it ties to 0, and below it all is 0.
    if (a <= 0x3300'0000u) return static_cast<std::uint16_t>(sign);
    // Subnormal f16 counts units of 2^-24: value = m * 2^(e - 150) with the
    // implicit bit in m, so the count is m >> (126 - e), rounded to even.
    // Rounding up from 0x3ff gives 0x400, the smallest normal, as it should.
    const std::uint32_t m = (a & 0x007f'ffffu) | 0x0080'0000u;
    const std::uint32_t shift = 126u - (a >> 23);  // 14..24 in this range
    const std::uint32_t half = 1u << (shift - 1);
    const std::uint32_t rest = m & ((1u << shift) - 1u);
    std::uint32_t q = m >> shift;
    if (rest > half || (rest == half && (q & 1u) != 0)) ++q;
    return static_cast<std::uint16_t>(sign | q);
}

LOOM_HOST_DEVICE constexpr float f16_bits_to_float(std::uint16_t bits) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    std::uint32_t exponent = (bits >> 10) & 0x1fu;
    std::uint32_t mantissa = bits & 0x03ffu;
    if (exponent == 0x1fu)  // Inf and NaN, payload kept
        return bit_cast<float>(sign | 0x7f80'0000u | (mantissa << 13));
    if (exponent == 0) {
        if (mantissa == 0) return bit_cast<float>(sign);
        // Subnormal f16 is a normal float: shift the leading 1 into the
        // implicit position, lowering the exponent once per shift.
        exponent = 1;
        while ((mantissa & 0x0400u) == 0) {
            mantissa <<= 1;
            --exponent;
        }
        mantissa &= 0x03ffu;
    }
    return bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace detail

// bfloat16: the top half of a float. A storage type without arithmetic:
// compute in float and convert back, so every rounding step is visible.
// No operator== either: bit equality and float equality disagree on NaN and
// ±0, and choosing one silently would surprise someone; compare .bits or floats.
struct bf16 {
    std::uint16_t bits;

    // Trivial, like float, so bf16 arrays can live in __shared__ memory.
    bf16() = default;
    // Round to nearest even; NaN stays NaN (quieted, sign kept), ±Inf stays ±Inf.
    LOOM_HOST_DEVICE explicit constexpr bf16(float value) noexcept
        : bits(detail::float_to_bf16_bits(value)) {}

    [[nodiscard]] LOOM_HOST_DEVICE static constexpr bf16 from_bits(std::uint16_t raw) noexcept {
        bf16 result{};
        result.bits = raw;
        return result;
    }
    // Exact: every bf16 is a float.
    LOOM_HOST_DEVICE explicit constexpr operator float() const noexcept {
        return detail::bf16_bits_to_float(bits);
    }
};

// IEEE 754 binary16. Storage only, for the same reasons as bf16.
struct f16 {
    std::uint16_t bits;

    f16() = default;
    // Round to nearest even, subnormals included; 65520 and above round to
    // ±Inf, below 2^-25 in magnitude to ±0; NaN stays NaN (quieted, sign kept).
    LOOM_HOST_DEVICE explicit constexpr f16(float value) noexcept
        : bits(detail::float_to_f16_bits(value)) {}

    [[nodiscard]] LOOM_HOST_DEVICE static constexpr f16 from_bits(std::uint16_t raw) noexcept {
        f16 result{};
        result.bits = raw;
        return result;
    }
    // Exact: every f16 is a float.
    LOOM_HOST_DEVICE explicit constexpr operator float() const noexcept {
        return detail::f16_bits_to_float(bits);
    }
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16> &&
                  std::is_trivially_default_constructible_v<bf16>,
              "bf16 must be a trivial 2-byte type so buffers of it can be copied as bytes.");
static_assert(sizeof(f16) == 2 && std::is_trivially_copyable_v<f16> &&
                  std::is_trivially_default_constructible_v<f16>,
              "f16 must be a trivial 2-byte type so buffers of it can be copied as bytes.");

[[nodiscard]] LOOM_HOST_DEVICE constexpr bf16 to_bf16(float value) noexcept { return bf16(value); }
[[nodiscard]] LOOM_HOST_DEVICE constexpr f16 to_f16(float value) noexcept { return f16(value); }
[[nodiscard]] LOOM_HOST_DEVICE constexpr float to_float(bf16 value) noexcept {
    return static_cast<float>(value);
}
[[nodiscard]] LOOM_HOST_DEVICE constexpr float to_float(f16 value) noexcept {
    return static_cast<float>(value);
}

inline std::ostream& operator<<(std::ostream& out, bf16 value) { return out << to_float(value); }
inline std::ostream& operator<<(std::ostream& out, f16 value) { return out << to_float(value); }

namespace detail {
// Reached only through a DType made by casting an out-of-range integer.
[[noreturn]] inline void invalid_dtype(DType type);
}  // namespace detail

// Bytes per element.
[[nodiscard]] constexpr std::size_t size_of(DType type) {
    switch (type) {
        case DType::f32: return 4;
        case DType::bf16: return 2;
        case DType::f16: return 2;
        case DType::i32: return 4;
        case DType::i64: return 8;
    }
    detail::invalid_dtype(type);
}

// The spelling parse_dtype accepts and operator<< prints.
[[nodiscard]] constexpr std::string_view name(DType type) {
    switch (type) {
        case DType::f32: return "f32";
        case DType::bf16: return "bf16";
        case DType::f16: return "f16";
        case DType::i32: return "i32";
        case DType::i64: return "i64";
    }
    detail::invalid_dtype(type);
}

[[nodiscard]] constexpr bool is_floating(DType type) {
    switch (type) {
        case DType::f32:
        case DType::bf16:
        case DType::f16: return true;
        case DType::i32:
        case DType::i64: return false;
    }
    detail::invalid_dtype(type);
}

namespace detail {

// "f32, bf16, f16, i32, i64", for error messages.
inline std::string valid_dtype_list() {
    std::string list;
    for (DType type : all_dtypes) {
        if (!list.empty()) list += ", ";
        list += name(type);
    }
    return list;
}

[[noreturn]] inline void invalid_dtype(DType type) {
    LOOM_FAIL("invalid DType value ", static_cast<int>(type), "; valid dtypes are ",
              valid_dtype_list());
}

}  // namespace detail

// Never throws, so a corrupted DType can still be printed inside an error message.
inline std::ostream& operator<<(std::ostream& out, DType type) {
    for (DType known : all_dtypes)
        if (known == type) return out << name(type);
    return out << "DType(" << static_cast<int>(type) << ")";
}

// Exact, case-sensitive match of the names above, e.g. from a command line or a config file.
[[nodiscard]] constexpr DType parse_dtype(std::string_view text) {
    for (DType type : all_dtypes)
        if (name(type) == text) return type;
    LOOM_FAIL("unknown dtype \"", text, "\"; valid dtypes are ", detail::valid_dtype_list());
}

namespace detail {

template <class T>
inline constexpr bool dependent_false = false;

template <class T>
constexpr DType dtype_of_impl() {
    if constexpr (std::is_same_v<T, float>) return DType::f32;
    else if constexpr (std::is_same_v<T, bf16>) return DType::bf16;
    else if constexpr (std::is_same_v<T, f16>) return DType::f16;
    else if constexpr (std::is_same_v<T, std::int32_t>) return DType::i32;
    else if constexpr (std::is_same_v<T, std::int64_t>) return DType::i64;
    else {
        static_assert(dependent_false<T>,
                      "dtype_of<T> is only defined for float, loom::bf16, loom::f16, std::int32_t "
                      "and std::int64_t; convert the data to one of these first.");
        return DType{};  // keeps the assertion above the only error reported
    }
}

}  // namespace detail

// The DType of a C++ element type; const and volatile are ignored so that
// dtype_of<const float> names the element type of a read-only buffer.
template <class T>
inline constexpr DType dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>();

}  // namespace loom
