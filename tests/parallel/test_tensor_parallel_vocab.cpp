// Vocabulary parallelism, Megatron 1D: an Embedding whose token table is cut
// by rows and a column-split head Linear feeding a vocabulary-parallel
// CrossEntropy, over 2 and 4 rank threads, compute the whole layers' outputs,
// loss and gradients (each rank's rows of the sliced ones) with no rank ever
// holding the whole table or a whole row of logits; tokens and targets both
// spread over every rank's slice and all on one rank's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
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
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

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

// A language model's two vocabulary ends back to back (GPT's head has no bias).
struct Ends {
    nn::Embedding embed;
    nn::Linear head;
    nn::CrossEntropy loss;
};
Ends make_ends() {
    return {make_embedding(), nn::Linear::make(width, vocab, loom::Init::normal(1.0f), /*with_bias=*/false), {}};
}

// Ids on every rank's slice of the vocabulary (all 16, some twice, for 2 and 4
// ranks alike), or all on the last rank's (the top quarter of the vocabulary
// is inside the last slice for 2 ranks and for 4).
std::vector<std::int32_t> ids_on(bool every_rank) {
    std::vector<std::int32_t> ids(rows);
    for (std::int64_t i = 0; i < rows; ++i)
        ids[static_cast<std::size_t>(i)] =
            static_cast<std::int32_t>(every_rank ? (i * 7 + 3) % vocab : vocab - 1 - i % 4);
    return ids;
}

std::vector<float> copy(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

// The whole gradient's element for element k of a (possibly sliced) Param.
float whole_at(const loom::Param& mine, const std::vector<float>& whole, std::int64_t k) {
    return whole[static_cast<std::size_t>(mine.full_index(k))];
}

// Catch2 v2's assertions and INFO are not thread-safe (concurrent ones from
// rank threads corrupt its state, now and then the heap), so a rank thread
// notes its first mismatch here and the test thread reports it.
class Findings {
public:
    // Passes when |got - want| <= max(margin, relative * |want|): exact by default.
    void compare(const char* what, std::int64_t k, double got, double want, double margin = 0, double relative = 0) {
        if (!first_.empty() || std::abs(got - want) <= std::max(margin, relative * std::abs(want))) return;
        std::ostringstream out;
        out.precision(9);
        out << what << '[' << k << "] = " << got << ", the whole layer's " << want;
        first_ = out.str();
    }
    [[nodiscard]] const std::string& first() const noexcept { return first_; }  // empty: all matched

private:
    std::string first_;
};

// Gradients: the bound of Approx(...).margin(1e-6) with its default relative
// tolerance (about 1e-5); the loss: 1e-6 relative.
constexpr double margin = 1e-6, relative = 1e-5, loss_relative = 1e-6;

// Runs `body(comm, findings)` on `degree` rank threads, then reports each rank's first mismatch.
template <class Body>
void on_ranks(int degree, const std::string& what, Body body) {
    std::vector<Findings> found(static_cast<std::size_t>(degree));
    loom::comm::ThreadWorld(degree).run(
        [&](loom::comm::ThreadComm& comm) { body(comm, found[static_cast<std::size_t>(comm.rank())]); });
    for (int r = 0; r < degree; ++r) {
        INFO(what << ": tp " << degree << ", rank " << r);
        CHECK(found[static_cast<std::size_t>(r)].first() == "");
    }
}

}  // namespace

