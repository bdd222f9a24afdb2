// nn::CrossAttention (GliDe's draft sub-layer): its gradients (input, query
// and output projections) against central finite differences with the
// stale-block mask on, its output against a double-precision reference of
// masked softmax attention, the mask's reach (a query never reads a memory
// row of its own block or later), and its bad inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "loom/core/rng.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/cross_attention.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"

using loom::Shape;
using loom::Tensor;
using loom_test::message_of;
namespace nn = loom::nn;

namespace {

std::vector<float> random_values(std::int64_t n, std::uint64_t stream, float scale = 1.0f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    loom::RngStream(23, stream).fill_normal(v, 0, 0.0f, scale);
    return v;
}

// A memory of B sequences of S positions, width M, packed as a qkv [B, S, 3M] would be.
struct Memory {
    std::vector<float> qkv;
    Tensor tensor;
    nn::CrossMemory view;
    Memory(std::int64_t B, std::int64_t S, std::int64_t M, std::uint64_t stream)
        : qkv(random_values(B * S * 3 * M, stream)), tensor(Tensor::of(qkv.data(), Shape{B, S, 3 * M})),
          view(nn::CrossMemory::of_qkv(tensor)) {}
};

double weighted_sum(const Tensor& y, const std::vector<float>& w) {
    double sum = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i) sum += static_cast<double>(w[static_cast<std::size_t>(i)]) * y.data<float>()[i];
    return sum;
}

}  // namespace

TEST_CASE("CrossAttention gradients (input, query and output projections) match finite differences under the stale mask") {
    // Draft width 6, memory width 8 in 2 heads, 12 positions: queries 0-4 see nothing, 5-9 five rows, 10-11 ten.
    const std::int64_t B = 2, T = 12, C = 6, M = 8;
    auto layer = nn::CrossAttention::make(C, M, 2, 5, 0.3f, 0.3f);
    nn::ParamArena arena(layer);
    arena.initialize(layer, 5);
    const auto noise = random_values(arena.size(), 99, 0.3f);
    for (std::size_t i = 0; i < noise.size(); ++i) arena.values()[i] += noise[i];
    Memory memory(B, T, M, 3);
    std::vector<float> x = random_values(B * T * C, 1);
    const auto w = random_values(B * T * C, 7);

    nn::Context ctx;
    layer.attach(ctx, memory.view);
    auto objective = [&] {
        ctx.reset();
        return weighted_sum(nn::forward(layer, ctx, Tensor::of(x.data(), Shape{B, T, C})), w);
    };
    arena.zero_grads();
    ctx.reset();
    (void)nn::forward(layer, ctx, Tensor::of(x.data(), Shape{B, T, C}));
    std::vector<float> wy = w;
    const Tensor dx = nn::backward(layer, ctx, Tensor::of(wy.data(), Shape{B, T, C}));
    const std::vector<float> analytic_dx(dx.data<float>(), dx.data<float>() + dx.numel());
    const std::vector<float> analytic_dp(arena.grads().begin(), arena.grads().end());

    const float h = 1e-2f;
    auto compare = [&](const std::vector<float>& analytic, auto&& element, std::size_t n, const char* what) {
        double num = 0, den = 0;
        for (std::size_t i = 0; i < n; ++i) {
            float& v = element(i);
            const float keep = v;
            v = keep + h;
            const double up = objective();
            v = keep - h;
            const double down = objective();
            v = keep;
            const double d = (up - down) / (2.0 * h);
            num += (d - analytic[i]) * (d - analytic[i]);
            den += d * d;
        }
        INFO(what << ": relative error " << std::sqrt(num / den));
        CHECK(den > 0);
        CHECK(std::sqrt(num / den) < 2e-2);
    };
    compare(analytic_dx, [&](std::size_t i) -> float& { return x[i]; }, x.size(), "d/dx");
    compare(analytic_dp, [&](std::size_t i) -> float& { return arena.values()[i]; },
            static_cast<std::size_t>(arena.size()), "d/dparams");
    // Queries 0-4 see no memory: their input gradient is zero (the output is the bias alone).
    for (std::int64_t t = 0; t < 5; ++t)
        for (std::int64_t c = 0; c < C; ++c) CHECK(analytic_dx[static_cast<std::size_t>(t * C + c)] == 0.0f);
}

