// Optimus 2D, layer by layer: on q x q rank threads (q = 2 and 3) every layer
// cut for the grid computes the whole layer's output block, input-gradient
// block and weight-gradient blocks (Linear with and without q/k/v groups,
// LayerNorm, attention, embedding, head + loss), and the whole GPT's loss and
// every gradient; then the cut itself (2D Param slices) and the one-line
// errors for what does not divide.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/core/init.hpp>
#include <loom/core/rng.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/nn/compose.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/parallel/optimus2d.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/parallel/grid2d.hpp>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace nn = loom::nn;
using loom::Param;
using loom::Shape;
using loom::Tensor;
using loom::comm::ThreadComm;
using loom::tp::GridPosition;

namespace {

constexpr std::uint64_t seed = 13;

// Each rank thread notes its first mismatch (Catch2 is not thread-safe); an
// element may differ from the whole layer's by 1e-5 of its tensor's scale.
struct Mismatch {
    std::string first;
    void near(const std::string& what, std::int64_t k, float got, float want, float scale) {
        if (!first.empty() || std::abs(got - want) <= 1e-5f * std::max(scale, 1e-3f)) return;
        first = loom::detail::concat(what, "[", k, "] = ", got, ", the whole layer's ", want);
    }
    void all_near(const std::string& what, const float* got, const std::vector<float>& want) {
        float scale = 0;
        for (float w : want) scale = std::max(scale, std::abs(w));
        for (std::size_t k = 0; k < want.size(); ++k) near(what, static_cast<std::int64_t>(k), got[k], want[k], scale);
    }
};

template <class Body>
void on_grid(int q, Body body) {
    std::vector<Mismatch> found(static_cast<std::size_t>(q * q));
    loom::comm::ThreadWorld(q * q).run([&](ThreadComm& comm) {
        loom::tp::Grid2D<ThreadComm> grid(comm);
        const nn::TensorGrid view = grid.view();
        body(view, GridPosition::of(comm.rank(), q * q), found[static_cast<std::size_t>(comm.rank())]);
    });
    for (int r = 0; r < q * q; ++r) {
        INFO("q " << q << ", rank " << r);
        CHECK(found[static_cast<std::size_t>(r)].first == "");
    }
}

// Block (i, j) of a whole [B, T, C] activation: sequences i, features j
// (features as `groups` equal blocks, each cut alike).
std::vector<float> block(const std::vector<float>& whole, std::int64_t B, std::int64_t T, std::int64_t C, GridPosition at,
                         std::int64_t groups = 1) {
    const std::int64_t b = B / at.q, per_group = C / groups, c = per_group / at.q;
    std::vector<float> out;
    for (std::int64_t s = at.i * b; s < (at.i + 1) * b; ++s)
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t g = 0; g < groups; ++g)
                for (std::int64_t f = 0; f < c; ++f)
                    out.push_back(whole[static_cast<std::size_t>((s * T + t) * C + g * per_group + at.j * c + f)]);
    return out;
}

std::vector<float> random(std::int64_t n, std::uint64_t stream, float offset = 0) {
    std::vector<float> v(static_cast<std::size_t>(n));
    loom::RngStream{seed, stream}.fill_normal(v, 0);
    for (float& x : v) x += offset;
    return v;
}

