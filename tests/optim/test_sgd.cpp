// SGD with momentum: PyTorch's formulas (checked against a double reference
// and hand-computed numbers), shards, checkpoints, refusals.
#include <catch2/catch.hpp>

#include "support/message_of.hpp"

#include <loom/core/error.hpp>
#include <loom/core/rng.hpp>
#include <loom/optim/sgd.hpp>

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

using loom::optim::Sgd;
using loom::optim::SgdConfig;

std::vector<float> sgd_normals(std::size_t n, std::uint64_t stream) {
    std::vector<float> out(n);
    loom::RngStream(11, stream).fill_normal(out, 0);
    return out;
}

bool sgd_same_bits(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}


// torch.optim.SGD's update (dampening 0) in double, from the same settings.
// `scale` holds each parameter's largest magnitude so far: float rounding is
// relative to the values an element was computed from, which can be far
// larger than where it ends (near 0).
struct SgdReference {
    std::vector<double> p, buf, scale;
    std::int64_t t = 0;

    explicit SgdReference(const std::vector<float>& params)
        : p(params.begin(), params.end()), buf(params.size(), 0.0), scale(p) {
        for (double& s : scale) s = std::abs(s);
    }

    void step(const std::vector<float>& grads, const SgdConfig& c) {
        ++t;
        const double lr = c.lr, momentum = c.momentum, wd = c.weight_decay;
        for (std::size_t i = 0; i < p.size(); ++i) {
            double d = grads[i];
            if (wd != 0.0) d += wd * p[i];
            if (momentum != 0.0) {
                buf[i] = t == 1 ? d : momentum * buf[i] + d;
                d = c.nesterov ? d + momentum * buf[i] : buf[i];
            }
            p[i] -= lr * d;
            scale[i] = std::max(scale[i], std::abs(p[i]));
        }
    }
};

// Largest of |actual - reference| / scale over the elements.
double sgd_worst_relative_error(std::span<const float> actual, const std::vector<double>& reference,
                                const std::vector<double>& scale) {
    double worst = 0.0;
    for (std::size_t i = 0; i < actual.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(actual[i]) - reference[i]) / scale[i]);
    return worst;
}

// Relative to the array's largest magnitude: the buffer is a running sum of
// terms of either sign, so single elements can cancel to near 0.
double sgd_worst_normwise_error(std::span<const float> actual, const std::vector<double>& reference) {
    double largest = 0.0;
    for (double x : reference) largest = std::max(largest, std::abs(x));
    return sgd_worst_relative_error(actual, reference, std::vector<double>(reference.size(), largest));
}

}  // namespace

TEST_CASE("SGD matches a double-precision reference of torch.optim.SGD over 5 steps", "[optim][sgd]") {
    const SgdConfig config = GENERATE(values<SgdConfig>({
        SgdConfig{0.1f, 0.0f, 0.0f, false},   // plain gradient descent
        SgdConfig{0.1f, 0.9f, 0.0f, false},   // heavy ball
        SgdConfig{0.05f, 0.9f, 0.01f, false},  // with weight decay
        SgdConfig{0.05f, 0.9f, 0.0f, true},   // nesterov
        SgdConfig{0.05f, 0.5f, 0.1f, true},   // nesterov with weight decay
        SgdConfig{0.02f, 0.0f, 0.2f, false},  // weight decay alone
    }));
    CAPTURE(config.lr, config.momentum, config.weight_decay, config.nesterov);
    const std::size_t n = 1000;  // 62 blocks of 16 and a tail of 8
    std::vector<float> params = sgd_normals(n, 1);
    SgdReference reference(params);
    Sgd sgd(static_cast<std::int64_t>(n), config);
    for (int t = 1; t <= 5; ++t) {
        const std::vector<float> grads = sgd_normals(n, 100 + static_cast<std::uint64_t>(t));
        sgd.step(params, grads);
        reference.step(grads, config);
    }
    CHECK(sgd.steps() == 5);
    CHECK(sgd_worst_relative_error(params, reference.p, reference.scale) <= 1e-6);
    if (config.momentum != 0.0f) {
        CHECK(sgd_worst_normwise_error(sgd.buffer(), reference.buf) <= 1e-6);
    } else {
        CHECK(sgd.buffer().empty());  // PyTorch keeps no buffer without momentum
    }
    reference.step(sgd_normals(n, 200), config);  // the check can fail
    CHECK(sgd_worst_relative_error(params, reference.p, reference.scale) > 1e-6);
}

