// Tensor parallelism, Megatron 1D, layer by layer: a Param cut over the tp
// axis initialises to exactly the serial values at its place in the whole
// tensor, and a column -> GELU -> row MLP sharded over 2 and 4 rank threads
// computes the unsharded MLP's output, input gradient and (sliced) weight
// gradients, with the f/g operators as its only communication.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/core/init.hpp>
#include <loom/core/rng.hpp>
#include <loom/gpt/model.hpp>
#include <loom/nn/compose.hpp>
#include <loom/nn/gelu.hpp>
#include <loom/nn/layernorm.hpp>
#include <loom/nn/residual.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/parallel/tensor_parallel.hpp>
#include <loom/parallel/tensor_parallel_model.hpp>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace nn = loom::nn;
using loom::Param;
using loom::Shape;
using loom::Tensor;

namespace {

struct Mlp {
    nn::Linear fc;
    nn::Gelu act;
    nn::Linear proj;
};

Mlp make_mlp() { return {nn::Linear::make(8, 16, loom::Init::normal(0.3f)), {}, nn::Linear::make(16, 8, loom::Init::normal(0.3f))}; }

constexpr std::uint64_t seed = 11;

// Element [i, j] of a row-major [rows, cols] array.
float at(const float* p, std::int64_t cols, std::int64_t i, std::int64_t j) { return p[i * cols + j]; }

// Catch2's assertions are not thread-safe: each rank thread notes its first
// mismatch here, and the main thread checks every rank's afterwards.
struct Mismatch {
    std::string first;
    void near(const char* what, std::int64_t k, float got, float want) {
        if (!first.empty() || std::abs(got - want) <= 1e-5f + 1e-5f * std::abs(want)) return;
        first = loom::detail::concat(what, "[", k, "] = ", got, ", the whole layer's ", want);
    }
};

template <class Body>
void on_ranks(int degree, Body body) {
    std::vector<Mismatch> found(static_cast<std::size_t>(degree));
    loom::comm::ThreadWorld(degree).run(
        [&](loom::comm::ThreadComm& comm) { body(comm, found[static_cast<std::size_t>(comm.rank())]); });
    for (int r = 0; r < degree; ++r) {
        INFO("tp " << degree << ", rank " << r);
        CHECK(found[static_cast<std::size_t>(r)].first == "");
    }
}

}  // namespace

TEST_CASE("tp::split_param keeps a shard's place in the whole tensor and its serial values", "[parallel][tp]") {
    for (int dim : {0, 1})
        for (int degree : {1, 2, 3}) {
            const Param whole{Shape{6, 9}, loom::Init::normal(1.0f)};
            std::vector<float> serial(54);
            loom::initialize_shard(whole, "w", seed, serial);
            for (int rank = 0; rank < degree; ++rank) {
                if (whole.shape[dim] % degree != 0) continue;
                Param shard = whole;
                loom::tp::split_param(shard, dim, rank, degree, "w");
                INFO("dim " << dim << ", rank " << rank << " of " << degree << ": " << shard);
                std::vector<float> mine(static_cast<std::size_t>(shard.numel()));
                loom::initialize_shard(shard, "w", seed, mine);
                const std::int64_t cols = shard.shape[1];
                for (std::int64_t i = 0; i < shard.shape[0]; ++i)
                    for (std::int64_t j = 0; j < cols; ++j) {
                        const std::int64_t gi = dim == 0 ? i + shard.slice.start() : i;
                        const std::int64_t gj = dim == 1 ? j + shard.slice.start() : j;
                        REQUIRE(shard.full_index(i * cols + j) == gi * 9 + gj);
                        REQUIRE(mine[static_cast<std::size_t>(i * cols + j)] == at(serial.data(), 9, gi, gj));
                    }
                // Any sub-range of the shard (as a ZeRO block cuts it) draws the same values.
                std::vector<float> part(5);
                loom::initialize_shard(shard, "w", seed, part, 2);
                for (std::size_t k = 0; k < part.size(); ++k) CHECK(part[k] == mine[k + 2]);
            }
        }
}