std::vector<float> copy(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

// Every gradient of `mine` (a grid shard) against the whole layer's at the
// same place in the whole tensor.
template <class L>
void compare_grads(const L& mine, const L& whole, Mismatch& found) {
    std::vector<const Param*> wholes;
    loom::reflect::visit_params(whole, [&](const Param& p, std::string_view) { wholes.push_back(&p); });
    std::size_t at = 0;
    loom::reflect::visit_params(mine, [&](const Param& p, std::string_view name) {
        const Param& w = *wholes[at++];
        float scale = 0;
        for (std::int64_t k = 0; k < w.numel(); ++k) scale = std::max(scale, std::abs(w.grad.data<float>()[k]));
        for (std::int64_t k = 0; k < p.numel(); ++k)
            found.near(std::string(name) + ".grad", k, p.grad.data<float>()[k], w.grad.data<float>()[p.full_index(k)],
                       scale);
    });
}

// A layer taking [B, T, in] to [B, T, out] (its output features in
// `out_groups` blocks): the whole layer's output, input gradient and weight
// gradients, then each grid rank's blocks of them.
template <class Make, class Shard>
void check_layer(int q, Make make, Shard shard, std::int64_t B, std::int64_t T, std::int64_t in, std::int64_t out,
                 std::int64_t out_groups = 1) {
    auto whole = make();
    nn::ParamArena whole_arena(whole);
    whole_arena.initialize(whole, seed);
    const auto x = random(B * T * in, 1, 0.5f), dy = random(B * T * out, 2);
    nn::Context whole_ctx;
    const auto y_whole = copy(nn::forward(whole, whole_ctx, Tensor::of(const_cast<float*>(x.data()), {B, T, in})));
    whole_arena.zero_grads();
    const auto dx_whole = copy(nn::backward(whole, whole_ctx, Tensor::of(const_cast<float*>(dy.data()), {B, T, out})));

    on_grid(q, [&](const nn::TensorGrid& grid, GridPosition at, Mismatch& found) {
        auto mine = make();
        shard(mine, at);
        nn::ParamArena arena(mine);
        arena.initialize(mine, seed);
        arena.zero_grads();
        nn::Context ctx;
        ctx.set_tensor_grid(&grid);
        auto x_mine = block(x, B, T, in, at), dy_mine = block(dy, B, T, out, at, out_groups);
        const Tensor y = nn::forward(mine, ctx, Tensor::of(x_mine.data(), {B / q, T, in / q}));
        found.all_near("y", y.data<float>(), block(y_whole, B, T, out, at, out_groups));
        const Tensor dx = nn::backward(mine, ctx, Tensor::of(dy_mine.data(), {B / q, T, out / q}));
        found.all_near("dx", dx.data<float>(), block(dx_whole, B, T, in, at));
        compare_grads(mine, whole, found);
    });
}

// A model whose widths divide by 2 and by 3.
loom::gpt::Config grid_model(int q) {
    return q == 3 ? loom::gpt::Config{.layers = 2, .width = 36, .heads = 3, .seq = 8, .vocab = 66}
                  : loom::gpt::Config{.layers = 2, .width = 32, .heads = 4, .seq = 8, .vocab = 64};
}

}  // namespace

TEST_CASE("a 2D cut keeps each block's place in the whole tensor and its serial values", "[parallel][tp][2d]") {
    const Param whole{Shape{18, 9}, loom::Init::normal(1.0f)};  // 3 blocks of 6 rows, as q, k, v
    std::vector<float> serial(static_cast<std::size_t>(whole.numel()));
    loom::initialize_shard(whole, "w", seed, serial);
    for (int q : {1, 3}) {
        for (int rank = 0; rank < q * q; ++rank) {
            const GridPosition at = GridPosition::of(rank, q * q);
            Param shard = whole;
            loom::tp::split_param(shard, 0, at.i, q, "w", 3, loom::CutAxis::grid_row);
            loom::tp::split_param(shard, 1, at.j, q, "w", 1, loom::CutAxis::grid_column);
            INFO("rank " << rank << " of " << q << " x " << q << ": " << shard);
            std::vector<float> mine(static_cast<std::size_t>(shard.numel()));
            loom::initialize_shard(shard, "w", seed, mine);
            const std::int64_t rows = shard.shape[0], cols = shard.shape[1], per_group = rows / 3;
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t c = 0; c < cols; ++c) {
                    const std::int64_t gr = r / per_group * 6 + at.i * per_group + r % per_group;
                    const std::int64_t gc = at.j * cols + c;
                    REQUIRE(shard.full_index(r * cols + c) == gr * 9 + gc);
                    REQUIRE(mine[static_cast<std::size_t>(r * cols + c)] == serial[static_cast<std::size_t>(gr * 9 + gc)]);
                }
        }
    }
    Param cut = whole;
    loom::tp::split_param(cut, 0, 1, 3, "w", 3, loom::CutAxis::grid_row);
    loom::tp::split_param(cut, 1, 2, 3, "w", 1, loom::CutAxis::grid_column);
    std::ostringstream text;
    text << cut;
    CHECK(text.str() == "Param(f32, [6, 3] of [18, 9] from 2 along dim 0 in each of 3 blocks, from 6 along dim 1, "
                        "normal(mean=0, std=1))");
    CHECK(loom_test::message_of([&] { loom::tp::split_param(cut, 1, 0, 3, "w"); })
              .starts_with("w is already a shard (Param(f32, [6, 3] of [18, 9]"));
}

