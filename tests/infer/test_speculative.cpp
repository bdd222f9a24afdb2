// Speculative decoding (include/loom/infer/speculative.hpp) and what it needs
// from the engine: logits at every position of a segment, and a cache slot
// cut back to fewer positions. Greedy speculative decoding returns the
// target's greedy tokens whatever the draft; sampled speculative decoding
// draws from the target's distribution (chi-square over seeded draws); the
// stats count what the draft got accepted; bad inputs are named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/speculative.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::infer::CachedGpt;
using loom::infer::KvCache;
using loom::infer::Logits;
using loom::infer::Request;
using loom::infer::Sampling;
using loom::infer::Segment;
using loom_test::max_relative_difference;
using loom_test::message_of;
using loom_test::prompt_of;

// A small random GPT of `vocab` tokens; weights scaled by `scale` (8 makes greedy choices clear-cut).
struct Gpt : loom_test::ScaledGpt {
    Gpt(std::int64_t vocab, std::uint64_t seed, float scale, std::int64_t layers = 2, std::int64_t width = 32)
        : ScaledGpt({.layers = layers, .width = width, .heads = 4, .seq = 32, .vocab = vocab}, seed, scale) {}
};

std::vector<double> softmax(std::span<const float> logits) {
    std::vector<double> p;
    loom::infer::sampling_probabilities(logits, Sampling{}, p);
    return p;
}

}  // namespace

TEST_CASE("Logits::every gives each position the logits a one-token-at-a-time run gives it", "[infer][speculative]") {
    Gpt gpt(40, 3, 8.0f);
    const auto tokens = prompt_of(13, 40, 1);
    // Every position of a 4-token prefill then a 9-token segment (rows and positions in blocks).
    KvCache all(2, 32, 1, 32, 4);
    CachedGpt engine(gpt.model, gpt.config, all);
    const Segment first{0, std::span(tokens).first(4)};
    const auto head = engine.forward(std::span(&first, 1), Logits::every);
    REQUIRE(head.size() == 4 * 40);
    std::vector<float> every(head.begin(), head.end());
    const Segment rest{0, std::span(tokens).subspan(4)};
    const auto tail = engine.forward(std::span(&rest, 1), Logits::every);
    REQUIRE(tail.size() == 9 * 40);
    every.insert(every.end(), tail.begin(), tail.end());
    KvCache one(2, 32, 1, 32, 4);
    CachedGpt stepper(gpt.model, gpt.config, one);
    for (std::size_t t = 0; t < tokens.size(); ++t) {
        const Segment s{0, std::span(tokens).subspan(t, 1)};
        const auto row = stepper.forward(std::span(&s, 1));
        CHECK(max_relative_difference(std::span<const float>(every).subspan(t * 40, 40), row) < 1e-5);
    }
    // Two segments packed: rows in segment order, the default still the last row of each.
    KvCache two(2, 32, 2, 32, 4);
    CachedGpt packed(gpt.model, gpt.config, two);
    const std::vector<Segment> both{{1, std::span(tokens).first(3)}, {0, std::span(tokens).first(2)}};
    const auto rows = packed.forward(both, Logits::every);
    REQUIRE(rows.size() == 5 * 40);
    CHECK(max_relative_difference(rows.subspan(4 * 40, 40), std::span<const float>(every).subspan(1 * 40, 40)) < 1e-5);
    CHECK(max_relative_difference(rows.subspan(2 * 40, 40), std::span<const float>(every).subspan(2 * 40, 40)) < 1e-5);
}

