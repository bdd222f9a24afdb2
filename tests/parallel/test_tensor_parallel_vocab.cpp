// Vocabulary parallelism, Megatron 1D: an Embedding whose token table is cut
// by rows and a column-split head Linear feeding a vocabulary-parallel
// CrossEntropy, over 2 and 4 rank threads, compute the whole layers' outputs,
// loss and gradients (each rank's rows of the sliced ones) with no rank ever
// holding the whole table or a whole row of logits; targets and tokens both
// spread over every rank's slice and all on one rank's.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/core/rng.hpp>
#include <loom/nn/compose.hpp>
#include <loom/nn/cross_entropy.hpp>
#include <loom/nn/embedding.hpp>
#include <loom/nn/linear.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/parallel/tensor_parallel_vocab.hpp>

#include "support/message_of.hpp"

namespace nn = loom::nn;
using loom::Tensor;

namespace {

constexpr std::uint64_t seed = 17;
constexpr std::int64_t vocab = 16, positions = 6, width = 8, B = 4, T = 5, rows = B * T;

nn::Embedding make_embedding() { return nn::Embedding::make(vocab, positions, width, 0.5f); }

// The vocabulary projection and its loss; a large init spreads the logits, so
// the row maxima differ from rank to rank and the max reduction matters.
struct Head {
    nn::Linear head;
    nn::CrossEntropy loss;
};
Head make_head() { return {nn::Linear::make(width, vocab, loom::Init::normal(1.0f)), {}}; }

// A language model's two vocabulary ends back to back.
struct Ends {
    nn::Embedding embed;
    nn::Linear head;
    nn::CrossEntropy loss;
};
Ends make_ends() {
    return {make_embedding(), nn::Linear::make(width, vocab, loom::Init::normal(1.0f), /*with_bias=*/false), {}};
}

// Ids that fall on every rank's slice of the vocabulary (all 16, some twice,
// for 2 and 4 ranks alike), and ids all on the last rank's slice (the top
// quarter is inside the last slice for 2 ranks and for 4).
std::vector<std::int32_t> spread_ids() {
    std::vector<std::int32_t> ids(rows);
    for (std::int64_t i = 0; i < rows; ++i) ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7 + 3) % vocab);
    return ids;
}
std::vector<std::int32_t> last_rank_ids() {
    std::vector<std::int32_t> ids(rows);
    for (std::int64_t i = 0; i < rows; ++i) ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(vocab - 1 - i % 4);
    return ids;
}

std::vector<float> copy(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

// The whole gradient's element for element k of a (possibly sliced) Param.
float whole_at(const loom::Param& mine, const std::vector<float>& whole, std::int64_t k) {
    return whole[static_cast<std::size_t>(mine.full_index(k))];
}

}  // namespace

TEST_CASE("a vocabulary-parallel Embedding equals the whole Embedding, output and gradients", "[parallel][tp]") {
    std::vector<float> dy(rows * width);
    loom::RngStream{8, 3}.fill_normal(dy, 0);
    for (const auto& ids : {spread_ids(), last_rank_ids()}) {
        const Tensor tokens = Tensor::of(ids.data(), {B, T});
        nn::Embedding whole = make_embedding();
        nn::ParamArena whole_arena(whole);
        whole_arena.initialize(whole, seed);
        nn::Context whole_ctx;
        const auto y_whole = copy(nn::forward(whole, whole_ctx, tokens));
        whole_arena.zero_grads();
        (void)nn::backward(whole, whole_ctx, Tensor::of(dy.data(), {B, T, width}));
        const auto dtoken_whole = copy(whole.token.grad), dposition_whole = copy(whole.position.grad);

        for (int degree : {2, 4}) {
            loom::comm::ThreadWorld(degree).run([&](loom::comm::ThreadComm& comm) {
                const int r = comm.rank();
                nn::Embedding mine = make_embedding();
                loom::tp::shard(mine, r, degree);
                REQUIRE(mine.vocab_parallel());
                REQUIRE(mine.vocab() == vocab / degree);
                REQUIRE(mine.position.shape == whole.position.shape);  // replicated, whole
                nn::ParamArena arena(mine);
                arena.initialize(mine, seed);
                const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
                nn::Context ctx;
                ctx.set_tensor_group(&group);
                const Tensor y = nn::forward(mine, ctx, tokens);
                arena.zero_grads();
                // dy is whole on every rank, as the replicated layers after it leave it.
                (void)nn::backward(mine, ctx, Tensor::of(dy.data(), {B, T, width}));
                INFO("tp " << degree << ", rank " << r << (ids == spread_ids() ? ", spread ids" : ", ids on the last rank"));
                // Exact: each token's row comes from one rank and the others add
                // zeros, then the position row is added as the whole layer adds it.
                for (std::int64_t k = 0; k < rows * width; ++k) REQUIRE(y.data<float>()[k] == y_whole[static_cast<std::size_t>(k)]);
                for (std::int64_t k = 0; k < mine.token.numel(); ++k)
                    REQUIRE(mine.token.grad.data<float>()[k] == whole_at(mine.token, dtoken_whole, k));
                for (std::int64_t k = 0; k < mine.position.numel(); ++k)
                    REQUIRE(mine.position.grad.data<float>()[k] == dposition_whole[static_cast<std::size_t>(k)]);
            });
        }
    }
}

