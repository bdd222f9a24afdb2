// The Kraken GPT (gpt/kraken.hpp) as loom layers: a Kraken layer's gradients
// (its input state and every parameter) and the whole model's loss gradient
// against central finite differences, degree 1 is the GPT itself, the
// parameter count is what KrakenConfig says, and bad shapes are named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "loom/core/rng.hpp"
#include "loom/gpt/kraken.hpp"
#include "loom/gpt/model.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Shape;
using loom::Tensor;
namespace nn = loom::nn;
namespace gpt = loom::gpt;

namespace {

std::vector<float> random_values(std::int64_t n, std::uint64_t stream, float scale = 1.0f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    loom::RngStream(13, stream).fill_normal(v, 0, 0.0f, scale);
    return v;
}

// Non-trivial parameter values (LayerNorm's ones and zeros would hide a
// transposed or missing term).
void perturb(nn::ParamArena& arena, float scale) {
    const auto noise = random_values(arena.size(), 99, scale);
    for (std::size_t i = 0; i < noise.size(); ++i) arena.values()[i] += noise[i];
}

double relative_error(const std::vector<double>& numeric, const std::vector<float>& analytic) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < numeric.size(); ++i) {
        num += (numeric[i] - analytic[i]) * (numeric[i] - analytic[i]);
        den += numeric[i] * numeric[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

TEST_CASE("a Kraken layer's gradients match finite differences", "[kraken]") {
    for (std::int64_t degree : {1, 2, 4}) {
        DYNAMIC_SECTION("degree " << degree) {
            constexpr std::int64_t B = 2, T = 5, C = 8;
            gpt::KrakenLayer layer;
            for (std::int64_t i = 0; i < degree; ++i) layer.subs.push_back(gpt::KrakenSubLayer::make(C, 4, degree, 0.3f));
            nn::ParamArena arena(layer);
            arena.initialize(layer, 5);
            perturb(arena, 0.3f);
            const Shape shape{degree + 2, B, T, C};
            auto x = random_values(shape.numel(), 1);
            const auto w = random_values(shape.numel(), 7);
            nn::Context ctx;
            // L = sum w * y: dL/dy = w.
            const auto objective = [&] {
                ctx.reset();
                const Tensor y = nn::forward(layer, ctx, Tensor::of(x.data(), shape));
                double sum = 0;
                for (std::int64_t i = 0; i < y.numel(); ++i) sum += static_cast<double>(w[static_cast<std::size_t>(i)]) * y.data<float>()[i];
                return sum;
            };
            arena.zero_grads();
            ctx.reset();
            (void)nn::forward(layer, ctx, Tensor::of(x.data(), shape));
            auto dy = w;
            const Tensor dx = nn::backward(layer, ctx, Tensor::of(dy.data(), shape));
            const std::vector<float> analytic_dx(dx.data<float>(), dx.data<float>() + dx.numel());
            const std::vector<float> analytic_dp(arena.grads().begin(), arena.grads().end());
            const float h = 1e-2f;
            const auto central = [&](float& v) {
                const float keep = v;
                v = keep + h;
                const double up = objective();
                v = keep - h;
                const double down = objective();
                v = keep;
                return (up - down) / (2.0 * h);
            };
            std::vector<double> numeric_dx, numeric_dp;
            for (float& v : x) numeric_dx.push_back(central(v));
            for (float& v : arena.values()) numeric_dp.push_back(central(v));
            CHECK(relative_error(numeric_dx, analytic_dx) < 2e-2);
            CHECK(relative_error(numeric_dp, analytic_dp) < 2e-2);
        }
    }
}

TEST_CASE("a Kraken GPT's loss gradient matches finite differences", "[kraken]") {
    const gpt::KrakenConfig config{.layers = 2, .width = 8, .heads = 2, .seq = 6, .vocab = 11, .degree = 2};
    auto model = gpt::make_kraken(config);
    nn::ParamArena arena(model);
    arena.initialize(model, 3);
    perturb(arena, 0.1f);
    std::vector<std::int32_t> tokens{1, 4, 2, 9, 0, 10, 3, 3, 7, 5, 6, 8}, targets{4, 2, 9, 0, 10, 3, 3, 7, 5, 6, 8, 1};
    const auto t = Tensor::of(tokens.data(), {2, 6});
    const auto y = Tensor::of(targets.data(), {2, 6});
    nn::Context ctx;
    arena.zero_grads();
    (void)nn::forward_backward(model, ctx, t, y);
    const std::vector<float> all(arena.grads().begin(), arena.grads().end());
    std::vector<float> analytic;
    std::vector<double> numeric;
    const float h = 1e-2f;
    for (std::size_t i = 0; i < all.size(); i += 3) {  // a spread of parameters of every kind
        float& v = arena.values()[i];
        const float keep = v;
        v = keep + h;
        const double up = nn::evaluate(model, ctx, t, y);
        v = keep - h;
        const double down = nn::evaluate(model, ctx, t, y);
        v = keep;
        numeric.push_back((up - down) / (2.0 * h));
        analytic.push_back(all[i]);
    }
    CHECK(relative_error(numeric, analytic) < 2e-2);
}

TEST_CASE("a Kraken GPT of degree 1 is the GPT", "[kraken]") {
    // One sub-layer: local = h, and h + (a + m) is the GPT block's (h + a) + m.
    const gpt::KrakenConfig config{.layers = 2, .width = 16, .heads = 4, .seq = 8, .vocab = 20, .degree = 1};
    auto kraken = gpt::make_kraken(config);
    auto reference = gpt::make_model(config.gpt());
    nn::ParamArena kraken_arena(kraken), reference_arena(reference);
    REQUIRE(kraken_arena.size() == reference_arena.size());
    reference_arena.initialize(reference, 4);
    std::copy(reference_arena.values().begin(), reference_arena.values().end(), kraken_arena.values().begin());
    std::vector<std::int32_t> tokens{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
    const auto t = Tensor::of(tokens.data(), {2, 8});
    nn::Context a, b;
    const Tensor ours = gpt::logits(kraken, a, t), theirs = gpt::logits(reference, b, t);
    REQUIRE(ours.shape() == theirs.shape());
    float worst = 0;
    for (std::int64_t i = 0; i < ours.numel(); ++i)
        worst = std::max(worst, std::abs(ours.data<float>()[i] - theirs.data<float>()[i]));
    CHECK(worst < 1e-5f);
}

TEST_CASE("KrakenConfig counts the parameters and refuses a degree that does not divide the heads", "[kraken]") {
    for (std::int64_t degree : {1, 2, 4}) {
        const gpt::KrakenConfig config{.layers = 3, .width = 32, .heads = 4, .seq = 16, .vocab = 50, .degree = degree};
        auto model = gpt::make_kraken(config);
        nn::ParamArena arena(model);
        CHECK(arena.size() == config.parameters());
        // The matrix weights are the GPT's; only LayerNorms and biases grow with N.
        const std::int64_t extra = config.parameters() - config.gpt().parameters();
        CHECK(extra == config.layers * (degree - 1) * (4 * 32 + 2 * 32));
    }
    const gpt::KrakenConfig bad{.layers = 1, .width = 12, .heads = 6, .seq = 4, .vocab = 8, .degree = 4};
    CHECK(loom_test::message_of([&] { (void)gpt::make_kraken(bad); }) ==
          "Kraken: degree 4 does not divide the 6 heads; use a divisor of the heads");
    gpt::KrakenLayer layer{{gpt::KrakenSubLayer::make(8, 2, 2, 0.02f), gpt::KrakenSubLayer::make(8, 2, 2, 0.02f)}};
    nn::ParamArena arena(layer);
    std::vector<float> x(2 * 3 * 8);
    nn::Context ctx;
    CHECK(loom_test::message_of([&] { (void)nn::forward(layer, ctx, Tensor::of(x.data(), {2, 3, 8})); }) ==
          "KrakenLayer: input of shape [2, 3, 8] is not a Kraken state [4, batch, sequence, width] of degree 2");
}

}  // namespace LOOM_TEST_FILE
