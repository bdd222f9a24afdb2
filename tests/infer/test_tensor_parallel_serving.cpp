// Tensor-parallel serving (infer/tensor_parallel_gpt.hpp) on rank threads
// against the whole model on one (tp 1): prefill logits to float rounding and
// the same bits on every rank, greedy and seeded generation token for token
// at tp 2 and 4, alone and in mixed-length continuous batches, speculative
// decoding on a tp target, and every bad input named in one line. Catch2's macros are not thread-safe, so the rank
// threads only record what they got and the checks run after the world ends.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/speculative.hpp"
#include "loom/infer/tensor_parallel_gpt.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/parallel/tensor_parallel_vocab.hpp"
#include "infer/tensor_parallel_serving_suite.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::comm::AnyComm;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;
using loom::infer::CachedGpt;
using loom::infer::Completion;
using loom::infer::KvCache;
using loom::infer::Request;
using loom::infer::Segment;
using loom_test::max_relative_difference;
using loom_test::message_of;
using loom_test::prompt_of;
using loom_test::RankShard;
using loom_test::SmallGpt;
using loom_test::mixed_batch;
using loom_test::request;

// Runs body(rank's shard, its tp group) on `degree` rank threads.
void on_ranks(const SmallGpt& whole, int degree, const std::function<void(RankShard&, AnyComm&)>& body) {
    ThreadWorld(degree).run([&](ThreadComm& comm) {
        AnyComm tp = AnyComm::view(comm);
        RankShard shard(whole, tp.rank(), degree);
        body(shard, tp);
    });
}

// Every rank's completions for the requests, generated on a tp group.
std::vector<std::vector<Completion>> generate_on_ranks(const SmallGpt& whole, int degree,
                                                       const std::vector<Request>& requests, std::int64_t max_batch) {
    std::vector<std::vector<Completion>> got(static_cast<std::size_t>(degree));
    ThreadWorld(degree).run([&](ThreadComm& comm) {
        AnyComm tp = AnyComm::view(comm);
        got[static_cast<std::size_t>(tp.rank())] = loom_test::serve_on(tp, whole, requests, max_batch);
    });
    return got;
}

void check_same(const std::vector<Completion>& got, const std::vector<Completion>& expected) {
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].tokens == expected[i].tokens);
        CHECK(got[i].finish == expected[i].finish);
    }
}

}  // namespace

TEST_CASE("tp prefill logits equal tp 1's and are the same bits on every rank", "[infer][tp]") {
    SmallGpt whole(31);
    const auto a = prompt_of(3, 42, 1), b = prompt_of(13, 42, 2), c = prompt_of(8, 42, 3);
    const std::vector<Segment> packed{{2, a}, {0, b}, {1, c}};
    KvCache cache(whole.config.layers, whole.config.width, 3, whole.config.seq);
    CachedGpt engine(whole.model, whole.config, cache);
    const auto serial = engine.forward(packed);
    const std::vector<float> expected(serial.begin(), serial.end());
    const Segment again{0, std::span(a).first(2)};
    const auto every = engine.forward(std::span(&again, 1), loom::infer::Logits::every);  // slot 0 after b: 2 more
    const std::vector<float> expected_every(every.begin(), every.end());
    for (const int degree : {2, 4}) {
        std::vector<std::vector<float>> got(static_cast<std::size_t>(degree)), got_every(got.size());
        on_ranks(whole, degree, [&](RankShard& shard, AnyComm& tp) {
            KvCache mine = loom::infer::serving_cache(whole.config, degree, 3, whole.config.seq, 4);
            CachedGpt rank_engine(shard.model, whole.config, mine, tp);
            const auto logits = rank_engine.forward(packed);
            got[static_cast<std::size_t>(tp.rank())].assign(logits.begin(), logits.end());
            const auto rows = rank_engine.forward(std::span(&again, 1), loom::infer::Logits::every);
            got_every[static_cast<std::size_t>(tp.rank())].assign(rows.begin(), rows.end());
        });
        INFO("tp " << degree);
        REQUIRE(got[0].size() == expected.size());
        CHECK(max_relative_difference(got[0], expected) < 1e-5);
        CHECK(max_relative_difference(got_every[0], expected_every) < 1e-5);
        for (int r = 1; r < degree; ++r) {
            CHECK(got[static_cast<std::size_t>(r)] == got[0]);  // bit for bit: each logit is one rank's
            CHECK(got_every[static_cast<std::size_t>(r)] == got_every[0]);
        }
    }
}

