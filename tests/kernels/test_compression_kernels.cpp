// Gradient compression on the host: the 16-bit casts (round to nearest even,
// bit for bit against the scalar bf16/f16 conversions), blockwise int8 (the
// half-step error bound), one-bit signs (the least-squares scale), top-k (the
// exact set of the k largest magnitudes, ties to the lower index), the
// Gram-Schmidt of PowerSGD, the error-feedback identity (nothing is lost,
// only delayed), ChunkCodec over every chunk compressor, and the parsing and
// printing of compressors and GradCompress policies.
#include <catch2/catch.hpp>

#include <loom/core/dtype.hpp>
#include <loom/exec/chunk_codec.hpp>
#include <loom/kernels/host/low_rank.hpp>
#include <loom/kernels/host/quantize.hpp>
#include <loom/kernels/host/top_k.hpp>
#include <loom/parallel/grad_compress.hpp>
#include <loom/parallel/strategy.hpp>

#include "support/message_of.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace host = loom::kernels::host;
using loom_test::message_of;

constexpr std::uint32_t sentinel = 0xdeadbeefu;
const float nan_f = std::numeric_limits<float>::quiet_NaN();
const float inf_f = std::numeric_limits<float>::infinity();

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
float pow2(int e) { return std::ldexp(1.0f, e); }

std::int64_t size_of(const std::vector<float>& v) { return static_cast<std::int64_t>(v.size()); }

// The scalar conversion the packed one must agree with.
float scalar_round_trip(host::Cast c, float x) {
    return c == host::Cast::bf16 ? static_cast<float>(loom::bf16(x)) : static_cast<float>(loom::f16(x));
}

const char* cast_name(host::Cast c) { return c == host::Cast::bf16 ? "bf16" : "f16"; }

// Normal values whose scale varies over many decades, from `lo` to `hi`.
std::vector<float> spread_normals(std::mt19937& rng, std::size_t n, float lo, float hi) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> exponent(std::log(lo), std::log(hi));
    std::vector<float> x(n);
    for (auto& v : x) v = normal(rng) * std::exp(exponent(rng));
    return x;
}

std::vector<float> normals(std::mt19937& rng, std::size_t n, float sigma = 1.0f) {
    std::normal_distribution<float> normal(0.0f, sigma);
    std::vector<float> x(n);
    for (auto& v : x) v = normal(rng);
    return x;
}

// Words with a sentinel after the `count` the encoding may use.
std::vector<std::uint32_t> words_with_sentinel(std::int64_t count) {
    std::vector<std::uint32_t> w(static_cast<std::size_t>(count) + 1, 0x5a5a5a5au);
    w.back() = sentinel;
    return w;
}

// The reference top-k: indices sorted by |x| descending (NaN as the largest),
// then index ascending; the first k, in increasing index order.
std::vector<std::int32_t> reference_top_k(const std::vector<float>& x, std::int64_t k) {
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

}  // namespace

// --- 1. casts ---------------------------------------------------------------

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
        std::vector<float> base = normals(rng, x.size());
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

// --- 2. int8 ------------------------------------------------------------------

TEST_CASE("pack_int8 stays within half a step of every value, block by block", "[compress]") {
    std::mt19937 rng(12345);
    double worst_ratio = 0;  // max |x - decoded| / (scale / 2) seen
    for (const float scale_of_data : {1e-6f, 1e-3f, 1.0f, 1e3f}) {
        for (const std::int64_t block : {std::int64_t{1}, std::int64_t{7}, std::int64_t{128}, std::int64_t{2048}}) {
            for (const std::size_t n : {std::size_t{1000}, std::size_t{1027}, std::size_t{3}}) {
                CAPTURE(scale_of_data, block, n);
                // Half plain normals, half values spread over six decades, so
                // small values share blocks with large ones.
                auto x = normals(rng, n, scale_of_data);
                const auto spread = spread_normals(rng, n, scale_of_data * 1e-3f, scale_of_data * 1e3f);
                for (std::size_t i = 0; i < n; i += 2) x[i] = spread[i];
                const auto len = static_cast<std::int64_t>(n);
                const std::int64_t blocks = (len + block - 1) / block;

                auto words = words_with_sentinel(host::int8_words(len, block));
                std::vector<float> residual(n, 5.0f);
                host::pack_int8(x.data(), len, block, words.data(), residual.data());
                CHECK(words.back() == sentinel);
                std::vector<float> decoded(n, 3.0f);
                host::unpack_int8(words.data(), len, block, decoded.data());

                const auto* q = reinterpret_cast<const std::int8_t*>(words.data() + blocks);
                std::int64_t out_of_bound = 0, wrong_scale = 0, wrong_residual = 0, wrong_q = 0;
                std::string first;
                for (std::int64_t b = 0; b < blocks; ++b) {
                    const std::int64_t lo = b * block, hi = std::min(lo + block, len);
                    float absmax = 0;
                    for (std::int64_t i = lo; i < hi; ++i) absmax = std::max(absmax, std::fabs(x[static_cast<std::size_t>(i)]));
                    const float scale = absmax / 127.0f;
                    if (bits_of(from_bits(words[static_cast<std::size_t>(b)])) != bits_of(scale)) ++wrong_scale;
                    for (std::int64_t i = lo; i < hi; ++i) {
                        const auto s = static_cast<std::size_t>(i);
                        const double err = std::fabs(static_cast<double>(x[s]) - static_cast<double>(decoded[s]));
                        // Half a step, plus the roundings of 1/scale, x/scale and q*scale.
                        const double bound = static_cast<double>(scale) / 2 * (1 + 1e-5) + 1e-30;
                        worst_ratio = std::max(worst_ratio, err / (static_cast<double>(scale) / 2));
                        if (!(err <= bound) && out_of_bound++ == 0) {
                            std::ostringstream m;
                            m.precision(9);
                            m << "x[" << i << "] = " << x[s] << " decoded " << decoded[s] << " scale " << scale;
                            first = m.str();
                        }
                        if (q[s] < -127 || decoded[s] != static_cast<float>(q[s]) * scale) ++wrong_q;
                        if (bits_of(residual[s]) != bits_of(x[s] - decoded[s])) ++wrong_residual;
                    }
                }
                INFO(first);
                CHECK(out_of_bound == 0);
                CHECK(wrong_scale == 0);
                CHECK(wrong_q == 0);
                CHECK(wrong_residual == 0);
            }
        }
    }
    INFO("worst |x - decoded| / (scale / 2) = " << worst_ratio);
    CHECK(worst_ratio <= 1 + 1e-5);
    CHECK(worst_ratio > 0.9);  // the bound is nearly reached: the check is not vacuous
}