TEST_CASE("tp::split_param and tp::shard refuse what does not divide, in one line", "[parallel][tp]") {
    Param p{Shape{6, 9}, loom::Init::normal(1.0f)};
    CHECK(loom_test::message_of([&] { loom::tp::split_param(p, 1, 0, 2, "Linear 9 -> 6 (rows) weight"); }) ==
          "Linear 9 -> 6 (rows) weight: tp degree 2 does not divide dimension 1 of [6, 9] (9); use a degree that "
          "divides 9");
    auto layer = nn::Linear::make(10, 12);
    CHECK(loom_test::message_of([&] { loom::tp::shard(layer, nn::Split::rows, 1, 4); }) ==
          "Linear 10 -> 12 (rows) weight: tp degree 4 does not divide dimension 1 of [12, 10] (10); use a degree "
          "that divides 10");
    auto twice = nn::Linear::make(8, 8);
    loom::tp::shard(twice, nn::Split::columns, 0, 2);
    CHECK(loom_test::message_of([&] { loom::tp::shard(twice, nn::Split::rows, 1, 2); }) ==
          "tp::shard: Linear 8 -> 4 is already cut (its split is not none); cut a layer once");
    // A Param takes a second cut only as a grid's (row, then column), never a second 1D one.
    Param cut = twice.weight;
    CHECK(loom_test::message_of([&] { loom::tp::split_param(cut, 1, 1, 2, "w"); })
              .starts_with("w is already a shard (Param(f32, [4, 8] of [8, 8] from 0 along dim 0"));
    auto grid = nn::Linear::make(8, 8);
    CHECK(loom_test::message_of([&] { loom::tp::shard(grid, nn::Split::grid, 0, 2); }) ==
          "tp::shard: Linear 8 x 8 needs Split::columns or Split::rows (a 2D grid cuts with tp::shard_grid)");
}

TEST_CASE("a column -> GELU -> row MLP over the tp axis equals the whole MLP, forward and backward", "[parallel][tp]") {
    constexpr std::int64_t rows = 6, width = 8;
    // The whole MLP: output, input gradient and weight gradients.
    Mlp whole = make_mlp();
    nn::ParamArena whole_arena(whole);
    whole_arena.initialize(whole, seed);
    std::vector<float> x(rows * width), dy(rows * width);
    const loom::RngStream data{5, 1};
    data.fill_normal(x, 0);
    data.fill_normal(dy, 1000);
    nn::Context whole_ctx;
    const Tensor y_whole = nn::forward(whole, whole_ctx, Tensor::of(x.data(), {rows, width}));
    whole_arena.zero_grads();
    const Tensor dx_whole = nn::backward(whole, whole_ctx, Tensor::of(dy.data(), {rows, width}));

    for (int degree : {2, 4}) {
        on_ranks(degree, [&](loom::comm::ThreadComm& comm, Mismatch& found) {
            const int r = comm.rank();
            Mlp mine = make_mlp();
            loom::tp::shard(mine.fc, nn::Split::columns, r, degree);
            loom::tp::shard(mine.proj, nn::Split::rows, r, degree);
            nn::ParamArena arena(mine);
            arena.initialize(mine, seed);
            const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
            nn::Context ctx;
            ctx.set_tensor_group(&group);
            const Tensor y = nn::forward(mine, ctx, Tensor::of(x.data(), {rows, width}));
            arena.zero_grads();
            const Tensor dx = nn::backward(mine, ctx, Tensor::of(dy.data(), {rows, width}));
            for (std::int64_t k = 0; k < rows * width; ++k) {
                found.near("y", k, y.data<float>()[k], y_whole.data<float>()[k]);
                found.near("dx", k, dx.data<float>()[k], dx_whole.data<float>()[k]);
            }
            // Weight gradients: this rank's slice of the whole layer's (the
            // row layer's bias is whole on every rank, with the whole gradient).
            for (const auto& [part_ptr, whole_ptr] : {std::pair{&mine.fc.weight, &whole.fc.weight}, std::pair{&mine.fc.bias, &whole.fc.bias},
                                     std::pair{&mine.proj.weight, &whole.proj.weight},
                                     std::pair{&mine.proj.bias, &whole.proj.bias}}) {
                const Param& part = *part_ptr;
                for (std::int64_t k = 0; k < part.numel(); ++k)
                    found.near("gradient", k, part.grad.data<float>()[k],
                               whole_ptr->grad.data<float>()[part.full_index(k)]);
            }
        });
    }
}