TEST_CASE("truncating a slot drops its last positions and returns the blocks it no longer needs",
          "[infer][speculative]") {
    KvCache cache(1, 4, 2, 16, 4, 6);
    cache.reserve(0, 10);  // blocks for 10 positions: 3
    cache.reserve(1, 3);   // 1
    REQUIRE(cache.free_blocks() == 2);
    for (std::int64_t t = 0; t < 10; ++t) cache.row(0, 0, t)[0] = static_cast<float>(t);
    cache.truncate(0, 9);  // still 3 blocks
    CHECK(cache.length(0) == 9);
    CHECK(cache.free_blocks() == 2);
    cache.truncate(0, 5);  // 2 blocks: one back
    CHECK(cache.length(0) == 5);
    CHECK(cache.block_table(0).size() == 2);
    CHECK(cache.free_blocks() == 3);
    for (std::int64_t t = 0; t < 5; ++t) CHECK(cache.row(0, 0, t)[0] == static_cast<float>(t));  // kept rows untouched
    cache.reserve(0, 6);  // grows again from the free list
    CHECK(cache.length(0) == 11);
    CHECK(cache.free_blocks() == 2);
    cache.truncate(0, 0);
    CHECK(cache.block_table(0).empty());
    CHECK(cache.free_blocks() == 5);
    CHECK(cache.length(1) == 3);  // the other slot is untouched
    CHECK(message_of([&] { cache.truncate(1, 4); }) ==
          "KvCache: truncating slot 1 to 4 positions; it holds 3, so give a length in [0, 3]");
    CHECK(message_of([&] { cache.truncate(1, -1); }) ==
          "KvCache: truncating slot 1 to -1 positions; it holds 3, so give a length in [0, 3]");
    CHECK(message_of([&] { cache.truncate(2, 0); }) == "KvCache: slot 2 is not in [0, 2)");

    // A cut-back sequence decodes as if the dropped tokens had never been fed.
    Gpt gpt(40, 4, 8.0f);
    const auto tokens = prompt_of(9, 40, 2);
    KvCache a(2, 32, 1, 32, 4);
    CachedGpt engine(gpt.model, gpt.config, a);
    (void)engine.prefill(0, tokens);
    a.truncate(0, 5);
    const auto after = engine.decode(std::vector<std::int64_t>{0}, std::span(tokens).subspan(5, 1));
    std::vector<float> cut(after.begin(), after.end());
    KvCache b(2, 32, 1, 32, 4);
    CachedGpt fresh(gpt.model, gpt.config, b);
    const auto direct = fresh.prefill(0, std::span(tokens).first(6));
    CHECK(max_relative_difference(cut, direct) < 1e-5);
}

TEST_CASE("greedy speculative decoding returns exactly the target's greedy tokens, whatever the draft",
          "[infer][speculative]") {
    Gpt target(40, 11, 8.0f);
    Gpt unrelated(40, 12, 8.0f, 1, 32);
    for (const std::int64_t prompt_length : {1, 5}) {
        Request request;
        request.prompt = prompt_of(prompt_length, 40, static_cast<std::int32_t>(prompt_length));
        request.max_new_tokens = 24;
        request.sampling.greedy = true;
        const std::vector<Request> one{request};
        const auto expected = loom::infer::generate(target.model, target.config, one)[0].tokens;
        for (const std::int64_t gamma : {1, 2, 4}) {
            INFO("prompt " << prompt_length << ", gamma " << gamma);
            const auto same = loom::infer::speculative_generate(target.model, target.config, target.model,
                                                                target.config, request, gamma);
            CHECK(same.tokens == expected);
            CHECK(same.stats.accepted == same.stats.drafted);
            const auto other = loom::infer::speculative_generate(target.model, target.config, unrelated.model,
                                                                 unrelated.config, request, gamma);
            CHECK(other.tokens == expected);
            CHECK(other.stats.accepted < other.stats.drafted / 2);  // an unrelated draft is mostly wrong
        }
    }
    // A stop token ends the run as in generate (kept as the last token).
    Request stopping;
    stopping.prompt = prompt_of(3, 40, 7);
    stopping.max_new_tokens = 24;
    stopping.sampling.greedy = true;
    const std::vector<Request> free_run{stopping};
    const auto full = loom::infer::generate(target.model, target.config, free_run)[0].tokens;
    stopping.stop_tokens = {full[6]};
    const std::vector<Request> stopped_run{stopping};
    const auto stopped = loom::infer::generate(target.model, target.config, stopped_run)[0];
    REQUIRE(stopped.finish == loom::infer::Finish::stop);
    const auto speculated =
        loom::infer::speculative_generate(target.model, target.config, unrelated.model, unrelated.config, stopping, 3);
    CHECK(speculated.tokens == stopped.tokens);
    CHECK(speculated.finish == loom::infer::Finish::stop);
}