TEST_CASE("SGD's steps match hand-computed numbers", "[optim][sgd]") {
    const std::vector<float> one{1.0f};
    SECTION("plain: p -= lr g") {
        std::vector<float> p{2.0f};
        Sgd sgd(1, SgdConfig{0.1f, 0.0f, 0.0f, false});
        sgd.step(p, one);
        CHECK(p[0] == Approx(1.9).epsilon(1e-7));
    }
    SECTION("momentum: the buffer starts at g, then grows 1, 1.9, 2.71") {
        std::vector<float> p{0.0f};
        Sgd sgd(1, SgdConfig{0.1f, 0.9f, 0.0f, false});
        sgd.step(p, one);
        CHECK(p[0] == Approx(-0.1).epsilon(1e-6));
        CHECK(sgd.buffer()[0] == 1.0f);
        sgd.step(p, one);
        CHECK(p[0] == Approx(-0.29).epsilon(1e-6));
        CHECK(sgd.buffer()[0] == Approx(1.9).epsilon(1e-6));
        sgd.step(p, one);
        CHECK(p[0] == Approx(-0.561).epsilon(1e-6));
    }
    SECTION("nesterov: the step is g + momentum * buffer") {
        std::vector<float> p{0.0f};
        Sgd sgd(1, SgdConfig{0.1f, 0.9f, 0.0f, true});
        sgd.step(p, one);
        CHECK(p[0] == Approx(-0.19).epsilon(1e-6));   // 1 + 0.9 * 1
        sgd.step(p, one);
        CHECK(p[0] == Approx(-0.461).epsilon(1e-6));  // -0.19 - 0.1 * (1 + 0.9 * 1.9)
        CHECK(sgd.buffer()[0] == Approx(1.9).epsilon(1e-6));
    }
    SECTION("weight decay is added to the gradient (coupled, as in torch.optim.SGD)") {
        std::vector<float> p{2.0f};
        Sgd sgd(1, SgdConfig{0.1f, 0.9f, 0.5f, false});
        sgd.step(p, one);
        CHECK(p[0] == Approx(1.8).epsilon(1e-6));  // d = 1 + 0.5 * 2 = 2
        CHECK(sgd.buffer()[0] == Approx(2.0).epsilon(1e-6));
    }
}

TEST_CASE("sgd_step at step 1 overwrites the momentum buffer, whatever it held", "[optim][sgd]") {
    std::vector<float> p{1.0f, 2.0f}, g{0.5f, -1.0f}, buffer{123.0f, -7.0f};
    loom::optim::sgd_step(p, g, buffer, 1, SgdConfig{0.1f, 0.9f, 0.0f, false});
    CHECK(buffer == std::vector<float>{0.5f, -1.0f});
    CHECK(p[0] == Approx(0.95));
    CHECK(p[1] == Approx(2.1));
    // Without momentum the buffer is not touched, and may be empty.
    std::vector<float> none;
    loom::optim::sgd_step(p, g, none, 2, SgdConfig{0.1f, 0.0f, 0.0f, false});
    loom::optim::sgd_step(p, g, buffer, 3, SgdConfig{0.1f, 0.0f, 0.0f, false});
    CHECK(buffer == std::vector<float>{0.5f, -1.0f});
    CHECK(p[0] == Approx(0.85));
}

TEST_CASE("SGD on shards: updating slices separately equals updating the whole", "[optim][sgd]") {
    const std::size_t n = 1000;
    const SgdConfig config = GENERATE(values<SgdConfig>({
        SgdConfig{0.05f, 0.9f, 0.01f, false},
        SgdConfig{0.05f, 0.9f, 0.01f, true},
        SgdConfig{0.05f, 0.0f, 0.0f, false},
    }));
    std::vector<float> whole = sgd_normals(n, 1);
    std::vector<float> sharded = whole;
    Sgd reference(static_cast<std::int64_t>(n), config);
    std::vector<float> buffer(n);
    const std::vector<std::size_t> cuts{0, 3, 517, 1000};  // off the blocks of 16
    for (std::int64_t t = 1; t <= 3; ++t) {
        const std::vector<float> grads = sgd_normals(n, 100 + static_cast<std::uint64_t>(t));
        reference.step(whole, grads);
        for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
            const std::size_t at = cuts[s], count = cuts[s + 1] - cuts[s];
            loom::optim::sgd_step(std::span(sharded).subspan(at, count), std::span(grads).subspan(at, count),
                                  std::span(buffer).subspan(at, count), t, config);
        }
    }
    CHECK(sgd_same_bits(sharded, whole));
    if (config.momentum != 0.0f) CHECK(sgd_same_bits(buffer, reference.buffer()));
}

