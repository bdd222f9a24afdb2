// CaPE (include/loom/infer/cape.hpp) and what it needs from the engine: a
// token tree verified in one forward (each node sees the cache and its
// ancestors only, at position = depth) against a plain forward of each
// node's root-to-node sequence; KvCache::keep compacting a slot to a path;
// greedy CaPE returning exactly the target's greedy tokens, alone and
// continuously batched; bad configurations named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/cape.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/speculative.hpp"
#include "loom/infer/speculative_batcher.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::infer::CachedGpt;
using loom::infer::CapeConfig;
using loom::infer::KvCache;
using loom::infer::Logits;
using loom::infer::Request;
using loom::infer::Segment;
using loom_test::max_relative_difference;
using loom_test::message_of;
using loom_test::prompt_of;

struct Gpt : loom_test::ScaledGpt {
    Gpt(std::int64_t vocab, std::uint64_t seed, float scale, std::int64_t layers = 2, std::int64_t width = 32)
        : ScaledGpt({.layers = layers, .width = width, .heads = 4, .seq = 48, .vocab = vocab}, seed, scale) {}
};

// The logits after `tokens`, from a fresh cache in one prefill (the causal path).
std::vector<float> plain_logits(Gpt& gpt, std::span<const std::int32_t> tokens) {
    KvCache cache(gpt.config.layers, gpt.config.width, 1, gpt.config.seq, 4);
    CachedGpt engine(gpt.model, gpt.config, cache);
    const auto row = engine.prefill(0, tokens);
    return {row.begin(), row.end()};
}

Request greedy_request(std::int64_t prompt_length, std::int64_t new_tokens, std::int32_t salt) {
    Request r;
    r.prompt = prompt_of(prompt_length, 40, salt);
    r.max_new_tokens = new_tokens;
    r.sampling.greedy = true;
    return r;
}

}  // namespace

TEST_CASE("a tree segment gives each node the logits of a plain forward of its root-to-node sequence",
          "[infer][cape]") {
    Gpt gpt(40, 21, 8.0f);
    const auto prompt = prompt_of(6, 40, 1);
    // A bushy tree: two roots' worth of children, a deep branch; 12 nodes, and its first 6.
    const std::vector<std::int32_t> tokens{7, 3, 9, 3, 11, 25, 1, 30, 4, 4, 17, 2};
    const std::vector<std::int32_t> parents{-1, 0, 1, 0, 3, 1, 2, 6, -1, 8, 4, 0};
    for (const std::size_t nodes : {tokens.size(), std::size_t{6}}) {
        INFO(nodes << " nodes");
        KvCache cache(2, 32, 1, 48, 4);
        CachedGpt engine(gpt.model, gpt.config, cache);
        (void)engine.prefill(0, prompt);
        const Segment tree{0, std::span(tokens).first(nodes), std::span(parents).first(nodes)};
        const auto rows = engine.forward(std::span(&tree, 1), Logits::every);
        REQUIRE(rows.size() == nodes * 40);
        CHECK(cache.length(0) == static_cast<std::int64_t>(prompt.size() + nodes));
        for (std::size_t j = 0; j < nodes; ++j) {
            std::vector<std::int32_t> path;
            for (auto a = static_cast<std::int32_t>(j); a >= 0; a = parents[static_cast<std::size_t>(a)])
                path.insert(path.begin(), tokens[static_cast<std::size_t>(a)]);
            std::vector<std::int32_t> sequence = prompt;
            sequence.insert(sequence.end(), path.begin(), path.end());
            INFO("node " << j);
            CHECK(max_relative_difference(rows.subspan(j * 40, 40), plain_logits(gpt, sequence)) < 1e-5);
        }
    }
    // A chain given as parents is the same forward as the plain segment.
    KvCache a(2, 32, 1, 48, 4), b(2, 32, 1, 48, 4);
    CachedGpt ea(gpt.model, gpt.config, a), eb(gpt.model, gpt.config, b);
    const std::vector<std::int32_t> chain{-1, 0, 1, 2};
    (void)ea.prefill(0, prompt);
    (void)eb.prefill(0, prompt);
    const Segment as_tree{0, std::span(tokens).first(4), chain}, as_chain{0, std::span(tokens).first(4)};
    const auto tree_rows = ea.forward(std::span(&as_tree, 1), Logits::every);
    const std::vector<float> kept(tree_rows.begin(), tree_rows.end());
    CHECK(max_relative_difference(kept, eb.forward(std::span(&as_chain, 1), Logits::every)) < 1e-5);

    const std::vector<std::int32_t> later{-1, 2, 0}, short_parents{-1};
    const Segment bad_parent{0, std::span(tokens).first(3), later}, bad_count{0, std::span(tokens).first(3), short_parents};
    CHECK(message_of([&] { (void)ea.forward(std::span(&bad_parent, 1)); }) ==
          "tree: node 1 has parent 2; a parent must be an earlier node, in [-1, 1) (-1: the cached prefix)");
    CHECK(message_of([&] { (void)ea.forward(std::span(&bad_count, 1)); }) ==
          "CachedGpt: the tree of slot 0 has 3 tokens but 1 parents; give one parent per token (or none for a chain)");
}

