// AdamW and the cosine schedule: PyTorch's formulas (checked against a double
// reference and hand-computed numbers), shards, checkpoints, refusals.
#include <catch2/catch.hpp>

#include "support/message_of.hpp"

#include <loom/core/error.hpp>
#include <loom/core/rng.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/schedule.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::optim::AdamW;
using loom::optim::AdamWConfig;

std::vector<float> normals(std::size_t n, std::uint64_t stream, float stddev = 1.0f) {
    std::vector<float> out(n);
    loom::RngStream(7, stream).fill_normal(out, 0, 0.0f, stddev);
    return out;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}


// AdamW settings as a user writes them (and as PyTorch holds them: doubles).
struct AdamWSettings {
    double lr, beta1, beta2, eps, weight_decay;
    [[nodiscard]] AdamWConfig config() const {
        return {static_cast<float>(lr), static_cast<float>(beta1), static_cast<float>(beta2), static_cast<float>(eps),
                static_cast<float>(weight_decay)};
    }
};

// torch.optim.AdamW's update in double. `scale` holds each parameter's largest
// magnitude so far: float rounding is relative to the values an element was
// computed from, which can be far larger than where it ends (near 0).
struct AdamWReference {
    std::vector<double> p, m, v, scale;
    std::int64_t t = 0;

    explicit AdamWReference(const std::vector<float>& params)
        : p(params.begin(), params.end()), m(params.size(), 0.0), v(params.size(), 0.0), scale(p) {
        for (double& s : scale) s = std::abs(s);
    }

    void step(const std::vector<float>& grads, const AdamWSettings& c) {
        ++t;
        const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
        const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
        for (std::size_t i = 0; i < p.size(); ++i) {
            const double g = grads[i];
            p[i] *= 1.0 - c.lr * c.weight_decay;
            m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g;
            v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g * g;
            p[i] -= (c.lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + c.eps);
            scale[i] = std::max(scale[i], std::abs(p[i]));
        }
    }
};

// Largest of |actual - reference| / scale over the elements.
double worst_relative_error(std::span<const float> actual, const std::vector<double>& reference,
                            const std::vector<double>& scale) {
    double worst = 0.0;
    for (std::size_t i = 0; i < actual.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(actual[i]) - reference[i]) / scale[i]);
    return worst;
}

// Relative to the array's largest magnitude: m and v are running sums of
// terms of either sign, so single elements can cancel to near 0.
double worst_normwise_error(std::span<const float> actual, const std::vector<double>& reference) {
    double largest = 0.0;
    for (double x : reference) largest = std::max(largest, std::abs(x));
    return worst_relative_error(actual, reference, std::vector<double>(reference.size(), largest));
}

}  // namespace

TEST_CASE("AdamW matches a double-precision reference of torch.optim.AdamW over 5 steps", "[optim][adamw]") {
    const AdamWSettings settings = GENERATE(values<AdamWSettings>({
        {3e-4, 0.9, 0.999, 1e-8, 0.01},   // the defaults
        {1e-2, 0.9, 0.999, 1e-8, 0.1},    // strong decay
        {1e-3, 0.9, 0.95, 1e-6, 0.0},     // GPT-style betas, no decay
        {5e-3, 0.0, 0.5, 1e-3, 0.3},      // beta1 = 0: no momentum
    }));
    CAPTURE(settings.lr, settings.beta1, settings.beta2, settings.eps, settings.weight_decay);
    const std::size_t n = 1000;  // 62 blocks of 16 and a tail of 8
    std::vector<float> params = normals(n, 1);
    AdamWReference reference(params);
    AdamW adamw(static_cast<std::int64_t>(n), settings.config());
    for (int t = 1; t <= 5; ++t) {
        // Gradients of mixed scale, so the per-element step sizes differ.
        const std::vector<float> grads = normals(n, 100 + static_cast<std::uint64_t>(t), t % 2 ? 1.0f : 1e-3f);
        adamw.step(params, grads);
        reference.step(grads, settings);
    }
    CHECK(adamw.steps() == 5);
    CHECK(worst_relative_error(params, reference.p, reference.scale) <= 1e-6);
    CHECK(worst_normwise_error(adamw.m(), reference.m) <= 1e-6);
    CHECK(worst_normwise_error(adamw.v(), reference.v) <= 1e-6);
    // The comparison can fail: the reference drifts off by one more step.
    reference.step(normals(n, 200), settings);
    CHECK(worst_relative_error(params, reference.p, reference.scale) > 1e-6);
}

