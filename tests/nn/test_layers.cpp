// Layers as wired in nn/: every layer's analytic gradients (inputs and
// parameters) against central finite differences of its own forward, and the
// composition rules (field order, reverse backward, Residual, sequences).
// The kernels' double-precision checks live in tests/kernels; these check
// that each layer passes the right tensors to them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "loom/core/rng.hpp"
#include "loom/gpt/model.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/optim/adamw.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Shape;
using loom::Tensor;
namespace nn = loom::nn;

namespace {

std::vector<float> random_values(std::int64_t n, std::uint64_t stream, float scale = 1.0f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    loom::RngStream(11, stream).fill_normal(v, 0, 0.0f, scale);
    return v;
}

// L = sum_i w_i * y_i for fixed random w: its gradient wrt y is w. Checks
// dL/dx and dL/dparams of `layer` by central differences in float with a
// step that keeps rounding error well below the tolerance.
template <class Layer>
void check_gradients(Layer& layer, std::vector<float> x, const Shape& x_shape, double tolerance = 2e-2) {
    nn::ParamArena arena(layer);
    arena.initialize(layer, 5);
    // Non-trivial parameter values (ones/zeros would hide transposes).
    auto noise = random_values(arena.size(), 99, 0.3f);
    for (std::size_t i = 0; i < noise.size(); ++i) arena.values()[i] += noise[i];

    nn::Context ctx;
    auto objective = [&](std::vector<float>& input) {
        ctx.reset();
        Tensor y = nn::forward(layer, ctx, Tensor::of(input.data(), x_shape));
        const auto w = random_values(y.numel(), 7);
        double sum = 0;
        for (std::int64_t i = 0; i < y.numel(); ++i) sum += static_cast<double>(w[static_cast<std::size_t>(i)]) * y.data<float>()[i];
        return sum;
    };
    // Analytic.
    arena.zero_grads();
    ctx.reset();
    Tensor y = nn::forward(layer, ctx, Tensor::of(x.data(), x_shape));
    auto w = random_values(y.numel(), 7);
    Tensor dx = nn::backward(layer, ctx, Tensor::of(w.data(), y.shape()));
    std::vector<float> analytic_dx(dx.data<float>(), dx.data<float>() + dx.numel());
    std::vector<float> analytic_dp(arena.grads().begin(), arena.grads().end());

    const float h = 1e-2f;
    auto numeric = [&](float& v, std::vector<float>& input) {
        const float keep = v;
        v = keep + h;
        const double up = objective(input);
        v = keep - h;
        const double down = objective(input);
        v = keep;
        return (up - down) / (2.0 * h);
    };
    auto compare = [&](const std::vector<float>& analytic, auto&& element, std::size_t n, const char* what) {
        double num = 0, den = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const double d = numeric(element(i), x);
            num += (d - analytic[i]) * (d - analytic[i]);
            den += d * d;
        }
        INFO(what << ": relative error " << std::sqrt(num / std::max(den, 1e-30)));
        CHECK(std::sqrt(num / std::max(den, 1e-30)) < tolerance);
    };
    compare(analytic_dx, [&](std::size_t i) -> float& { return x[i]; }, x.size(), "d/dx");
    if (arena.size() > 0)
        compare(analytic_dp, [&](std::size_t i) -> float& { return arena.values()[i]; }, static_cast<std::size_t>(arena.size()),
                "d/dparams");
}

}  // namespace

TEST_CASE("Linear gradients (input, weight, bias) match finite differences") {
    auto layer = nn::Linear::make(5, 3);
    check_gradients(layer, random_values(4 * 5, 1), Shape{4, 5});
    auto no_bias = nn::Linear::make(6, 2, loom::Init::normal(0.5f), false);
    check_gradients(no_bias, random_values(3 * 6, 2), Shape{3, 6});
}

TEST_CASE("LayerNorm gradients match finite differences") {
    auto layer = nn::LayerNorm::make(7);
    check_gradients(layer, random_values(3 * 7, 3), Shape{3, 7});
}

TEST_CASE("Gelu gradient matches finite differences") {
    nn::Gelu layer;
    check_gradients(layer, random_values(20, 4), Shape{20});
}

TEST_CASE("CausalSelfAttention gradients match finite differences") {
    auto layer = nn::CausalSelfAttention::make(8, 2, 0.3f, 0.3f);
    check_gradients(layer, random_values(2 * 5 * 8, 5), Shape{2, 5, 8});
}

TEST_CASE("Residual chain gradients match finite differences") {
    nn::Residual<nn::LayerNorm, nn::Linear, nn::Gelu, nn::Linear> block{
        {nn::LayerNorm::make(6), nn::Linear::make(6, 12), nn::Gelu{}, nn::Linear::make(12, 6)}};
    check_gradients(block, random_values(3 * 6, 6), Shape{3, 6});
}