TEST_CASE("Optimus 2D layers equal the whole layers, forward and backward, at q = 2 and 3", "[parallel][tp][2d]") {
    for (int q : {2, 3}) {
        SECTION("Linear, q " + std::to_string(q)) {
            check_layer(q, [] { return nn::Linear::make(12, 18, loom::Init::normal(0.3f)); },
                        [](nn::Linear& l, GridPosition at) { loom::tp::shard_grid(l, at); }, 6, 2, 12, 18);
        }
        SECTION("Linear in q, k, v blocks, q " + std::to_string(q)) {
            check_layer(q, [] { return nn::Linear::make(12, 36, loom::Init::normal(0.3f)); },
                        [](nn::Linear& l, GridPosition at) { loom::tp::shard_grid(l, at, 3); }, 6, 2, 12, 36, 3);
        }
        SECTION("LayerNorm, q " + std::to_string(q)) {
            // gain and shift away from 1 and 0, so their gradients are checked through.
            check_layer(q, [] {
                            auto ln = nn::LayerNorm::make(12);
                            ln.gain.init = loom::Init::normal(0.5f, 1.0f);
                            ln.shift.init = loom::Init::normal(0.5f);
                            return ln;
                        },
                        [](nn::LayerNorm& l, GridPosition at) { loom::tp::shard_grid(l, at); }, 6, 2, 12, 12);
        }
        SECTION("CausalSelfAttention, q " + std::to_string(q)) {
            check_layer(q, [] { return nn::CausalSelfAttention::make(12, 6, 0.3f, 0.3f); },
                        [](nn::CausalSelfAttention& l, GridPosition at) { loom::tp::shard_grid(l, at); }, 6, 5, 12,
                        12);
        }
    }
}