TEST_CASE("a column-split head and a vocabulary-parallel CrossEntropy give the whole loss and gradients",
          "[parallel][tp]") {
    std::vector<float> x(rows * width);
    loom::RngStream{9, 4}.fill_normal(x, 0);
    const Tensor input = Tensor::of(x.data(), {B, T, width});
    for (const auto& targets : {spread_ids(), last_rank_ids()}) {
        const Tensor target = Tensor::of(targets.data(), {B, T});
        float one = 1.0f;
        Head whole = make_head();
        nn::ParamArena whole_arena(whole);
        whole_arena.initialize(whole, seed);
        nn::Context whole_ctx;
        whole_ctx.set_targets(target);
        (void)nn::forward(whole, whole_ctx, input);
        const float loss_whole = whole_ctx.loss();
        whole_arena.zero_grads();
        const auto dx_whole = copy(nn::backward(whole, whole_ctx, Tensor::of(&one, {1})));
        const auto dw_whole = copy(whole.head.weight.grad), db_whole = copy(whole.head.bias.grad);

        for (int degree : {2, 4}) {
            loom::comm::ThreadWorld(degree).run([&](loom::comm::ThreadComm& comm) {
                const int r = comm.rank();
                Head mine = make_head();
                loom::tp::shard_vocab_head(mine.head, mine.loss, r, degree);
                REQUIRE(mine.head.out() == vocab / degree);
                REQUIRE(mine.loss.vocab_start == r * (vocab / degree));
                nn::ParamArena arena(mine);
                arena.initialize(mine, seed);
                const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
                nn::Context ctx;
                ctx.set_tensor_group(&group);
                ctx.set_targets(target);
                const Tensor loss = nn::forward(mine, ctx, input);
                arena.zero_grads();
                const Tensor dx = nn::backward(mine, ctx, Tensor::of(&one, {1}));
                INFO("tp " << degree << ", rank " << r << (targets == spread_ids() ? ", spread targets" : ", targets on the last rank"));
                REQUIRE(ctx.loss() == Approx(loss_whole).epsilon(1e-6));
                REQUIRE(*loss.data<float>() == ctx.loss());
                for (std::int64_t k = 0; k < rows * width; ++k)
                    REQUIRE(dx.data<float>()[k] == Approx(dx_whole[static_cast<std::size_t>(k)]).margin(1e-6));
                for (std::int64_t k = 0; k < mine.head.weight.numel(); ++k)
                    REQUIRE(mine.head.weight.grad.data<float>()[k] == Approx(whole_at(mine.head.weight, dw_whole, k)).margin(1e-6));
                for (std::int64_t k = 0; k < mine.head.bias.numel(); ++k)
                    REQUIRE(mine.head.bias.grad.data<float>()[k] == Approx(whole_at(mine.head.bias, db_whole, k)).margin(1e-6));
            });
        }
    }
}

TEST_CASE("a model's two vocabulary ends, both sharded, train as the whole model", "[parallel][tp]") {
    // Embedding -> head -> loss: the head's f hands the embedding a whole,
    // replicated dy, so its position gradient is the whole one on every rank.
    const auto ids = spread_ids(), targets = last_rank_ids();
    const Tensor tokens = Tensor::of(ids.data(), {B, T}), target = Tensor::of(targets.data(), {B, T});
    Ends whole = make_ends();
    nn::ParamArena whole_arena(whole);
    whole_arena.initialize(whole, seed);
    nn::Context whole_ctx;
    whole_arena.zero_grads();
    const float loss_whole = nn::forward_backward(whole, whole_ctx, tokens, target);
    const auto dtoken = copy(whole.embed.token.grad), dposition = copy(whole.embed.position.grad),
               dhead = copy(whole.head.weight.grad);
    for (int degree : {2, 4}) {
        loom::comm::ThreadWorld(degree).run([&](loom::comm::ThreadComm& comm) {
            const int r = comm.rank();
            Ends mine = make_ends();
            loom::tp::shard(mine.embed, r, degree);
            loom::tp::shard_vocab_head(mine.head, mine.loss, r, degree);
            nn::ParamArena arena(mine);
            arena.initialize(mine, seed);
            const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
            nn::Context ctx;
            ctx.set_tensor_group(&group);
            arena.zero_grads();
            const float loss = nn::forward_backward(mine, ctx, tokens, target);
            INFO("tp " << degree << ", rank " << r);
            REQUIRE(loss == Approx(loss_whole).epsilon(1e-6));
            for (std::int64_t k = 0; k < mine.embed.token.numel(); ++k)
                REQUIRE(mine.embed.token.grad.data<float>()[k] == Approx(whole_at(mine.embed.token, dtoken, k)).margin(1e-6));
            for (std::int64_t k = 0; k < mine.embed.position.numel(); ++k)
                REQUIRE(mine.embed.position.grad.data<float>()[k] == Approx(dposition[static_cast<std::size_t>(k)]).margin(1e-6));
            for (std::int64_t k = 0; k < mine.head.weight.numel(); ++k)
                REQUIRE(mine.head.weight.grad.data<float>()[k] == Approx(whole_at(mine.head.weight, dhead, k)).margin(1e-6));
        });
    }
}