TEST_CASE("a split Linear without a tensor-parallel group says what is missing", "[parallel][tp]") {
    auto layer = nn::Linear::make(4, 4);
    loom::tp::shard(layer, nn::Split::rows, 0, 2);
    nn::ParamArena arena(layer);
    std::vector<float> x(8, 1.0f);
    nn::Context ctx;
    CHECK(loom_test::message_of([&] { (void)layer.forward(ctx, Tensor::of(x.data(), {4, 2})); }) ==
          "Linear: split by rows but the context has no tensor-parallel group; run it through an executor with a tp "
          "axis");
    static_assert(loom::Strategy<loom::DataParallel<>, loom::TensorParallel>::data_parallel);
}

TEST_CASE("a Param cut in groups (q, k, v) keeps each block's slice in place", "[parallel][tp]") {
    const Param whole{Shape{12, 5}, loom::Init::normal(1.0f)};  // 3 blocks of 4 rows
    std::vector<float> serial(60);
    loom::initialize_shard(whole, "qkv", seed, serial);
    for (int rank = 0; rank < 2; ++rank) {
        Param shard = whole;
        loom::tp::split_param(shard, 0, rank, 2, "qkv", 3);
        REQUIRE(shard.shape == Shape{6, 5});
        std::vector<float> mine(30);
        loom::initialize_shard(shard, "qkv", seed, mine);
        for (std::int64_t i = 0; i < 6; ++i) {
            const std::int64_t block = i / 2, row = block * 4 + rank * 2 + i % 2;  // rows of this rank in each block
            for (std::int64_t j = 0; j < 5; ++j) {
                REQUIRE(shard.full_index(i * 5 + j) == row * 5 + j);
                REQUIRE(mine[static_cast<std::size_t>(i * 5 + j)] == serial[static_cast<std::size_t>(row * 5 + j)]);
            }
        }
    }
    Param odd = whole;
    CHECK(loom_test::message_of([&] { loom::tp::split_param(odd, 0, 0, 3, "qkv", 3); }) ==
          "qkv: tp degree 3 does not divide dimension 0 of [12, 5] (3 blocks of 4); use a degree that divides 4");
}

TEST_CASE("attention with its heads split over the tp axis equals the whole attention", "[parallel][tp]") {
    constexpr std::int64_t B = 2, T = 5, C = 16, heads = 4;
    auto make = [] { return nn::CausalSelfAttention::make(C, heads, 0.3f, 0.3f); };
    nn::CausalSelfAttention whole = make();
    nn::ParamArena whole_arena(whole);
    whole_arena.initialize(whole, seed);
    std::vector<float> x(B * T * C), dy(B * T * C);
    const loom::RngStream data{6, 2};
    data.fill_normal(x, 0);
    data.fill_normal(dy, 5000);
    nn::Context whole_ctx;
    const Tensor y_whole = nn::forward(whole, whole_ctx, Tensor::of(x.data(), {B, T, C}));
    whole_arena.zero_grads();
    const Tensor dx_whole = nn::backward(whole, whole_ctx, Tensor::of(dy.data(), {B, T, C}));
    for (int degree : {2, 4}) {
        on_ranks(degree, [&](loom::comm::ThreadComm& comm, Mismatch& found) {
            const int r = comm.rank();
            nn::CausalSelfAttention mine = make();
            loom::tp::shard(mine, r, degree);
            if (mine.local_heads() != heads / degree) found.first = "wrong local heads";
            nn::ParamArena arena(mine);
            arena.initialize(mine, seed);
            const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
            nn::Context ctx;
            ctx.set_tensor_group(&group);
            const Tensor y = nn::forward(mine, ctx, Tensor::of(x.data(), {B, T, C}));
            arena.zero_grads();
            const Tensor dx = nn::backward(mine, ctx, Tensor::of(dy.data(), {B, T, C}));
            for (std::int64_t k = 0; k < B * T * C; ++k) {
                found.near("y", k, y.data<float>()[k], y_whole.data<float>()[k]);
                found.near("dx", k, dx.data<float>()[k], dx_whole.data<float>()[k]);
            }
            // qkv's weight gradient: this rank's rows of q, k and v; the projection's columns.
            for (const auto& [part_ptr, whole_ptr] : {std::pair{&mine.qkv.weight, &whole.qkv.weight},
                                     std::pair{&mine.proj.weight, &whole.proj.weight}}) {
                const Param& part = *part_ptr;
                for (std::int64_t k = 0; k < part.numel(); ++k)
                    found.near("gradient", k, part.grad.data<float>()[k],
                               whole_ptr->grad.data<float>()[part.full_index(k)]);
            }
        });
    }
    nn::CausalSelfAttention three = make();
    CHECK(loom_test::message_of([&] { loom::tp::shard(three, 0, 3); }) ==
          "CausalSelfAttention: tp degree 3 does not divide the 4 heads; use a degree that divides 4");
}

