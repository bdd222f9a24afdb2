// Host GELU (tanh form): the forward against PyTorch's formula evaluated in
// double, the backward against central finite differences of it (the layer's
// gradient check), in place, and the far tails.
#include <catch2/catch.hpp>

#include <loom/core/rng.hpp>
#include <loom/kernels/host/gelu.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;

// Ordinary activations, plus the tails and the values around zero.
std::vector<float> gelu_inputs() {
    std::vector<float> x(1001);
    loom::RngStream{17, 1}.fill_normal(x, 0, 0.0f, 3.0f);
    const float specials[] = {0.0f, -0.0f, 1e-20f, -1e-20f, 1e-4f, -1e-4f, 0.5f, -0.5f, 3.0f, -3.0f,
                              5.0f, -5.0f, 9.0f, -9.0f, 12.0f, -12.0f, 40.0f, -40.0f, 1e4f, -1e4f};
    std::copy(std::begin(specials), std::end(specials), x.begin());
    return x;
}

double inner(double x) { return std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x); }

// PyTorch's definition, literally, in double.
double gelu_tanh_form(double x) { return 0.5 * x * (1.0 + std::tanh(inner(x))); }

// The same function without the cancellation of 1 + tanh(u) for negative x:
// the reference where relative accuracy is checked.
double gelu_exact(double x) { return x / (1.0 + std::exp(-2.0 * inner(x))); }

}  // namespace

TEST_CASE("gelu_forward matches the tanh formula to float accuracy", "[kernels][gelu]") {
    const auto x = gelu_inputs();
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<float> y(x.size());
    host::gelu_forward(x.data(), y.data(), n);
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double xi = x[i];
        CAPTURE(i, xi, y[i]);
        const double exact = gelu_exact(xi);
        // The formula itself agrees with the reference (a check of the test).
        REQUIRE(std::fabs(gelu_tanh_form(xi) - exact) <= 1e-15 * std::max(1.0, std::fabs(xi)));
        // Relative error: a few float roundings, magnified for negative x by
        // the slope of log(sigmoid(2u)), 2|u|, since u itself is rounded in
        // float; below 1e-30 only the absolute size matters (true results
        // there are under 1e-35; the kernel gives at most ~1e-30).
        const double u = inner(xi);
        const double tolerance = 6e-7 * (1.0 + 2.0 * std::max(0.0, -u)) * std::fabs(exact) + 1e-30;
        CHECK(std::fabs(y[i] - exact) <= tolerance);
    }
    CHECK(y[0] == 0.0f);
    CHECK(y[18] == 1e4f);  // the identity far right
}

TEST_CASE("gelu_forward works in place", "[kernels][gelu]") {
    const auto x = gelu_inputs();
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<float> out(x.size());
    host::gelu_forward(x.data(), out.data(), n);
    auto in_place = x;
    host::gelu_forward(in_place.data(), in_place.data(), n);
    CHECK(in_place == out);
}

TEST_CASE("gelu_backward matches finite differences of the tanh formula", "[kernels][gelu][gradcheck]") {
    const auto x = gelu_inputs();
    const auto n = static_cast<std::int64_t>(x.size());
    std::vector<float> dy(x.size());
    loom::RngStream{17, 2}.fill_normal(dy, 0);
    std::vector<float> dx(x.size(), 123.0f);  // written, not accumulated
    host::gelu_backward(x.data(), dy.data(), dx.data(), n);
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double xi = x[i];
        CAPTURE(i, xi, dy[i], dx[i]);
        const double h = 1e-4 * std::max(1.0, std::fabs(xi));
        const double slope = (gelu_exact(xi + h) - gelu_exact(xi - h)) / (2 * h);
        const double expected = dy[i] * slope;
        // gelu' reaches 1.13 and dips to -0.17; a few float roundings of it,
        // with the same 2|u| magnification of rounded u as the forward.
        const double u = inner(xi);
        CHECK(std::fabs(dx[i] - expected) <= 2e-6 * (1.0 + 2.0 * std::max(0.0, -u)) * std::fabs(dy[i]) + 1e-12);
    }

    // In place over dy gives the same bits.
    auto in_place = dy;
    host::gelu_backward(x.data(), in_place.data(), in_place.data(), n);
    CHECK(in_place == dx);
}

TEST_CASE("gelu keeps NaN and behaves at the infinities", "[kernels][gelu]") {
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x{std::numeric_limits<float>::quiet_NaN(), inf, -inf, 2.0f};
    std::vector<float> y(x.size()), dx(x.size());
    const std::vector<float> dy(x.size(), 1.0f);
    host::gelu_forward(x.data(), y.data(), 4);
    host::gelu_backward(x.data(), dy.data(), dx.data(), 4);
    CHECK(std::isnan(y[0]));
    CHECK(std::isnan(dx[0]));
    CHECK(y[1] == inf);
    CHECK(y[3] == Approx(gelu_exact(2.0)).epsilon(1e-6));
}

}  // namespace LOOM_TEST_FILE