TEST_CASE("tp degree 1 leaves the vocabulary ends whole, bit for bit", "[parallel][tp]") {
    const auto ids = spread_ids();
    const Tensor tokens = Tensor::of(ids.data(), {B, T});
    Ends whole = make_ends(), one = make_ends();
    loom::tp::shard(one.embed, 0, 1);
    loom::tp::shard_vocab_head(one.head, one.loss, 0, 1);
    CHECK_FALSE(one.embed.vocab_parallel());
    CHECK_FALSE(one.loss.vocab_parallel());
    CHECK(one.head.split == nn::Split::none);
    nn::ParamArena a(whole), b(one);
    a.initialize(whole, seed);
    b.initialize(one, seed);
    nn::Context ca, cb;  // no tensor group: a degree-1 layer needs none
    a.zero_grads();
    b.zero_grads();
    CHECK(nn::forward_backward(whole, ca, tokens, tokens) == nn::forward_backward(one, cb, tokens, tokens));
    CHECK(std::vector<float>(a.grads().begin(), a.grads().end()) == std::vector<float>(b.grads().begin(), b.grads().end()));
}

TEST_CASE("vocabulary sharding refuses what does not divide, and says what is missing, in one line",
          "[parallel][tp]") {
    auto embed = nn::Embedding::make(64, 8, 4);
    CHECK(loom_test::message_of([&] { loom::tp::shard(embed, 0, 3); }) ==
          "Embedding: tp degree 3 does not divide the vocabulary of 64 tokens; use a degree that divides 64");
    auto head = nn::Linear::make(4, 64);
    nn::CrossEntropy loss;
    CHECK(loom_test::message_of([&] { loom::tp::shard_vocab_head(head, loss, 2, 3); }) ==
          "Linear 4 -> 64 (vocabulary head): tp degree 3 does not divide the vocabulary of 64 tokens; use a degree "
          "that divides 64");
    CHECK_FALSE(loss.vocab_parallel());  // a refused cut leaves the loss whole
    loom::tp::shard(embed, 1, 2);
    CHECK(loom_test::message_of([&] { loom::tp::shard(embed, 1, 2); })
              .starts_with("Embedding token table is already a shard"));
    loom::tp::shard_vocab_head(head, loss, 1, 2);
    CHECK(loss.vocab_start == 32);
    nn::CrossEntropy again{32};
    auto fresh = nn::Linear::make(4, 64);
    CHECK(loom_test::message_of([&] { loom::tp::shard_vocab_head(fresh, again, 1, 2); }) ==
          "CrossEntropy: already vocabulary-parallel from class 32; shard a loss once");

    // Sharded layers run without a tensor-parallel group: refused by name.
    nn::ParamArena arena(embed);
    std::vector<std::int32_t> ids{1, 40};
    nn::Context ctx;
    CHECK(loom_test::message_of([&] { (void)embed.forward(ctx, Tensor::of(ids.data(), {1, 2})); }) ==
          "Embedding: its token table is a vocabulary shard but the context has no tensor-parallel group; run it "
          "through an executor with a tp axis");
    std::vector<float> logits(2 * 32, 0.0f);
    ctx.set_targets(Tensor::of(ids.data(), {2}));
    CHECK(loom_test::message_of([&] { (void)loss.forward(ctx, Tensor::of(logits.data(), {2, 32})); }) ==
          "CrossEntropy: vocabulary-parallel from class 32 but the context has no tensor-parallel group; run it "
          "through an executor with a tp axis");
}

TEST_CASE("vocabulary-parallel layers check ids against the whole vocabulary on every rank", "[parallel][tp]") {
    // A bad id throws on every rank before any collective, so none is left waiting.
    std::vector<std::int32_t> ids{3, 16};
    std::string messages[2], loss_messages[2];
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        const int r = comm.rank();
        nn::Embedding embed = make_embedding();
        loom::tp::shard(embed, r, 2);
        nn::ParamArena arena(embed);
        const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
        nn::Context ctx;
        ctx.set_tensor_group(&group);
        messages[r] = loom_test::message_of([&] { (void)embed.forward(ctx, Tensor::of(ids.data(), {1, 2})); });
        Head head = make_head();
        loom::tp::shard_vocab_head(head.head, head.loss, r, 2);
        std::vector<float> logits(2 * 8, 0.0f);
        ctx.set_targets(Tensor::of(ids.data(), {2}));
        loss_messages[r] = loom_test::message_of([&] { (void)head.loss.forward(ctx, Tensor::of(logits.data(), {2, 8})); });
    });
    for (const auto& m : messages)
        CHECK(m == "embedding: token id 16 at batch 0, position 1 is outside the vocabulary [0, 16)");
    for (const auto& m : loss_messages) CHECK(m == "cross_entropy: target 16 at row 1 is outside the classes [0, 16)");
}
