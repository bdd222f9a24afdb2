// Gradient compression's 16-bit casts on the host: round to nearest even, bit
// for bit against the scalar bf16 and f16 conversions, on random bit patterns,
// hand-picked ties, overflow, subnormals and NaN; the residual aliasing x; and
// unpack_cast's weighted accumulation.
#include <catch2/catch.hpp>

#include <loom/core/dtype.hpp>
#include <loom/kernels/host/quantize.hpp>

#include "support/compression_values.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;
using namespace loom_test;

}  // namespace

// --- casts ---------------------------------------------------------------

TEST_CASE("pack_cast rounds to nearest even, bit for bit as the scalar bf16 and f16", "[compress]") {
    std::mt19937 rng(20240611);
    std::vector<float> x;
    // Every kind of float: random bit patterns (NaN, Inf, subnormals included) ...
    std::uniform_int_distribution<std::uint32_t> any_bits;
    for (int i = 0; i < 3000; ++i) x.push_back(from_bits(any_bits(rng)));
    // ... ordinary values over many decades, inside and outside the f16 range ...
    for (float v : spread_normals(rng, 3000, 1e-9f, 1e6f)) x.push_back(v);
    // ... and exact bf16/f16 midpoints: a representable value plus half its ulp.
    std::uniform_int_distribution<std::uint32_t> bf16_bits(0, 0x7f7fu);
    for (int i = 0; i < 500; ++i) x.push_back(from_bits((bf16_bits(rng) << 16) | 0x8000u));
    std::uniform_int_distribution<std::uint32_t> f16_bits(0, 0x7bfeu);
    for (int i = 0; i < 500; ++i) {
        const auto b = static_cast<std::uint16_t>(f16_bits(rng));
        const float lo = loom::detail::f16_bits_to_float(b);
        const float next = loom::detail::f16_bits_to_float(static_cast<std::uint16_t>(b + 1));
        x.push_back(0.5f * lo + 0.5f * next);  // exact in float: f16 has 13 fewer mantissa bits
    }
    const std::int64_t n = size_of(x);
    REQUIRE(n % 2 == 0);

    for (const auto cast : {host::Cast::bf16, host::Cast::f16}) {
        INFO(cast_name(cast));
        for (const std::int64_t len : {n, n - 1}) {  // even, and odd: the last word half filled
            INFO("n = " << len);
            auto words = words_with_sentinel(host::cast_words(len));
            std::vector<float> residual(static_cast<std::size_t>(len), 123.0f);
            host::pack_cast(cast, x.data(), len, words.data(), residual.data());
            CHECK(words.back() == sentinel);
            std::vector<float> decoded(static_cast<std::size_t>(len), 7.0f);
            host::unpack_cast(cast, words.data(), len, decoded.data());

            std::int64_t wrong = 0, wrong_residual = 0;
            std::string first;
            for (std::int64_t i = 0; i < len; ++i) {
                const auto s = static_cast<std::size_t>(i);
                const float expected = scalar_round_trip(cast, x[s]);
                if (bits_of(decoded[s]) != bits_of(expected)) {
                    if (wrong++ == 0) {
                        std::ostringstream m;
                        m << "x[" << i << "] bits 0x" << std::hex << bits_of(x[s]) << " decoded 0x"
                          << bits_of(decoded[s]) << " expected 0x" << bits_of(expected);
                        first = m.str();
                    }
                }
                // The 16 bits sit in the low half for even i, the high half for odd i.
                const auto half = static_cast<std::uint16_t>(words[s / 2] >> ((i & 1) * 16));
                const std::uint16_t scalar_bits =
                    cast == host::Cast::bf16 ? loom::bf16(x[s]).bits : loom::f16(x[s]).bits;
                if (half != scalar_bits) ++wrong;
                const float r = x[s] - expected;
                if (bits_of(residual[s]) != bits_of(r)) ++wrong_residual;
            }
            INFO(first);
            CHECK(wrong == 0);
            CHECK(wrong_residual == 0);
            if (len % 2 == 1) CHECK((words[static_cast<std::size_t>(len / 2)] >> 16) == 0u);
        }
    }
}