TEST_CASE("greedy generation at tp 2 and tp 4 gives tp 1's tokens, alone and continuously batched", "[infer][tp]") {
    SmallGpt whole(32);
    auto& model = whole.model;
    const std::vector<Request> one{request(prompt_of(6, 42, 9), 24, true)};
    const auto single = loom::infer::generate(model, whole.config, one);
    const auto batch = mixed_batch(true);
    const auto batched = loom::infer::generate(model, whole.config, batch, 2);
    for (const int degree : {2, 4}) {
        INFO("tp " << degree);
        for (const auto& rank : generate_on_ranks(whole, degree, one, 0)) check_same(rank, single);
        for (const auto& rank : generate_on_ranks(whole, degree, batch, 2)) check_same(rank, batched);
    }
    // The batch really ran mixed: a stop token and length limits, tokens of every count asked.
    CHECK(batched[0].tokens.size() == 10);
    CHECK(batched[5].tokens.size() == 11);
}

TEST_CASE("sampled generation at tp 2 is reproducible and equals tp 1's for the same seeds", "[infer][tp]") {
    SmallGpt whole(33);
    const auto batch = mixed_batch(false);
    const auto serial = loom::infer::generate(whole.model, whole.config, batch, 3);
    const auto first = generate_on_ranks(whole, 2, batch, 3);
    const auto second = generate_on_ranks(whole, 2, batch, 0);  // another batch composition, the same seeds
    for (const auto& rank : first) check_same(rank, serial);
    for (const auto& rank : second) check_same(rank, serial);
    // Not all greedy: at temperature 4 some draw differs from the argmax.
    std::vector<Request> greedy = batch;
    for (Request& r : greedy) r.sampling.greedy = true;
    const auto argmax = loom::infer::generate(whole.model, whole.config, greedy, 3);
    bool differs = false;
    for (std::size_t i = 0; i < batch.size(); ++i) differs = differs || argmax[i].tokens != serial[i].tokens;
    CHECK(differs);
}

TEST_CASE("speculative decoding with a tp 2 target gives tp 1's tokens", "[infer][tp]") {
    // The target is sharded, the draft (another small GPT) whole on every rank: the ranks propose alike.
    SmallGpt target(35), draft(36);
    auto batch = mixed_batch(true);
    batch.resize(4);
    const auto greedy = loom::infer::generate(target.model, target.config, batch);
    std::vector<std::vector<std::vector<std::int32_t>>> got(2);
    ThreadWorld(2).run([&](ThreadComm& comm) {
        AnyComm tp = AnyComm::view(comm);
        RankShard shard(target, tp.rank(), 2);
        KvCache target_cache = loom::infer::serving_cache(target.config, 2, 4, target.config.seq);
        KvCache draft_cache(draft.config.layers, draft.config.width, 4, draft.config.seq);
        CachedGpt t(shard.model, target.config, target_cache, tp);
        CachedGpt d(draft.model, draft.config, draft_cache);
        for (const auto& c : loom::infer::speculative_generate(t, d, batch, 3))
            got[static_cast<std::size_t>(tp.rank())].push_back(c.tokens);
    });
    for (const auto& rank : got) {
        REQUIRE(rank.size() == greedy.size());
        for (std::size_t i = 0; i < rank.size(); ++i) CHECK(rank[i] == greedy[i].tokens);
    }
}

