// Host elementwise kernels against double-precision loops, the bias gradient
// against finite differences, and the shared building blocks (lane-split
// sum and max, fast_exp) against their exact counterparts.
#include <catch2/catch.hpp>

#include <loom/core/rng.hpp>
#include <loom/kernels/host/elementwise.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;

std::vector<float> normal_values(std::size_t n, std::uint64_t stream, float stddev = 1.0f) {
    std::vector<float> v(n);
    loom::RngStream{11, stream}.fill_normal(v, 0, 0.0f, stddev);
    return v;
}

// Distance between consecutive floats at x's magnitude.
double ulp_at(double x) {
    const auto f = static_cast<float>(std::fabs(x));
    return std::nextafter(f, std::numeric_limits<float>::infinity()) - f;
}

}  // namespace

TEST_CASE("add_bias adds the bias to every row", "[kernels][elementwise]") {
    const std::int64_t rows = 7, n = 37;
    auto y = normal_values(rows * n, 1);
    const auto y_before = y;
    const auto bias = normal_values(n, 2);
    host::add_bias(y.data(), bias.data(), rows, n);
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < n; ++j)
            CHECK(y[r * n + j] == y_before[r * n + j] + bias[j]);  // one float addition: exact match
}

TEST_CASE("bias_grad accumulates column sums and matches finite differences of add_bias",
          "[kernels][elementwise][gradcheck]") {
    const std::int64_t rows = 7, n = 37;
    const auto dy = normal_values(rows * n, 3);
    auto dbias = normal_values(n, 4);
    const auto dbias_before = dbias;
    host::bias_grad(dy.data(), dbias.data(), rows, n);

    // L(bias) = sum_{r,j} dy[r,j] * (y[r,j] + bias[j]), evaluated in double.
    const auto y = normal_values(rows * n, 5);
    const auto bias = normal_values(n, 6);
    auto loss = [&](const std::vector<double>& b) {
        double total = 0.0;
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t j = 0; j < n; ++j) total += double{dy[r * n + j]} * (y[r * n + j] + b[j]);
        return total;
    };
    std::vector<double> b(bias.begin(), bias.end());
    const double h = 1e-3;
    for (std::int64_t j = 0; j < n; ++j) {
        const double saved = b[j];
        b[j] = saved + h;
        const double up = loss(b);
        b[j] = saved - h;
        const double down = loss(b);
        b[j] = saved;
        const double numeric = (up - down) / (2 * h);
        CHECK(dbias[j] - dbias_before[j] == Approx(numeric).epsilon(1e-5).margin(1e-5));
    }
}

// The order is part of the contract (column_sum_order.hpp): the CUDA kernel
// follows it bit for bit, so the host must keep it. The reference here spells
// it out one column at a time: chunks of ceil(rows / 32) rows, each summed
// from its first row, then added to dbias in chunk order. Shapes: fewer rows
// than chunks, short and empty last chunks, columns past one 256-wide tile.
TEST_CASE("bias_grad adds each column in column_sum_order's chunks, bit for bit", "[kernels][elementwise]") {
    for (const auto& [rows, n] : {std::pair<std::int64_t, std::int64_t>{1, 3}, {5, 300}, {32, 7}, {33, 5},
                                  {100, 37}, {1000, 513}}) {
        CAPTURE(rows, n);
        const auto dy = normal_values(static_cast<std::size_t>(rows * n), 9, 1e3f);
        auto dbias = normal_values(static_cast<std::size_t>(n), 10);
        std::vector<float> expected = dbias;
        const std::int64_t chunk_rows = (rows + 31) / 32;
        REQUIRE(chunk_rows == loom::kernels::column_sum_chunk_rows(rows));
        for (std::int64_t j = 0; j < n; ++j) {
            for (std::int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
                float chunk = dy[static_cast<std::size_t>(r0 * n + j)];
                for (std::int64_t r = r0 + 1; r < std::min(rows, r0 + chunk_rows); ++r)
                    chunk += dy[static_cast<std::size_t>(r * n + j)];
                expected[static_cast<std::size_t>(j)] += chunk;
            }
        }
        host::bias_grad(dy.data(), dbias.data(), rows, n);
        for (std::int64_t j = 0; j < n; ++j) {
            CAPTURE(j);
            CHECK(std::bit_cast<std::uint32_t>(dbias[static_cast<std::size_t>(j)]) ==
                  std::bit_cast<std::uint32_t>(expected[static_cast<std::size_t>(j)]));
        }
    }
}

