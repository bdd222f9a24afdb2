// Kraken served with a KV cache (infer/cached_kraken.hpp): prefill logits
// equal the model's full forward; cached greedy generation equals re-running
// the whole sequence every step, token for token, with every sub-layer on one
// rank (N = 2 and 4) and with tp = 2 and 4 rank threads (each rank its own
// sub-layers, the all-reduce overlapping the next layer's attention), also
// without the overlap; mixed-length requests continuously batched (a finished
// request's slot refilled at the next step, prompts prefilled beside decodes)
// give each request's own tokens; bad shards and caches are named.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <vector>

#include <loom/comm/any_comm.hpp>
#include <loom/comm/thread_world.hpp>

#include "loom/gpt/kraken.hpp"
#include "loom/infer/cached_kraken.hpp"
#include "loom/infer/sampler.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::infer::CachedKraken;
using loom::infer::Segment;

// A small random Kraken, its values scaled by 8 so greedy choices are
// clear-cut (as support/scaled_gpt.hpp does for the GPT).
struct TinyKraken {
    loom::gpt::KrakenConfig config;
    loom::gpt::KrakenModel model;
    loom::nn::ParamArena arena;

    explicit TinyKraken(std::int64_t degree)
        : config{.layers = 3, .width = 32, .heads = 4, .seq = 40, .vocab = 40, .degree = degree},
          model(loom::gpt::make_kraken(config)), arena(model) {
        arena.initialize(model, 21);
        for (float& v : arena.values()) v *= 8.0f;
    }
};

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

// Greedy continuous batching over `engine` with its cache's slots: each step
// one packed forward of the running requests' last tokens and the prompts of
// those that start now; a finished request's slot is taken at the next step.
std::vector<std::vector<std::int32_t>> serve(CachedKraken& engine, const std::vector<Job>& work) {
    loom::infer::KvCache& cache = engine.cache();
    std::vector<std::vector<std::int32_t>> out(work.size());
    std::vector<std::int64_t> running, slot_of(work.size(), -1), free_slots;
    for (std::int64_t s = cache.slots() - 1; s >= 0; --s) free_slots.push_back(s);
    std::size_t next = 0;
    std::vector<Segment> segments;
    while (next < work.size() || !running.empty()) {
        segments.clear();
        for (const std::int64_t r : running) segments.push_back({slot_of[static_cast<std::size_t>(r)], std::span(&out[static_cast<std::size_t>(r)].back(), 1)});
        while (next < work.size() && !free_slots.empty()) {
            slot_of[next] = free_slots.back();
            free_slots.pop_back();
            segments.push_back({slot_of[next], work[next].prompt});
            running.push_back(static_cast<std::int64_t>(next++));
        }
        const std::span<const float> logits = engine.forward(segments);
        const auto V = static_cast<std::size_t>(engine.config().vocab);
        std::vector<std::int64_t> still;
        for (std::size_t j = 0; j < running.size(); ++j) {
            const auto r = static_cast<std::size_t>(running[j]);
            out[r].push_back(loom::infer::argmax(logits.subspan(j * V, V)));
            if (static_cast<std::int64_t>(out[r].size()) < work[r].new_tokens) {
                still.push_back(running[j]);
            } else {
                cache.release(slot_of[r]);
                free_slots.push_back(slot_of[r]);
            }
        }
        running.swap(still);
    }
    return out;
}

std::vector<std::vector<std::int32_t>> expected(TinyKraken& kraken) {
    std::vector<std::vector<std::int32_t>> out;
    for (const Job& job : jobs) out.push_back(greedy_by_recomputing(kraken, job.prompt, job.new_tokens));
    return out;
}

// Every rank's tokens for `jobs` on a tp group of `tp` rank threads, 2 slots.
std::vector<std::vector<std::vector<std::int32_t>>> serve_on_threads(TinyKraken& kraken, int tp, bool overlap) {
    std::vector<std::vector<std::vector<std::int32_t>>> per_rank(static_cast<std::size_t>(tp));
    loom::comm::ThreadWorld(tp).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::AnyComm group = loom::comm::AnyComm::view(comm);
        auto shard = loom::infer::kraken_serving_shard(kraken.config, group.rank(), tp);
        loom::nn::ParamArena arena(shard);
        loom::infer::load_kraken_shard(shard, kraken.config, group.rank(), kraken.arena.values());
        auto cache = loom::infer::kraken_cache(kraken.config, tp, 2, kraken.config.seq, 4);
        CachedKraken engine(shard, kraken.config, cache, group, overlap);
        per_rank[static_cast<std::size_t>(group.rank())] = serve(engine, jobs);
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

TEST_CASE("Kraken serving names a shard or cache that does not fit", "[infer][kraken]") {
    TinyKraken kraken(4);
    CHECK(loom_test::message_of([&] { (void)loom::infer::kraken_serving_shard(kraken.config, 0, 3); }) ==
          "kraken_serving_shard: a tp group of 3 ranks does not divide the 4 sub-layers per layer; use a divisor of 4");
    auto wrong = loom::infer::kraken_cache(kraken.config, 2, 1, 8);
    CHECK(loom_test::message_of([&] { CachedKraken engine(kraken.model, kraken.config, wrong); }) ==
          "CachedKraken: the cache is for 6 layers of width 8 but this rank needs 12 of width 8; build it with "
          "kraken_cache(config, 1, ...)");
}

}  // namespace LOOM_TEST_FILE