TEST_CASE("batched speculative decoding gives each request the tokens it gets alone", "[infer][speculative]") {
    Gpt target(40, 51, 8.0f);
    Gpt draft(40, 52, 8.0f, 1, 32);
    std::vector<Request> requests(4);
    for (std::size_t i = 0; i < requests.size(); ++i) {
        requests[i].prompt = prompt_of(static_cast<std::int64_t>(1 + 3 * i), 40, static_cast<std::int32_t>(i));
        requests[i].max_new_tokens = static_cast<std::int64_t>(6 + 5 * i);
    }
    requests[0].sampling.greedy = true;
    requests[1].sampling = Sampling{.temperature = 0.7f, .seed = 3};
    requests[2].sampling.greedy = true;
    requests[3].sampling = Sampling{.top_k = 5, .seed = 4};
    // Request 2 stops at a token of its free run.
    const std::vector<Request> free_run{requests[2]};
    requests[2].stop_tokens = {loom::infer::generate(target.model, target.config, free_run)[0].tokens[4]};
    KvCache tcache(2, 32, 4, 32, 4);
    KvCache dcache(1, 32, 4, 32, 4);
    CachedGpt t(target.model, target.config, tcache);
    CachedGpt d(draft.model, draft.config, dcache);
    const auto together = loom::infer::speculative_generate(t, d, requests, 3);
    REQUIRE(together.size() == 4);
    for (std::size_t i = 0; i < requests.size(); ++i) {
        INFO("request " << i);
        const auto alone = loom::infer::speculative_generate(t, d, requests[i], 3);
        CHECK(together[i].tokens == alone.tokens);
        CHECK(together[i].finish == alone.finish);
        CHECK(together[i].stats.accepted == alone.stats.accepted);
        CHECK(together[i].stats.target_passes == alone.stats.target_passes);
    }
    // The greedy ones are the target's greedy tokens.
    const std::vector<Request> greedy{requests[0], requests[2]};
    const auto expected = loom::infer::generate(target.model, target.config, greedy);
    CHECK(together[0].tokens == expected[0].tokens);
    CHECK(together[2].tokens == expected[1].tokens);
    CHECK(together[2].finish == loom::infer::Finish::stop);
    for (std::int64_t s = 0; s < 4; ++s) CHECK(tcache.length(s) == 0);
    CHECK(tcache.free_blocks() == tcache.blocks());
    CHECK(dcache.free_blocks() == dcache.blocks());
}

TEST_CASE("the stats: gamma + 1 tokens per target pass when the draft is the target, fewer when it is not",
          "[infer][speculative]") {
    Gpt target(40, 21, 8.0f);
    Gpt unrelated(40, 22, 8.0f, 1, 32);
    for (const std::int64_t gamma : {1, 2, 4}) {
        Request request;
        request.prompt = prompt_of(4, 40, 3);
        request.max_new_tokens = 5 * (gamma + 1);  // whole passes: no pass is shortened by the length limit
        request.sampling.greedy = true;
        const auto same =
            loom::infer::speculative_generate(target.model, target.config, target.model, target.config, request, gamma);
        CHECK(same.stats.target_passes == 5);
        CHECK(same.stats.drafted == 5 * gamma);
        CHECK(same.stats.tokens_per_pass() == static_cast<double>(gamma + 1));
        CHECK(same.stats.acceptance_rate() == 1.0);
        const auto other = loom::infer::speculative_generate(target.model, target.config, unrelated.model,
                                                             unrelated.config, request, gamma);
        CHECK(other.stats.tokens_per_pass() < static_cast<double>(gamma + 1));
        CHECK(other.stats.tokens_per_pass() >= 1.0);
        CHECK(other.stats.accepted + other.stats.target_passes == static_cast<std::int64_t>(other.tokens.size()));
    }
}