TEST_CASE("CrossAttention's output is masked softmax attention over the memory, and the stale mask reaches no "
          "row of a query's own block") {
    const std::int64_t B = 2, T = 11, S = 13, C = 4, M = 6, H = 3, D = 2;
    for (const std::int64_t block : {0, 1, 5}) {
        auto layer = nn::CrossAttention::make(C, M, H, block, 0.5f, 0.5f);
        nn::ParamArena arena(layer);
        arena.initialize(layer, 9);
        Memory memory(B, S, M, 4);
        std::vector<float> x = random_values(B * T * C, 2);
        nn::Context ctx;
        layer.attach(ctx, memory.view);
        const Tensor y = nn::forward(layer, ctx, Tensor::of(x.data(), Shape{B, T, C}));
        const std::vector<float> first(y.data<float>(), y.data<float>() + y.numel());
        // Reference in double: q = x Wq^T + bq, attention over s < visible, then the projection.
        const float* wq = layer.query.weight.value.data<float>();
        const float* bq = layer.query.bias.value.data<float>();
        const float* wo = layer.proj.weight.value.data<float>();
        const float* bo = layer.proj.bias.value.data<float>();
        double worst = 0;
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < T; ++t) {
                const std::int64_t visible = block == 0 ? S : std::min(S, t / block * block);
                std::vector<double> q(M), out(M, 0.0);
                for (std::int64_t j = 0; j < M; ++j) {
                    q[j] = bq[j];
                    for (std::int64_t c = 0; c < C; ++c) q[j] += double(wq[j * C + c]) * x[(b * T + t) * C + c];
                }
                for (std::int64_t h = 0; h < H && visible > 0; ++h) {
                    std::vector<double> e(static_cast<std::size_t>(visible));
                    double total = 0;
                    for (std::int64_t s = 0; s < visible; ++s) {
                        const float* k = memory.qkv.data() + (b * S + s) * 3 * M + M + h * D;
                        double dot = 0;
                        for (std::int64_t d = 0; d < D; ++d) dot += q[h * D + d] * k[d];
                        e[s] = std::exp(dot / std::sqrt(double(D)));
                        total += e[s];
                    }
                    for (std::int64_t s = 0; s < visible; ++s) {
                        const float* v = memory.qkv.data() + (b * S + s) * 3 * M + 2 * M + h * D;
                        for (std::int64_t d = 0; d < D; ++d) out[h * D + d] += e[s] / total * v[d];
                    }
                }
                for (std::int64_t c = 0; c < C; ++c) {
                    double ref = bo[c];
                    for (std::int64_t j = 0; j < M; ++j) ref += double(wo[c * M + j]) * out[j];
                    worst = std::max(worst, std::abs(ref - first[(b * T + t) * C + c]));
                }
            }
        INFO("stale block " << block << ": largest difference " << worst);
        CHECK(worst < 1e-5);
        if (block != 5) continue;
        // Change memory row s of sequence 1: only queries t with floor(s/5) < floor(t/5) may move.
        for (const std::int64_t s : {0, 4, 5, 9, 10, 12}) {
            Memory changed(B, S, M, 4);
            for (std::int64_t j = M; j < 3 * M; ++j) changed.qkv[(S + s) * 3 * M + j] += 1.0f;
            layer.attach(ctx, changed.view);
            ctx.reset();
            const Tensor z = nn::forward(layer, ctx, Tensor::of(x.data(), Shape{B, T, C}));
            for (std::int64_t b = 0; b < B; ++b)
                for (std::int64_t t = 0; t < T; ++t) {
                    bool moved = false;
                    for (std::int64_t c = 0; c < C; ++c)
                        moved = moved || z.data<float>()[(b * T + t) * C + c] != first[(b * T + t) * C + c];
                    INFO("memory row " << s << ", query " << t << " of sequence " << b);
                    CHECK(moved == (b == 1 && s / 5 < t / 5));
                }
        }
    }
}

TEST_CASE("CrossAttention names its bad inputs") {
    CHECK(message_of([] { (void)nn::CrossAttention::make(4, 6, 4); }) ==
          "CrossAttention: the memory's width 6 does not split into 4 heads; use a divisor of it");
    CHECK(message_of([] { (void)nn::CrossAttention::make(4, 6, 2, -1); }) ==
          "CrossAttention: stale_block = -1; give the block size of the stale mask (5 in GliDe), or 0 for no mask");
    auto layer = nn::CrossAttention::make(4, 6, 2);
    nn::ParamArena arena(layer);
    nn::Context ctx;
    std::vector<float> x(2 * 3 * 4, 0.5f);
    CHECK(message_of([&] { (void)layer.forward(ctx, Tensor::of(x.data(), Shape{2, 3, 4})); }) ==
          "CrossAttention: no memory attached in this context; call attach(ctx, memory) with the target's keys and "
          "values before the forward");
    Memory wide(2, 3, 8, 1), one(1, 3, 6, 1);
    CHECK(message_of([&] { layer.attach(ctx, wide.view); }) ==
          "CrossAttention: the memory is 8 wide but the layer's query projects to 6; attach the keys and values of "
          "the model it was built for");
    CHECK(message_of([&] { layer.attach(ctx, nn::CrossMemory{}); }) ==
          "CrossAttention: attaching a memory with no keys or values");
    layer.attach(ctx, one.view);
    CHECK(message_of([&] { (void)layer.forward(ctx, Tensor::of(x.data(), Shape{2, 3, 4})); }) ==
          "CrossAttention: the memory holds 1 sequences but the input has 2; attach the keys and values of the same "
          "batch");
    CHECK(message_of([&] { (void)layer.forward(ctx, Tensor::of(x.data(), Shape{6, 4})); }) ==
          "CrossAttention: input of shape [6, 4] is not [batch, sequence, 4]");
    std::vector<float> flat(10);
    CHECK(message_of([&] { (void)nn::CrossMemory::of_qkv(Tensor::of(flat.data(), Shape{1, 2, 5})); }) ==
          "CrossMemory: qkv of shape [1, 2, 5] is not [batch, sequence, 3 x width]");
}