TEST_CASE("AdamW's first two steps match hand-computed numbers", "[optim][adamw]") {
    // lr 0.1, weight decay 0.01: every step multiplies p by 0.999 first. With a
    // constant gradient the bias-corrected moments are exactly g and g^2, so
    // the step is lr * g / (|g| + eps), i.e. 0.1 * sign(g); g = 0 moves nothing.
    const AdamWConfig config{0.1f, 0.9f, 0.999f, 1e-8f, 0.01f};
    std::vector<float> params{1.0f, 1.0f, 1.0f, -3.0f};
    const std::vector<float> grads{0.5f, -2.0f, 0.0f, 4.0f};
    AdamW adamw(4, config);

    adamw.step(params, grads);
    CHECK(params[0] == Approx(0.899).epsilon(1e-6));   // 0.999 - 0.1
    CHECK(params[1] == Approx(1.099).epsilon(1e-6));   // 0.999 + 0.1
    CHECK(params[2] == Approx(0.999).epsilon(1e-6));   // decay only
    CHECK(params[3] == Approx(-3.097).epsilon(1e-6));  // -2.997 - 0.1
    CHECK(adamw.m()[0] == Approx(0.05).epsilon(1e-6));  // (1 - beta1) g
    CHECK(adamw.m()[3] == Approx(0.4).epsilon(1e-6));
    CHECK(adamw.v()[1] == Approx(0.004).epsilon(1e-6));  // (1 - beta2) g^2
    CHECK(adamw.v()[3] == Approx(0.016).epsilon(1e-6));
    CHECK(adamw.m()[2] == 0.0f);
    CHECK(adamw.v()[2] == 0.0f);

    adamw.step(params, grads);
    CHECK(params[0] == Approx(0.798101).epsilon(1e-6));   // 0.899 * 0.999 - 0.1
    CHECK(params[1] == Approx(1.197901).epsilon(1e-6));   // 1.099 * 0.999 + 0.1
    CHECK(params[2] == Approx(0.998001).epsilon(1e-6));   // 0.999^2
    CHECK(params[3] == Approx(-3.193903).epsilon(1e-6));  // -3.097 * 0.999 - 0.1
    CHECK(adamw.m()[1] == Approx(-0.38).epsilon(1e-6));     // 0.19 g
    CHECK(adamw.v()[3] == Approx(0.031984).epsilon(1e-6));  // 0.001999 g^2
}

TEST_CASE("AdamW on shards: updating slices separately equals updating the whole", "[optim][adamw]") {
    const std::size_t n = 1000;
    const AdamWConfig config{1e-2f, 0.9f, 0.99f, 1e-8f, 0.05f};
    std::vector<float> whole = normals(n, 1);
    std::vector<float> sharded = whole;
    AdamW reference(static_cast<std::int64_t>(n), config);
    std::vector<float> m(n), v(n);  // one state arena, updated slice by slice
    // Shard boundaries off the blocks of 16, so the slices' tails differ from
    // the whole arena's.
    const std::vector<std::size_t> cuts =
        GENERATE(values<std::vector<std::size_t>>({{0, 517, 1000}, {0, 5, 600, 601, 1000}}));
    for (std::int64_t t = 1; t <= 3; ++t) {
        const std::vector<float> grads = normals(n, 100 + static_cast<std::uint64_t>(t));
        reference.step(whole, grads);
        for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
            const std::size_t at = cuts[s], count = cuts[s + 1] - cuts[s];
            loom::optim::adamw_step(std::span(sharded).subspan(at, count), std::span(grads).subspan(at, count),
                                    std::span(m).subspan(at, count), std::span(v).subspan(at, count), t, config);
        }
    }
    CHECK(same_bits(sharded, whole));
    CHECK(same_bits(m, reference.m()));
    CHECK(same_bits(v, reference.v()));
}

