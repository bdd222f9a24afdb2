// CachedModel (include/loom/infer/cached_model.hpp), the KV-cached forward of
// any model composed from loom's layers: loom's GPT through it gives
// CachedGpt's logits bit for bit; a user's model of another shape (post-LN
// blocks in a std::array, a per-token layer of the user's own, three attention
// layers, no loss) generates by the cache exactly what re-running its whole
// sequence every step gives, alone, batched, continuously batched and sampled;
// cut by training's Megatron walker, it serves at tp 2 and 4 with tp 1's tokens;
// it drafts for a GPT target and is itself a speculative target (vanilla and
// CaPE) with its own greedy tokens; and every model or input the engine cannot
// run is refused in one line.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/cached_model.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/sampler.hpp"
#include "loom/infer/speculative.hpp"
#include "loom/parallel/tensor_parallel_model.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "infer/user_model_suite.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace nn = loom::nn;
using loom::Shape;
using loom::Tensor;
using loom::infer::CachedGpt;
using loom::infer::CachedModel;
using loom::infer::Completion;
using loom::infer::KvCache;
using loom::infer::Logits;
using loom::infer::Request;
using loom::infer::Segment;
using loom_test::message_of;
using loom_test::prompt_of;
using loom_test::user_model::C;
using loom_test::user_model::make_user_lm;
using loom_test::user_model::request;
using loom_test::user_model::ScaledUserLm;
using loom_test::user_model::T;
using loom_test::user_model::UserLm;
using loom_test::user_model::UserLmWithLoss;
using loom_test::user_model::V;

// The whole sequence through nn::forward: every position's logits.
std::vector<float> full_logits(UserLm& model, const std::vector<std::int32_t>& tokens) {
    nn::Context ctx;
    const auto n = static_cast<std::int64_t>(tokens.size());
    const Tensor logits = nn::forward(model, ctx, Tensor::of(tokens.data(), Shape{1, n}));
    return {logits.data<float>(), logits.data<float>() + n * V};
}

std::vector<std::int32_t> greedy_by_recomputing(UserLm& model, std::vector<std::int32_t> tokens, std::int64_t count) {
    std::vector<std::int32_t> out;
    for (std::int64_t k = 0; k < count; ++k) {
        const std::vector<float> logits = full_logits(model, tokens);
        const auto chosen = loom::infer::argmax(std::span(logits).last(static_cast<std::size_t>(V)));
        out.push_back(chosen);
        tokens.push_back(chosen);
    }
    return out;
}

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }


TEST_CASE("loom's GPT through CachedModel gives CachedGpt's logits bit for bit", "[infer][user-model]") {
    loom_test::ScaledGpt gpt({.layers = 2, .width = 32, .heads = 4, .seq = 40, .vocab = 40}, 5, 8.0f);
    const auto& config = gpt.config;
    KvCache a(config.layers, config.width, 3, 40, 8), b(config.layers, config.width, 3, 40, 8);
    CachedGpt reference(gpt.model, config, a);
    CachedModel<loom::gpt::Model> engine(gpt.model, b);
    CHECK(engine.attention_layers() == 2);
    CHECK(engine.vocab() == 40);
    const auto p0 = prompt_of(13, 40, 1), p1 = prompt_of(5, 40, 2), p2 = prompt_of(20, 40, 3);
    // Two prompts packed, every position's logits; then a third prompt beside their decode steps.
    const std::vector<Segment> prompts{{0, p0}, {1, p1}};
    CHECK(copy(engine.forward(prompts, Logits::every)) == copy(reference.forward(prompts, Logits::every)));
    const std::vector<std::int32_t> next{7, 9};
    const std::vector<Segment> mixed{{0, std::span(next).first(1)}, {2, p2}, {1, std::span(next).last(1)}};
    CHECK(copy(engine.forward(mixed)) == copy(reference.forward(mixed)));
    // A token tree (CaPE's verification) after slot 1's cached positions.
    const std::vector<std::int32_t> tree{3, 4, 5, 6}, parents{-1, 0, 0, 1};
    const std::vector<Segment> treed{{1, tree, parents}};
    CHECK(copy(engine.forward(treed, Logits::every)) == copy(reference.forward(treed, Logits::every)));
    CHECK(engine.work().attention_pairs == reference.work().attention_pairs);
    CHECK(engine.work().linear_flops == reference.work().linear_flops);
    CHECK(engine.work().linear_rows == reference.work().linear_rows);
}