TEST_CASE("keeping a path compacts a slot to it; the cache then decodes like one built straight", "[infer][cape]") {
    KvCache cache(2, 2, 1, 16, 4);
    cache.reserve(0, 11);
    for (std::int64_t l = 0; l < 2; ++l)
        for (std::int64_t t = 0; t < 11; ++t) cache.row(l, 0, t)[3] = static_cast<float>(100 * l + t);
    const std::vector<std::int64_t> path{5, 6, 9};
    cache.keep(0, 5, path);
    CHECK(cache.length(0) == 8);
    CHECK(cache.free_blocks() == 2);
    for (std::int64_t l = 0; l < 2; ++l) {
        for (std::int64_t t = 0; t < 7; ++t) CHECK(cache.row(l, 0, t)[3] == static_cast<float>(100 * l + t));
        CHECK(cache.row(l, 0, 7)[3] == static_cast<float>(100 * l + 9));
    }
    const std::vector<std::int64_t> descending{6, 5}, before_base{3}, too_many{5, 6, 7, 8};
    CHECK(message_of([&] { cache.keep(0, 4, descending); }) ==
          "KvCache: position 5 kept as 5 of slot 0 must be in [7, 8) (ascending, after base 4)");
    CHECK(message_of([&] { cache.keep(0, 4, before_base); }) ==
          "KvCache: position 3 kept as 4 of slot 0 must be in [4, 8) (ascending, after base 4)");
    CHECK(message_of([&] { cache.keep(0, 5, too_many); }) ==
          "KvCache: keeping 4 positions after the first 5 of slot 0, which holds 8; give base + positions in [0, 8]");

    // A tree's path through a leaf off the chain: compacted, the next token's logits are a straight build's.
    Gpt gpt(40, 22, 8.0f);
    const auto prompt = prompt_of(5, 40, 2);
    const std::vector<std::int32_t> tokens{7, 3, 9, 12, 31, 8, 14};  // root 7, chain 3 9 12, then leaves
    const std::vector<std::int32_t> parents{-1, 0, 1, 2, 0, 1, 2};
    KvCache tree_cache(2, 32, 1, 48, 4);
    CachedGpt engine(gpt.model, gpt.config, tree_cache);
    (void)engine.prefill(0, std::span(prompt).first(4));  // the root is the prompt's last token
    const Segment tree{0, tokens, parents};
    (void)engine.forward(std::span(&tree, 1), Logits::every);
    // Path root -> 3 -> 8 (node 5, a leaf hanging off node 1): positions 4 + {1, 5} after the root at 4.
    const std::vector<std::int64_t> kept{5, 9};
    tree_cache.keep(0, 5, kept);
    REQUIRE(tree_cache.length(0) == 7);
    const std::vector<std::int32_t> next{22};
    const auto after = engine.decode(std::vector<std::int64_t>{0}, next);
    const std::vector<float> compacted(after.begin(), after.end());
    std::vector<std::int32_t> straight(prompt.begin(), prompt.begin() + 4);
    straight.insert(straight.end(), {7, 3, 8, 22});
    CHECK(max_relative_difference(compacted, plain_logits(gpt, straight)) < 1e-5);
}

