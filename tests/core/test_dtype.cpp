// Tests for loom/core/dtype.hpp: exhaustive bf16/f16 conversions, DType names and parsing.
#include "loom/core/dtype.hpp"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::bf16;
using loom::DType;
using loom::f16;

// ---- Compile-time checks: the conversions and tables work in constant expressions.
static_assert(loom::to_bf16(1.0f).bits == 0x3f80);
static_assert(loom::to_bf16(-2.5f).bits == 0xc020);
static_assert(loom::to_f16(1.0f).bits == 0x3c00);
static_assert(loom::to_f16(65504.0f).bits == 0x7bff);
static_assert(loom::to_f16(65520.0f).bits == 0x7c00);
static_assert(loom::to_f16(0x1p-24f).bits == 0x0001);
static_assert(loom::to_f16(std::numeric_limits<float>::quiet_NaN()).bits == 0x7e00);
static_assert(loom::to_float(f16::from_bits(0x0001)) == 0x1p-24f);
static_assert(loom::to_float(f16::from_bits(0xfbff)) == -65504.0f);
static_assert(loom::to_float(bf16::from_bits(0x4049)) == 3.140625f);
static_assert(static_cast<float>(bf16(1.5f)) == 1.5f);
static_assert(static_cast<float>(f16(0.1f)) == 0.0999755859375f);
static_assert(loom::size_of(DType::bf16) == 2);
static_assert(loom::name(DType::i64) == "i64");
static_assert(loom::parse_dtype("f16") == DType::f16);
static_assert(!loom::is_floating(DType::i32));
static_assert(loom::dtype_of<float> == DType::f32);
static_assert(loom::dtype_of<bf16> == DType::bf16);
static_assert(loom::dtype_of<f16> == DType::f16);
static_assert(loom::dtype_of<std::int32_t> == DType::i32);
static_assert(loom::dtype_of<const std::int64_t> == DType::i64);
static_assert(loom::size_of(loom::dtype_of<bf16>) == sizeof(bf16));
static_assert(loom::size_of(loom::dtype_of<std::int64_t>) == sizeof(std::int64_t));

// The two formats differ only in where exponent and mantissa split, so one set
// of exhaustive tests covers both; each trait also holds an independent
// reference decoder written with std::ldexp rather than bit manipulation.
struct Bf16Traits {
    using Type = bf16;
    static constexpr const char* label = "bf16";
    static constexpr std::uint16_t max_finite = 0x7f7f;
    static constexpr std::uint16_t inf = 0x7f80;
    static constexpr int mantissa_bits = 7;
    static constexpr int exponent_bias = 127;
    // One ulp above the largest finite value, where the next binade would begin.
    static constexpr double beyond_max = 0x1p128;
    static Type convert(float value) { return loom::to_bf16(value); }
};

struct F16Traits {
    using Type = f16;
    static constexpr const char* label = "f16";
    static constexpr std::uint16_t max_finite = 0x7bff;
    static constexpr std::uint16_t inf = 0x7c00;
    static constexpr int mantissa_bits = 10;
    static constexpr int exponent_bias = 15;
    static constexpr double beyond_max = 65536.0;
    static Type convert(float value) { return loom::to_f16(value); }
};

template <class Traits>
bool is_nan_bits(std::uint16_t bits) {
    return (bits & 0x7fffu) > Traits::inf;
}

template <class Traits>
double reference_value(std::uint16_t bits) {
    const int m_bits = Traits::mantissa_bits;
    const int exponent = (bits & 0x7fff) >> m_bits;
    const int mantissa = bits & ((1 << m_bits) - 1);
    const double magnitude =
        exponent == 0 ? std::ldexp(mantissa, 1 - Traits::exponent_bias - m_bits)
                      : std::ldexp(mantissa + (1 << m_bits), exponent - Traits::exponent_bias - m_bits);
    return (bits & 0x8000) != 0 ? -magnitude : magnitude;
}

std::string hex(std::uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%x", value);
    return text;
}

// Collects mismatches so a broken conversion reports a count and a few
// examples instead of hundreds of thousands of failed assertions.
struct Mismatches {
    std::size_t count = 0;
    std::vector<std::string> examples;
    void add(std::string what) {
        if (count++ < 5) examples.push_back(std::move(what));
    }
    std::string report() const {
        std::string text = std::to_string(count) + " mismatches";
        for (const auto& example : examples) text += "; " + example;
        return text;
    }
};