TEST_CASE("a user's model: cached logits equal its full forward, and greedy generation equals recomputation",
          "[infer][user-model]") {
    ScaledUserLm<> user(11);
    KvCache cache(3, C, 4, T, 4);
    CachedModel<UserLm> engine(user.model, cache);
    REQUIRE(engine.attention_layers() == 3);

    SECTION("prefill in one piece and in chunks: every position's logits") {
        const auto prompt = prompt_of(19, V, 4);
        const std::vector<float> full = full_logits(user.model, prompt);
        const Segment whole{0, prompt};
        CHECK(loom_test::max_relative_difference(engine.forward(std::span(&whole, 1), Logits::every), full) < 1e-5);
        // Slot 1 takes the same prompt in chunks of 7, 1 and 11 tokens (the decode path for the 1).
        std::int64_t at = 0;
        for (const std::int64_t chunk : {7, 1, 11}) {
            const Segment piece{1, std::span(prompt).subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(chunk))};
            const auto got = engine.forward(std::span(&piece, 1), Logits::every);
            CHECK(loom_test::max_relative_difference(
                      got, std::span(full).subspan(static_cast<std::size_t>(at * V), static_cast<std::size_t>(chunk * V))) <
                  1e-5);
            at += chunk;
        }
    }

    SECTION("greedy, continuously batched: 5 requests of mixed lengths on 2 slots, each as if alone") {
        std::vector<Request> requests;
        for (std::int32_t i = 0; i < 5; ++i)
            requests.push_back(request(prompt_of(2 + 4 * i, V, i), 8 - i, /*greedy=*/true));
        KvCache two(3, C, 2, T, 4);
        CachedModel<UserLm> narrow(user.model, two);
        const std::vector<Completion> got = loom::infer::generate(narrow, requests);
        for (std::size_t i = 0; i < requests.size(); ++i)
            CHECK(got[i].tokens == greedy_by_recomputing(user.model, requests[i].prompt, requests[i].max_new_tokens));
        for (std::int64_t s = 0; s < two.slots(); ++s) CHECK(two.length(s) == 0);
    }

    SECTION("sampling: the same tokens for a seed, alone or beside other requests") {
        Request sampled = request(prompt_of(6, V, 9), 10, /*greedy=*/false);
        sampled.sampling.temperature = 1.3f;
        sampled.sampling.seed = 77;
        const auto alone = loom::infer::generate(engine, std::span(&sampled, 1));
        const std::vector<Request> crowd{request(prompt_of(11, V, 2), 5, false), sampled,
                                         request(prompt_of(3, V, 5), 12, false)};
        const auto together = loom::infer::generate(engine, crowd);
        CHECK(together[1].tokens == alone[0].tokens);
    }
}

