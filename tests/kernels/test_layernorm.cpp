// Host LayerNorm: the forward against a double-precision reference, both
// backwards against central finite differences of that reference (the layer's
// gradient check), and the argument checks.
#include <catch2/catch.hpp>

#include "support/message_of.hpp"

#include <loom/core/error.hpp>
#include <loom/core/rng.hpp>
#include <loom/kernels/host/layernorm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;

constexpr std::int64_t rows = 7, C = 37;
constexpr float eps = 1e-5f;

std::vector<float> normal_values(std::size_t n, std::uint64_t stream, float mean = 0.0f, float stddev = 1.0f) {
    std::vector<float> v(n);
    loom::RngStream{13, stream}.fill_normal(v, 0, mean, stddev);
    return v;
}

// Inputs with the rows that stress a LayerNorm: an ordinary one, one far from
// zero (|mean| >> std, where E[x^2] - mean^2 would cancel), a constant one
// (variance 0: eps alone keeps rstd finite; 0.5 so that its float mean is
// exact), a nearly constant one.
std::vector<float> layer_input() {
    auto x = normal_values(rows * C, 1);
    for (std::int64_t j = 0; j < C; ++j) {
        x[1 * C + j] += 50.0f;
        x[3 * C + j] = 0.5f;
        x[4 * C + j] = 0.5f + 1e-2f * x[4 * C + j];
    }
    return x;
}

// y = layernorm(x) in double, and the loss sum(w * y) the gradient checks use.
std::vector<double> reference_forward(const std::vector<double>& x, const std::vector<double>& gain,
                                      const std::vector<double>& shift, std::vector<double>* mean = nullptr,
                                      std::vector<double>* rstd = nullptr) {
    std::vector<double> y(x.size());
    for (std::int64_t r = 0; r < rows; ++r) {
        double m = 0.0;
        for (std::int64_t j = 0; j < C; ++j) m += x[r * C + j];
        m /= C;
        double var = 0.0;
        for (std::int64_t j = 0; j < C; ++j) var += (x[r * C + j] - m) * (x[r * C + j] - m);
        var /= C;
        const double rs = 1.0 / std::sqrt(var + double{eps});
        for (std::int64_t j = 0; j < C; ++j) y[r * C + j] = (x[r * C + j] - m) * rs * gain[j] + shift[j];
        if (mean) (*mean)[r] = m;
        if (rstd) (*rstd)[r] = rs;
    }
    return y;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Central differences of loss() with respect to every element of `values`.
std::vector<double> numeric_gradient(std::vector<double>& values, const std::function<double()>& loss) {
    std::vector<double> gradient(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
        const double saved = values[i];
        const double h = 1e-4 * std::max(1.0, std::fabs(saved));
        values[i] = saved + h;
        const double up = loss();
        values[i] = saved - h;
        const double down = loss();
        values[i] = saved;
        gradient[i] = (up - down) / (2 * h);
    }
    return gradient;
}

// |got - expected| <= rel * |expected| + abs_of_max * max|expected|, element by element.
void check_close(const std::vector<float>& got, const std::vector<double>& expected, double rel, double abs_of_max) {
    REQUIRE(got.size() == expected.size());
    double largest = 0.0;
    for (double e : expected) largest = std::max(largest, std::fabs(e));
    for (std::size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i, got[i], expected[i]);
        CHECK(std::fabs(got[i] - expected[i]) <= rel * std::fabs(expected[i]) + abs_of_max * largest);
    }
}

using loom_test::message_of;

}  // namespace

TEST_CASE("layernorm_forward matches a double-precision reference and saves mean and rstd", "[kernels][layernorm]") {
    const auto x = layer_input();
    const auto gain = normal_values(C, 2, 1.0f, 0.1f);
    const auto shift = normal_values(C, 3, 0.0f, 0.1f);
    std::vector<float> y(rows * C), mean(rows), rstd(rows);
    host::layernorm_forward(x.data(), gain.data(), shift.data(), y.data(), mean.data(), rstd.data(), rows, C, eps);

    std::vector<double> ref_mean(rows), ref_rstd(rows);
    const auto ref_y = reference_forward(widen(x), widen(gain), widen(shift), &ref_mean, &ref_rstd);
    // Absolute part: the row at 50 stores its mean in float, off by up to
    // half an ulp of 50 (1.9e-6), which every xhat of that row inherits.
    check_close(y, ref_y, 1e-5, 2e-6);
    check_close(mean, ref_mean, 1e-6, 1e-7);
    check_close(rstd, ref_rstd, 1e-5, 0.0);
    CHECK(rstd[3] == Approx(1.0 / std::sqrt(1e-5)).epsilon(1e-6));  // the constant row: eps alone
}