TEST_CASE("Optimus 2D embedding and head + loss equal the whole layers at q = 2 and 3", "[parallel][tp][2d]") {
    constexpr std::int64_t B = 6, T = 4, C = 12, V = 18;
    std::vector<std::int32_t> tokens(B * T), targets(B * T);
    for (std::size_t k = 0; k < tokens.size(); ++k) {
        tokens[k] = static_cast<std::int32_t>((k * 7 + 3) % V);
        targets[k] = static_cast<std::int32_t>((k * 5 + 1) % V);
    }
    const Tensor tokens_t = Tensor::of(tokens.data(), {B, T}), targets_t = Tensor::of(targets.data(), {B, T});
    for (int q : {2, 3}) {
        SECTION("Embedding, q " + std::to_string(q)) {
            auto whole = nn::Embedding::make(V, 5, C, 0.5f);
            nn::ParamArena whole_arena(whole);
            whole_arena.initialize(whole, seed);
            nn::Context whole_ctx;
            const auto y_whole = copy(nn::forward(whole, whole_ctx, tokens_t));
            const auto dy = random(B * T * C, 3);
            whole_arena.zero_grads();
            (void)nn::backward(whole, whole_ctx, Tensor::of(const_cast<float*>(dy.data()), {B, T, C}));
            on_grid(q, [&](const nn::TensorGrid& grid, GridPosition at, Mismatch& found) {
                auto mine = nn::Embedding::make(V, 5, C, 0.5f);
                loom::tp::shard_grid(mine, at);
                nn::ParamArena arena(mine);
                arena.initialize(mine, seed);
                arena.zero_grads();
                nn::Context ctx;
                ctx.set_tensor_grid(&grid);
                const Tensor y = nn::forward(mine, ctx, tokens_t);
                found.all_near("y", y.data<float>(), block(y_whole, B, T, C, at));
                auto dy_mine = block(dy, B, T, C, at);
                (void)nn::backward(mine, ctx, Tensor::of(dy_mine.data(), {B / q, T, C / q}));
                compare_grads(mine, whole, found);
            });
        }
        SECTION("head Linear + CrossEntropy, q " + std::to_string(q)) {
            struct Head {
                nn::Linear head;
                nn::CrossEntropy loss;
            };
            const auto make = [] { return Head{nn::Linear::make(C, V, loom::Init::normal(0.5f), false), {}}; };
            auto whole = make();
            nn::ParamArena whole_arena(whole);
            whole_arena.initialize(whole, seed);
            const auto x = random(B * T * C, 4);
            nn::Context whole_ctx;
            whole_ctx.set_targets(targets_t);
            const float loss_whole =
                *nn::forward(whole, whole_ctx, Tensor::of(const_cast<float*>(x.data()), {B, T, C})).data<float>();
            whole_arena.zero_grads();
            float one = 1.0f;
            const auto dx_whole = copy(nn::backward(whole, whole_ctx, Tensor::of(&one, {1})));
            on_grid(q, [&](const nn::TensorGrid& grid, GridPosition at, Mismatch& found) {
                auto mine = make();
                loom::tp::shard_model_grid(mine, at.i * at.q + at.j, at.q * at.q);
                nn::ParamArena arena(mine);
                arena.initialize(mine, seed);
                arena.zero_grads();
                nn::Context ctx;
                ctx.set_tensor_grid(&grid);
                ctx.set_targets(targets_t);
                auto x_mine = block(x, B, T, C, at);
                const float loss = *nn::forward(mine, ctx, Tensor::of(x_mine.data(), {B / q, T, C / q})).data<float>();
                found.near("loss", 0, loss, loss_whole, loss_whole);
                const Tensor dx = nn::backward(mine, ctx, Tensor::of(&one, {1}));
                found.all_near("dx", dx.data<float>(), block(dx_whole, B, T, C, at));
                compare_grads(mine, whole, found);
            });
        }
    }
}

TEST_CASE("the GPT cut by tp::shard_model_grid has the whole model's loss and gradients", "[parallel][tp][2d]") {
    for (int q : {2, 3}) {
        const auto config = grid_model(q);
        const std::int64_t B = 6;
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * config.seq)), targets(tokens.size());
        for (std::size_t k = 0; k < tokens.size(); ++k) {
            tokens[k] = static_cast<std::int32_t>((k * 11 + 5) % 64);
            targets[k] = static_cast<std::int32_t>((k * 13 + 2) % 64);
        }
        const Tensor tokens_t = Tensor::of(tokens.data(), {B, config.seq});
        const Tensor targets_t = Tensor::of(targets.data(), {B, config.seq});
        auto whole = loom::gpt::make_model(config);
        nn::ParamArena whole_arena(whole);
        whole_arena.initialize(whole, seed);
        whole_arena.zero_grads();
        nn::Context whole_ctx;
        const float loss_whole = nn::forward_backward(whole, whole_ctx, tokens_t, targets_t);
        on_grid(q, [&](const nn::TensorGrid& grid, GridPosition at, Mismatch& found) {
            auto mine = loom::gpt::make_model(config);
            // embed, 2 x (2 LayerNorms, attention, 2 Linears), ln_f, head, loss
            const int cut = loom::tp::shard_model_grid(mine, at.i * at.q + at.j, at.q * at.q);
            if (cut != 14) found.first = loom::detail::concat("shard_model_grid cut ", cut, " layers, not 14");
            nn::ParamArena arena(mine);
            arena.initialize(mine, seed);
            arena.zero_grads();
            nn::Context ctx;
            ctx.set_tensor_grid(&grid);
            const float loss = nn::forward_backward(mine, ctx, tokens_t, targets_t);
            found.near("loss", 0, loss, loss_whole, loss_whole);
            compare_grads(mine, whole, found);
        });
    }
}