TEST_CASE("a vocabulary-parallel Embedding equals the whole Embedding in output and gradients", "[parallel][tp]") {
    std::vector<float> dy(rows * width);
    loom::RngStream{8, 3}.fill_normal(dy, 0);
    for (const bool every_rank : {true, false}) {
        const auto ids = ids_on(every_rank);
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
            on_ranks(degree, every_rank ? "ids on every rank" : "ids on the last rank",
                     [&](loom::comm::ThreadComm& comm, Findings& f) {
                const int r = comm.rank();
                nn::Embedding mine = make_embedding();
                loom::tp::shard(mine, r, degree);
                f.compare("vocab_parallel()", 0, mine.vocab_parallel(), 1);
                f.compare("token rows", 0, static_cast<double>(mine.vocab()), static_cast<double>(vocab / degree));
                f.compare("position rows", 0, static_cast<double>(mine.max_sequence()), static_cast<double>(positions));
                nn::ParamArena arena(mine);
                arena.initialize(mine, seed);
                const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
                nn::Context ctx;
                ctx.set_tensor_group(&group);
                const Tensor y = nn::forward(mine, ctx, tokens);
                arena.zero_grads();
                // dy is whole on every rank, as the replicated layers after it leave it.
                (void)nn::backward(mine, ctx, Tensor::of(dy.data(), {B, T, width}));
                // Exact: each token's row comes from one rank and the others add
                // zeros, then the position row is added as the whole layer adds it.
                for (std::int64_t k = 0; k < rows * width; ++k)
                    f.compare("y", k, y.data<float>()[k], y_whole[static_cast<std::size_t>(k)]);
                for (std::int64_t k = 0; k < mine.token.numel(); ++k)
                    f.compare("token grad", k, mine.token.grad.data<float>()[k], whole_at(mine.token, dtoken_whole, k));
                for (std::int64_t k = 0; k < mine.position.numel(); ++k)
                    f.compare("position grad", k, mine.position.grad.data<float>()[k],
                              dposition_whole[static_cast<std::size_t>(k)]);
            });
        }
    }
}

TEST_CASE("a column-split head and a vocabulary-parallel CrossEntropy give the whole loss and gradients",
          "[parallel][tp]") {
    std::vector<float> x(rows * width);
    loom::RngStream{9, 4}.fill_normal(x, 0);
    const Tensor input = Tensor::of(x.data(), {B, T, width});
    float one = 1.0f;
    for (const bool every_rank : {true, false}) {
        const auto targets = ids_on(every_rank);
        const Tensor target = Tensor::of(targets.data(), {B, T});
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
            on_ranks(degree, every_rank ? "targets on every rank" : "targets on the last rank",
                     [&](loom::comm::ThreadComm& comm, Findings& f) {
                const int r = comm.rank();
                Head mine = make_head();
                loom::tp::shard_vocab_head(mine.head, mine.loss, r, degree);
                f.compare("head outputs", 0, static_cast<double>(mine.head.out()), static_cast<double>(vocab / degree));
                f.compare("vocab_start", 0, static_cast<double>(mine.loss.vocab_start),
                          static_cast<double>(r * (vocab / degree)));
                nn::ParamArena arena(mine);
                arena.initialize(mine, seed);
                const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
                nn::Context ctx;
                ctx.set_tensor_group(&group);
                ctx.set_targets(target);
                const Tensor loss = nn::forward(mine, ctx, input);
                arena.zero_grads();
                // The head's f sums each rank's part of the input gradient.
                const Tensor dx = nn::backward(mine, ctx, Tensor::of(&one, {1}));
                f.compare("loss", 0, ctx.loss(), loss_whole, 0, loss_relative);
                f.compare("returned loss", 0, *loss.data<float>(), ctx.loss());
                for (std::int64_t k = 0; k < rows * width; ++k)
                    f.compare("dx", k, dx.data<float>()[k], dx_whole[static_cast<std::size_t>(k)], margin, relative);
                for (std::int64_t k = 0; k < mine.head.weight.numel(); ++k)
                    f.compare("weight grad", k, mine.head.weight.grad.data<float>()[k],
                              whole_at(mine.head.weight, dw_whole, k), margin, relative);
                for (std::int64_t k = 0; k < mine.head.bias.numel(); ++k)
                    f.compare("bias grad", k, mine.head.bias.grad.data<float>()[k],
                              whole_at(mine.head.bias, db_whole, k), margin, relative);
            });
        }
    }
}

