// Gradient compression's sparse and low-rank kernels on the host: top-k keeps
// exactly the k largest magnitudes (ties to the lower index, NaN as the
// largest), unpack_top_k_add refuses bad indices, top_k_count's clamping; and
// PowerSGD's Gram-Schmidt (orthonormal, same span, finite when rank-deficient).
#include <catch2/catch.hpp>

#include <loom/kernels/host/low_rank.hpp>
#include <loom/kernels/host/top_k.hpp>

#include "support/compression_values.hpp"
#include "support/message_of.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;
using namespace loom_test;

}  // namespace

// --- top-k -----------------------------------------------------------------------

TEST_CASE("pack_top_k keeps exactly the k largest magnitudes, ties to the lower index", "[compress]") {
    std::mt19937 rng(4242);
    std::uniform_int_distribution<int> small(-12, 12);
    std::vector<std::int32_t> scratch;
    for (int trial = 0; trial < 6; ++trial) {
        const std::size_t n = trial % 2 == 0 ? 1000 : 257;
        std::vector<float> x;
        if (trial < 2) x = normal_values(n, rng);
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

// --- Gram-Schmidt ------------------------------------------------------------------

TEST_CASE("orthonormalize_columns: orthonormal, same span, finite for rank-deficient input", "[compress]") {
    constexpr std::int64_t rows = 50, cols = 4;
    std::mt19937 rng(31337);
    const auto a = normal_values(rows * cols, rng);
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
    auto d = normal_values(rows * cols, rng);
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

}  // namespace LOOM_TEST_FILE
