// Kraken served with a KV cache (infer/cached_kraken.hpp): prefill logits
// equal the model's full forward; cached greedy generation equals re-running
// the whole sequence every step, token for token, with every sub-layer on one
// rank (N = 2 and 4) and with tp = 2 and 4 rank threads (each rank its own
// sub-layers, the all-reduce overlapping the next layer's attention), also
// without the overlap; mixed-length requests continuously batched (a finished
// request's slot refilled at the next step, prompts prefilled beside decodes)
// give each request's own tokens; so does the non-blocking pipeline at pp 2,
// and at pp 2 x tp 2; as a speculative target (a GPT drafting) it
// gives its own greedy tokens, vanilla and with CaPE's trees; bad
// shards, stages and caches are named.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <loom/comm/any_comm.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>

#include "loom/gpt/kraken.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/cached_kraken.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/sampler.hpp"
#include "loom/infer/speculative.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "infer/kraken_serving_suite.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::infer::CachedKraken;

using loom_test::TinyKraken;

std::vector<float> full_last_logits(TinyKraken& kraken, const std::vector<std::int32_t>& tokens) {
    loom::nn::Context ctx;
    const auto T = static_cast<std::int64_t>(tokens.size());
    const loom::Tensor logits = loom::gpt::logits(kraken.model, ctx, loom::Tensor::of(tokens.data(), {1, T}));
    const float* last = logits.data<float>() + (T - 1) * kraken.config.vocab;
    return {last, last + kraken.config.vocab};
}

std::vector<std::int32_t> greedy_by_recomputing(TinyKraken& kraken, std::vector<std::int32_t> tokens, std::int64_t count) {
    std::vector<std::int32_t> out;
    for (std::int64_t k = 0; k < count; ++k) {
        const std::int32_t chosen = loom::infer::argmax(full_last_logits(kraken, tokens));
        out.push_back(chosen);
        tokens.push_back(chosen);
    }
    return out;
}

struct Job {
    std::vector<std::int32_t> prompt;
    std::int64_t new_tokens;
};

const std::vector<Job> jobs{{loom_test::prompt_of(7, 40, 1), 9},  {loom_test::prompt_of(3, 40, 2), 5},
                            {loom_test::prompt_of(12, 40, 3), 6}, {loom_test::prompt_of(1, 40, 4), 11},
                            {loom_test::prompt_of(5, 40, 5), 4}};

// Greedy continuous batching over `engine` with its cache's slots, by the
// Batcher every engine shares (infer/generate.hpp): a finished request's slot
// is taken at the next step.
std::vector<loom::infer::Request> greedy_requests(const std::vector<Job>& work) {
    std::vector<loom::infer::Request> requests;
    for (const Job& job : work) requests.push_back(loom_test::request(job.prompt, job.new_tokens, /*greedy=*/true));
    return requests;
}

std::vector<std::vector<std::int32_t>> serve(CachedKraken& engine, const std::vector<Job>& work) {
    std::vector<std::vector<std::int32_t>> out;
    for (loom::infer::Completion& done : loom::infer::generate(engine, greedy_requests(work)))
        out.push_back(std::move(done.tokens));
    return out;
}

std::vector<std::vector<std::int32_t>> expected(TinyKraken& kraken) {
    std::vector<std::vector<std::int32_t>> out;
    for (const Job& job : jobs) out.push_back(greedy_by_recomputing(kraken, job.prompt, job.new_tokens));
    return out;
}

// Every rank's tokens for `jobs` on a tp group of `tp` rank threads, 2 slots.
std::vector<std::vector<std::vector<std::int32_t>>> serve_on_threads(TinyKraken& kraken, int tp, bool overlap) {
    const std::vector<loom::infer::Request> requests = greedy_requests(jobs);
    std::vector<std::vector<std::vector<std::int32_t>>> per_rank(static_cast<std::size_t>(tp));
    loom::comm::ThreadWorld(tp).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::AnyComm group = loom::comm::AnyComm::view(comm);
        for (loom::infer::Completion& done : loom_test::serve_kraken_on(group, kraken, requests, 2, overlap))
            per_rank[static_cast<std::size_t>(group.rank())].push_back(std::move(done.tokens));
    });
    return per_rank;
}

}  // namespace