TEST_CASE("Optimus 2D refuses what does not fit its grid, in one line", "[parallel][tp][2d]") {
    auto model = loom::gpt::make_model({.layers = 1, .width = 32, .heads = 4, .seq = 8, .vocab = 64});
    CHECK(loom_test::message_of([&] { (void)loom::tp::shard_model_grid(model, 0, 6); }) ==
          "Optimus 2D: a tp axis of 6 ranks is not a square grid; use 4 or 9 ranks (q x q)");
    auto heads = loom::gpt::make_model({.layers = 1, .width = 36, .heads = 4, .seq = 8, .vocab = 66});
    CHECK(loom_test::message_of([&] { (void)loom::tp::shard_model_grid(heads, 0, 9); }) ==
          "CausalSelfAttention: the 4 heads do not split over the q = 3 columns of the Optimus 2D grid; use a grid "
          "side that divides 4");
    auto vocab = loom::gpt::make_model({.layers = 1, .width = 36, .heads = 3, .seq = 8, .vocab = 64});
    CHECK(loom_test::message_of([&] { (void)loom::tp::shard_model_grid(vocab, 0, 9); }) ==
          "Embedding: the grid side q = 3 does not divide the vocabulary of 64 tokens; use a q that divides 64");
    auto width = nn::LayerNorm::make(32);
    CHECK(loom_test::message_of([&] { loom::tp::shard_grid(width, GridPosition::of(0, 9)); }) ==
          "LayerNorm of 32 features (Optimus 2D): tp degree 3 does not divide dimension 0 of [32] (32); use a degree "
          "that divides 32");
    class Opaque {  // not an aggregate: reflection cannot see inside it
    public:
        [[nodiscard]] Tensor forward(nn::Context&, const Tensor& x) { return x; }

    private:
        int calls_ = 0;
    };
    struct WithOpaque {
        nn::Linear fc;
        Opaque odd;
    };
    WithOpaque odd{nn::Linear::make(4, 4), {}};
    CHECK(loom_test::message_of([&] { (void)loom::tp::shard_model_grid(odd, 0, 4); }).find("has no 2D form") !=
          std::string::npos);
    // A user layer that computes itself, with a Param the walk would leave
    // whole while its forward saw a block: refused, not run wrong.
    struct RowScale {
        Param gain{Shape{4}, loom::Init::ones()};
        [[nodiscard]] Tensor forward(nn::Context&, const Tensor& x) { return x; }
        [[nodiscard]] Tensor backward_input(nn::Context&, const Tensor& dy) { return dy; }
    };
    struct WithLeaf {
        nn::Linear fc;
        RowScale scale;
    };
    WithLeaf leaf{nn::Linear::make(4, 4), {}};
    CHECK(loom_test::message_of([&] { (void)loom::tp::shard_model_grid(leaf, 0, 4); }).find("has no 2D form") !=
          std::string::npos);
    std::ostringstream strategy;
    strategy << loom::Strategy<loom::DataParallel<>, loom::Optimus2D>{};
    CHECK(strategy.str().find("Optimus2D") != std::string::npos);
    STATIC_REQUIRE(loom::Strategy<loom::Optimus2D>::tensor_grid);
    STATIC_REQUIRE(!loom::Strategy<loom::TensorParallel>::tensor_grid);
}

