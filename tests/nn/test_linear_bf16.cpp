// Linear at MatmulPrecision::bf16 (kernels/matmul_precision.hpp): its three
// products are the f32 products of the operands rounded to bf16, bit for bit
// on the host when rounding into the f32 kernels and up to reassociation with
// vdpbf16ps, and the bias and its gradient stay f32. Also: the context
// keeps its precision across reset(), and a GPT trains at bf16 to losses
// near, but not equal to, f32's.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/rng.hpp"
#include "loom/exec/serial_trainer.hpp"
#include "loom/gpt/model.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/bf16_product_ways.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Shape;
using loom::Tensor;
using loom::kernels::MatmulPrecision;
namespace nn = loom::nn;

namespace {

std::vector<float> random_values(std::int64_t n, std::uint64_t stream, float scale = 1.0f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    loom::RngStream(13, stream).fill_normal(v, 0, 0.0f, scale);
    return v;
}

std::vector<float> rounded(std::vector<float> v) {
    for (float& x : v) x = loom::to_float(loom::to_bf16(x));
    return v;
}

std::vector<float> values_of(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

// One forward and backward of `layer` on x and dy at `precision`; returns y,
// dx, the weight's and the bias's gradients.
struct LinearRun {
    std::vector<float> y, dx, dw, db;
};

LinearRun run(nn::Linear& layer, const nn::ParamArena& arena, MatmulPrecision precision, std::vector<float> x,
              std::vector<float> dy, std::int64_t rows) {
    nn::Context ctx;
    ctx.set_matmul_precision(precision);
    arena.zero_grads();
    const Tensor y = nn::forward(layer, ctx, Tensor::of(x.data(), {rows, layer.in()}));
    const Tensor dx = nn::backward(layer, ctx, Tensor::of(dy.data(), {rows, layer.out()}));
    return {values_of(y), values_of(dx), values_of(layer.weight.grad), values_of(layer.bias.grad)};
}

}  // namespace

TEST_CASE("Linear at bf16 is the f32 Linear of its operands rounded to bf16, forward and backward", "[nn][bf16]") {
    const std::int64_t in = 24, out = 10, rows = 6;
    auto layer = nn::Linear::make(in, out);
    auto twin = nn::Linear::make(in, out);  // the f32 layer fed rounded operands
    nn::ParamArena arena(layer), twin_arena(twin);
    const auto params = random_values(arena.size(), 1, 0.5f);  // weight, then a non-zero bias
    std::copy(params.begin(), params.end(), arena.values().begin());
    std::copy(params.begin(), params.end(), twin_arena.values().begin());
    const auto w16 = rounded(values_of(layer.weight.value));
    std::copy(w16.begin(), w16.end(), twin.weight.value.data<float>());

    const auto x = random_values(rows * in, 2), dy = random_values(rows * out, 3);
    const LinearRun emulated = run(twin, twin_arena, MatmulPrecision::f32, rounded(x), rounded(dy), rows);
    const LinearRun f32 = run(layer, arena, MatmulPrecision::f32, x, dy, rows);
    // Rounding into the f32 kernels gives the emulation's bits; vdpbf16ps
    // (where this CPU has it) the same exact products summed in another order.
    loom_test::for_each_bf16_product_way([&](bool dot) {
        CAPTURE(dot);
        const LinearRun bf16 = run(layer, arena, MatmulPrecision::bf16, x, dy, rows);
        const auto same = [dot](const std::vector<float>& a, const std::vector<float>& b) {
            if (!dot) return a == b;
            for (std::size_t i = 0; i < a.size(); ++i)
                if (std::abs(a[i] - b[i]) > 1e-5f * (1.0f + std::abs(b[i]))) return false;
            return a.size() == b.size();
        };
        CHECK(same(bf16.y, emulated.y));    // round(x) round(W)^T + b
        CHECK(same(bf16.dx, emulated.dx));  // round(dy) round(W)
        CHECK(same(bf16.dw, emulated.dw));  // round(dy)^T round(x)
        CHECK(bf16.db == f32.db);           // the bias's gradient sums the f32 dy either way
        // The rounding happened, and stayed small: bf16 keeps 8 significant bits.
        CHECK(bf16.y != f32.y);
        CHECK(bf16.dw != f32.dw);
        for (std::size_t i = 0; i < f32.y.size(); ++i) CHECK(std::abs(bf16.y[i] - f32.y[i]) <= 0.05f);
    });
}

TEST_CASE("a context keeps its matmul precision across reset, and a GPT trains at bf16 close to f32", "[nn][bf16]") {
    nn::Context ctx;
    CHECK(ctx.matmul_precision() == MatmulPrecision::f32);
    ctx.set_matmul_precision(MatmulPrecision::bf16);
    ctx.reset();
    CHECK(ctx.matmul_precision() == MatmulPrecision::bf16);

    const loom::gpt::Config config{.layers = 2, .width = 32, .heads = 2, .seq = 16, .vocab = 64};
    const std::int64_t batch = 8;
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * config.seq)), targets(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::int32_t>((i * 7 + 3) % 64);
        targets[i] = static_cast<std::int32_t>((i * 5 + 1) % 64);
    }
    std::vector<float> losses[2];
    for (MatmulPrecision precision : {MatmulPrecision::f32, MatmulPrecision::bf16}) {
        auto model = loom::gpt::make_model(config);
        loom::exec::SerialTrainer trainer(model, loom::host_device, {.micro_batches = 2, .matmul = precision});
        trainer.initialize(3);
        for (int step = 0; step < 8; ++step)
            losses[static_cast<int>(precision)].push_back(trainer.step(
                Tensor::of(tokens.data(), {batch, config.seq}), Tensor::of(targets.data(), {batch, config.seq}), 3e-3f));
    }
    INFO("f32 losses " << losses[0].front() << " .. " << losses[0].back() << ", bf16 " << losses[1].front() << " .. "
                       << losses[1].back());
    CHECK(losses[1] != losses[0]);
    CHECK(losses[1].back() < losses[1].front() - 0.1f);  // it learns
    for (std::size_t i = 0; i < losses[0].size(); ++i)
        CHECK(std::abs(losses[1][i] - losses[0][i]) <= 0.02f * std::abs(losses[0][i]));
}

}  // namespace LOOM_TEST_FILE
