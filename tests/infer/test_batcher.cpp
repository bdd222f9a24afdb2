// The step-wise engine (infer/batcher.hpp) a server feeds while requests
// run: requests submitted mid-run get the tokens a one-shot generate() gives
// them, a waiting request takes a freed slot at the next step, cancelling
// frees a slot at once, and a request the cache cannot run is refused in
// one line without taking an id.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "loom/gpt/model.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::infer::Batcher;
using loom::infer::CachedGpt;
using loom::infer::Finish;
using loom::infer::KvCache;
using loom::infer::Request;
using loom::infer::Sampling;
using loom_test::message_of;

// A small random GPT whose logits are far from uniform (support/scaled_gpt.hpp).
struct SmallGpt : loom_test::ScaledGpt {
    explicit SmallGpt(std::uint64_t seed)
        : ScaledGpt({.layers = 2, .width = 32, .heads = 4, .seq = 24, .vocab = 40}, seed, 8.0f) {}
};

Request request_of(std::int64_t prompt_length, std::int32_t salt, std::int64_t max_new, bool greedy) {
    Request r;
    for (std::int64_t i = 0; i < prompt_length; ++i) r.prompt.push_back(static_cast<std::int32_t>((i * 5 + salt) % 40));
    r.max_new_tokens = max_new;
    if (greedy) r.sampling.greedy = true;
    else r.sampling = Sampling{.temperature = 1.3f, .top_k = 12, .seed = 50u + static_cast<std::uint64_t>(salt)};
    return r;
}

struct Collected {
    std::vector<std::int32_t> tokens;
    std::optional<Finish> finish;
};

// Steps until idle, gathering each id's tokens.
void drain(Batcher& batcher, std::map<std::uint64_t, Collected>& out) {
    while (!batcher.idle())
        for (const Batcher::Event& e : batcher.step()) {
            REQUIRE_FALSE(out[e.id].finish);  // nothing after a request's last token
            out[e.id].tokens.push_back(e.token);
            out[e.id].finish = e.finish;
        }
}

}  // namespace

TEST_CASE("requests submitted mid-run get the tokens a one-shot generate gives them", "[infer][batcher]") {
    SmallGpt gpt(21);
    std::vector<Request> requests;
    for (std::int32_t i = 0; i < 5; ++i) requests.push_back(request_of(2 + 3 * i, i, 9 - i, i % 2 == 0));
    requests[3].stop_tokens = {7, 11, 19};  // may stop early; the same either way
    const auto one_shot = loom::infer::generate(gpt.model, gpt.config, requests, 2);

    KvCache cache(gpt.config.layers, gpt.config.width, 2, gpt.config.seq);
    CachedGpt engine(gpt.model, gpt.config, cache);
    std::map<std::uint64_t, Collected> got;
    {
        Batcher batcher(engine);
        CHECK(batcher.submit(requests[0]) == 0);
        const auto step = [&] {
            for (const Batcher::Event& e : batcher.step()) {
                got[e.id].tokens.push_back(e.token);
                got[e.id].finish = e.finish;
            }
        };
        step();
        step();
        CHECK(batcher.submit(requests[1]) == 1);
        CHECK(batcher.submit(requests[2]) == 2);  // waits: two slots, both taken
        step();
        CHECK(batcher.running() == 2);
        CHECK(batcher.waiting() == 1);
        step();
        CHECK(batcher.submit(requests[3]) == 3);
        step();
        CHECK(batcher.submit(requests[4]) == 4);
        drain(batcher, got);
        CHECK(batcher.step().empty());
    }
    CHECK(cache.length(0) == 0);  // the destroyed Batcher left the slots free
    CHECK(cache.length(1) == 0);
    REQUIRE(got.size() == requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
        INFO("request " << i);
        CHECK(got[i].tokens == one_shot[i].tokens);
        REQUIRE(got[i].finish);
        CHECK(*got[i].finish == one_shot[i].finish);
    }
}

