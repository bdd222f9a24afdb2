// Speculative decoding continuously batched (infer/speculative_batcher.hpp):
// requests submitted mid-run, more of them than the caches have slots, get
// the tokens they get alone (greedy: the target's greedy tokens; sampled:
// the same seed's speculative tokens); a waiting request takes a freed slot
// (or freed blocks) at the next round; cancelling frees a slot in both
// caches at once; a round yields up to gamma + 1 tokens per request; bad
// inputs are refused in one line without taking an id.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/speculative.hpp"
#include "loom/infer/speculative_batcher.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::infer::CachedGpt;
using loom::infer::Finish;
using loom::infer::KvCache;
using loom::infer::Request;
using loom::infer::Sampling;
using loom::infer::SpeculativeBatcher;
using loom_test::message_of;

// A small random GPT of `vocab` tokens; weights scaled by `scale` (8 makes greedy choices clear-cut).
struct Gpt : loom_test::ScaledGpt {
    Gpt(std::int64_t vocab, std::uint64_t seed, float scale, std::int64_t layers = 2, std::int64_t width = 32)
        : ScaledGpt({.layers = layers, .width = width, .heads = 4, .seq = 32, .vocab = vocab}, seed, scale) {}
};

Request request_of(std::int64_t prompt_length, std::int32_t salt, std::int64_t max_new, bool greedy) {
    Request r;
    for (std::int64_t i = 0; i < prompt_length; ++i)
        r.prompt.push_back(static_cast<std::int32_t>((i * 5 + salt * 3 + 2) % 40));
    r.max_new_tokens = max_new;
    if (greedy) r.sampling.greedy = true;
    else r.sampling = Sampling{.temperature = 1.2f, .top_k = 12, .seed = 70u + static_cast<std::uint64_t>(salt)};
    return r;
}

struct Collected {
    std::vector<std::int32_t> tokens;
    std::optional<Finish> finish;
};

// One round's events into `out`, checking their shape; the ids that had one.
std::set<std::uint64_t> collect(SpeculativeBatcher& batcher, std::map<std::uint64_t, Collected>& out) {
    std::set<std::uint64_t> ids;
    for (const SpeculativeBatcher::Event& e : batcher.step()) {
        REQUIRE_FALSE(out[e.id].finish);  // nothing after a request's last token
        CHECK(e.tokens.size() >= 1);
        CHECK(static_cast<std::int64_t>(e.tokens.size()) <= e.accepted + 1);
        CHECK(e.accepted <= e.drafted);
        CHECK(e.drafted <= batcher.gamma());
        out[e.id].tokens.insert(out[e.id].tokens.end(), e.tokens.begin(), e.tokens.end());
        out[e.id].finish = e.finish;
        ids.insert(e.id);
    }
    return ids;
}

}  // namespace