TEST_CASE("Kraken's cached prefill equals its full forward", "[infer][kraken]") {
    for (std::int64_t degree : {2, 4}) {
        TinyKraken kraken(degree);
        auto cache = loom::infer::kraken_cache(kraken.config, 1, 1, kraken.config.seq);
        CachedKraken engine(kraken.model, kraken.config, cache);
        const auto prompt = loom_test::prompt_of(13, 40, 9);
        const auto cached = engine.prefill(0, prompt);
        const auto full = full_last_logits(kraken, prompt);
        CHECK(loom_test::max_relative_difference(cached, full) < 1e-4);
    }
}

TEST_CASE("Kraken's cached greedy generation on one rank equals recomputation, mixed lengths batched",
          "[infer][kraken]") {
    for (std::int64_t degree : {2, 4}) {
        DYNAMIC_SECTION("N = " << degree << ", every sub-layer on one rank") {
            TinyKraken kraken(degree);
            auto cache = loom::infer::kraken_cache(kraken.config, 1, 2, kraken.config.seq, 4);
            CachedKraken engine(kraken.model, kraken.config, cache);
            CHECK(serve(engine, jobs) == expected(kraken));
        }
    }
}

TEST_CASE("Kraken served over tp = 2 and 4 rank threads equals recomputation on every rank", "[infer][kraken][tp]") {
    struct Case {
        std::int64_t degree;
        int tp;
        bool overlap;
    };
    for (const Case c : {Case{2, 2, true}, Case{4, 4, true}, Case{4, 2, true}, Case{2, 2, false}}) {
        DYNAMIC_SECTION("N = " << c.degree << ", tp " << c.tp << (c.overlap ? ", overlapped" : ", blocking")) {
            TinyKraken kraken(c.degree);
            const auto reference = expected(kraken);
            const auto per_rank = serve_on_threads(kraken, c.tp, c.overlap);
            for (const auto& tokens : per_rank) CHECK(tokens == reference);
        }
    }
}

TEST_CASE("Kraken through the Batcher at tp 2: greedy and seeded mixed batches give the whole model's completions",
          "[infer][kraken][tp]") {
    TinyKraken kraken(4);
    for (const bool greedy : {true, false}) {
        const auto batch = loom_test::mixed_batch(greedy);
        const auto expected = loom_test::serve_kraken_whole(kraken, batch, 2);
        std::vector<std::vector<loom::infer::Completion>> per_rank(2);
        loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
            loom::comm::AnyComm group = loom::comm::AnyComm::view(comm);
            per_rank[static_cast<std::size_t>(group.rank())] = loom_test::serve_kraken_on(group, kraken, batch, 2);
        });
        for (const auto& got : per_rank)
            for (std::size_t i = 0; i < batch.size(); ++i) {
                INFO((greedy ? "greedy" : "sampled") << " request " << i);
                CHECK(got[i].tokens == expected[i].tokens);
                CHECK(got[i].finish == expected[i].finish);
            }
    }
}

TEST_CASE("Kraken served pipeline-parallel (pp 2, and pp 2 x tp 2) gives the whole model's completions",
          "[infer][kraken][pp]") {
    TinyKraken kraken(2, /*layers=*/4);
    for (const bool greedy : {true, false}) {
        const auto batch = loom_test::mixed_batch(greedy);
        const auto expected = loom_test::serve_kraken_whole(kraken, batch, 2);
        for (const int tp : {1, 2}) {
            std::vector<std::vector<loom::infer::Completion>> got(static_cast<std::size_t>(2 * tp));
            loom::comm::ThreadWorld(2 * tp).run([&](loom::comm::ThreadComm& comm) {
                loom::comm::Mesh<loom::comm::ThreadComm> mesh(comm, {{"pp", 2}, {"tp", tp}});
                loom::comm::AnyComm pp = loom::comm::AnyComm::view(mesh.axis("pp"));
                loom::comm::AnyComm group = loom::comm::AnyComm::view(mesh.axis("tp"));
                got[static_cast<std::size_t>(comm.rank())] =
                    loom_test::serve_kraken_pipelined_on(pp, tp == 1 ? nullptr : &group, kraken, batch, 2);
            });
            for (std::size_t rank = 0; rank < got.size(); ++rank) {
                INFO((greedy ? "greedy" : "sampled") << ", tp " << tp << ", rank " << rank);
                REQUIRE(got[rank].size() == expected.size());
                for (std::size_t i = 0; i < expected.size(); ++i) {
                    INFO("request " << i);
                    CHECK(got[rank][i].tokens == expected[i].tokens);
                    CHECK(got[rank][i].finish == expected[i].finish);
                }
            }
        }
    }
}