template <class Traits>
void check_round_trip() {
    using Type = typename Traits::Type;
    Mismatches bad;
    std::size_t nan_patterns = 0;
    for (std::uint32_t i = 0; i <= 0xffff; ++i) {
        const auto bits = static_cast<std::uint16_t>(i);
        const float value = loom::to_float(Type::from_bits(bits));
        const Type back = Traits::convert(value);
        if (is_nan_bits<Traits>(bits)) {
            ++nan_patterns;
            const bool sign_kept = std::signbit(value) == ((bits & 0x8000) != 0) &&
                                   (back.bits & 0x8000) == (bits & 0x8000);
            if (!std::isnan(value) || !is_nan_bits<Traits>(back.bits) || !sign_kept)
                bad.add(hex(bits) + " -> " + hex(std::bit_cast<std::uint32_t>(value)) + " -> " +
                        hex(back.bits));
            continue;
        }
        const double expected = reference_value<Traits>(bits);
        const bool is_inf = (bits & 0x7fff) == Traits::inf;
        const bool value_ok = is_inf ? std::isinf(value) && (value < 0) == ((bits & 0x8000) != 0)
                                     : static_cast<double>(value) == expected &&
                                           std::signbit(value) == ((bits & 0x8000) != 0);
        if (!value_ok || back.bits != bits)
            bad.add(hex(bits) + " -> " + hex(std::bit_cast<std::uint32_t>(value)) + " -> " +
                    hex(back.bits));
    }
    INFO(Traits::label << ": " << bad.report());
    CHECK(bad.count == 0);
    // Both formats have 2 * (2^mantissa_bits - 1) NaN patterns; a wrong NaN
    // test would change the count.
    CHECK(nan_patterns == 2 * ((std::size_t{1} << Traits::mantissa_bits) - 1));
}

// For each adjacent pair a < b in magnitude (b may be Inf, standing for the
// value one ulp past the largest finite), the exact midpoint must go to the
// neighbour with an even mantissa, and the floats on either side of it to the
// nearer neighbour.
template <class Traits>
void check_round_to_nearest_even() {
    Mismatches bad;
    std::size_t pairs = 0;
    for (std::uint32_t sign : {0x0000u, 0x8000u}) {
        for (std::uint32_t i = 0; i < Traits::max_finite + 1u; ++i) {
            const auto a = static_cast<std::uint16_t>(sign | i);
            const auto b = static_cast<std::uint16_t>(sign | (i + 1));
            const double magnitude_b =
                i + 1 == Traits::inf ? Traits::beyond_max : std::abs(reference_value<Traits>(b));
            const double magnitude_mid = (std::abs(reference_value<Traits>(a)) + magnitude_b) / 2;
            const double mid = sign != 0 ? -magnitude_mid : magnitude_mid;
            const auto mid_f = static_cast<float>(mid);
            // 16-bit midpoints need at most one bit more than the format, so a float holds them.
            REQUIRE(static_cast<double>(mid_f) == mid);
            const float toward_zero = std::nextafter(mid_f, 0.0f);
            const float away = std::nextafter(mid_f, sign != 0 ? -INFINITY : INFINITY);
            const std::uint16_t even = (a & 1u) == 0 ? a : b;

            const std::uint16_t got_mid = Traits::convert(mid_f).bits;
            const std::uint16_t got_below = Traits::convert(toward_zero).bits;
            const std::uint16_t got_above = Traits::convert(away).bits;
            if (got_mid != even || got_below != a || got_above != b)
                bad.add("between " + hex(a) + " and " + hex(b) + ": got " + hex(got_below) + ", " +
                        hex(got_mid) + ", " + hex(got_above));
            ++pairs;
        }
    }
    INFO(Traits::label << ": " << bad.report());
    CHECK(bad.count == 0);
    CHECK(pairs == 2u * (Traits::max_finite + 1u));
}

}  // namespace

TEST_CASE("bf16 and f16 are trivial 2-byte types with exact float conversions", "[dtype]") {
    STATIC_REQUIRE(sizeof(bf16) == 2);
    STATIC_REQUIRE(sizeof(f16) == 2);
    STATIC_REQUIRE(std::is_trivially_copyable_v<bf16>);
    STATIC_REQUIRE(std::is_trivially_copyable_v<f16>);
    // Conversions are explicit: a float must not silently become a 16-bit value.
    STATIC_REQUIRE(!std::is_convertible_v<float, bf16>);
    STATIC_REQUIRE(!std::is_convertible_v<float, f16>);
    STATIC_REQUIRE(!std::is_convertible_v<bf16, float>);
    STATIC_REQUIRE(!std::is_convertible_v<f16, float>);
}