TEST_CASE("a user's model cut by tp::shard_model serves at tp 2 and 4 with tp 1's completions on every rank",
          "[infer][user-model][tp]") {
    // Every kind of cut is served: the MLPs' column -> row pairs, the heads, the token table and the head.
    auto probe = make_user_lm<UserLmWithLoss>();
    const loom::tp::ShardSummary summary = loom::tp::shard_model(probe, 0, 2);
    CHECK(summary.linear_pairs == 2);
    CHECK(summary.attentions == 3);
    CHECK(summary.embeddings == 1);
    CHECK(summary.vocab_heads == 1);
    ScaledUserLm<UserLmWithLoss> whole(12);
    const std::vector<Request> requests = loom_test::user_model::mixed_requests();
    const std::vector<Completion> expected = loom_test::user_model::serve_whole(whole);
    for (const int degree : {2, 4}) {
        std::vector<std::vector<Completion>> got(static_cast<std::size_t>(degree));
        loom::comm::ThreadWorld(degree).run([&](loom::comm::ThreadComm& comm) {
            loom::comm::AnyComm tp = loom::comm::AnyComm::view(comm);
            got[static_cast<std::size_t>(tp.rank())] = loom_test::user_model::serve_on(tp);
        });
        for (std::size_t rank = 0; rank < got.size(); ++rank)
            for (std::size_t i = 0; i < requests.size(); ++i) {
                INFO("tp " << degree << ", rank " << rank << ", request " << i);
                CHECK(got[rank][i].tokens == expected[i].tokens);
            }
    }
    // The cut is checked: a shard without its group, and the whole model on a group.
    ScaledUserLm<UserLmWithLoss> rank0(12, 0, 2);
    KvCache half(3, C / 2, 2, T, 4);
    CHECK(message_of([&] { CachedModel<UserLmWithLoss> engine(rank0.model, half); }) ==
          "CachedModel: the Embedding at field path 0 is a tensor-parallel shard; give the engine its tp group, or "
          "serve the whole model");
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::AnyComm tp = loom::comm::AnyComm::view(comm);
        KvCache full(3, C, 2, T, 4);
        CHECK(message_of([&] { CachedModel<UserLmWithLoss> engine(whole.model, full, tp); }) ==
              loom::detail::concat("CachedModel: the Embedding at field path 0 is not rank ", tp.rank(),
                                   "'s Megatron cut for a tp group of 2; cut the model with tp::shard_model(model, ",
                                   tp.rank(), ", 2) before binding it"));
    });
}

// A model that does not start from token ids.
struct HeadFirst {
    nn::LayerNorm norm;
    nn::Embedding embed;
    nn::Linear head;
};

// Speculative completions against the plain ones, request by request; what the drafts did.
loom::infer::SpeculativeStats check_speculative(const std::vector<loom::infer::SpeculativeCompletion>& got,
                                               const std::vector<Completion>& expected) {
    REQUIRE(got.size() == expected.size());
    loom::infer::SpeculativeStats stats;
    for (std::size_t i = 0; i < got.size(); ++i) {
        INFO("request " << i);
        CHECK(got[i].tokens == expected[i].tokens);
        CHECK(got[i].finish == expected[i].finish);
        stats.drafted += got[i].stats.drafted;
        stats.accepted += got[i].stats.accepted;
    }
    CHECK(stats.drafted > 0);  // the draft did propose
    return stats;
}

// A model whose head does not give the vocabulary's logits.
struct WrongHead {
    nn::Embedding embed;
    nn::Residual<nn::LayerNorm, nn::CausalSelfAttention> attention;
    nn::Linear head;
};

TEST_CASE("a user's model as a speculative draft gives the target's greedy tokens", "[infer][user-model]") {
    // The target: loom's GPT with the user model's vocabulary and positions (a target is a CachedGpt).
    namespace um = loom_test::user_model;
    const loom::gpt::Config config{.layers = 2, .width = 32, .heads = 4, .seq = um::T, .vocab = um::V};
    loom_test::ScaledGpt target(config, 5, 8.0f);
    um::ScaledUserLm<um::UserLm> draft_model(9);
    std::vector<Request> requests = um::mixed_requests();
    for (Request& r : requests) r.sampling.greedy = true;
    const auto expected = loom::infer::generate(target.model, config, requests);
    loom::infer::KvCache target_cache(config.layers, config.width, 5, config.seq, 4);
    loom::infer::CachedGpt target_engine(target.model, config, target_cache);
    loom::infer::KvCache draft_cache(3, um::C, 5, um::T, 4);
    loom::infer::CachedModel<um::UserLm> draft_engine(draft_model.model, draft_cache);
    loom::infer::PlainDraft draft(draft_engine);
    (void)check_speculative(loom::infer::speculative_generate(target_engine, draft, requests, 3), expected);
}

