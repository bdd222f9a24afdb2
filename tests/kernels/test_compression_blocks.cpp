// Gradient compression's block packers on the host: int8 within half a step of
// every value, block by block (zero, NaN and Inf blocks, word counts, in
// place), and one-bit signs with the block's mean |x|, the least-squares scale.
#include <catch2/catch.hpp>

#include <loom/kernels/host/quantize.hpp>

#include "support/compression_values.hpp"
#include "support/message_of.hpp"

#include <algorithm>
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

// --- int8 ------------------------------------------------------------------

TEST_CASE("pack_int8 stays within half a step of every value, block by block", "[compress]") {
    std::mt19937 rng(12345);
    double worst_ratio = 0;  // max |x - decoded| / (scale / 2) seen
    for (const float scale_of_data : {1e-6f, 1e-3f, 1.0f, 1e3f}) {
        for (const std::int64_t block : {std::int64_t{1}, std::int64_t{7}, std::int64_t{128}, std::int64_t{2048}}) {
            for (const std::size_t n : {std::size_t{1000}, std::size_t{1027}, std::size_t{3}}) {
                CAPTURE(scale_of_data, block, n);
                // Half plain normals, half values spread over six decades, so
                // small values share blocks with large ones.
                auto x = normal_values(n, rng, 0.0f, scale_of_data);
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

// --- one-bit signs -------------------------------------------------------------

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

}  // namespace LOOM_TEST_FILE