TEST_CASE("speculative requests submitted mid-run, more than the slots, get the tokens each gets alone",
          "[infer][speculative]") {
    Gpt target(40, 61, 8.0f);
    Gpt draft(40, 62, 1.0f, 1, 32);  // unrelated: many rejections (and residual draws when sampled)
    std::vector<Request> requests;
    for (std::int32_t i = 0; i < 7; ++i) requests.push_back(request_of(1 + 3 * (i % 4), i, 5 + 3 * i, i % 2 == 0));
    // Request 4 stops at a token of its free run.
    const std::vector<Request> free_run{requests[4]};
    requests[4].stop_tokens = {loom::infer::generate(target.model, target.config, free_run)[0].tokens[3]};
    constexpr std::int64_t gamma = 3;
    // Each request alone, on caches of its own.
    std::vector<Collected> alone(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
        const auto out = loom::infer::speculative_generate(target.model, target.config, draft.model, draft.config,
                                                           requests[i], gamma);
        alone[i] = {out.tokens, out.finish};
        if (requests[i].sampling.greedy) {  // and the greedy ones are the target's greedy tokens
            const std::vector<Request> one{requests[i]};
            const auto plain = loom::infer::generate(target.model, target.config, one)[0];
            CHECK(out.tokens == plain.tokens);
            CHECK(out.finish == plain.finish);
        }
    }
    CHECK(alone[4].finish == Finish::stop);

    // Two slots, and blocks of 4 positions: enough for two requests at once.
    KvCache tcache(2, 32, 2, 32, 4, 16);
    KvCache dcache(1, 32, 2, 32, 4, 16);
    CachedGpt t(target.model, target.config, tcache);
    CachedGpt d(draft.model, draft.config, dcache);
    std::map<std::uint64_t, Collected> got;
    std::size_t widest = 0;
    bool joined_mid_run = false;  // a request started in a round while another that started earlier ran
    {
        SpeculativeBatcher batcher(t, d, gamma);
        CHECK(batcher.step().empty());  // idle
        CHECK(batcher.submit(requests[0]) == 0);
        std::set<std::uint64_t> seen;
        const auto round = [&] {
            const auto ids = collect(batcher, got);
            widest = std::max(widest, ids.size());
            for (const std::uint64_t id : ids)
                if (!seen.contains(id) && ids.size() > 1 && std::any_of(ids.begin(), ids.end(), [&](std::uint64_t o) {
                        return seen.contains(o);
                    }))
                    joined_mid_run = true;
            seen.insert(ids.begin(), ids.end());
        };
        round();
        CHECK(batcher.submit(requests[1]) == 1);
        CHECK(batcher.submit(requests[2]) == 2);
        round();
        CHECK(batcher.running() <= 2);
        CHECK(batcher.waiting() >= 1);
        round();
        for (std::size_t i = 3; i < requests.size(); ++i) CHECK(batcher.submit(requests[i]) == i);
        while (!batcher.idle()) round();
        CHECK(batcher.stats().target_passes > 0);
        CHECK(batcher.stats().accepted <= batcher.stats().drafted);
    }
    CHECK(widest == 2);
    CHECK(joined_mid_run);
    for (KvCache* cache : {&tcache, &dcache}) {  // the destroyed batcher left every slot and block free
        CHECK(cache->length(0) == 0);
        CHECK(cache->length(1) == 0);
        CHECK(cache->free_blocks() == cache->blocks());
    }
    REQUIRE(got.size() == requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
        INFO("request " << i << (requests[i].sampling.greedy ? ", greedy" : ", sampled"));
        CHECK(got[i].tokens == alone[i].tokens);
        REQUIRE(got[i].finish);
        CHECK(*got[i].finish == alone[i].finish);
    }
}

TEST_CASE("a speculative request waits for the blocks it needs in either cache, not only for a slot",
          "[infer][speculative]") {
    Gpt target(40, 63, 8.0f);
    Gpt draft(40, 64, 8.0f, 1, 32);
    // Each request needs 4 + 9 - 1 = 12 positions: 3 blocks of 4. The target's
    // cache holds 8 blocks (two at once), the draft's 5 (one at once).
    const Request request = request_of(4, 1, 9, true);
    KvCache tcache(2, 32, 2, 32, 4, 8);
    KvCache dcache(1, 32, 2, 32, 4, 5);
    CachedGpt t(target.model, target.config, tcache);
    CachedGpt d(draft.model, draft.config, dcache);
    SpeculativeBatcher batcher(t, d, 2);
    const std::uint64_t a = batcher.submit(request);
    const std::uint64_t b = batcher.submit(request_of(4, 2, 9, true));
    std::map<std::uint64_t, Collected> got;
    (void)collect(batcher, got);
    CHECK(batcher.running() == 1);  // a slot is free, the draft's blocks are not
    CHECK(batcher.waiting() == 1);
    while (batcher.waiting() == 1) (void)collect(batcher, got);
    CHECK(got[a].finish);  // b started only once a had finished
    while (!batcher.idle()) (void)collect(batcher, got);
    const std::vector<Request> both{request, request_of(4, 2, 9, true)};
    const auto expected = loom::infer::generate(target.model, target.config, both);
    CHECK(got[a].tokens == expected[0].tokens);
    CHECK(got[b].tokens == expected[1].tokens);
}