TEST_CASE("add writes a + b, also in place over either input", "[kernels][elementwise]") {
    const std::int64_t n = 37;
    const auto a = normal_values(n, 7);
    const auto b = normal_values(n, 8);
    std::vector<float> out(n);
    host::add(a.data(), b.data(), out.data(), n);
    for (std::int64_t i = 0; i < n; ++i) CHECK(out[i] == a[i] + b[i]);

    auto in_a = a;
    host::add(in_a.data(), b.data(), in_a.data(), n);
    CHECK(in_a == out);
    auto in_b = b;
    host::add(a.data(), in_b.data(), in_b.data(), n);
    CHECK(in_b == out);
}

TEST_CASE("accumulate adds x into the destination", "[kernels][elementwise]") {
    const std::int64_t n = 37;
    auto into = normal_values(n, 9);
    const auto before = into;
    const auto x = normal_values(n, 10);
    host::accumulate(into.data(), x.data(), n);
    for (std::int64_t i = 0; i < n; ++i) CHECK(into[i] == before[i] + x[i]);
}

TEST_CASE("sum_over and max_over agree with exact answers at every length around the lane count",
          "[kernels][elementwise]") {
    for (std::int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 37, 1000}) {
        CAPTURE(n);
        const auto x = normal_values(n, 12 + static_cast<std::uint64_t>(n));
        double exact = 0.0, magnitude = 0.0;
        float largest = x[0];
        for (float v : x) {
            exact += v;
            magnitude += std::fabs(v);
            largest = std::max(largest, v);
        }
        const float sum = host::sum_over(n, [&](std::int64_t i) { return x[i]; });
        CHECK(std::fabs(sum - exact) <= 1e-6 * magnitude);
        CHECK(host::max_over(n, [&](std::int64_t i) { return x[i]; }) == largest);
        // The maximum found wherever it sits: first, in a lane block, in the tail.
        for (std::int64_t at : {std::int64_t{0}, n / 2, n - 1}) {
            auto y = x;
            y[at] = 100.0f;
            CHECK(host::max_over(n, [&](std::int64_t i) { return y[i]; }) == 100.0f);
        }
    }
    CHECK(host::sum_over(0, [](std::int64_t) { return 1.0f; }) == 0.0f);
}

TEST_CASE("fast_exp is within one ulp of exp, exactly 0 below -87 and NaN for NaN", "[kernels][elementwise]") {
    // A dense sweep of the range. The exhaustive sweep of all floats in
    // [-87, 88] (too long for a unit test) stays within 0.99 ulp, 1.01 when
    // the compiler contracts to FMA (-march with FMA); hence 1.02 here.
    double worst = 0.0;
    for (int i = 0; i <= 1000000; ++i) {
        const auto z = static_cast<float>(-87.0 + 175.0 * i / 1000000.0);
        const double exact = std::exp(double{z});
        worst = std::max(worst, std::fabs(host::fast_exp(z) - exact) / ulp_at(exact));
    }
    for (float z : {-1e-3f, -1e-7f, 1e-7f, 1e-3f, 0.5f, -0.5f}) {
        const double exact = std::exp(double{z});
        worst = std::max(worst, std::fabs(host::fast_exp(z) - exact) / ulp_at(exact));
    }
    CHECK(worst <= 1.02);
    CHECK(host::fast_exp(0.0f) == 1.0f);
    CHECK(host::fast_exp(-87.5f) == 0.0f);
    CHECK(host::fast_exp(-std::numeric_limits<float>::infinity()) == 0.0f);
    CHECK(host::fast_exp(100.0f) == host::fast_exp(88.0f));  // saturates instead of overflowing
    CHECK(std::isfinite(host::fast_exp(std::numeric_limits<float>::infinity())));
    CHECK(std::isnan(host::fast_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("fast_exp vectorised over an array gives the same values as one call at a time", "[kernels][elementwise]") {
    // The loop below is the shape GCC vectorises; the scalar calls are
    // compiled separately, so a difference would mean the vector path is off.
    const std::int64_t n = 101;
    auto x = normal_values(n, 30, 20.0f);
    x[3] = std::numeric_limits<float>::quiet_NaN();
    x[4] = -200.0f;
    std::vector<float> y(n);
    for (std::int64_t i = 0; i < n; ++i) y[i] = host::fast_exp(x[i]);
    for (std::int64_t i = 0; i < n; ++i) {
        CAPTURE(i, x[i]);
        volatile float one = x[i];  // keeps this call scalar
        const float expected = host::fast_exp(one);
        if (std::isnan(expected))
            CHECK(std::isnan(y[i]));
        else
            CHECK(y[i] == expected);
    }
}

}  // namespace LOOM_TEST_FILE