TEST_CASE("CaPE's bins: alternatives by confidence, the next-most-likely tokens, bad bins named", "[infer][cape]") {
    const CapeConfig defaults;
    CHECK(defaults.alternatives_for(0.1) == 8);
    CHECK(defaults.alternatives_for(0.3) == 6);
    CHECK(defaults.alternatives_for(0.7) == 4);
    CHECK(defaults.alternatives_for(0.95) == 2);
    // Logits: token 4 far ahead (confidence ~1: 2 alternatives), then 1 and 6 tied, then 2.
    std::vector<float> logits{0, 5, 2, 0, 30, 0, 5, 0};
    std::vector<std::int32_t> alternatives;
    CHECK(loom::infer::cape_step(logits, defaults, 100, alternatives) == 4);
    CHECK(alternatives == std::vector<std::int32_t>{1, 6});
    // A flat distribution (confidence 1/8 < 0.3): 8 alternatives, but only 7 other tokens exist; room 3 caps it.
    const std::vector<float> flat(8, 1.0f);
    CHECK(loom::infer::draft_confidence(flat) == Approx(0.125));
    CHECK(loom::infer::cape_step(flat, defaults, 100, alternatives) == 0);
    CHECK(alternatives == std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7});
    (void)loom::infer::cape_step(flat, defaults, 3, alternatives);
    CHECK(alternatives.size() == 3);

    const auto message = [](CapeConfig c) { return message_of([&] { c.validate(); }); };
    CHECK(message(CapeConfig{{0.3, 0.2}, {8, 6, 4}}) ==
          "CapeConfig: threshold 1 = 0.2 is not above threshold 0 = 0.3; give them increasing");
    CHECK(message(CapeConfig{{0.3, 0.6}, {8, -1, 4}}) == "CapeConfig: bin 1 adds -1 alternatives; give 0 or more");
    CHECK(message(CapeConfig{{0.3}, {8}}) == "CapeConfig: 1 thresholds need 2 alternative counts (one per bin), got 1");
    CHECK(message(CapeConfig{{0.0}, {8, 2}}) == "CapeConfig: threshold 0 = 0 is not a probability in (0, 1]");
    CHECK(message(CapeConfig{{}, {3}}) == "(no error)");  // one bin: always 3

    // The bins' text: read back as written, and every bad text named.
    const CapeConfig read = loom::infer::parse_cape_bins("8@0.3,6@0.6,4@0.8,2");
    CHECK(read.thresholds == defaults.thresholds);
    CHECK(read.alternatives == defaults.alternatives);
    CHECK(loom::infer::to_string(read) == "8@0.3,6@0.6,4@0.8,2");
    CHECK(loom::infer::parse_cape_bins("3").alternatives == std::vector<std::int64_t>{3});
    const auto parse_message = [](const char* text) { return message_of([&] { (void)loom::infer::parse_cape_bins(text); }); };
    CHECK(parse_message("8@0.6") == "8@0.6 does not end with a bin without @P; write K@P,...,K (e.g. 8@0.3,6@0.6,4@0.8,2)");
    CHECK(parse_message("2,8@0.6,1") == "2,8@0.6,1: only the last bin may go without @P; write K@P,...,K");
    CHECK(parse_message("-1@0.5,2") == "-1 is not a whole number in 0..1048576");
    CHECK(parse_message("4@half,2") == "half is not a number");
    CHECK(parse_message("8@0.6,4@0.3,2") ==
          "8@0.6,4@0.3,2: CapeConfig: threshold 1 = 0.3 is not above threshold 0 = 0.6; give them increasing");

    Gpt gpt(40, 23, 8.0f);
    KvCache tcache(2, 32, 1, 48, 4), dcache(2, 32, 1, 48, 4);
    CachedGpt t(gpt.model, gpt.config, tcache), d(gpt.model, gpt.config, dcache);
    CHECK(message_of([&] { loom::infer::SpeculativeBatcher b(t, d, 4, 0, CapeConfig{{0.5}, {2, -3}}); }) ==
          "CapeConfig: bin 1 adds -3 alternatives; give 0 or more");
    loom::infer::SpeculativeBatcher batcher(t, d, 4, 0, CapeConfig{});
    Request sampled = greedy_request(3, 5, 1);
    sampled.sampling = {.temperature = 0.8f, .seed = 1};
    CHECK(message_of([&] { (void)batcher.submit(sampled); }) ==
          "SpeculativeBatcher: request 0 is sampled but CaPE's tree acceptance is greedy only; set sampling.greedy or "
          "run without CaPE");
}