TEST_CASE("a speculative round yields up to gamma + 1 tokens per request, and the stats add up",
          "[infer][speculative]") {
    Gpt target(40, 65, 8.0f);
    KvCache tcache(2, 32, 2, 32);
    KvCache dcache(2, 32, 2, 32);
    CachedGpt t(target.model, target.config, tcache);
    CachedGpt d(target.model, target.config, dcache);  // the target as its own draft: every proposal accepted
    SpeculativeBatcher batcher(t, d, 4);
    const std::uint64_t a = batcher.submit(request_of(3, 1, 12, true));  // rounds of 5, 5, then 2 tokens
    const std::uint64_t b = batcher.submit(request_of(6, 2, 5, true));   // one round of 5
    std::vector<std::vector<std::size_t>> sizes;
    std::map<std::uint64_t, Collected> got;
    while (!batcher.idle()) {
        std::vector<std::size_t> round;
        for (const SpeculativeBatcher::Event& e : batcher.step()) {
            round.push_back(e.tokens.size());
            CHECK(e.accepted == e.drafted);
            got[e.id].tokens.insert(got[e.id].tokens.end(), e.tokens.begin(), e.tokens.end());
            got[e.id].finish = e.finish;
        }
        sizes.push_back(round);
    }
    CHECK(sizes == std::vector<std::vector<std::size_t>>{{5, 5}, {5}, {2}});
    CHECK(batcher.stats().target_passes == 4);
    CHECK(batcher.stats().drafted == 4 + 4 + 4 + 1);
    CHECK(batcher.stats().acceptance_rate() == 1.0);
    const std::vector<Request> both{request_of(3, 1, 12, true), request_of(6, 2, 5, true)};
    const auto expected = loom::infer::generate(target.model, target.config, both);
    CHECK(got[a].tokens == expected[0].tokens);
    CHECK(got[b].tokens == expected[1].tokens);
    CHECK(*got[b].finish == Finish::length);
}

TEST_CASE("cancelling a speculative request frees its slot in both caches at once", "[infer][speculative]") {
    Gpt target(40, 66, 8.0f);
    Gpt draft(40, 67, 8.0f, 1, 32);
    KvCache tcache(2, 32, 1, 32, 4);
    KvCache dcache(1, 32, 1, 32, 4);
    CachedGpt t(target.model, target.config, tcache);
    CachedGpt d(draft.model, draft.config, dcache);
    SpeculativeBatcher batcher(t, d, 3);
    const std::uint64_t a = batcher.submit(request_of(5, 1, 20, false));
    const std::uint64_t b = batcher.submit(request_of(3, 2, 6, false));
    const std::uint64_t c = batcher.submit(request_of(2, 3, 6, true));
    std::map<std::uint64_t, Collected> got;
    (void)collect(batcher, got);  // a runs in the one slot
    CHECK(tcache.length(0) > 0);
    CHECK(dcache.length(0) > 0);
    CHECK(batcher.cancel(a));
    CHECK(tcache.length(0) == 0);
    CHECK(dcache.length(0) == 0);
    CHECK(tcache.free_blocks() == tcache.blocks());
    CHECK(dcache.free_blocks() == dcache.blocks());
    CHECK(batcher.cancel(c));  // waiting: it never runs
    CHECK_FALSE(batcher.cancel(c));
    CHECK_FALSE(batcher.cancel(a));
    CHECK_FALSE(batcher.cancel(99));  // never given
    CHECK(batcher.running() == 0);
    CHECK(batcher.waiting() == 1);
    while (!batcher.idle()) (void)collect(batcher, got);
    CHECK(got.size() == 2);  // a's first round and b
    CHECK_FALSE(got.contains(c));
    const auto b_alone = loom::infer::speculative_generate(target.model, target.config, draft.model, draft.config,
                                                           request_of(3, 2, 6, false), 3);
    CHECK(got[b].tokens == b_alone.tokens);
    CHECK_FALSE(batcher.cancel(b));  // finished
}