TEST_CASE("tensor-parallel serving names each bad input in one line", "[infer][tp]") {
    SmallGpt whole(34);
    const auto& config = whole.config;
    CHECK(message_of([&] { auto m = loom::gpt::make_model(config); loom::infer::shard_for_serving(m, 0, 3); }) ==
          "CausalSelfAttention: tp degree 3 does not divide the 4 heads; use a degree that divides 4");
    CHECK(message_of([&] { auto m = loom::gpt::make_model(config); loom::infer::shard_for_serving(m, 2, 2); }) ==
          "shard_for_serving: rank 2 is not in a tp group of 2 ranks; give a degree >= 1 and a rank in [0, 2)");
    CHECK(message_of([&] {
              auto m = loom::gpt::make_model(config);
              loom::nn::ParamArena bound(m);
              loom::infer::shard_for_serving(m, 0, 2);
          }) == "shard_for_serving: the model is already bound to a ParamArena; cut it first, then bind it");
    CHECK(message_of([&] {
              RankShard shard(whole, 0, 2);
              loom::infer::load_whole_values(shard.model, whole.arena.values().first(10));
          }) == "load_whole_values: 10 values given but the whole model has " + std::to_string(config.parameters()) +
                    "; give the whole model's values in serial order");
    CHECK(message_of([&] { (void)loom::infer::serving_cache(config, 3, 1, 8); }) ==
          "serving_cache: a tp group of 3 ranks does not divide the 4 heads; use a degree that divides 4");

    // A shard without its group, and the engine's checks on rank groups (rank 0's message).
    CHECK(message_of([&] {
              RankShard shard(whole, 0, 2);
              KvCache cache = loom::infer::serving_cache(config, 2, 1, 8);
              CachedGpt e(shard.model, config, cache);
          }) == "CachedGpt: block 0 is a tensor-parallel shard (2 of 4 heads); give the engine its tp group, or run "
                "the whole model");
    auto engine_message = [&](int degree, const std::function<void(AnyComm&, std::string&)>& body) {
        std::vector<std::string> said(static_cast<std::size_t>(degree));
        ThreadWorld(degree).run([&](ThreadComm& comm) {
            AnyComm tp = AnyComm::view(comm);
            body(tp, said[static_cast<std::size_t>(tp.rank())]);
        });
        return said[0];  // each rank names itself; every rank refused, or the others' collectives would hang
    };
    CHECK(engine_message(3, [&](AnyComm& tp, std::string& said) {
              said = message_of([&] {
                  KvCache cache(config.layers, config.width, 1, 8);
                  CachedGpt e(whole.model, config, cache, tp);
              });
          }) == "CachedGpt: a tp group of 3 ranks does not divide the 4 heads; use a degree that divides 4");
    CHECK(engine_message(2, [&](AnyComm& tp, std::string& said) {
              said = message_of([&] {
                  KvCache cache = loom::infer::serving_cache(config, 2, 1, 8);
                  CachedGpt e(whole.model, config, cache, tp);
              });
          }) == "CachedGpt: block 0 holds 4 of the 4 heads but rank 0 of a tp group of 2 serves 2; cut the model "
                "with infer::shard_for_serving(model, 0, 2) before binding it");
    CHECK(engine_message(2, [&](AnyComm& tp, std::string& said) {
              said = message_of([&] {
                  RankShard other(whole, 1 - tp.rank(), 2);  // the other rank's shard
                  KvCache cache = loom::infer::serving_cache(config, 2, 1, 8);
                  CachedGpt e(other.model, config, cache, tp);
              });
          }) == "CachedGpt: block 0 is rank 1's shard but this is rank 0 of the tp group; cut the model with "
                "infer::shard_for_serving(model, 0, 2) before binding it");
    CHECK(engine_message(2, [&](AnyComm& tp, std::string& said) {
              said = message_of([&] {
                  auto m = loom::gpt::make_model(config);
                  loom::infer::shard_for_serving(m, tp.rank(), 2);
                  loom::tp::shard(m.embed, tp.rank(), 2);  // training's vocabulary cut
                  loom::nn::ParamArena arena(m);
                  KvCache cache = loom::infer::serving_cache(config, 2, 1, 8);
                  CachedGpt e(m, config, cache, tp);
              });
          }) == "CachedGpt: the token embedding is cut by vocabulary (training's cut); serving keeps the embeddings "
                "and the head whole on every rank; cut the model with infer::shard_for_serving(model, 0, 2) before "
                "binding it");
    CHECK(engine_message(2, [&](AnyComm& tp, std::string& said) {
              said = message_of([&] {
                  RankShard shard(whole, tp.rank(), 2);
                  KvCache cache(config.layers, config.width, 1, 8);  // every head's width, not this rank's
                  CachedGpt e(shard.model, config, cache, tp);
              });
          }) == "CachedGpt: the cache is for 2 layers of width 32 but the model has 2 of width 32 (16 on each of 2 tp "
                "ranks)");
}

}  // namespace LOOM_TEST_FILE