TEST_CASE("pack_int8: zero blocks, NaN blocks, word counts, in place", "[compress]") {
    // Three blocks of 4 (the last of 2): zeros, values with a NaN, values.
    std::vector<float> x{0.0f, -0.0f, 0.0f, 0.0f, 1.0f, nan_f, -2.0f, 0.5f, 3.0f, -1.5f};
    const std::int64_t n = size_of(x), block = 4;
    CHECK(host::int8_words(n, block) == 3 + 3);
    auto words = words_with_sentinel(host::int8_words(n, block));
    std::vector<float> residual(x.size(), 9.0f);
    host::pack_int8(x.data(), n, block, words.data(), residual.data());
    CHECK(words.back() == sentinel);
    std::vector<float> out(x.size(), 9.0f);
    host::unpack_int8(words.data(), n, block, out.data());
    for (std::size_t i = 0; i < 4; ++i) {
        CAPTURE(i);
        CHECK(bits_of(out[i]) == 0u);  // +0 exactly: a zero scale
        CHECK(residual[i] == 0.0f);
    }
    CHECK(from_bits(words[0]) == 0.0f);
    CHECK(std::isnan(from_bits(words[1])));  // NaN propagates into its block's scale
    for (std::size_t i = 4; i < 8; ++i) {
        CAPTURE(i);
        CHECK(std::isnan(out[i]));
    }
    const float scale = 3.0f / 127.0f;
    CHECK(from_bits(words[2]) == scale);
    CHECK(out[8] == Approx(3.0f).epsilon(1e-6));
    CHECK(out[9] == static_cast<float>(std::nearbyint(-1.5f / scale)) * scale);
    CHECK(std::fabs(out[9] + 1.5f) <= scale / 2);

    // In place gives the same words and the residual.
    auto in_place = x;
    auto words_in_place = words_with_sentinel(host::int8_words(n, block));
    host::pack_int8(in_place.data(), n, block, words_in_place.data(), in_place.data());
    CHECK(words_in_place == words);
    CHECK(bits_of(in_place[8]) == bits_of(residual[8]));
    CHECK(bits_of(in_place[9]) == bits_of(residual[9]));

    // Weighted accumulation.
    std::vector<float> acc(x.size(), 1.0f);
    host::unpack_int8(words.data(), n, block, acc.data(), 0.5f, true);
    CHECK(acc[0] == 1.0f);
    CHECK(acc[8] == 1.0f + 127.0f * (0.5f * scale));

    // Word counts: the scales, then four int8 per word.
    CHECK(host::int8_words(0, 128) == 0);
    CHECK(host::int8_words(1, 128) == 2);
    CHECK(host::int8_words(128, 128) == 1 + 32);
    CHECK(host::int8_words(129, 128) == 2 + 33);
    CHECK(host::int8_words(1000, 7) == 143 + 250);
    CHECK(host::int8_words(5, 1) == 5 + 2);

    CHECK(message_of([&] { host::pack_int8(x.data(), n, 0, words.data()); }) ==
          "pack_int8: a block of 0 values; it must hold at least 1");
}

// An Inf makes its block's scale NaN (an infinite scale would decode 0 x inf
// as NaN for some values and the wrong infinity for others): the block
// decodes non-finite, the other blocks are untouched.
TEST_CASE("pack_int8: an Inf keeps its block non-finite and its sign; other blocks unaffected", "[compress]") {
    const std::vector<float> x{1.0f, inf_f, -2.0f, 0.5f, 3.0f, -inf_f, 1.0f, 2.0f, 1.0f, -1.0f};
    const std::int64_t n = size_of(x), block = 4;
    std::vector<std::uint32_t> words(static_cast<std::size_t>(host::int8_words(n, block)));
    host::pack_int8(x.data(), n, block, words.data());
    std::vector<float> out(x.size());
    host::unpack_int8(words.data(), n, block, out.data());
    for (std::size_t i = 0; i < 8; ++i) {
        CAPTURE(i, x[i], out[i]);
        CHECK_FALSE(std::isfinite(out[i]));
    }
    CHECK(out[8] == Approx(1.0f).epsilon(1e-6));
    CHECK(out[9] == Approx(-1.0f).epsilon(1e-6));
    // An infinity never comes back as the opposite infinity.
    CAPTURE(out[1], out[5]);
    CHECK_FALSE((std::isinf(out[1]) && out[1] < 0));
    CHECK_FALSE((std::isinf(out[5]) && out[5] > 0));
}

// --- 3. one-bit signs -------------------------------------------------------------