TEST_CASE("SGD restored from a checkpoint continues bit-identically", "[optim][sgd]") {
    const std::size_t n = 77;
    const SgdConfig config{0.05f, 0.9f, 0.01f, true};
    auto grads_at = [&](std::int64_t t) { return sgd_normals(n, 300 + static_cast<std::uint64_t>(t)); };

    std::vector<float> uninterrupted = sgd_normals(n, 1);
    Sgd first(static_cast<std::int64_t>(n), config);
    for (std::int64_t t = 1; t <= 6; ++t) first.step(uninterrupted, grads_at(t));

    std::vector<float> params = sgd_normals(n, 1);
    Sgd before(static_cast<std::int64_t>(n), config);
    for (std::int64_t t = 1; t <= 3; ++t) before.step(params, grads_at(t));
    const std::vector<float> saved(before.buffer().begin(), before.buffer().end());

    auto resume = [&](std::int64_t restored_steps) {
        std::vector<float> resumed = params;
        Sgd after(static_cast<std::int64_t>(n), config);
        std::copy(saved.begin(), saved.end(), after.buffer().begin());
        after.restore(restored_steps);
        for (std::int64_t t = 4; t <= 6; ++t) after.step(resumed, grads_at(t));
        return std::pair{resumed, std::move(after)};
    };
    auto [resumed, after] = resume(3);
    CHECK(after.steps() == 6);
    CHECK(sgd_same_bits(resumed, uninterrupted));
    CHECK(sgd_same_bits(after.buffer(), first.buffer()));
    // Without restore() the next step counts as the first and drops the buffer.
    CHECK_FALSE(sgd_same_bits(resume(0).first, uninterrupted));
}

TEST_CASE("SGD refuses invalid settings, naming the value and the valid range", "[optim][sgd]") {
    auto with = [](auto change) {
        SgdConfig config;
        change(config);
        return loom_test::message_of([&] { (void)Sgd(4, config); });
    };
    CHECK(with([](SgdConfig& c) { c.lr = 0.0f; }) == "SGD lr = 0 is invalid; it must be finite and > 0");
    CHECK(with([](SgdConfig& c) { c.lr = std::numeric_limits<float>::quiet_NaN(); }) ==
          "SGD lr = nan is invalid; it must be finite and > 0");
    CHECK(with([](SgdConfig& c) { c.momentum = -0.1f; }) ==
          "SGD momentum = -0.1 is invalid; it must be finite and >= 0");
    CHECK(with([](SgdConfig& c) { c.momentum = std::numeric_limits<float>::infinity(); }) ==
          "SGD momentum = inf is invalid; it must be finite and >= 0");
    CHECK(with([](SgdConfig& c) { c.weight_decay = -1.0f; }) ==
          "SGD weight_decay = -1 is invalid; it must be finite and >= 0");
    CHECK(with([](SgdConfig& c) {
              c.momentum = 0.0f;
              c.nesterov = true;
          }) == "SGD nesterov = true needs momentum > 0, got momentum = 0");
    CHECK(with([](SgdConfig&) {}) == "(no error)");
    CHECK(loom_test::message_of([] { Sgd(-3, SgdConfig{}); }) == "Sgd: n = -3 elements is invalid; it must be >= 0");

    Sgd sgd(4, SgdConfig{});
    sgd.set_lr(0.5f);
    CHECK(sgd.config().lr == 0.5f);
    CHECK(loom_test::message_of([&] { sgd.set_lr(-0.5f); }) == "SGD lr = -0.5 is invalid; it must be finite and > 0");
    CHECK(sgd.config().lr == 0.5f);
    CHECK(loom_test::message_of([&] { sgd.restore(-1); }) == "Sgd::restore: steps = -1 is invalid; it must be >= 0");
}

TEST_CASE("SGD refuses mismatched sizes and overlapping arrays, naming the sizes", "[optim][sgd]") {
    Sgd sgd(8, SgdConfig{});
    std::vector<float> params(8), grads(5), eight(8);
    CHECK(loom_test::message_of([&] { sgd.step(params, grads); }) ==
          "Sgd::step: params has 8 elements and grads 5; this optimizer holds state for 8");
    CHECK(sgd.steps() == 0);

    std::vector<float> buffer(3);
    CHECK(loom_test::message_of([&] { loom::optim::sgd_step(params, grads, buffer, 1, SgdConfig{}); }) ==
          "sgd_step: params has 8 elements and grads 5; they must have the same size");
    CHECK(loom_test::message_of([&] { loom::optim::sgd_step(params, eight, buffer, 1, SgdConfig{}); }) ==
          "sgd_step: params has 8 elements and momentum_buffer 3; with momentum they must have the same size");
    CHECK(loom_test::message_of([&] { loom::optim::sgd_step(params, eight, buffer, 1, SgdConfig{0.1f, 0.0f, 0.0f, false}); }) ==
          "sgd_step: params has 8 elements and momentum_buffer 3; without momentum the buffer must be empty or the "
          "same size");
    CHECK(loom_test::message_of([&] { loom::optim::sgd_step(params, eight, params, 1, SgdConfig{}); }) ==
          "sgd_step: params, grads and momentum_buffer overlap in memory; they must be distinct arrays");
    CHECK(loom_test::message_of([&] { loom::optim::sgd_step(params, eight, eight, 0, SgdConfig{}); }) ==
          "sgd_step: step = 0 is invalid; steps count from 1");
}

}  // namespace LOOM_TEST_FILE