TEST_CASE("greedy CaPE returns exactly the target's greedy tokens, whatever the draft", "[infer][cape]") {
    Gpt target(40, 11, 8.0f);
    Gpt unrelated(40, 12, 8.0f, 1, 32);
    Gpt blurred(40, 11, 6.0f);  // the target's weights at another scale: agrees often, not always
    std::int64_t off_chain = 0;
    for (const std::int64_t prompt_length : {1, 5}) {
        const Request request = greedy_request(prompt_length, 24, static_cast<std::int32_t>(prompt_length));
        const std::vector<Request> one{request};
        const auto expected = loom::infer::generate(target.model, target.config, one)[0].tokens;
        for (const std::int64_t gamma : {1, 2, 4}) {
            INFO("prompt " << prompt_length << ", gamma " << gamma);
            const auto same = loom::infer::speculative_generate(target.model, target.config, target.model,
                                                                target.config, request, gamma, CapeConfig{});
            CHECK(same.tokens == expected);
            CHECK(same.stats.alternatives == 0);  // the chain is the target's own: every chain token accepted
            CHECK(same.stats.accepted + same.stats.target_passes == 24);
            for (Gpt* draft : {&unrelated, &blurred}) {
                const auto other = loom::infer::speculative_generate(target.model, target.config, draft->model,
                                                                     draft->config, request, gamma, CapeConfig{});
                CHECK(other.tokens == expected);
                CHECK(other.stats.accepted + other.stats.target_passes == 24);
                off_chain += other.stats.alternatives;
            }
        }
    }
    CHECK(off_chain > 0);  // some paths went through an alternative: the compaction's copies ran

    // Combs as wide as the vocabulary allows (39 alternatives a step) in caches exactly as long as the
    // request needs: near the end the combs shrink to the room left, and the tokens do not change.
    const Request request = greedy_request(5, 30, 9);
    const auto expected = loom::infer::generate(target.model, target.config, std::vector<Request>{request})[0].tokens;
    const auto wide = loom::infer::speculative_generate(target.model, target.config, unrelated.model,
                                                        unrelated.config, request, 4, CapeConfig{{}, {50}});
    CHECK(wide.tokens == expected);
    CHECK(wide.stats.drafted > wide.stats.target_passes * 4);  // alternatives were proposed
}

TEST_CASE("batched greedy CaPE gives each request the target's greedy tokens, whenever it starts", "[infer][cape]") {
    Gpt target(40, 51, 8.0f);
    Gpt draft(40, 51, 6.0f);
    std::vector<Request> requests;
    for (std::int32_t i = 0; i < 5; ++i) requests.push_back(greedy_request(1 + 3 * i, 6 + 5 * i, i));
    requests[2].stop_tokens = {loom::infer::generate(target.model, target.config,
                                                     std::vector<Request>{requests[2]})[0].tokens[4]};
    const auto expected = loom::infer::generate(target.model, target.config, requests);
    // All at once (5 slots, paged blocks of 4).
    KvCache tcache(2, 32, 5, 48, 4), dcache(2, 32, 5, 48, 4);
    CachedGpt t(target.model, target.config, tcache), d(draft.model, draft.config, dcache);
    const auto together = loom::infer::speculative_generate(t, d, requests, 4, CapeConfig{});
    std::int64_t off_chain = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        INFO("request " << i);
        CHECK(together[i].tokens == expected[i].tokens);
        CHECK(together[i].finish == expected[i].finish);
        off_chain += together[i].stats.alternatives;
    }
    CHECK(off_chain > 0);
    CHECK(tcache.free_blocks() == tcache.blocks());
    // Continuously: two slots, tight caches (blocks for two requests at their longest), submitted in two batches.
    KvCache tsmall(2, 32, 2, 48, 4, 16), dsmall(2, 32, 2, 48, 4, 16);
    CachedGpt ts(target.model, target.config, tsmall), ds(draft.model, draft.config, dsmall);
    loom::infer::SpeculativeBatcher batcher(ts, ds, 4, 0, CapeConfig{{0.5}, {3, 1}});
    std::vector<std::vector<std::int32_t>> got(requests.size());
    for (std::size_t i = 0; i < 3; ++i) (void)batcher.submit(requests[i]);
    std::size_t rounds = 0;
    while (!batcher.idle()) {
        if (++rounds == 2)
            for (std::size_t i = 3; i < requests.size(); ++i) (void)batcher.submit(requests[i]);
        for (const auto& e : batcher.step()) {
            auto& tokens = got[static_cast<std::size_t>(e.id)];
            tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
            CHECK(e.drafted <= 4 + 4 * 3);
        }
    }
    for (std::size_t i = 0; i < requests.size(); ++i) CHECK(got[i] == expected[i].tokens);
    CHECK(batcher.stats().tokens_per_pass() > 1.0);
    CHECK(tsmall.free_blocks() == tsmall.blocks());
}

}  // namespace LOOM_TEST_FILE