TEST_CASE("a waiting request takes a freed slot at the next step; cancelling frees one at once", "[infer][batcher]") {
    SmallGpt gpt(22);
    KvCache cache(gpt.config.layers, gpt.config.width, 1, gpt.config.seq);
    CachedGpt engine(gpt.model, gpt.config, cache);
    Batcher batcher(engine);
    const std::uint64_t a = batcher.submit(request_of(3, 1, 2, true));
    const std::uint64_t b = batcher.submit(request_of(4, 2, 3, true));
    auto events = batcher.step();  // a's prefill; b waits for the one slot
    REQUIRE(events.size() == 1);
    CHECK(events[0].id == a);
    CHECK_FALSE(events[0].finish);
    events = batcher.step();  // a's last token
    REQUIRE(events.size() == 1);
    CHECK(events[0].id == a);
    REQUIRE(events[0].finish);
    CHECK(*events[0].finish == Finish::length);
    CHECK(batcher.running() == 0);
    CHECK(batcher.waiting() == 1);
    events = batcher.step();  // b starts in the slot a left
    REQUIRE(events.size() == 1);
    CHECK(events[0].id == b);
    CHECK(cache.length(0) == 4);

    // Cancelling b (running) frees the slot for c at once; cancelling d (waiting) means it never runs.
    const std::uint64_t c = batcher.submit(request_of(5, 3, 4, false));
    const std::uint64_t d = batcher.submit(request_of(5, 4, 4, false));
    CHECK(batcher.cancel(b));
    CHECK(cache.length(0) == 0);
    CHECK(batcher.cancel(d));
    CHECK_FALSE(batcher.cancel(d));
    CHECK_FALSE(batcher.cancel(a));   // already finished
    CHECK_FALSE(batcher.cancel(99));  // never given
    std::map<std::uint64_t, Collected> got;
    drain(batcher, got);
    CHECK(got.size() == 1);
    const std::vector<Request> alone{request_of(5, 3, 4, false)};
    CHECK(got[c].tokens == loom::infer::generate(gpt.model, gpt.config, alone)[0].tokens);
}

TEST_CASE("bad requests to the Batcher are refused in one line and take no id", "[infer][batcher]") {
    SmallGpt gpt(23);
    KvCache cache(gpt.config.layers, gpt.config.width, 2, 16, 4, 3);  // 3 blocks of 4 positions
    CachedGpt engine(gpt.model, gpt.config, cache);
    {
        Batcher batcher(engine);
        CHECK(message_of([&] { (void)batcher.submit(request_of(0, 0, 3, true)); }) ==
              "Batcher: request 0 has an empty prompt; give at least one token");
        CHECK(message_of([&] { (void)batcher.submit(request_of(17, 0, 1, true)); }) ==
              "Batcher: request 0's prompt of 17 tokens is longer than the cache's 16 positions per sequence");
        CHECK(message_of([&] { (void)batcher.submit(request_of(2, 0, 0, true)); }) ==
              "Batcher: request 0 asks for max_new_tokens = 0; ask for at least 1");
        CHECK(message_of([&] { (void)batcher.submit(request_of(10, 0, 8, true)); }) ==
              "Batcher: request 0 needs 17 cached positions (a prompt of 10 and 8 new tokens, the last never cached) "
              "but the cache holds 16 per sequence");
        CHECK(message_of([&] { (void)batcher.submit(request_of(10, 0, 4, true)); }) ==
              "Batcher: request 0 needs 4 blocks of 4 positions but the cache has 3; build it with more blocks");
        Request bad = request_of(2, 0, 2, false);
        bad.sampling.temperature = 0.0f;
        CHECK(message_of([&] { (void)batcher.submit(bad); }) ==
              "Sampling: temperature 0 must be a finite number > 0 (use greedy = true for the most likely token)");
        CHECK(batcher.idle());
        CHECK(batcher.submit(request_of(2, 0, 2, true)) == 0);  // the refusals took no id
        (void)batcher.step();
    }
    const std::vector<std::int32_t> two{1, 2};
    (void)engine.prefill(1, two);
    CHECK(message_of([&] { Batcher held(engine); }) ==
          "Batcher: slot 1 of the cache holds 2 positions; release it first");
}

}  // namespace LOOM_TEST_FILE