TEST_CASE("layernorm_backward_input matches finite differences of the reference forward",
          "[kernels][layernorm][gradcheck]") {
    const auto x = layer_input();
    const auto gain = normal_values(C, 4, 1.0f, 0.1f);
    const auto shift = normal_values(C, 5, 0.0f, 0.1f);
    const auto dy = normal_values(rows * C, 6);  // the loss is sum(dy * y)
    std::vector<float> y(rows * C), mean(rows), rstd(rows);
    host::layernorm_forward(x.data(), gain.data(), shift.data(), y.data(), mean.data(), rstd.data(), rows, C, eps);
    std::vector<float> dx(rows * C, 123.0f);  // written, not accumulated
    host::layernorm_backward_input(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(), dx.data(), rows, C);

    auto xd = widen(x);
    const auto gd = widen(gain), sd = widen(shift), dyd = widen(dy);
    const auto numeric = numeric_gradient(xd, [&] {
        const auto yd = reference_forward(xd, gd, sd);
        double loss = 0.0;
        for (std::size_t i = 0; i < yd.size(); ++i) loss += dyd[i] * yd[i];
        return loss;
    });
    // The constant row's rstd is 316: its gradients are that large, and
    // relative accuracy is what matters there.
    check_close(dx, numeric, 1e-4, 1e-6);
}

TEST_CASE("layernorm_backward_weight accumulates the gain and shift gradients of finite differences",
          "[kernels][layernorm][gradcheck]") {
    const auto x = layer_input();
    const auto gain = normal_values(C, 7, 1.0f, 0.1f);
    const auto shift = normal_values(C, 8, 0.0f, 0.1f);
    const auto dy = normal_values(rows * C, 9);
    std::vector<float> y(rows * C), mean(rows), rstd(rows);
    host::layernorm_forward(x.data(), gain.data(), shift.data(), y.data(), mean.data(), rstd.data(), rows, C, eps);
    auto dgain = normal_values(C, 10);
    auto dshift = normal_values(C, 11);
    const auto dgain_before = dgain, dshift_before = dshift;
    host::layernorm_backward_weight(dy.data(), x.data(), mean.data(), rstd.data(), dgain.data(), dshift.data(), rows,
                                    C);
    std::vector<float> dgain_added(C), dshift_added(C);
    for (std::int64_t j = 0; j < C; ++j) {
        dgain_added[j] = dgain[j] - dgain_before[j];
        dshift_added[j] = dshift[j] - dshift_before[j];
    }

    const auto xd = widen(x), dyd = widen(dy);
    auto gd = widen(gain), sd = widen(shift);
    auto loss = [&] {
        const auto yd = reference_forward(xd, gd, sd);
        double total = 0.0;
        for (std::size_t i = 0; i < yd.size(); ++i) total += dyd[i] * yd[i];
        return total;
    };
    check_close(dgain_added, numeric_gradient(gd, loss), 1e-4, 1e-5);
    check_close(dshift_added, numeric_gradient(sd, loss), 1e-4, 1e-5);
}

TEST_CASE("layernorm kernels name a bad size or eps", "[kernels][layernorm]") {
    std::vector<float> x(64, 1.0f), gain(8, 1.0f), shift(8), y(64), mean(8), rstd(8), dgain(8), dshift(8);
    auto forward = [&](std::int64_t r, std::int64_t c, float e) {
        host::layernorm_forward(x.data(), gain.data(), shift.data(), y.data(), mean.data(), rstd.data(), r, c, e);
    };
    CHECK(message_of([&] { forward(2, 0, eps); }) ==
          "layernorm: C = 0 normalises nothing; pass C >= 1");
    CHECK(message_of([&] { forward(-1, 4, eps); }) ==
          "layernorm: rows = -1 is negative; pass rows >= 0");
    CHECK(message_of([&] { forward(2, 4, -1.0f); }) ==
          "layernorm: eps = -1 is negative (or NaN); pass eps >= 0, e.g. 1e-5");
    CHECK(message_of([&] {
              host::layernorm_backward_input(y.data(), x.data(), gain.data(), mean.data(), rstd.data(), shift.data(), 2,
                                             0);
          }) ==
          "layernorm: C = 0 normalises nothing; pass C >= 1");
    CHECK(message_of([&] {
              host::layernorm_backward_weight(y.data(), x.data(), mean.data(), rstd.data(), dgain.data(),
                                              dshift.data(), -3, 4);
          }) ==
          "layernorm: rows = -3 is negative; pass rows >= 0");
}

}  // namespace LOOM_TEST_FILE