TEST_CASE("Embedding and CrossEntropy gradients match finite differences") {
    // The whole GPT end to end: embeddings and the loss included.
    const loom::gpt::Config config{.layers = 1, .width = 8, .heads = 2, .seq = 6, .vocab = 11};
    auto model = loom::gpt::make_model(config);
    nn::ParamArena arena(model);
    arena.initialize(model, 3);
    std::vector<std::int32_t> tokens{1, 4, 2, 9, 0, 10, 3, 3, 7, 5, 6, 8}, targets{4, 2, 9, 0, 10, 3, 3, 7, 5, 6, 8, 1};
    const auto t = Tensor::of(tokens.data(), {2, 6});
    const auto y = Tensor::of(targets.data(), {2, 6});
    nn::Context ctx;
    arena.zero_grads();
    loom::nn::forward_backward(model, ctx, t, y);
    std::vector<float> analytic(arena.grads().begin(), arena.grads().end());
    double num = 0, den = 0;
    const float h = 1e-2f;
    for (std::size_t i = 0; i < analytic.size(); i += 7) {  // a spread of parameters of every kind
        float& v = arena.values()[i];
        const float keep = v;
        v = keep + h;
        const double up = loom::nn::evaluate(model, ctx, t, y);
        v = keep - h;
        const double down = loom::nn::evaluate(model, ctx, t, y);
        v = keep;
        const double d = (up - down) / (2.0 * h);
        num += (d - analytic[i]) * (d - analytic[i]);
        den += d * d;
    }
    CHECK(std::sqrt(num / den) < 2e-2);
}

namespace {
struct UserChain {  // a user's block: fields run in order
    nn::Linear up;
    nn::Gelu act;
    nn::Linear down;
    int note = 3;  // configuration: skipped
};
}  // namespace

TEST_CASE("A user aggregate runs its fields in order, backward in reverse") {
    UserChain chain{nn::Linear::make(4, 8), nn::Gelu{}, nn::Linear::make(8, 4)};
    nn::ParamArena arena(chain);
    arena.initialize(chain, 1);
    auto x = random_values(3 * 4, 8);
    nn::Context ctx;
    Tensor y = nn::forward(chain, ctx, Tensor::of(x.data(), {3, 4}));
    std::vector<float> composed(y.data<float>(), y.data<float>() + y.numel());
    // The same layers called one by one.
    nn::Context manual;
    Tensor h = chain.up.forward(manual, Tensor::of(x.data(), {3, 4}));
    h = chain.act.forward(manual, h);
    h = chain.down.forward(manual, h);
    CHECK(std::memcmp(composed.data(), h.data<float>(), composed.size() * sizeof(float)) == 0);
    CHECK(loom::reflect::param_count(chain) == 4);
    check_gradients(chain, x, Shape{3, 4});
}

TEST_CASE("ParamArena binds every Param to one contiguous allocation in reflection order") {
    auto model = loom::gpt::make_model({.layers = 2, .width = 16, .heads = 2, .seq = 8, .vocab = 32});
    nn::ParamArena arena(model);
    CHECK(arena.size() == loom::reflect::parameter_numel(model));
    CHECK(arena.size() == loom::gpt::Config{.layers = 2, .width = 16, .heads = 2, .seq = 8, .vocab = 32}.parameters());
    std::int64_t offset = 0;
    for (const auto& entry : arena.entries()) {
        CHECK(entry.offset == offset);
        if (entry.param->numel() > 0) CHECK(entry.param->value.data<float>() == arena.values().data() + offset);
        offset += entry.param->numel();
    }
    CHECK(loom::gpt::parameter_names({.layers = 2, .width = 16, .heads = 2, .seq = 8, .vocab = 32}).size() ==
          arena.entries().size());
}

TEST_CASE("The GPT's loss starts near ln(vocab), repeats exactly, and falls under AdamW") {
    const loom::gpt::Config config{.layers = 2, .width = 32, .heads = 4, .seq = 16, .vocab = 64};
    auto model = loom::gpt::make_model(config);
    nn::ParamArena arena(model);
    arena.initialize(model, 1);
    std::vector<std::int32_t> tokens(4 * 16), targets(4 * 16);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::int32_t>((i * 7) % 64);
        targets[i] = static_cast<std::int32_t>((i * 7 + 7) % 64);  // learnable: next = token + 7
    }
    const auto t = Tensor::of(tokens.data(), {4, 16});
    const auto y = Tensor::of(targets.data(), {4, 16});
    nn::Context ctx;
    arena.zero_grads();
    const float first = loom::nn::forward_backward(model, ctx, t, y);
    CHECK(first == Approx(std::log(64.0)).epsilon(0.05));
    std::vector<float> grads(arena.grads().begin(), arena.grads().end());
    // The same step again (context reused): identical loss, gradients doubled
    // (up to rounding: BLAS may accumulate its product straight onto them).
    const float again = loom::nn::forward_backward(model, ctx, t, y);
    CHECK(again == first);
    for (std::size_t i = 0; i < grads.size(); i += 97)
        CHECK(arena.grads()[i] == Approx(2 * grads[i]).epsilon(1e-4).margin(1e-9));
    loom::optim::AdamW optimizer(arena.size(), {.lr = 3e-3f});
    float loss = first;
    for (int step = 0; step < 30; ++step) {
        arena.zero_grads();
        loss = loom::nn::forward_backward(model, ctx, t, y);
        optimizer.step(arena.values(), arena.grads());
    }
    CHECK(loss < 0.5f * first);
}

}  // namespace LOOM_TEST_FILE