TEST_CASE("a vocabulary-parallel CrossEntropy reduces the whole row's max for logits hundreds apart",
          "[parallel][tp]") {
    // Each rank's logits sit near its own level, hundreds apart: e^(x - max)
    // is finite only against the whole row's max, and a rank that kept its own
    // would add terms of a different scale into the sum.
    constexpr std::int64_t n = 3;
    const float levels[4] = {-250.0f, 120.0f, 300.0f, -40.0f};
    std::vector<float> logits(n * vocab);
    std::vector<std::int32_t> targets{2, 9, 15};
    for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t j = 0; j < vocab; ++j)
            logits[static_cast<std::size_t>(i * vocab + j)] =
                levels[j / 4] + 0.5f * static_cast<float>((i * 5 + j * 3) % 7);
    float one = 1.0f;
    nn::CrossEntropy whole;
    nn::Context whole_ctx;
    whole_ctx.set_targets(Tensor::of(targets.data(), {n}));
    (void)whole.forward(whole_ctx, Tensor::of(logits.data(), {n, vocab}));
    const float loss_whole = whole_ctx.loss();
    const auto dlogits_whole = copy(whole.backward_input(whole_ctx, Tensor::of(&one, {1})));
    REQUIRE(std::isfinite(loss_whole));
    for (int degree : {2, 4}) {
        on_ranks(degree, "logits hundreds apart", [&](loom::comm::ThreadComm& comm, Findings& f) {
            const int r = comm.rank();
            const std::int64_t V = vocab / degree, start = r * V;
            std::vector<float> mine(static_cast<std::size_t>(n * V));
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t j = 0; j < V; ++j)
                    mine[static_cast<std::size_t>(i * V + j)] = logits[static_cast<std::size_t>(i * vocab + start + j)];
            nn::CrossEntropy loss{start};
            const nn::TensorGroupOf<loom::comm::ThreadComm> group(comm);
            nn::Context ctx;
            ctx.set_tensor_group(&group);
            ctx.set_targets(Tensor::of(targets.data(), {n}));
            (void)loss.forward(ctx, Tensor::of(mine.data(), {n, V}));
            const Tensor dlogits = loss.backward_input(ctx, Tensor::of(&one, {1}));
            f.compare("loss", 0, ctx.loss(), loss_whole, 0, loss_relative);
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t j = 0; j < V; ++j)
                    f.compare("dlogits", i * vocab + start + j, dlogits.data<float>()[i * V + j],
                              dlogits_whole[static_cast<std::size_t>(i * vocab + start + j)], margin, relative);
        });
    }
}

TEST_CASE("a model's two vocabulary ends both sharded train as the whole model", "[parallel][tp]") {
    // Embedding -> head -> loss: the head's f hands the embedding a whole,
    // replicated dy, so its position gradient is the whole one on every rank.
    const auto ids = ids_on(true), targets = ids_on(false);
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
        on_ranks(degree, "embedding, head and loss", [&](loom::comm::ThreadComm& comm, Findings& f) {
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
            f.compare("loss", 0, nn::forward_backward(mine, ctx, tokens, target), loss_whole, 0, loss_relative);
            for (std::int64_t k = 0; k < mine.embed.token.numel(); ++k)
                f.compare("token grad", k, mine.embed.token.grad.data<float>()[k],
                          whole_at(mine.embed.token, dtoken, k), margin, relative);
            for (std::int64_t k = 0; k < mine.embed.position.numel(); ++k)
                f.compare("position grad", k, mine.embed.position.grad.data<float>()[k],
                          dposition[static_cast<std::size_t>(k)], margin, relative);
            for (std::int64_t k = 0; k < mine.head.weight.numel(); ++k)
                f.compare("head grad", k, mine.head.weight.grad.data<float>()[k],
                          whole_at(mine.head.weight, dhead, k), margin, relative);
        });
    }
}

TEST_CASE("tp degree 1 leaves the vocabulary ends whole bit for bit", "[parallel][tp]") {
    const auto ids = ids_on(true);
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
    CHECK(std::vector<float>(a.grads().begin(), a.grads().end()) ==
          std::vector<float>(b.grads().begin(), b.grads().end()));
}

TEST_CASE("vocabulary sharding refuses what does not divide and says what is missing in one line",
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
    CHECK(fresh.split == nn::Split::none);  // nor is the head cut

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
        loss_messages[r] =
            loom_test::message_of([&] { (void)head.loss.forward(ctx, Tensor::of(logits.data(), {2, 8})); });
    });
    for (const auto& m : messages)
        CHECK(m == "embedding: token id 16 at batch 0, position 1 is outside the vocabulary [0, 16)");
    for (const auto& m : loss_messages) CHECK(m == "cross_entropy: target 16 at row 1 is outside the classes [0, 16)");
}

}  // namespace LOOM_TEST_FILE