TEST_CASE("pack_signs: sign times the block's mean |x|, the least-squares scale", "[compress]") {
    std::mt19937 rng(99);
    for (const std::int64_t block : {std::int64_t{1}, std::int64_t{5}, std::int64_t{32}, std::int64_t{64},
                                     std::int64_t{1024}}) {
        for (const std::size_t n : {std::size_t{1000}, std::size_t{33}}) {
            CAPTURE(block, n);
            auto x = spread_normals(rng, n, 1e-3f, 10.0f);
            x[0] = 0.0f;  // zero and negative zero count as positive
            x[1] = -0.0f;
            const auto len = static_cast<std::int64_t>(n);
            const std::int64_t blocks = (len + block - 1) / block;
            CHECK(host::sign_words(len, block) == blocks + (len + 31) / 32);
            auto words = words_with_sentinel(host::sign_words(len, block));
            std::vector<float> residual(n, 4.0f);
            host::pack_signs(x.data(), len, block, words.data(), residual.data());
            CHECK(words.back() == sentinel);
            std::vector<float> decoded(n, 4.0f);
            host::unpack_signs(words.data(), len, block, decoded.data());

            std::int64_t wrong_scale = 0, wrong_value = 0, wrong_bit = 0, wrong_residual = 0, not_optimal = 0;
            for (std::int64_t b = 0; b < blocks; ++b) {
                const std::int64_t lo = b * block, hi = std::min(lo + block, len);
                double sum = 0;
                for (std::int64_t i = lo; i < hi; ++i) sum += std::fabs(static_cast<double>(x[static_cast<std::size_t>(i)]));
                const auto scale = static_cast<float>(sum / static_cast<double>(hi - lo));
                if (from_bits(words[static_cast<std::size_t>(b)]) != scale) ++wrong_scale;
                for (std::int64_t i = lo; i < hi; ++i) {
                    const auto s = static_cast<std::size_t>(i);
                    const bool positive = !(x[s] < 0);
                    const bool bit = ((words[static_cast<std::size_t>(blocks + i / 32)] >> (i % 32)) & 1u) != 0;
                    if (bit != positive) ++wrong_bit;
                    if (decoded[s] != (positive ? scale : -scale)) ++wrong_value;
                    if (bits_of(residual[s]) != bits_of(x[s] - decoded[s])) ++wrong_residual;
                }
                // The squared error, with the block's scale scaled by 1 + delta
                // (through unpack's weight): smallest at delta = 0.
                const auto squared_error = [&](float weight) {
                    std::vector<float> d(n);
                    host::unpack_signs(words.data(), len, block, d.data(), weight);
                    double e = 0;
                    for (std::int64_t i = lo; i < hi; ++i) {
                        const double r = static_cast<double>(x[static_cast<std::size_t>(i)]) - d[static_cast<std::size_t>(i)];
                        e += r * r;
                    }
                    return e;
                };
                if (scale > 0) {  // a zero block has the same error at every scale
                    const double best = squared_error(1.0f);
                    for (const float delta : {-0.05f, -0.002f, 0.002f, 0.05f})
                        if (!(squared_error(1.0f + delta) > best)) ++not_optimal;
                }
            }
            CHECK(wrong_scale == 0);
            CHECK(wrong_bit == 0);
            CHECK(wrong_value == 0);
            CHECK(wrong_residual == 0);
            CHECK(not_optimal == 0);
            // Zero and -0 travel as positive.
            CHECK(decoded[0] >= 0.0f);
            CHECK(decoded[1] >= 0.0f);
            CHECK_FALSE(std::signbit(decoded[1]));
        }
    }
}

TEST_CASE("pack_signs: in place, accumulation, NaN stays in its block, block 1 is exact", "[compress]") {
    const std::vector<float> x{2.0f, -4.0f, 1.0f, -1.0f, 0.5f, nan_f, 3.0f};
    const std::int64_t n = size_of(x), block = 2;
    auto words = words_with_sentinel(host::sign_words(n, block));
    host::pack_signs(x.data(), n, block, words.data());
    CHECK(words.back() == sentinel);
    std::vector<float> out(x.size());
    host::unpack_signs(words.data(), n, block, out.data());
    CHECK(out[0] == 3.0f);
    CHECK(out[1] == -3.0f);
    CHECK(out[2] == 1.0f);
    CHECK(out[3] == -1.0f);
    CHECK(std::isnan(out[4]));
    CHECK(std::isnan(out[5]));
    CHECK(out[6] == 3.0f);
    CHECK(words[4] == 0b1110101u);  // bits for x >= 0 (NaN is not < 0)

    std::vector<float> acc{1, 1, 1, 1, 1, 1, 1};
    host::unpack_signs(words.data(), n, block, acc.data(), -0.5f, true);
    CHECK(acc[0] == -0.5f);
    CHECK(acc[1] == 2.5f);
    CHECK(acc[6] == -0.5f);

    auto in_place = x;
    auto words_in_place = words_with_sentinel(host::sign_words(n, block));
    host::pack_signs(in_place.data(), n, block, words_in_place.data(), in_place.data());
    CHECK(words_in_place == words);
    CHECK(in_place[0] == -1.0f);
    CHECK(in_place[1] == -1.0f);
    CHECK(in_place[2] == 0.0f);
    CHECK(in_place[6] == 0.0f);

    // One value per block: the scale is |x|, so everything but -0 comes back exactly.
    const std::vector<float> y{1.5f, -2.25f, 1e-20f, -7.0f};
    std::vector<std::uint32_t> w1(static_cast<std::size_t>(host::sign_words(4, 1)));
    std::vector<float> r1(4, 1.0f), d1(4);
    host::pack_signs(y.data(), 4, 1, w1.data(), r1.data());
    host::unpack_signs(w1.data(), 4, 1, d1.data());
    CHECK(d1 == y);
    CHECK(r1 == std::vector<float>(4, 0.0f));

    CHECK(message_of([&] { host::pack_signs(x.data(), n, 0, words.data()); }) ==
          "pack_signs: a block of 0 values; it must hold at least 1");
}

// --- 4. top-k -----------------------------------------------------------------------

TEST_CASE("pack_top_k keeps exactly the k largest magnitudes, ties to the lower index", "[compress]") {
    std::mt19937 rng(4242);
    std::uniform_int_distribution<int> small(-12, 12);
    std::vector<std::int32_t> scratch;
    for (int trial = 0; trial < 6; ++trial) {
        const std::size_t n = trial % 2 == 0 ? 1000 : 257;
        std::vector<float> x;
        if (trial < 2) x = normals(rng, n);
        else if (trial < 4) {  // few distinct magnitudes: many ties
            for (std::size_t i = 0; i < n; ++i) x.push_back(static_cast<float>(small(rng)) * 0.25f);
        } else {  // ties, signed zeros and a few NaN and Inf
            for (std::size_t i = 0; i < n; ++i) x.push_back(static_cast<float>(small(rng)));
            x[17] = nan_f;
            x[3] = -0.0f;
            x[100] = -inf_f;
            x[200] = -nan_f;
            x[250] = inf_f;
        }
        const auto len = static_cast<std::int64_t>(n);
        for (const std::int64_t k : {std::int64_t{0}, std::int64_t{1}, std::int64_t{2}, std::int64_t{10}, len / 2,
                                     len - 1, len}) {
            CAPTURE(trial, n, k);
            auto words = words_with_sentinel(host::top_k_words(k));
            std::vector<float> residual(n, 8.0f);
            host::pack_top_k(x.data(), len, k, words.data(), scratch, residual.data());
            CHECK(words.back() == sentinel);

            const auto expected = reference_top_k(x, k);
            std::vector<std::int32_t> got(words.begin(), words.begin() + k);
            CHECK(got == expected);
            std::int64_t wrong_value = 0, wrong_residual = 0;
            std::vector<bool> selected(n, false);
            for (std::int64_t j = 0; j < k; ++j) {
                const auto i = static_cast<std::size_t>(words[static_cast<std::size_t>(j)]);
                if (i >= n) continue;
                selected[i] = true;
                if (words[static_cast<std::size_t>(k + j)] != bits_of(x[i])) ++wrong_value;
            }
            for (std::size_t i = 0; i < n; ++i)
                if (bits_of(residual[i]) != (selected[i] ? 0u : bits_of(x[i]))) ++wrong_residual;
            CHECK(wrong_value == 0);
            CHECK(wrong_residual == 0);

            // In place (the executor's error feedback) gives the same words.
            auto in_place = x;
            auto words_in_place = words_with_sentinel(host::top_k_words(k));
            host::pack_top_k(in_place.data(), len, k, words_in_place.data(), scratch, in_place.data());
            CHECK(words_in_place == words);
            std::int64_t wrong_in_place = 0;
            for (std::size_t i = 0; i < n; ++i)
                if (bits_of(in_place[i]) != bits_of(residual[i])) ++wrong_in_place;
            CHECK(wrong_in_place == 0);
        }
    }
}