TEST_CASE("AdamW restored from a checkpoint continues bit-identically", "[optim][adamw]") {
    const std::size_t n = 77;
    const AdamWConfig config{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f};
    auto grads_at = [&](std::int64_t t) { return normals(n, 300 + static_cast<std::uint64_t>(t)); };

    std::vector<float> uninterrupted = normals(n, 1);
    AdamW first(static_cast<std::int64_t>(n), config);
    for (std::int64_t t = 1; t <= 6; ++t) first.step(uninterrupted, grads_at(t));

    // Three steps, then a "checkpoint": the values and both moments.
    std::vector<float> params = normals(n, 1);
    AdamW before(static_cast<std::int64_t>(n), config);
    for (std::int64_t t = 1; t <= 3; ++t) before.step(params, grads_at(t));
    const std::vector<float> saved_m(before.m().begin(), before.m().end());
    const std::vector<float> saved_v(before.v().begin(), before.v().end());

    auto resume = [&](std::int64_t restored_steps) {
        std::vector<float> resumed = params;
        AdamW after(static_cast<std::int64_t>(n), config);
        std::copy(saved_m.begin(), saved_m.end(), after.m().begin());
        std::copy(saved_v.begin(), saved_v.end(), after.v().begin());
        after.restore(restored_steps);
        for (std::int64_t t = 4; t <= 6; ++t) after.step(resumed, grads_at(t));
        return std::pair{resumed, std::move(after)};
    };
    auto [resumed, after] = resume(3);
    CHECK(after.steps() == 6);
    CHECK(same_bits(resumed, uninterrupted));
    CHECK(same_bits(after.m(), first.m()));
    CHECK(same_bits(after.v(), first.v()));
    // Forgetting restore() gives the wrong bias corrections, and the test sees it.
    CHECK_FALSE(same_bits(resume(0).first, uninterrupted));
}

TEST_CASE("AdamW refuses invalid settings, naming the value and the valid range", "[optim][adamw]") {
    auto with = [](auto change) {
        AdamWConfig config;
        change(config);
        return loom_test::message_of([&] { (void)AdamW(4, config); });
    };
    CHECK(with([](AdamWConfig& c) { c.lr = 0.0f; }) == "AdamW lr = 0 is invalid; it must be finite and > 0");
    CHECK(with([](AdamWConfig& c) { c.lr = -1.0f; }) == "AdamW lr = -1 is invalid; it must be finite and > 0");
    constexpr float inf = std::numeric_limits<float>::infinity();
    constexpr float nan = std::numeric_limits<float>::quiet_NaN();
    CHECK(with([](AdamWConfig& c) { c.lr = inf; }) == "AdamW lr = inf is invalid; it must be finite and > 0");
    CHECK(with([](AdamWConfig& c) { c.lr = nan; }) == "AdamW lr = nan is invalid; it must be finite and > 0");
    CHECK(with([](AdamWConfig& c) { c.beta1 = 1.0f; }) == "AdamW beta1 = 1 is invalid; it must be in [0, 1)");
    CHECK(with([](AdamWConfig& c) { c.beta1 = -0.5f; }) == "AdamW beta1 = -0.5 is invalid; it must be in [0, 1)");
    CHECK(with([](AdamWConfig& c) { c.beta2 = 1.5f; }) == "AdamW beta2 = 1.5 is invalid; it must be in [0, 1)");
    CHECK(with([](AdamWConfig& c) { c.beta2 = nan; }) == "AdamW beta2 = nan is invalid; it must be in [0, 1)");
    CHECK(with([](AdamWConfig& c) { c.eps = 0.0f; }) == "AdamW eps = 0 is invalid; it must be finite and > 0");
    CHECK(with([](AdamWConfig& c) { c.weight_decay = -0.01f; }) ==
          "AdamW weight_decay = -0.01 is invalid; it must be finite and >= 0");
    CHECK(with([](AdamWConfig&) {}) == "(no error)");
    CHECK(loom_test::message_of([] { AdamW(-1, AdamWConfig{}); }) == "AdamW: n = -1 elements is invalid; it must be >= 0");

    AdamW adamw(4, AdamWConfig{});
    adamw.set_lr(1e-3f);
    CHECK(adamw.config().lr == 1e-3f);
    CHECK(loom_test::message_of([&] { adamw.set_lr(0.0f); }) == "AdamW lr = 0 is invalid; it must be finite and > 0");
    CHECK(adamw.config().lr == 1e-3f);  // a refused rate leaves the old one
    CHECK(loom_test::message_of([&] { adamw.restore(-2); }) == "AdamW::restore: steps = -2 is invalid; it must be >= 0");
}