TEST_CASE("Kraken as a speculative target gives its own greedy tokens, vanilla and with CaPE's trees",
          "[infer][kraken][speculative]") {
    TinyKraken kraken(2);
    const std::vector<loom::infer::Request> requests = greedy_requests(jobs);
    const std::vector<std::vector<std::int32_t>> want = expected(kraken);
    auto cache = loom::infer::kraken_cache(kraken.config, 1, 5, kraken.config.seq, 4);
    CachedKraken target(kraken.model, kraken.config, cache);
    const loom::gpt::Config draft_config{.layers = 1, .width = 16, .heads = 2, .seq = kraken.config.seq,
                                         .vocab = kraken.config.vocab};
    loom_test::ScaledGpt draft_model(draft_config, 3, 8.0f);
    loom::infer::KvCache draft_cache(draft_config.layers, draft_config.width, 5, draft_config.seq, 4);
    loom::infer::CachedGpt draft(draft_model.model, draft_config, draft_cache);
    const loom::infer::CapeConfig cape{.thresholds = {0.9}, .alternatives = {8, 8}};
    for (const bool with_cape : {false, true}) {
        const auto got = with_cape ? loom::infer::speculative_generate(target, draft, requests, 3, cape)
                                   : loom::infer::speculative_generate(target, draft, requests, 3);
        REQUIRE(got.size() == want.size());
        std::int64_t drafted = 0, alternatives = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
            INFO((with_cape ? "CaPE" : "vanilla") << ", request " << i);
            CHECK(got[i].tokens == want[i]);
            drafted += got[i].stats.drafted;
            alternatives += got[i].stats.alternatives;
        }
        CHECK(drafted > 0);
        // CaPE's tree decided some tokens: an accepted path went through an alternative.
        if (with_cape) CHECK(alternatives > 0);
    }
}

TEST_CASE("Kraken serving names a shard or cache that does not fit", "[infer][kraken]") {
    TinyKraken kraken(4);
    CHECK(loom_test::message_of([&] { (void)loom::infer::kraken_serving_shard(kraken.config, 0, 3); }) ==
          "kraken_serving_shard: a tp group of 3 ranks does not divide the 4 sub-layers per layer; use a divisor of 4");
    auto wrong = loom::infer::kraken_cache(kraken.config, 2, 1, 8);
    CHECK(loom_test::message_of([&] { CachedKraken engine(kraken.model, kraken.config, wrong); }) ==
          "CachedKraken: the cache is for 6 layers of width 8 but this rank needs 12 of width 8; build it with "
          "kraken_cache(config, 1, ...)");
    // Pipeline stages: layers outside the model, a whole model or a whole cache given for a stage.
    CHECK(loom_test::message_of([&] {
              (void)loom::infer::kraken_stage_model(kraken.config, loom::infer::PipelineStage{1, 2, 2, 2});
          }) == "kraken_stage_model: layers [2, 4) are not in the model's 3; build the stage with "
                "pipeline_stage(config.gpt(), stage, stages)");
    const loom::infer::PipelineStage first = loom::infer::pipeline_stage(kraken.config.gpt(), 0, 3);
    auto whole_cache = loom::infer::kraken_cache(kraken.config, 1, 1, 8);
    CHECK(loom_test::message_of([&] { CachedKraken engine(kraken.model, kraken.config, whole_cache, first); }) ==
          "CachedKraken: the model has 3 layers but pipeline stage 0 of 3 holds 1; build it with kraken_stage_model "
          "for that stage");
    auto stage = loom::infer::kraken_stage_model(kraken.config, first);
    loom::nn::ParamArena arena(stage);
    loom::infer::load_kraken_shard(stage, kraken.config, 0, kraken.arena.values(), first);
    CHECK(loom_test::message_of([&] { CachedKraken engine(stage, kraken.config, whole_cache, first); }) ==
          "CachedKraken: the cache is for 12 layers of width 8 but this rank needs 4 of width 8; build it with "
          "kraken_cache(config, where, 1, ...)");
    auto stage_cache = loom::infer::kraken_cache(kraken.config, first, 1, 1, 8);
    CachedKraken engine(stage, kraken.config, stage_cache, first);
    const std::vector<std::int32_t> tokens{1, 2, 3};
    const loom::infer::Segment segment{0, tokens};
    CHECK(loom_test::message_of([&] { (void)engine.forward(std::span(&segment, 1)); }) ==
          "CachedKraken: forward on pipeline stage 0 of 3; a stage runs forward_stage with the hidden rows of the "
          "stage before");
}

}  // namespace LOOM_TEST_FILE