TEST_CASE("every bf16 bit pattern converts to float and back unchanged", "[dtype][bf16]") {
    check_round_trip<Bf16Traits>();
}

TEST_CASE("every f16 bit pattern converts to float and back unchanged", "[dtype][f16]") {
    check_round_trip<F16Traits>();
}

TEST_CASE("float to bf16 rounds every midpoint to even", "[dtype][bf16]") {
    check_round_to_nearest_even<Bf16Traits>();
}

TEST_CASE("float to f16 rounds every midpoint to even", "[dtype][f16]") {
    check_round_to_nearest_even<F16Traits>();
}

TEST_CASE("float to bf16 and f16 handle overflow, underflow, Inf and NaN", "[dtype]") {
    constexpr float inf = std::numeric_limits<float>::infinity();
    constexpr float max = std::numeric_limits<float>::max();
    const float below_65520 = std::nextafter(65520.0f, 0.0f);

    CHECK(loom::to_f16(65504.0f).bits == 0x7bff);
    CHECK(loom::to_f16(below_65520).bits == 0x7bff);
    CHECK(loom::to_f16(65520.0f).bits == 0x7c00);
    CHECK(loom::to_f16(-65520.0f).bits == 0xfc00);
    CHECK(loom::to_f16(max).bits == 0x7c00);
    CHECK(loom::to_f16(inf).bits == 0x7c00);
    CHECK(loom::to_f16(-inf).bits == 0xfc00);
    CHECK(loom::to_bf16(max).bits == 0x7f80);  // FLT_MAX is past the bf16 midpoint to Inf
    CHECK(loom::to_bf16(-max).bits == 0xff80);
    CHECK(loom::to_bf16(inf).bits == 0x7f80);
    CHECK(loom::to_bf16(-inf).bits == 0xff80);

    // Underflow: half the smallest f16 subnormal ties to zero, anything above it does not.
    CHECK(loom::to_f16(0x1p-25f).bits == 0x0000);
    CHECK(loom::to_f16(-0x1p-25f).bits == 0x8000);
    CHECK(loom::to_f16(std::nextafter(0x1p-25f, 1.0f)).bits == 0x0001);
    CHECK(loom::to_f16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    CHECK(loom::to_f16(-0.0f).bits == 0x8000);
    CHECK(loom::to_bf16(-0.0f).bits == 0x8000);
    CHECK(loom::to_bf16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    // The largest f16 subnormal rounds up into the smallest normal.
    CHECK(loom::to_f16(std::nextafter(0x1p-14f, 0.0f)).bits == 0x0400);

    // A signalling NaN whose payload lives only in bits truncation drops must
    // stay NaN (not become Inf), quieted, with its sign.
    for (std::uint32_t nan : {0x7f800001u, 0xff800001u, 0x7fc00000u, 0xffffffffu, 0x7f801fffu}) {
        const float value = std::bit_cast<float>(nan);
        INFO("float bits " << hex(nan));
        const std::uint16_t b = loom::to_bf16(value).bits;
        const std::uint16_t h = loom::to_f16(value).bits;
        CHECK((b & 0x7fff) > 0x7f80);
        CHECK((b & 0x0040) != 0);
        CHECK((b & 0x8000) == ((nan >> 16) & 0x8000));
        CHECK((h & 0x7fff) > 0x7c00);
        CHECK((h & 0x0200) != 0);
        CHECK((h & 0x8000) == ((nan >> 16) & 0x8000));
    }
}

#ifdef __FLT16_MAX__
// The compiler's _Float16 conversion (libgcc's soft-float on plain x86-64) is
// an independent implementation of IEEE rounding to compare against.
TEST_CASE("float to f16 matches the compiler's _Float16", "[dtype][f16]") {
    Mismatches bad;
    std::size_t tested = 0;
    auto compare = [&](std::uint32_t float_bits) {
        const float value = std::bit_cast<float>(float_bits);
        const auto expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
        const std::uint16_t got = loom::to_f16(value).bits;
        const bool ok = is_nan_bits<F16Traits>(expected)
                            ? is_nan_bits<F16Traits>(got) && (got & 0x8000) == (expected & 0x8000)
                            : got == expected;
        if (!ok) bad.add("float " + hex(float_bits) + ": _Float16 " + hex(expected) + ", loom " + hex(got));
        ++tested;
    };
    // An odd stride through all 2^32 patterns reaches every exponent, both
    // signs, NaNs and every residue of the low mantissa bits.
    constexpr std::uint64_t stride = 2053;
    for (std::uint64_t bits = 0; bits <= 0xffff'ffffu; bits += stride)
        compare(static_cast<std::uint32_t>(bits));
    // Floats that land on f16 subnormals, 2^-25 up to 2^-14, where the
    // rounding position moves with the exponent. All 92M of them would take
    // seconds with soft-float _Float16, so step through them with a small
    // odd stride instead.
    for (std::uint32_t sign : {0u, 0x8000'0000u})
        for (std::uint32_t bits = 0x3300'0000u; bits < 0x3880'0000u; bits += 61)
            compare(sign | bits);
    INFO(bad.report());
    CHECK(bad.count == 0);
    CHECK(tested > 4'000'000);
}
#endif

TEST_CASE("bf16 and f16 print their float value", "[dtype]") {
    std::ostringstream out;
    out << loom::to_bf16(1.5f) << ' ' << loom::to_f16(-0.25f) << ' ' << f16::from_bits(0x7c00);
    CHECK(out.str() == "1.5 -0.25 inf");
}

TEST_CASE("DType sizes, names and kinds", "[dtype]") {
    CHECK(loom::all_dtypes.size() == 5);
    CHECK(loom::size_of(DType::f32) == 4);
    CHECK(loom::size_of(DType::bf16) == 2);
    CHECK(loom::size_of(DType::f16) == 2);
    CHECK(loom::size_of(DType::i32) == 4);
    CHECK(loom::size_of(DType::i64) == 8);

    CHECK(loom::name(DType::f32) == "f32");
    CHECK(loom::name(DType::bf16) == "bf16");
    CHECK(loom::name(DType::f16) == "f16");
    CHECK(loom::name(DType::i32) == "i32");
    CHECK(loom::name(DType::i64) == "i64");

    CHECK(loom::is_floating(DType::f32));
    CHECK(loom::is_floating(DType::bf16));
    CHECK(loom::is_floating(DType::f16));
    CHECK_FALSE(loom::is_floating(DType::i32));
    CHECK_FALSE(loom::is_floating(DType::i64));

    std::ostringstream out;
    for (DType type : loom::all_dtypes) out << type << ' ';
    out << static_cast<DType>(9);
    CHECK(out.str() == "f32 bf16 f16 i32 i64 DType(9)");
}

TEST_CASE("parse_dtype reads every name back and rejects others", "[dtype]") {
    for (DType type : loom::all_dtypes) {
        INFO(type);
        CHECK(loom::parse_dtype(loom::name(type)) == type);
    }

    REQUIRE_THROWS_AS(loom::parse_dtype("fp8"), loom::Error);
    REQUIRE_THROWS_WITH(loom::parse_dtype("fp8"),
                        Catch::Matchers::StartsWith(
                            "unknown dtype \"fp8\"; valid dtypes are f32, bf16, f16, i32, i64 [") &&
                            Catch::Matchers::Contains("dtype.hpp:"));
    // Names are exact: no case folding, no surrounding space, no aliases.
    for (const char* text : {"F32", " f32", "float32", "bfloat16", ""}) {
        INFO("text: \"" << text << '"');
        try {
            (void)loom::parse_dtype(text);
            FAIL("parse_dtype accepted it");
        } catch (const loom::Error& error) {
            CHECK(error.message() == "unknown dtype \"" + std::string(text) +
                                         "\"; valid dtypes are f32, bf16, f16, i32, i64");
        }
    }
}

TEST_CASE("an out-of-range DType is reported, not read as garbage", "[dtype]") {
    const auto bad = static_cast<DType>(7);
    REQUIRE_THROWS_WITH(loom::size_of(bad), Catch::Matchers::StartsWith(
                                                "invalid DType value 7; valid dtypes are f32, bf16, "
                                                "f16, i32, i64"));
    REQUIRE_THROWS_AS(loom::name(bad), loom::Error);
    REQUIRE_THROWS_AS(loom::is_floating(bad), loom::Error);
}

}  // namespace LOOM_TEST_FILE