TEST_CASE("pack_top_k: hand-picked ties and NaN; unpack_top_k_add scatters and refuses bad indices",
          "[compress]") {
    std::vector<std::int32_t> scratch;
    const auto select = [&](const std::vector<float>& x, std::int64_t k) {
        std::vector<std::uint32_t> words(static_cast<std::size_t>(host::top_k_words(k)));
        host::pack_top_k(x.data(), size_of(x), k, words.data(), scratch);
        return std::vector<std::uint32_t>(words.begin(), words.begin() + k);
    };
    using W = std::vector<std::uint32_t>;
    const std::vector<float> ties{1.0f, -3.0f, 3.0f, 2.0f, -3.0f, 3.0f};
    CHECK(select(ties, 1) == W{1});
    CHECK(select(ties, 2) == W{1, 2});
    CHECK(select(ties, 3) == W{1, 2, 4});
    CHECK(select(ties, 4) == W{1, 2, 4, 5});
    CHECK(select(ties, 5) == W{1, 2, 3, 4, 5});

    // NaN counts as the largest magnitude, before any finite value.
    const std::vector<float> with_nan{5.0f, -100.0f, 1.0f, nan_f, 1e30f};
    CHECK(select(with_nan, 1) == W{3});
    CHECK(select(with_nan, 2) == W{3, 4});
    CHECK(select(with_nan, 3) == W{1, 3, 4});
    const std::vector<float> nan_first{nan_f, inf_f, -inf_f};
    CHECK(select(nan_first, 1) == W{0});
    CHECK(select(nan_first, 2) == W{0, 1});
    // The value of a NaN travels with its bits.
    std::vector<std::uint32_t> nan_words(2);
    const std::vector<float> negative_nan{1.0f, from_bits(0xffc01234u)};
    host::pack_top_k(negative_nan.data(), 2, 1, nan_words.data(), scratch);
    CHECK(nan_words == W{1, 0xffc01234u});

    // Indices, then values, in increasing index order.
    const std::vector<float> x{0.5f, -7.0f, 0.25f, 6.0f, -0.125f};
    std::vector<std::uint32_t> words(4);
    host::pack_top_k(x.data(), 5, 2, words.data(), scratch);
    CHECK(words == W{1, 3, bits_of(-7.0f), bits_of(6.0f)});

    // Scatter: out[i] += weight * value for the pairs, nothing else touched.
    std::vector<float> out{1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    host::unpack_top_k_add(words.data(), 2, 5, out.data(), 0.5f);
    CHECK(out == std::vector<float>{1.0f, -2.5f, 1.0f, 4.0f, 1.0f});
    host::unpack_top_k_add(words.data(), 2, 5, out.data());
    CHECK(out == std::vector<float>{1.0f, -9.5f, 1.0f, 10.0f, 1.0f});

    // A corrupted index is refused, and nothing is written past the chunk.
    std::vector<std::uint32_t> bad{1, 5, bits_of(2.0f), bits_of(3.0f)};
    std::vector<float> guarded(6, 0.0f);
    CHECK(message_of([&] { host::unpack_top_k_add(bad.data(), 2, 5, guarded.data()); }) ==
          "top-k: index 5 received for a chunk of 5 values");
    CHECK(guarded[5] == 0.0f);
    bad[0] = 0xffffffffu;
    CHECK(message_of([&] { host::unpack_top_k_add(bad.data(), 2, 5, guarded.data()); }) ==
          "top-k: index 4294967295 received for a chunk of 5 values");

    CHECK(message_of([&] { host::pack_top_k(x.data(), 5, 6, words.data(), scratch); }) ==
          "pack_top_k: k = 6 of 5 values; it must be in 0..5");
    CHECK(message_of([&] { host::pack_top_k(x.data(), 5, -1, words.data(), scratch); }) ==
          "pack_top_k: k = -1 of 5 values; it must be in 0..5");
}

TEST_CASE("top_k_count is ceil(ratio * n) clamped to [1, n]; other ratios are refused", "[compress]") {
    CHECK(host::top_k_count(1000, 0.01) == 10);
    CHECK(host::top_k_count(1000, 0.0101) == 11);
    CHECK(host::top_k_count(1001, 0.01) == 11);
    CHECK(host::top_k_count(100, 0.07) == 7);  // 0.07 * 100 is 7.000000000000001 in double
    CHECK(host::top_k_count(100, 0.29) == 29);
    CHECK(host::top_k_count(3, 0.5) == 2);
    CHECK(host::top_k_count(10, 0.01) == 1);  // at least one
    CHECK(host::top_k_count(1, 1e-9) == 1);
    CHECK(host::top_k_count(5, 1.0) == 5);
    CHECK(host::top_k_count(0, 0.5) == 0);
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> ratio(1e-4, 1.0);
    std::uniform_int_distribution<std::int64_t> size(1, 100000);
    std::int64_t wrong = 0;
    for (int i = 0; i < 2000; ++i) {
        const double r = ratio(rng);
        const std::int64_t n = size(rng);
        const auto expected = std::clamp<std::int64_t>(static_cast<std::int64_t>(std::ceil(r * static_cast<double>(n))), 1, n);
        if (host::top_k_count(n, r) != expected) ++wrong;
    }
    CHECK(wrong == 0);

    CHECK(message_of([] { (void)host::top_k_count(100, 0.0); }) ==
          "top-k ratio 0 is outside (0, 1]; use e.g. 0.01 for 1%");
    CHECK(message_of([] { (void)host::top_k_count(100, 1.5); }) ==
          "top-k ratio 1.5 is outside (0, 1]; use e.g. 0.01 for 1%");
    CHECK(message_of([] { (void)host::top_k_count(100, -0.25); }) ==
          "top-k ratio -0.25 is outside (0, 1]; use e.g. 0.01 for 1%");
    CHECK_THAT(message_of([] { (void)host::top_k_count(100, std::nan("")); }),
               Catch::Contains("outside (0, 1]"));
}

// --- 5. Gram-Schmidt ------------------------------------------------------------------

TEST_CASE("orthonormalize_columns: orthonormal, same span, finite for rank-deficient input", "[compress]") {
    constexpr std::int64_t rows = 50, cols = 4;
    std::mt19937 rng(31337);
    const auto a = normals(rng, rows * cols);
    auto p = a;
    host::orthonormalize_columns(p.data(), rows, cols);
    const auto at = [](const std::vector<float>& m, std::int64_t r, std::int64_t c) {
        return static_cast<double>(m[static_cast<std::size_t>(r * cols + c)]);
    };
    const auto dot = [&](const std::vector<float>& m1, std::int64_t c1, const std::vector<float>& m2, std::int64_t c2) {
        double s = 0;
        for (std::int64_t r = 0; r < rows; ++r) s += at(m1, r, c1) * at(m2, r, c2);
        return s;
    };
    for (std::int64_t i = 0; i < cols; ++i)
        for (std::int64_t j = 0; j < cols; ++j) {
            CAPTURE(i, j);
            CHECK(std::fabs(dot(p, i, p, j) - (i == j ? 1.0 : 0.0)) <= 1e-5);
        }
    // Gram-Schmidt's basis: column c is orthogonal to the original columns
    // before it and points along its own (positive diagonal of R).
    for (std::int64_t c = 0; c < cols; ++c) {
        CAPTURE(c);
        for (std::int64_t j = 0; j < c; ++j) CHECK(std::fabs(dot(p, c, a, j)) <= 1e-5 * std::sqrt(dot(a, j, a, j)));
        CHECK(dot(p, c, a, c) > 0.1);
    }
    // The span is kept: every original column is its projection onto P.
    for (std::int64_t j = 0; j < cols; ++j) {
        double err = 0;
        for (std::int64_t r = 0; r < rows; ++r) {
            double proj = 0;
            for (std::int64_t c = 0; c < cols; ++c) proj += at(p, r, c) * dot(p, c, a, j);
            err += (proj - at(a, r, j)) * (proj - at(a, r, j));
        }
        CAPTURE(j);
        CHECK(std::sqrt(err) <= 1e-5 * std::sqrt(dot(a, j, a, j)));
    }

    // Rank-deficient: column 1 duplicates column 0, column 3 is zero.
    auto d = a;
    for (std::int64_t r = 0; r < rows; ++r) {
        d[static_cast<std::size_t>(r * cols + 1)] = d[static_cast<std::size_t>(r * cols)];
        d[static_cast<std::size_t>(r * cols + 3)] = 0.0f;
    }
    host::orthonormalize_columns(d.data(), rows, cols);
    CHECK(std::all_of(d.begin(), d.end(), [](float v) { return std::isfinite(v); }));
    CHECK(std::fabs(dot(d, 0, d, 0) - 1.0) <= 1e-5);
    CHECK(std::fabs(dot(d, 2, d, 2) - 1.0) <= 1e-5);
    // The duplicate and the zero column become fresh unit directions, orthogonal to the rest.
    CHECK(std::fabs(dot(d, 1, d, 1) - 1.0) <= 1e-5);
    CHECK(std::fabs(dot(d, 3, d, 3) - 1.0) <= 1e-5);
    for (std::int64_t c1 = 0; c1 < cols; ++c1)
        for (std::int64_t c2 = c1 + 1; c2 < cols; ++c2) {
            CAPTURE(c1, c2);
            CHECK(std::fabs(dot(d, c1, d, c2)) <= 1e-5);
        }

    // Degenerate shapes do nothing.
    std::vector<float> none;
    host::orthonormalize_columns(none.data(), 0, 0);
    CHECK(message_of([&] { host::orthonormalize_columns(none.data(), -1, 2); }) ==
          "orthonormalize_columns: a -1 x 2 matrix");
}

// A column that depends on the earlier ones leaves only rounding noise after
// one projection pass, and that noise still leans on them; the second pass
// removes the lean, so every column comes out orthogonal to the others (the
// dependent one as a unit vector, or zero when nothing at all is left).
TEST_CASE("orthonormalize_columns: a dependent column comes out orthogonal to the others", "[compress]") {
    // [1, 1] and [2, 2] as the columns of a 2 x 2 matrix: nothing is left of the second.
    std::vector<float> exact{1.0f, 2.0f, 1.0f, 2.0f};
    host::orthonormalize_columns(exact.data(), 2, 2);
    CHECK(std::all_of(exact.begin(), exact.end(), [](float v) { return std::isfinite(v); }));
    CHECK(exact[0] == Approx(std::sqrt(0.5)).epsilon(1e-6));
    CHECK(exact[2] == Approx(std::sqrt(0.5)).epsilon(1e-6));
    CHECK(std::fabs(exact[0] * exact[1] + exact[2] * exact[3]) <= 1e-6);  // columns: elements 0, 2 and 1, 3

    // 50 x 4 with column 1 a copy of column 0: all four columns orthogonal.
    constexpr std::int64_t rows = 50, cols = 4;
    std::mt19937 rng(31337);
    auto d = normals(rng, rows * cols);
    for (std::int64_t r = 0; r < rows; ++r)
        d[static_cast<std::size_t>(r * cols + 1)] = d[static_cast<std::size_t>(r * cols)];
    host::orthonormalize_columns(d.data(), rows, cols);
    const auto dot = [&](std::int64_t c1, std::int64_t c2) {
        double s = 0;
        for (std::int64_t r = 0; r < rows; ++r)
            s += static_cast<double>(d[static_cast<std::size_t>(r * cols + c1)]) * d[static_cast<std::size_t>(r * cols + c2)];
        return s;
    };
    for (std::int64_t a = 0; a < cols; ++a)
        for (std::int64_t b = a + 1; b < cols; ++b) {
            CAPTURE(a, b);
            CHECK(std::fabs(dot(a, b)) <= 1e-5);
        }
    CHECK(dot(0, 0) == Approx(1.0).epsilon(1e-5));
    CHECK(dot(2, 2) == Approx(1.0).epsilon(1e-5));
    CHECK(dot(3, 3) == Approx(1.0).epsilon(1e-5));
}

// --- 6. error feedback ---------------------------------------------------------------------

TEST_CASE("error feedback loses nothing: sent + residual == sum of the gradients", "[compress]") {
    constexpr std::size_t n = 1000;
    constexpr int steps = 20;
    const std::vector<loom::Compression> compressors{
        loom::TopK<0.05>::compression,
        loom::Compression{loom::CompressorKind::top_k, 0.001},  // k = 1
        loom::Compression{loom::CompressorKind::one_bit, 1.0, 0, 64},
        loom::OneBit::compression,
        loom::Int8Block<32>::compression,
        loom::CastBf16::compression,
    };
    for (const auto& c : compressors) {
        for (const bool in_place : {false, true}) {
            CAPTURE(c.describe(), in_place);
            std::mt19937 rng(555);
            loom::exec::ChunkCodec codec(c);
            std::vector<double> sum_g(n, 0.0), sum_sent(n, 0.0), sum_abs(n, 0.0);
            std::vector<float> e(n, 0.0f), x(n);
            std::vector<std::uint32_t> words(static_cast<std::size_t>(codec.words(n)));
            std::vector<float> sent(n);
            for (int t = 0; t < steps; ++t) {
                const auto g = normals(rng, n, t % 3 == 0 ? 10.0f : 1.0f);
                for (std::size_t i = 0; i < n; ++i) {
                    sum_g[i] += g[i];
                    sum_abs[i] += std::fabs(g[i]);
                }
                if (in_place) {  // the executor's way: e += g, then pack e into itself
                    for (std::size_t i = 0; i < n; ++i) e[i] += g[i];
                    codec.pack(e.data(), n, words.data(), e.data());
                } else {
                    for (std::size_t i = 0; i < n; ++i) x[i] = g[i] + e[i];
                    codec.pack(x.data(), n, words.data(), e.data());
                }
                codec.unpack(words.data(), n, sent.data(), 1.0f, false);
                for (std::size_t i = 0; i < n; ++i) sum_sent[i] += sent[i];
            }
            double scale = 0, worst = 0, residual_size = 0;
            for (std::size_t i = 0; i < n; ++i) {
                scale = std::max(scale, sum_abs[i]);
                worst = std::max(worst, std::fabs(sum_sent[i] + e[i] - sum_g[i]));
                residual_size = std::max(residual_size, static_cast<double>(std::fabs(e[i])));
            }
            INFO("worst |sent + e - sum g| = " << worst << " of a scale " << scale);
            CHECK(worst <= 1e-5 * scale);
            if (c.error_feedback()) CHECK(residual_size > 1e-3 * scale);  // a lossy compressor left something
        }
    }
}

// --- 7. ChunkCodec -------------------------------------------------------------------------

TEST_CASE("ChunkCodec: word counts and round trips for every chunk compressor", "[compress]") {
    const std::vector<loom::Compression> compressors{
        loom::CastBf16::compression,   loom::CastFp16::compression,         loom::Int8Block<>::compression,
        loom::Int8Block<7>::compression, loom::TopK<0.01>::compression,     loom::TopK<0.3>::compression,
        loom::OneBit::compression,     loom::Compression{loom::CompressorKind::one_bit, 1.0, 0, 10},
    };
    std::mt19937 rng(8080);
    std::vector<std::int32_t> scratch;
    for (const auto& c : compressors) {
        loom::exec::ChunkCodec codec(c);
        CHECK(codec.compression() == c);
        for (const std::int64_t n : {std::int64_t{1}, std::int64_t{2}, std::int64_t{7}, std::int64_t{1000},
                                     std::int64_t{1025}}) {
            CAPTURE(c.describe(), n);
            std::int64_t expected_words = 0;
            switch (c.kind) {
                case loom::CompressorKind::bf16:
                case loom::CompressorKind::fp16: expected_words = host::cast_words(n); break;
                case loom::CompressorKind::int8: expected_words = host::int8_words(n, c.block); break;
                case loom::CompressorKind::one_bit: expected_words = host::sign_words(n, c.block); break;
                case loom::CompressorKind::top_k: expected_words = 2 * host::top_k_count(n, c.ratio); break;
                default: FAIL("not a chunk compressor");
            }
            CHECK(codec.words(n) == expected_words);

            const auto x = normals(rng, static_cast<std::size_t>(n));
            auto words = words_with_sentinel(codec.words(n));
            std::vector<float> residual(x.size(), 6.0f);
            codec.pack(x.data(), n, words.data(), residual.data());
            CHECK(words.back() == sentinel);

            // The same words as the kernel itself writes.
            auto kernel_words = words_with_sentinel(expected_words);
            switch (c.kind) {
                case loom::CompressorKind::bf16: host::pack_cast(host::Cast::bf16, x.data(), n, kernel_words.data()); break;
                case loom::CompressorKind::fp16: host::pack_cast(host::Cast::f16, x.data(), n, kernel_words.data()); break;
                case loom::CompressorKind::int8: host::pack_int8(x.data(), n, c.block, kernel_words.data()); break;
                case loom::CompressorKind::one_bit: host::pack_signs(x.data(), n, c.block, kernel_words.data()); break;
                case loom::CompressorKind::top_k:
                    host::pack_top_k(x.data(), n, host::top_k_count(n, c.ratio), kernel_words.data(), scratch);
                    break;
                default: break;
            }
            CHECK(words == kernel_words);

            // Decoded: written over garbage, then accumulated with a weight.
            std::vector<float> decoded(x.size(), 1e9f);
            codec.unpack(words.data(), n, decoded.data(), 1.0f, false);
            std::int64_t wrong = 0, wrong_residual = 0, wrong_add = 0;
            const auto k = host::top_k_count(n, c.ratio);
            const auto selected = c.kind == loom::CompressorKind::top_k ? reference_top_k(x, k) : std::vector<std::int32_t>{};
            for (std::size_t i = 0; i < x.size(); ++i) {
                float expected = 0;
                switch (c.kind) {
                    case loom::CompressorKind::bf16: expected = scalar_round_trip(host::Cast::bf16, x[i]); break;
                    case loom::CompressorKind::fp16: expected = scalar_round_trip(host::Cast::f16, x[i]); break;
                    case loom::CompressorKind::top_k:
                        expected = std::binary_search(selected.begin(), selected.end(), static_cast<std::int32_t>(i)) ? x[i] : 0.0f;
                        break;
                    default: expected = decoded[i]; break;  // checked against the kernels below
                }
                if (bits_of(decoded[i]) != bits_of(expected)) ++wrong;
                if (bits_of(residual[i]) != bits_of(x[i] - decoded[i])) ++wrong_residual;
            }
            if (c.kind == loom::CompressorKind::int8) {
                std::vector<float> direct(x.size());
                host::unpack_int8(words.data(), n, c.block, direct.data());
                CHECK(direct == decoded);
                for (std::size_t i = 0; i < x.size(); ++i) {
                    const auto b = static_cast<std::int64_t>(i) / c.block;
                    if (!(std::fabs(x[i] - decoded[i]) <= from_bits(words[static_cast<std::size_t>(b)]) * 0.50001f)) ++wrong;
                }
            }
            if (c.kind == loom::CompressorKind::one_bit) {
                for (std::size_t i = 0; i < x.size(); ++i) {
                    const float s = from_bits(words[static_cast<std::size_t>(static_cast<std::int64_t>(i) / c.block)]);
                    if (decoded[i] != (x[i] < 0 ? -s : s)) ++wrong;
                }
            }
            CHECK(wrong == 0);
            CHECK(wrong_residual == 0);

            std::vector<float> acc(x.size(), 2.0f);
            codec.unpack(words.data(), n, acc.data(), 0.25f, true);
            for (std::size_t i = 0; i < x.size(); ++i)
                if (acc[i] != 2.0f + 0.25f * decoded[i]) ++wrong_add;
            CHECK(wrong_add == 0);
        }
    }
}

TEST_CASE("ChunkCodec refuses PowerSGD, no compression and invalid settings", "[compress]") {
    CHECK(message_of([] { loom::exec::ChunkCodec codec(loom::PowerSGD<4>::compression); }) ==
          "ChunkCodec: PowerSGD<4> does not compress chunk by chunk");
    CHECK(message_of([] { loom::exec::ChunkCodec codec(loom::Compression{}); }) ==
          "ChunkCodec: NoCompression does not compress chunk by chunk");
    CHECK(message_of([] { loom::exec::ChunkCodec codec(loom::Compression{loom::CompressorKind::top_k, 0.0}); }) ==
          "TopK: ratio 0 is outside (0, 1]; it is the fraction of each chunk sent, e.g. 0.01 for 1%");
    CHECK(message_of([] { loom::exec::ChunkCodec codec(loom::Compression{loom::CompressorKind::int8, 1.0, 0, 0}); }) ==
          "Int8Block<0>: a block of 0 values; it must hold at least 1");
    CHECK(message_of([] { loom::exec::ChunkCodec codec(loom::Compression{loom::CompressorKind::one_bit}); }) ==
          "OneBit<0>: a block of 0 values; it must hold at least 1");
    CHECK(message_of([] { loom::exec::ChunkCodec codec(loom::Compression{loom::CompressorKind::power_sgd}); }) ==
          "PowerSGD: rank 0 must be at least 1 (1 to 4 is typical)");
}

// --- 8. parsing and printing ---------------------------------------------------------------

TEST_CASE("parse_compression reads train_gpt's --compress spellings", "[compress]") {
    using K = loom::CompressorKind;
    CHECK(loom::parse_compression("none") == loom::Compression{});
    CHECK_FALSE(loom::parse_compression("none").on());
    CHECK(loom::parse_compression("bf16").kind == K::bf16);
    CHECK(loom::parse_compression("bf16") == loom::CastBf16::compression);
    CHECK(loom::parse_compression("fp16") == loom::CastFp16::compression);
    const auto int8 = loom::parse_compression("int8");
    CHECK(int8.kind == K::int8);
    CHECK(int8.block == 128);
    CHECK(int8 == loom::Int8Block<128>::compression);
    CHECK(loom::parse_compression("int8:64").block == 64);
    CHECK(loom::parse_compression("int8:64") == loom::Int8Block<64>::compression);
    const auto topk = loom::parse_compression("topk:0.01");
    CHECK(topk.kind == K::top_k);
    CHECK(topk.ratio == 0.01);
    CHECK(topk == loom::TopK<0.01>::compression);
    CHECK(loom::parse_compression("topk:1").ratio == 1.0);
    CHECK(loom::parse_compression("topk:1e-3").ratio == 0.001);
    const auto psgd = loom::parse_compression("powersgd:4");
    CHECK(psgd.kind == K::power_sgd);
    CHECK(psgd.rank == 4);
    CHECK(psgd == loom::PowerSGD<4>::compression);
    const auto onebit = loom::parse_compression("onebit");
    CHECK(onebit.kind == K::one_bit);
    CHECK(onebit.block == loom::default_one_bit_block);
    CHECK(onebit == loom::OneBit::compression);

    // What each kind does with the exchange.
    CHECK(topk.error_feedback());
    CHECK(psgd.error_feedback());
    CHECK(onebit.error_feedback());
    CHECK_FALSE(int8.error_feedback());
    CHECK_FALSE(loom::CastBf16::compression.error_feedback());
    CHECK(int8.two_stage());
    CHECK(onebit.two_stage());
    CHECK_FALSE(topk.two_stage());
    CHECK_FALSE(psgd.two_stage());
    CHECK(loom::CastFp16::compression.is_cast());
    CHECK_FALSE(int8.is_cast());
}

TEST_CASE("parse_compression: bad spellings give one line naming the value", "[compress]") {
    const auto parse = [](const char* text) { return message_of([text] { (void)loom::parse_compression(text); }); };
    const auto zip = parse("zip");
    CHECK_THAT(zip, Catch::Contains("unknown compressor 'zip'"));
    for (const char* valid : {"none", "bf16", "fp16", "int8", "topk:RATIO", "powersgd:RANK", "onebit"}) {
        CAPTURE(valid);
        CHECK_THAT(zip, Catch::Contains(valid));
    }
    CHECK(parse("") != "(no error)");
    CHECK_THAT(parse("BF16"), Catch::Contains("unknown compressor 'BF16'"));

    const auto zero = parse("topk:0");
    CHECK_THAT(zero, Catch::Contains("outside (0, 1]"));
    CHECK_THAT(zero, Catch::Contains("ratio 0 "));
    const auto big = parse("topk:1.5");
    CHECK_THAT(big, Catch::Contains("outside (0, 1]"));
    CHECK_THAT(big, Catch::Contains("1.5"));
    CHECK_THAT(parse("topk:-0.1"), Catch::Contains("outside (0, 1]"));
    CHECK_THAT(parse("topk:nan"), Catch::Contains("outside (0, 1]"));
    CHECK(parse("topk") == "compressor 'topk' needs its ratio, e.g. topk:0.01");
    CHECK(parse("topk:") == "compressor 'topk' needs its ratio, e.g. topk:0.01");
    CHECK(parse("topk:abc") == "compressor 'topk:abc': 'abc' is not a ratio");
    CHECK(parse("topk:0.01x") == "compressor 'topk:0.01x': '0.01x' is not a ratio");

    CHECK(parse("powersgd:0") == "compressor 'powersgd:0': PowerSGD rank 0 must be a whole number in 1..1024");
    CHECK(parse("powersgd:2.5") == "compressor 'powersgd:2.5': PowerSGD rank 2.5 must be a whole number in 1..1024");
    CHECK(parse("powersgd:2000") ==
          "compressor 'powersgd:2000': PowerSGD rank 2000 must be a whole number in 1..1024");
    CHECK(parse("powersgd") == "compressor 'powersgd' needs its rank, e.g. powersgd:4");
    CHECK(parse("powersgd:x") == "compressor 'powersgd:x': 'x' is not a rank");

    CHECK(parse("bf16:3") == "compressor 'bf16:3' takes no ':' argument");
    CHECK(parse("bf16:") == "compressor 'bf16:' takes no ':' argument");
    CHECK(parse("onebit:0") == "compressor 'onebit:0': the onebit block 0 must be a whole number in 1..16777216");
    CHECK(parse("none:1") == "compressor 'none:1' takes no ':' argument");
    CHECK(parse("fp16:x") == "compressor 'fp16:x' takes no ':' argument");

    CHECK(parse("int8:0") == "compressor 'int8:0': the int8 block 0 must be a whole number in 1..16777216");
    CHECK(parse("int8:1.5") == "compressor 'int8:1.5': the int8 block 1.5 must be a whole number in 1..16777216");
    CHECK(parse("int8:q") == "compressor 'int8:q': 'q' is not a block size");

    for (const char* text : {"zip", "topk:0", "topk:1.5", "topk", "powersgd:0", "bf16:3", "int8:0"}) {
        CAPTURE(text);
        const auto m = parse(text);
        CHECK(m != "(no error)");
        CHECK(m.find('\n') == std::string::npos);
    }
}

TEST_CASE("Compression and GradCompress describe themselves as the policy types print", "[compress]") {
    CHECK(loom::parse_compression("topk:0.01").describe() == "TopK<0.01>");
    CHECK(loom::TopK<0.01>::compression.describe() == "TopK<0.01>");
    CHECK(loom::PowerSGD<4>::compression.describe() == "PowerSGD<4>");
    CHECK(loom::parse_compression("powersgd:4").describe() == "PowerSGD<4>");
    CHECK(loom::Int8Block<>::compression.describe() == "Int8Block<128>");
    CHECK(loom::parse_compression("int8:64").describe() == "Int8Block<64>");
    CHECK(loom::OneBit::compression.describe() == "OneBit");
    CHECK(loom::CastBf16::compression.describe() == "CastBf16");
    CHECK(loom::CastFp16::compression.describe() == "CastFp16");
    CHECK(loom::Compression{}.describe() == "NoCompression");

    CHECK(loom::describe<loom::GradCompress<loom::PowerSGD<4>>>() == "GradCompress<PowerSGD<4>>");
    CHECK(loom::describe<loom::GradCompress<loom::TopK<0.01>>>() == "GradCompress<TopK<0.01>>");
    CHECK(loom::describe<loom::GradCompress<loom::CastBf16, loom::PpAxis>>() == "GradCompress<CastBf16, PpAxis>");
    CHECK(loom::describe<loom::GradCompress<loom::CastFp16, loom::TpAxis>>() == "GradCompress<CastFp16, TpAxis>");
    CHECK(loom::describe<loom::GradCompress<loom::CastBf16, loom::DpAxis>>() == "GradCompress<CastBf16>");
    CHECK(loom::GradCompress<loom::CastBf16, loom::PpAxis>::axis == loom::CompressedAxis::pp);
    CHECK(loom::GradCompress<loom::OneBit>::axis == loom::CompressedAxis::dp);
    CHECK(loom::GradCompress<loom::OneBit>::kind == loom::PolicyKind::compression);

    using S = loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::TopK<0.01>>>;
    STATIC_REQUIRE(S::dp_compression.kind == loom::CompressorKind::top_k);
    CHECK(S::dp_compression.ratio == 0.01);
    CHECK(S::dp_compression == loom::parse_compression("topk:0.01"));
    CHECK_FALSE(S::pp_compression.on());
    CHECK_FALSE(S::tp_compression.on());
    std::ostringstream printed;
    printed << S{};
    CHECK_THAT(printed.str(), Catch::EndsWith(", GradCompress<TopK<0.01>>>"));
    CHECK_THAT(printed.str(), Catch::StartsWith("Strategy<DataParallel<"));

    using H = loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::PowerSGD<2>>,
                             loom::GradCompress<loom::CastBf16, loom::PpAxis>>;
    CHECK(H::dp_compression == loom::PowerSGD<2>::compression);
    CHECK(H::pp_compression == loom::CastBf16::compression);
    CHECK_FALSE(H::tp_compression.on());
    CHECK_FALSE(loom::Strategy<loom::DataParallel<>>::dp_compression.on());
}