TEST_CASE("pack_cast: hand-picked ties, overflow, subnormals and NaN", "[compress]") {
    struct Case {
        float x;
        float expected;
    };
    const float one = 1.0f;
    const std::vector<Case> bf16_cases{
        {one + pow2(-8), one},                         // halfway, ties to even (1.0)
        {-(one + pow2(-8)), -one},                     // the same with the sign
        {one + 3 * pow2(-8), one + pow2(-6)},          // halfway between odd 1+2^-7 and even 1+2^-6: up
        {one + pow2(-8) + pow2(-23), one + pow2(-7)},  // just above halfway: up
        {one + pow2(-8) - pow2(-23), one},             // just below halfway: down
        {from_bits(0x7f7fffffu), inf_f},               // FLT_MAX rounds past the largest bf16
        {from_bits(0x7f7f0000u), from_bits(0x7f7f0000u)},
        {from_bits(0x00018000u), from_bits(0x00020000u)},  // subnormal tie, to even
        {from_bits(0x00008000u), 0.0f},                    // half the smallest bf16 subnormal: to 0
        {from_bits(0x00008001u), from_bits(0x00010000u)},  // just above: up
        {-0.0f, -0.0f},
        {inf_f, inf_f},
        {-inf_f, -inf_f},
    };
    const std::vector<Case> f16_cases{
        {2049.0f, 2048.0f},  // ulp 2: ties to even
        {2051.0f, 2052.0f},
        {-2049.0f, -2048.0f},
        {2050.0f, 2050.0f},
        {one + pow2(-11), one},  // f16 ulp at 1 is 2^-10
        {one + 3 * pow2(-11), one + pow2(-9)},
        {65504.0f, 65504.0f},             // the largest f16
        {65519.0f, 65504.0f},             // below the midpoint 65520
        {from_bits(0x477fefffu), 65504.0f},  // the float just below 65520
        {65520.0f, inf_f},                // the midpoint ties to the even neighbour, Inf
        {-65520.0f, -inf_f},
        {1e6f, inf_f},
        {pow2(-14), pow2(-14)},  // the smallest normal
        {pow2(-24), pow2(-24)},  // the smallest subnormal
        {pow2(-25), 0.0f},       // half of it: ties to 0
        {-pow2(-25), -0.0f},
        {1.5f * pow2(-25), pow2(-24)},
        {3 * pow2(-25), pow2(-23)},  // 1.5 units: ties to 2
        {5 * pow2(-25), pow2(-23)},  // 2.5 units: ties to 2
        {7 * pow2(-25), pow2(-22)},  // 3.5 units: ties to 4
        {1023.5f * pow2(-24), pow2(-14)},  // the largest subnormal's upper midpoint: up to the smallest normal
        {1023.0f * pow2(-24), 1023.0f * pow2(-24)},
        {pow2(-30), 0.0f},
        {-0.0f, -0.0f},
        {inf_f, inf_f},
    };
    for (const auto cast : {host::Cast::bf16, host::Cast::f16}) {
        INFO(cast_name(cast));
        const auto& cases = cast == host::Cast::bf16 ? bf16_cases : f16_cases;
        std::vector<float> x;
        for (const auto& c : cases) x.push_back(c.x);
        const std::int64_t n = size_of(x);
        auto words = words_with_sentinel(host::cast_words(n));
        host::pack_cast(cast, x.data(), n, words.data());
        std::vector<float> out(x.size());
        host::unpack_cast(cast, words.data(), n, out.data());
        for (std::size_t i = 0; i < cases.size(); ++i) {
            CAPTURE(i, cases[i].x, cases[i].expected, out[i]);
            CHECK(bits_of(out[i]) == bits_of(cases[i].expected));
            CHECK(bits_of(scalar_round_trip(cast, cases[i].x)) == bits_of(cases[i].expected));
        }
        CHECK(words.back() == sentinel);

        // NaN stays NaN with its sign, even with its payload only in the low bits.
        const std::vector<float> nans{nan_f, from_bits(0xff800001u), from_bits(0x7f800001u)};
        std::vector<std::uint32_t> nan_words(2);
        host::pack_cast(cast, nans.data(), 3, nan_words.data());
        std::vector<float> nan_out(3);
        host::unpack_cast(cast, nan_words.data(), 3, nan_out.data());
        for (std::size_t i = 0; i < 3; ++i) {
            CAPTURE(i);
            CHECK(std::isnan(nan_out[i]));
            CHECK(std::signbit(nan_out[i]) == std::signbit(nans[i]));
        }
    }

    // The word layout: element 0 in the low half, element 1 in the high half.
    const std::vector<float> pair{1.0f, -2.0f};
    std::uint32_t word = 0;
    host::pack_cast(host::Cast::bf16, pair.data(), 2, &word);
    CHECK(word == 0xc0003f80u);
    host::pack_cast(host::Cast::f16, pair.data(), 2, &word);
    CHECK(word == 0xc0003c00u);
    // One value: the high half is zero.
    host::pack_cast(host::Cast::f16, pair.data(), 1, &word);
    CHECK(word == 0x00003c00u);
    CHECK(host::cast_words(0) == 0);
    CHECK(host::cast_words(1) == 1);
    CHECK(host::cast_words(2) == 1);
    CHECK(host::cast_words(7) == 4);
}

TEST_CASE("pack_cast residual may alias x; unpack_cast weights and accumulates", "[compress]") {
    std::mt19937 rng(7);
    const auto x = spread_normals(rng, 1001, 1e-3f, 1e3f);
    const std::int64_t n = size_of(x);
    for (const auto cast : {host::Cast::bf16, host::Cast::f16}) {
        INFO(cast_name(cast));
        std::vector<std::uint32_t> words(static_cast<std::size_t>(host::cast_words(n)));
        host::pack_cast(cast, x.data(), n, words.data());

        // In place: x becomes its residual, and the words are the same.
        auto in_place = x;
        std::vector<std::uint32_t> words_in_place(words.size());
        host::pack_cast(cast, in_place.data(), n, words_in_place.data(), in_place.data());
        CHECK(words_in_place == words);
        std::int64_t wrong = 0;
        for (std::size_t i = 0; i < x.size(); ++i)
            if (bits_of(in_place[i]) != bits_of(x[i] - scalar_round_trip(cast, x[i]))) ++wrong;
        CHECK(wrong == 0);

        // out = weight * decoded, then out += weight * decoded.
        const float weight = 0.375f;
        std::vector<float> base = normal_values(x.size(), rng);
        auto out = base;
        host::unpack_cast(cast, words.data(), n, out.data(), weight, true);
        std::vector<float> written(x.size(), 99.0f);
        host::unpack_cast(cast, words.data(), n, written.data(), weight, false);
        std::int64_t wrong_add = 0, wrong_write = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
            const float d = weight * scalar_round_trip(cast, x[i]);
            if (out[i] != base[i] + d) ++wrong_add;
            if (written[i] != d) ++wrong_write;
        }
        CHECK(wrong_add == 0);
        CHECK(wrong_write == 0);
    }
}

}  // namespace LOOM_TEST_FILE