TEST_CASE("bad inputs to the SpeculativeBatcher are named in one line, and refusals take no id",
          "[infer][speculative]") {
    Gpt target(40, 68, 1.0f);
    Gpt draft(40, 69, 1.0f, 1, 32);
    Gpt other_vocab(30, 70, 1.0f, 1, 32);
    KvCache tcache(2, 32, 2, 32, 4, 5);   // 5 blocks of 4 positions
    KvCache dcache(1, 32, 3, 16, 4, 3);   // 16 positions a sequence, 3 blocks
    KvCache ocache(1, 32, 2, 32);
    CachedGpt t(target.model, target.config, tcache);
    CachedGpt d(draft.model, draft.config, dcache);
    CachedGpt o(other_vocab.model, other_vocab.config, ocache);
    CHECK(message_of([&] { SpeculativeBatcher b(t, d, 0); }) ==
          "SpeculativeBatcher: gamma = 0 draft tokens per pass; propose at least 1");
    CHECK(message_of([&] { SpeculativeBatcher b(t, o, 2); }) ==
          "SpeculativeBatcher: the draft's vocabulary of 30 tokens is not the target's 40; the draft must share the "
          "target's tokens");
    CachedGpt same(target.model, target.config, tcache);
    CHECK(message_of([&] { SpeculativeBatcher b(t, same, 2); }) ==
          "SpeculativeBatcher: the target and the draft share one KvCache; give each its own");
    CHECK(message_of([&] { SpeculativeBatcher b(t, d, 2, 3); }) ==
          "SpeculativeBatcher: max_batch = 3 but the target's cache has 2 slots and the draft's 3; give 0..2 (0: "
          "every slot both have)");
    CHECK(message_of([&] { SpeculativeBatcher b(t, d, 2, -1); }) ==
          "SpeculativeBatcher: max_batch = -1 but the target's cache has 2 slots and the draft's 3; give 0..2 (0: "
          "every slot both have)");
    dcache.reserve(1, 2);
    CHECK(message_of([&] { SpeculativeBatcher b(t, d, 2); }) ==
          "SpeculativeBatcher: slot 1 of the draft's cache holds 2 positions; release it first");
    {
        SpeculativeBatcher one_slot(t, d, 2, 1);  // slot 1 is not its: the draft's holds 1 block of its 3
        CHECK(message_of([&] { (void)one_slot.submit(request_of(4, 0, 9, true)); }) ==
              "SpeculativeBatcher: request 0 needs 3 blocks of 4 positions in the draft's cache but the batcher has 2 "
              "(those free when it was built); build the cache with more blocks");
    }
    CHECK(dcache.length(1) == 2);  // a batcher leaves the slots past its own alone
    dcache.release(1);
    SpeculativeBatcher batcher(t, d, 2);
    CHECK(message_of([&] { (void)batcher.submit(request_of(0, 0, 3, true)); }) ==
          "SpeculativeBatcher: request 0 has an empty prompt; give at least one token");
    CHECK(message_of([&] { (void)batcher.submit(request_of(33, 0, 1, true)); }) ==
          "SpeculativeBatcher: request 0's prompt of 33 tokens is longer than the cache's 32 positions per sequence");
    CHECK(message_of([&] { (void)batcher.submit(request_of(2, 0, 0, true)); }) ==
          "SpeculativeBatcher: request 0 asks for max_new_tokens = 0; ask for at least 1");
    CHECK(message_of([&] { (void)batcher.submit(request_of(10, 0, 8, true)); }) ==
          "SpeculativeBatcher: request 0 needs 17 cached positions but the draft's cache holds 16 per sequence; build "
          "it (and the draft's Config::seq) at least that long");
    CHECK(message_of([&] { (void)batcher.submit(request_of(10, 0, 4, true)); }) ==
          "SpeculativeBatcher: request 0 needs 4 blocks of 4 positions in the draft's cache but the batcher has 3 "
          "(those free when it was built); build the cache with more blocks");
    Request bad = request_of(2, 0, 2, false);
    bad.sampling.top_p = 0.0f;
    CHECK(message_of([&] { (void)batcher.submit(bad); }) == "Sampling: top_p 0 is not in (0, 1] (1 keeps every token)");
    CHECK(batcher.idle());
    CHECK(batcher.submit(request_of(2, 0, 2, true)) == 0);  // the refusals took no id
    (void)batcher.step();
    KvCache tight(2, 32, 1, 32, 4, 2);  // the target's cache short of blocks instead
    KvCache roomy(1, 32, 1, 32, 4);
    CachedGpt t2(target.model, target.config, tight);
    CachedGpt d2(draft.model, draft.config, roomy);
    SpeculativeBatcher short_target(t2, d2, 2);
    CHECK(message_of([&] { (void)short_target.submit(request_of(4, 0, 6, true)); }) ==
          "SpeculativeBatcher: request 0 needs 3 blocks of 4 positions in the target's cache but the batcher has 2 "
          "(those free when it was built); build the cache with more blocks");
}

}  // namespace LOOM_TEST_FILE