TEST_CASE("an Optimus 2D embedding refuses a batch the grid rows cannot split", "[parallel][tp][2d]") {
    std::vector<std::string> messages(4);
    loom::comm::ThreadWorld(4).run([&](ThreadComm& comm) {
        loom::tp::Grid2D<ThreadComm> grid(comm);
        const nn::TensorGrid view = grid.view();
        auto embed = nn::Embedding::make(8, 4, 8);
        loom::tp::shard_grid(embed, GridPosition::of(comm.rank(), 4));
        nn::ParamArena arena(embed);
        arena.initialize(embed, seed);
        nn::Context ctx;
        ctx.set_tensor_grid(&view);
        std::vector<std::int32_t> tokens(3 * 4, 1);
        messages[static_cast<std::size_t>(comm.rank())] =
            loom_test::message_of([&] { (void)nn::forward(embed, ctx, Tensor::of(tokens.data(), {3, 4})); });
    });
    for (const auto& m : messages)
        CHECK(m == "Embedding: a batch of 3 sequences does not split over the 2 rows of the Optimus 2D grid; use a "
                   "batch that is a multiple of 2");
}

TEST_CASE("Optimus 2D layers without a grid, and a bad target on one grid row, fail in one line on every rank",
          "[parallel][tp][2d]") {
    auto lone = nn::Linear::make(4, 4);
    loom::tp::shard_grid(lone, GridPosition::of(0, 4));
    nn::Context no_grid;
    std::vector<float> x(2 * 2, 1.0f);
    CHECK(loom_test::message_of([&] { (void)lone.forward(no_grid, Tensor::of(x.data(), {2, 2})); }) ==
          "Linear: cut for an Optimus 2D grid but the context has no grid; run it through an executor whose strategy "
          "has Optimus2D");

    // Row 5 (of grid row 1's block) names a class that does not exist: every
    // rank of both grid rows refuses it, before any collective.
    constexpr std::int64_t B = 4, T = 2, C = 4, V = 6;
    std::vector<std::int32_t> targets(B * T, 1);
    targets[5] = 99;
    std::vector<std::string> messages(4);
    loom::comm::ThreadWorld(4).run([&](ThreadComm& comm) {
        loom::tp::Grid2D<ThreadComm> grid(comm);
        const nn::TensorGrid view = grid.view();
        struct Head {
            nn::Linear head;
            nn::CrossEntropy loss;
        } mine{nn::Linear::make(C, V, loom::Init::normal(0.5f), false), {}};
        loom::tp::shard_model_grid(mine, comm.rank(), 4);
        nn::ParamArena arena(mine);
        arena.initialize(mine, seed);
        nn::Context ctx;
        ctx.set_tensor_grid(&view);
        ctx.set_targets(Tensor::of(targets.data(), {B, T}));
        std::vector<float> x_mine(B / 2 * T * C / 2, 0.5f);
        messages[static_cast<std::size_t>(comm.rank())] = loom_test::message_of(
            [&] { (void)nn::forward(mine, ctx, Tensor::of(x_mine.data(), {B / 2, T, C / 2})); });
    });
    for (const auto& m : messages) CHECK(m == "cross_entropy: target 99 at row 5 is outside the classes [0, 6)");
}

TEST_CASE("the executor refuses micro-batches the Optimus 2D grid rows cannot split, on every rank",
          "[parallel][tp][2d]") {
    std::vector<std::string> messages(4);
    loom::comm::ThreadWorld(4).run([&](ThreadComm& comm) {
        loom::comm::Mesh<ThreadComm> mesh(comm, {{"dp", 1}, {"tp", 4}});
        auto model = loom::gpt::make_model(grid_model(2));
        auto exec = loom::exec::Executor<ThreadComm>::make<loom::Strategy<loom::DataParallel<>, loom::Optimus2D>>(
            model, mesh, {.micro_batches = 2});
        exec.initialize(seed);
        std::vector<std::int32_t> tokens(6 * 8, 1);
        messages[static_cast<std::size_t>(comm.rank())] = loom_test::message_of([&] {
            (void)exec.step(Tensor::of(tokens.data(), {6, 8}), Tensor::of(tokens.data(), {6, 8}), 1e-3f);
        });
    });
    for (const auto& m : messages)
        CHECK(m == "Executor::step: micro-batches of 3 sequences do not split over the 2 rows of the Optimus 2D "
                   "grid; use rows per micro-batch that are a multiple of 2");
}

}  // namespace LOOM_TEST_FILE