TEST_CASE("a user's model as the speculative target gives its own greedy tokens: vanilla, CaPE, batched",
          "[infer][user-model]") {
    namespace um = loom_test::user_model;
    um::ScaledUserLm<um::UserLm> target_model(11);
    std::vector<Request> requests = um::mixed_requests();
    for (Request& r : requests) r.sampling.greedy = true;
    KvCache plain_cache(3, C, 2, T, 4);
    CachedModel<UserLm> plain(target_model.model, plain_cache);
    const std::vector<Completion> expected = loom::infer::generate(plain, requests);

    KvCache target_cache(3, C, 5, T, 4);
    CachedModel<UserLm> target(target_model.model, target_cache);
    SECTION("its own weights as the draft: every draft is accepted") {
        KvCache draft_cache(3, C, 5, T, 4);
        CachedModel<UserLm> draft(target_model.model, draft_cache);
        const auto stats = check_speculative(loom::infer::speculative_generate(target, draft, requests, 3), expected);
        CHECK(stats.accepted == stats.drafted);
    }
    SECTION("loom's GPT of the same vocabulary as the draft, vanilla and with CaPE's tree verification") {
        const loom::gpt::Config config{.layers = 1, .width = 16, .heads = 2, .seq = T, .vocab = V};
        loom_test::ScaledGpt draft_model(config, 3, 8.0f);
        KvCache draft_cache(config.layers, config.width, 5, config.seq, 4);
        CachedGpt draft(draft_model.model, config, draft_cache);
        (void)check_speculative(loom::infer::speculative_generate(target, draft, requests, 3), expected);
        const loom::infer::CapeConfig cape{.thresholds = {0.5}, .alternatives = {2, 1}};
        (void)check_speculative(loom::infer::speculative_generate(target, draft, requests, 2, cape), expected);
    }
}

TEST_CASE("models and inputs CachedModel cannot run are refused in one line", "[infer][user-model]") {
    {
        HeadFirst model{nn::LayerNorm::make(8), nn::Embedding::make(10, 8, 8), nn::Linear::make(8, 10)};
        nn::ParamArena arena(model);
        KvCache cache(1, 8, 1, 8);
        CHECK(message_of([&] { CachedModel<HeadFirst> engine(model, cache); }) ==
              "CachedModel: the model's first layer (field path 0) is not an nn::Embedding; the cached forward "
              "starts from token ids");
    }
    WrongHead model{nn::Embedding::make(10, 8, 8), {{nn::LayerNorm::make(8), nn::CausalSelfAttention::make(8, 2)}},
                    nn::Linear::make(8, 9)};
    KvCache cache(1, 8, 2, 8);
    CHECK(message_of([&] { CachedModel<WrongHead> engine(model, cache); }) ==
          "CachedModel: the Param at field path 0.0 is not bound; give the model a ParamArena (and load or "
          "initialise it) first");
    nn::ParamArena arena(model);
    arena.initialize(model, 1);
    KvCache two_layers(2, 8, 1, 8), narrow(1, 4, 1, 8), long_cache(1, 8, 1, 9);
    CHECK(message_of([&] { CachedModel<WrongHead> engine(model, two_layers); }) ==
          "CachedModel: the model has 1 CausalSelfAttention layers but the cache has 2; build the cache with one "
          "layer per attention layer");
    CHECK(message_of([&] { CachedModel<WrongHead> engine(model, narrow); }) ==
          "CachedModel: the attention at field path 1.1 has width 8 but the cache holds rows of width 4; build the "
          "cache with the attention layers' width (every one must have it)");
    CHECK(message_of([&] { CachedModel<WrongHead> engine(model, long_cache); }) ==
          "CachedModel: the cache holds 9 positions per slot but the Embedding has positions for 8; build the cache "
          "with capacity <= 8");
    CachedModel<WrongHead> engine(model, cache);
    const std::vector<std::int32_t> tokens{1, 2, 3};
    const Segment segment{0, tokens};
    CHECK(message_of([&] { (void)engine.forward(std::span(&segment, 1)); }) ==
          "CachedModel: the model's last layer gives 9 features per token but its Embedding has a vocabulary of 10; "
          "end the model with a head of 10 outputs (the logits)");
    CHECK(cache.length(0) == 0);  // a failed forward leaves the cache as it found it
    CHECK(cache.free_blocks() == cache.blocks());
    const std::vector<std::int32_t> outside{1, 10};
    const Segment bad{1, outside};
    CHECK(message_of([&] { (void)engine.forward(std::span(&bad, 1)); }) ==
          "CachedModel: token id 10 at position 1 of slot 1 is outside the vocabulary [0, 10)");
}

}  // namespace

}  // namespace LOOM_TEST_FILE