namespace {

// A layer of the user's own that computes itself with two Linears inside:
// the walk cannot know how its forward uses them, so it runs whole.
struct OwnMlp {
    nn::Linear up;
    nn::Gelu act;
    nn::Linear down;
    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& x) {
        return down.forward(ctx, act.forward(ctx, up.forward(ctx, x)));
    }
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dy) {
        return up.backward_input(ctx, act.backward_input(ctx, down.backward_input(ctx, dy)));
    }
};

// A user's block written with loom's layers, cut by the same walk as the GPT.
struct UserBlock {
    nn::Residual<nn::LayerNorm, nn::CausalSelfAttention> attention;
    nn::Residual<nn::LayerNorm, nn::Linear, nn::Gelu, nn::Linear> mlp;
    nn::Linear lone;  // no partner: stays whole
    OwnMlp own;       // computes itself: stays whole
};

}  // namespace

TEST_CASE("tp::shard_model finds the column -> row pairs and the attentions of any model", "[parallel][tp]") {
    auto make = [] {
        return UserBlock{{{nn::LayerNorm::make(8), nn::CausalSelfAttention::make(8, 4)}},
                         {{nn::LayerNorm::make(8), nn::Linear::make(8, 32), nn::Gelu{}, nn::Linear::make(32, 8)}},
                         nn::Linear::make(8, 8),
                         {nn::Linear::make(8, 16), {}, nn::Linear::make(16, 8)}};
    };
    UserBlock block = make();
    const auto summary = loom::tp::shard_model(block, 1, 2);
    CHECK(summary.linear_pairs == 1);
    CHECK(summary.attentions == 1);
    CHECK(summary.embeddings == 0);
    CHECK(summary.vocab_heads == 0);
    CHECK(std::get<1>(block.mlp.layers).split == nn::Split::columns);
    CHECK(std::get<1>(block.mlp.layers).weight.shape == Shape{16, 8});
    CHECK(std::get<3>(block.mlp.layers).split == nn::Split::rows);
    CHECK(std::get<3>(block.mlp.layers).weight.shape == Shape{8, 16});
    CHECK(std::get<1>(block.attention.layers).local_heads() == 2);
    CHECK(block.lone.split == nn::Split::none);
    CHECK(block.lone.weight.shape == Shape{8, 8});
    CHECK(block.own.up.split == nn::Split::none);
    CHECK(block.own.down.weight.shape == Shape{8, 16});
    // Degree 1 cuts nothing.
    UserBlock whole = make();
    loom::tp::shard_model(whole, 0, 1);
    CHECK(std::get<1>(whole.mlp.layers).split == nn::Split::none);
    CHECK(std::get<1>(whole.mlp.layers).weight.shape == Shape{32, 8});
}

TEST_CASE("tp::shard_model cuts the GPT's MLPs, attentions and both vocabulary ends", "[parallel][tp]") {
    auto model = loom::gpt::make_model({.layers = 3, .width = 32, .heads = 4, .seq = 8, .vocab = 64});
    const auto summary = loom::tp::shard_model(model, 1, 4);
    CHECK(summary.linear_pairs == 3);
    CHECK(summary.attentions == 3);
    CHECK(summary.embeddings == 1);
    CHECK(summary.vocab_heads == 1);
    CHECK(model.embed.token.shape == Shape{16, 32});
    CHECK(model.embed.token.slice.start() == 16);
    CHECK(model.head.weight.shape == Shape{16, 32});
    CHECK(model.loss.vocab_start == 16);
    CHECK(model.ln_f.gain.shape == Shape{32});  // whole on every rank
}

}  // namespace LOOM_TEST_FILE