TEST_CASE("sampled speculative decoding draws from the target's distribution (chi-square)", "[infer][speculative]") {
    // Vocabulary 8: the first and the second new token of many seeded runs,
    // against the target's own probabilities (the second token's marginal:
    // sum over the first token a of p(a) p(x | a)). The draft is an unrelated
    // model, so most proposals are rejected and the residual rule is exercised.
    constexpr std::int64_t V = 8;
    Gpt target(V, 31, 2.0f);
    Gpt draft(V, 32, 2.0f, 1, 32);
    const auto prompt = prompt_of(3, V, 1);
    const auto last_logits = [&](Gpt& gpt, const std::vector<std::int32_t>& tokens) {
        KvCache cache(gpt.config.layers, gpt.config.width, 1, 32);
        CachedGpt engine(gpt.model, gpt.config, cache);
        const auto row = engine.prefill(0, tokens);
        return std::vector<float>(row.begin(), row.end());
    };
    const auto p1 = softmax(last_logits(target, prompt));
    const auto q1 = softmax(last_logits(draft, prompt));
    std::vector<double> p2(V, 0.0);
    for (std::int32_t a = 0; a < V; ++a) {
        auto longer = prompt;
        longer.push_back(a);
        const auto pa = softmax(last_logits(target, longer));
        for (std::int64_t x = 0; x < V; ++x)
            p2[static_cast<std::size_t>(x)] += p1[static_cast<std::size_t>(a)] * pa[static_cast<std::size_t>(x)];
    }
    constexpr int draws = 6000;
    std::vector<double> first(V, 0.0), second(V, 0.0);
    KvCache tcache(2, 32, 1, 32);
    KvCache dcache(1, 32, 1, 32);
    CachedGpt t(target.model, target.config, tcache);
    CachedGpt d(draft.model, draft.config, dcache);
    std::int64_t drafted = 0, accepted = 0;
    for (int s = 0; s < draws; ++s) {
        Request request;
        request.prompt = prompt;
        request.max_new_tokens = 3;  // gamma 2 proposes both of the first two tokens in one pass
        request.sampling = Sampling{.seed = 1000 + static_cast<std::uint64_t>(s)};
        const auto out = loom::infer::speculative_generate(t, d, request, 2);
        REQUIRE(out.tokens.size() == 3);
        first[static_cast<std::size_t>(out.tokens[0])] += 1;
        second[static_cast<std::size_t>(out.tokens[1])] += 1;
        drafted += out.stats.drafted;
        accepted += out.stats.accepted;
    }
    // Pearson's statistic, sum (observed - expected)^2 / expected, cells with
    // an expected count under 5 pooled into one.
    const auto chi_square = [&](const std::vector<double>& observed, const std::vector<double>& p) {
        double statistic = 0, pooled_observed = 0, pooled_expected = 0;
        for (std::size_t v = 0; v < p.size(); ++v) {
            const double expected = draws * p[v];
            if (expected < 5) {
                pooled_observed += observed[v];
                pooled_expected += expected;
                continue;
            }
            statistic += (observed[v] - expected) * (observed[v] - expected) / expected;
        }
        if (pooled_expected > 0)
            statistic += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
        return statistic;
    };
    // The same statistic for counts drawn exactly at the draft's probabilities:
    // how far off a sampler that accepted every draft would be.
    std::vector<double> as_draft(V);
    for (std::size_t v = 0; v < static_cast<std::size_t>(V); ++v) as_draft[v] = draws * q1[v];
    const double first_statistic = chi_square(first, p1), second_statistic = chi_square(second, p2);
    const double draft_statistic = chi_square(as_draft, p1);
    // Every cell expects at least 5 draws, so none is pooled: 7 degrees of freedom.
    CHECK(draws * *std::min_element(p1.begin(), p1.end()) >= 5);
    CHECK(draws * *std::min_element(p2.begin(), p2.end()) >= 5);
    std::printf("speculative chi-square over %d draws, vocab 8 (7 degrees of freedom, 0.1%% critical value 24.3): "
                "first token %.2f, second token %.2f; a sampler of the draft's own distribution: %.1f; "
                "drafts accepted %.2f\n",
                draws, first_statistic, second_statistic, draft_statistic,
                static_cast<double>(accepted) / static_cast<double>(drafted));
    CHECK(draft_statistic > 100);  // the test can tell the draft's distribution from the target's
    CHECK(first_statistic < 24.3);
    CHECK(second_statistic < 24.3);
    CHECK(accepted < drafted);  // rejections happened, so the residual draws were tested
    CHECK(accepted > 0);
}

TEST_CASE("the probabilities rejection sampling uses are the ones Sampler draws from", "[infer][speculative]") {
    // Probabilities 0.2, 0.4, 0.1, 0.3 by id.
    const std::vector<float> logits{std::log(0.2f), std::log(0.4f), std::log(0.1f), std::log(0.3f)};
    std::vector<double> p;
    loom::infer::sampling_probabilities(logits, Sampling{.top_k = 2}, p);
    CHECK(p[0] == 0.0);
    CHECK(p[1] == Approx(4.0 / 7));
    CHECK(p[2] == 0.0);
    CHECK(p[3] == Approx(3.0 / 7));
    loom::infer::sampling_probabilities(logits, Sampling{.top_p = 0.3f}, p);
    CHECK(p == std::vector<double>{0.0, 1.0, 0.0, 0.0});
    loom::infer::sampling_probabilities(logits, Sampling{.temperature = 0.5f}, p);
    CHECK(p[1] == Approx(0.16 / 0.30));
    loom::infer::sampling_probabilities(logits, Sampling{.greedy = true}, p);
    CHECK(p == std::vector<double>{0.0, 1.0, 0.0, 0.0});
    // The same uniform picks the same token as Sampler::pick.
    loom::infer::Sampler sampler;
    for (const Sampling s : {Sampling{.seed = 1}, Sampling{.top_k = 3, .seed = 2}, Sampling{.top_p = 0.8f, .seed = 3},
                             Sampling{.temperature = 0.7f, .seed = 4}}) {
        loom::infer::sampling_probabilities(logits, s, p);
        for (std::uint64_t k = 0; k < 200; ++k)
            CHECK(loom::infer::draw_from(p, loom::RngStream{s.seed, k}.uniform(0)) == sampler.pick(logits, s, k));
    }
}