TEST_CASE("AdamW refuses mismatched sizes and overlapping arrays, naming the sizes", "[optim][adamw]") {
    AdamW adamw(8, AdamWConfig{});
    std::vector<float> params(8), grads(7), eight(8);
    CHECK(loom_test::message_of([&] { adamw.step(params, grads); }) ==
          "AdamW::step: params has 8 elements and grads 7; this optimizer holds state for 8");
    std::vector<float> nine(9);
    CHECK(loom_test::message_of([&] { adamw.step(nine, nine); }) ==
          "AdamW::step: params has 9 elements and grads 9; this optimizer holds state for 8");
    CHECK(adamw.steps() == 0);  // refused steps are not counted

    std::vector<float> m(8), v(6);
    CHECK(loom_test::message_of([&] { loom::optim::adamw_step(params, eight, m, v, 1, AdamWConfig{}); }) ==
          "adamw_step: params has 8 elements, grads 8, m 8, v 6; all four must have the same size");
    CHECK(loom_test::message_of([&] { loom::optim::adamw_step(params, eight, m, m, 1, AdamWConfig{}); }) ==
          "adamw_step: params, grads, m and v overlap in memory; they must be distinct arrays");
    std::vector<float> arena(16);
    CHECK(loom_test::message_of([&] {
              loom::optim::adamw_step(std::span(arena).subspan(0, 8), eight, std::span(arena).subspan(7, 8), m, 1,
                                      AdamWConfig{});
          }) == "adamw_step: params, grads, m and v overlap in memory; they must be distinct arrays");
    CHECK(loom_test::message_of([&] { loom::optim::adamw_step(params, eight, m, eight, 0, AdamWConfig{}); }) ==
          "adamw_step: step = 0 is invalid; steps count from 1");
}

TEST_CASE("AdamW of zero elements is valid and does nothing", "[optim][adamw]") {
    AdamW adamw(0, AdamWConfig{});
    std::vector<float> none;
    adamw.step(none, none);
    CHECK(adamw.steps() == 1);
    CHECK(adamw.m().empty());
}

TEST_CASE("cosine_lr warms up linearly, then decays along a cosine to the floor", "[optim][schedule]") {
    using loom::optim::cosine_lr;
    const float peak = 1e-3f;
    CHECK(cosine_lr(1, 100, peak, 10) == Approx(1e-4));   // 1/10 of the peak, never 0
    CHECK(cosine_lr(5, 100, peak, 10) == Approx(5e-4));
    CHECK(cosine_lr(10, 100, peak, 10) == Approx(1e-3));  // warmup ends at the peak
    CHECK(cosine_lr(55, 100, peak, 10) == Approx(0.55e-3));  // half way: the mean of peak and floor
    CHECK(cosine_lr(100, 100, peak, 10) == Approx(1e-4));    // floor = 0.1 * peak
    CHECK(cosine_lr(250, 100, peak, 10) == Approx(1e-4));    // and it stays there
    CHECK(cosine_lr(100, 100, peak, 10, 0.5f) == Approx(5e-4));
    // A quarter of the way: floor + (peak - floor) * (1 + cos(pi / 4)) / 2.
    CHECK(cosine_lr(40, 100, peak, 20) == Approx(1e-4 + 0.9e-3 * (1.0 + std::sqrt(0.5)) / 2.0));
    CHECK(cosine_lr(1, 100, peak, 0) < peak);  // no warmup: decay from the first step
    CHECK(cosine_lr(1, 100, peak, 0) > 0.99f * peak);
    float previous = peak;
    for (std::int64_t step = 11; step <= 100; ++step) {
        const float lr = cosine_lr(step, 100, peak, 10);
        CHECK(lr <= previous);
        previous = lr;
    }
}

TEST_CASE("cosine_lr refuses invalid arguments, naming the value and the valid range", "[optim][schedule]") {
    using loom::optim::cosine_lr;
    CHECK(loom_test::message_of([] { (void)cosine_lr(0, 100, 1e-3f, 10); }) == "cosine_lr: step = 0 is invalid; steps count from 1");
    CHECK(loom_test::message_of([] { (void)cosine_lr(1, 0, 1e-3f, 0); }) ==
          "cosine_lr: total = 0 steps is invalid; it must be >= 1");
    CHECK(loom_test::message_of([] { (void)cosine_lr(1, 100, 1e-3f, 101); }) ==
          "cosine_lr: warmup = 101 steps is invalid; it must be in [0, 100] (total)");
    CHECK(loom_test::message_of([] { (void)cosine_lr(1, 100, 0.0f, 10); }) ==
          "cosine_lr: peak = 0 is invalid; it must be finite and > 0");
    CHECK(loom_test::message_of([] { (void)cosine_lr(1, 100, 1e-3f, 10, 0.0f); }) ==
          "cosine_lr: floor_fraction = 0 is invalid; it must be in (0, 1]");
}

}  // namespace LOOM_TEST_FILE
