// OptEx's gradient estimator: the GP posterior mean interpolates its history,
// equals a double-precision reference written from the formula (the one the
// OptEx suite uses), keeps the last T0 points, refuses non-finite gradients,
// and names bad settings.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <span>
#include <vector>

#include <loom/optim/gp_estimator.hpp>

#include "optim/optex_suite.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::optim::GpEstimatorConfig;
using loom::optim::GpGradientEstimator;

std::vector<float> random_vector(std::mt19937& rng, std::int64_t d, float scale = 1.0f) {
    std::uniform_real_distribution<float> u(-scale, scale);
    std::vector<float> v(static_cast<std::size_t>(d));
    for (float& x : v) x = u(rng);
    return v;
}

}  // namespace

TEST_CASE("OptEx's estimator equals a double-precision reference of its formula", "[optex]") {
    std::mt19937 rng(3);
    for (const std::int64_t d : {1, 7, 300}) {
        const GpEstimatorConfig c{.history = 12};
        GpGradientEstimator est(d, c);
        std::vector<std::vector<float>> X, G;
        for (int i = 0; i < 12; ++i) {
            X.push_back(random_vector(rng, d));
            G.push_back(random_vector(rng, d, 3.0f));
            REQUIRE(est.add(X.back(), G.back()));
        }
        est.prepare();
        for (int q = 0; q < 5; ++q) {
            auto x = random_vector(rng, d);
            if (q == 0) x = X[3];  // a history point itself
            std::vector<float> mu(static_cast<std::size_t>(d));
            est.estimate(x, mu);
            const auto ref = loom_test::reference_posterior_mean(X, G, x, static_cast<std::size_t>(d), c);
            double worst = 0, scale = 1e-12;
            for (std::size_t e = 0; e < mu.size(); ++e) {
                worst = std::max(worst, std::abs(double(mu[e]) - ref[e]));
                scale = std::max(scale, std::abs(double(ref[e])));
            }
            INFO("d " << d << ", query " << q << ": worst " << worst << " of " << scale);
            CHECK(worst <= 1e-5 * scale + 1e-6);
        }
    }
}

TEST_CASE("OptEx's estimator interpolates its history within the noise", "[optex]") {
    std::mt19937 rng(5);
    constexpr std::int64_t d = 20;
    GpGradientEstimator est(d, {.history = 8});
    std::vector<std::vector<float>> X, G;
    for (int i = 0; i < 8; ++i) {
        X.push_back(random_vector(rng, d));
        G.push_back(random_vector(rng, d, 2.0f));
        est.add(X.back(), G.back());
    }
    est.prepare();
    std::vector<float> mu(d);
    for (int i = 0; i < 8; ++i) {
        est.estimate(X[static_cast<std::size_t>(i)], mu);
        double worst = 0;
        for (std::int64_t e = 0; e < d; ++e)
            worst = std::max(worst, std::abs(double(mu[static_cast<std::size_t>(e)]) - G[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)]));
        INFO("point " << i << ": worst |mu - g| " << worst);
        CHECK(worst <= 2e-2);  // sigma^2 = 1e-3 pulls mu towards 0 by about that share of |g| <= 2
        CHECK(worst > 0);      // and it does pull: the noise is in the model
    }
}

TEST_CASE("OptEx's estimator keeps the last T0 points and refuses non-finite gradients", "[optex]") {
    GpGradientEstimator est(2, {.history = 3});
    std::vector<float> mu(2);
    est.prepare();
    est.estimate(std::vector<float>{0.5f, 0.5f}, mu);
    CHECK(mu == std::vector<float>{0.0f, 0.0f});  // fewer than 2 points: mu = 0
    for (int i = 0; i < 5; ++i) est.add(std::vector<float>{float(i), 1.0f}, std::vector<float>{1.0f, float(i)});
    CHECK(est.size() == 3);
    CHECK_FALSE(est.add(std::vector<float>{9.0f, 9.0f}, std::vector<float>{NAN, 1.0f}));
    CHECK_FALSE(est.add(std::vector<float>{9.0f, 9.0f}, std::vector<float>{1.0f, INFINITY}));
    CHECK(est.skipped() == 2);
    CHECK(est.size() == 3);
    CHECK(loom_test::message_of([&] { est.estimate(std::vector<float>{0.0f, 0.0f}, mu); }) ==
          "OptEx: estimate() before prepare() since the history last changed");
    est.prepare();
    est.estimate(std::vector<float>{4.0f, 1.0f}, mu);  // the newest point: close to its gradient (1, 4)
    CHECK(mu[0] == Approx(1.0f).epsilon(0.02));
    CHECK(mu[1] == Approx(4.0f).epsilon(0.02));
}

TEST_CASE("OptEx's estimator names bad settings", "[optex]") {
    CHECK(loom_test::message_of([] { GpGradientEstimator est(4, {.history = 1}); }) ==
          "OptEx: a history of T0 = 1 points; it needs at least 2");
    CHECK(loom_test::message_of([] { GpGradientEstimator est(4, {.length_scale = 0}); }) ==
          "OptEx: length scale 0 must be finite and > 0");
    CHECK(loom_test::message_of([] { GpGradientEstimator est(0); }) == "OptEx: dimension 0 must be at least 1");
    GpGradientEstimator est(3);
    CHECK(loom_test::message_of([&] { est.add(std::vector<float>(2), std::vector<float>(3)); }) ==
          "OptEx: a point of 2 elements; the dimension is 3");
}

}  // namespace LOOM_TEST_FILE