TEST_CASE("bad inputs to speculative decoding are named in one line", "[infer][speculative]") {
    Gpt target(40, 41, 1.0f);
    Gpt draft(40, 42, 1.0f, 1, 32);
    Gpt other_vocab(30, 43, 1.0f, 1, 32);
    Request request;
    request.prompt = prompt_of(4, 40, 1);
    request.max_new_tokens = 8;
    const auto run = [&](Gpt& d, const Request& r, std::int64_t gamma) {
        return message_of([&] {
            (void)loom::infer::speculative_generate(target.model, target.config, d.model, d.config, r, gamma);
        });
    };
    CHECK(run(draft, request, 0) == "speculative_generate: gamma = 0 draft tokens per pass; propose at least 1");
    CHECK(run(other_vocab, request, 2) ==
          "speculative_generate: the draft's vocabulary of 30 tokens is not the target's 40; the draft must share "
          "the target's tokens");
    loom::gpt::Config short_config = draft.config;
    short_config.seq = 8;
    Request longer = request;
    longer.max_new_tokens = 20;
    CHECK(message_of([&] {
              (void)loom::infer::speculative_generate(target.model, target.config, draft.model, short_config, longer,
                                                      2);
          }) == "speculative_generate: the request needs 23 positions but the draft's Config::seq is 8; use a draft "
                "with at least the target's sequence length");
    KvCache tcache(2, 32, 1, 32);
    KvCache short_cache(1, 32, 1, 16);
    CachedGpt t(target.model, target.config, tcache);
    CachedGpt d(draft.model, draft.config, short_cache);
    CHECK(message_of([&] { (void)loom::infer::speculative_generate(t, d, longer, 2); }) ==
          "speculative_generate: request 0 needs 23 cached positions but the draft's cache holds 16 per sequence; "
          "build it (and the draft's Config::seq) at least that long");
    CachedGpt same_cache(draft.model, draft.config, short_cache);
    CHECK(message_of([&] { (void)loom::infer::speculative_generate(d, same_cache, request, 2); }) ==
          "speculative_generate: the target and the draft share one KvCache; give each its own");
    KvCache dcache(1, 32, 1, 32);
    CachedGpt d2(draft.model, draft.config, dcache);
    dcache.reserve(0, 2);
    CHECK(message_of([&] { (void)loom::infer::speculative_generate(t, d2, request, 2); }) ==
          "speculative_generate: slot 0 of the draft's cache holds 2 positions; release it first");
    dcache.release(0);
    KvCache few_blocks(1, 32, 1, 32, 4, 2);
    CachedGpt d3(draft.model, draft.config, few_blocks);
    CHECK(message_of([&] { (void)loom::infer::speculative_generate(t, d3, request, 2); }) ==
          "speculative_generate: the requests need 3 blocks of 4 positions in the draft's cache but 2 are free");
    const std::vector<Request> three(3, request);
    CHECK(message_of([&] { (void)loom::infer::speculative_generate(t, d2, three, 2); }) ==
          "speculative_generate: 3 requests but the target's cache has 1 slots; run at most that many at once");
    CHECK(message_of([&] { (void)loom::infer::speculative_generate(t, d2, std::span<const Request>{}, 2); }) ==
          "speculative_generate: no requests");
    Request empty = request;
    empty.prompt.clear();
    CHECK(run(draft, empty, 2) == "generate: request 0 has an empty prompt; give at least one token");
    // After an error in the call form taking engines, the caches are free again.
    CHECK(tcache.length(0) == 0);
}

}  // namespace LOOM_TEST_FILE
