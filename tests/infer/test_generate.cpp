// The KV-cached inference engine (include/loom/infer/) against the model's own
// full forward: prefill logits equal gpt::logits, cached greedy generation
// equals a loop that re-runs the whole sequence every step (alone and with
// requests of other lengths beside it), sampling is deterministic in the seed,
// top-k / top-p / temperature / stop tokens / length limits do what they say,
// and every bad input is named in one line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/sampler.hpp"
#include "loom/kernels/host/gemm_threads.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::infer::CachedGpt;
using loom::infer::Completion;
using loom::infer::Finish;
using loom::infer::KvCache;
using loom::infer::Request;
using loom::infer::Sampler;
using loom::infer::Sampling;
using loom::infer::Segment;
using loom_test::message_of;

// A small random GPT whose logits are far from uniform (support/scaled_gpt.hpp).
struct TinyGpt : loom_test::ScaledGpt {
    explicit TinyGpt(std::uint64_t seed)
        : ScaledGpt({.layers = 2, .width = 32, .heads = 4, .seq = 24, .vocab = 40}, seed, 8.0f) {}
};

std::vector<std::int32_t> prompt_of(std::int64_t length, std::int32_t vocab, std::int32_t salt) {
    std::vector<std::int32_t> tokens;
    for (std::int64_t i = 0; i < length; ++i)
        tokens.push_back(static_cast<std::int32_t>((i * 7 + salt * 3 + 1) % vocab));
    return tokens;
}

// gpt::logits over the whole sequence: its last position's row.
std::vector<float> full_last_logits(TinyGpt& gpt, const std::vector<std::int32_t>& tokens) {
    loom::nn::Context ctx;
    const auto T = static_cast<std::int64_t>(tokens.size());
    const loom::Tensor logits = loom::gpt::logits(gpt.model, ctx, loom::Tensor::of(tokens.data(), {1, T}));
    const float* last = logits.data<float>() + (T - 1) * gpt.config.vocab;
    return {last, last + gpt.config.vocab};
}

// Greedy by re-running the whole sequence every step (what gpt::sample does).
std::vector<std::int32_t> greedy_by_recomputing(TinyGpt& gpt, std::vector<std::int32_t> tokens, std::int64_t count) {
    std::vector<std::int32_t> out;
    for (std::int64_t k = 0; k < count; ++k) {
        const auto logits = full_last_logits(gpt, tokens);
        const auto chosen = loom::infer::argmax(logits);
        out.push_back(chosen);
        tokens.push_back(chosen);
    }
    return out;
}

double relative_difference(std::span<const float> a, std::span<const float> b) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    }
    return diff / scale;
}

Request greedy_request(std::vector<std::int32_t> prompt, std::int64_t count) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = count;
    r.sampling.greedy = true;
    return r;
}

}  // namespace

TEST_CASE("prefill's logits equal gpt::logits at the last position, in one piece or in chunks", "[infer]") {
    TinyGpt gpt(11);
    KvCache cache(gpt.config.layers, gpt.config.width, 3, gpt.config.seq);
    CachedGpt engine(gpt.model, gpt.config, cache);
    for (std::int64_t length : {1, 5, 17, 24}) {
        const auto prompt = prompt_of(length, 40, static_cast<std::int32_t>(length));
        const auto expected = full_last_logits(gpt, prompt);
        const auto got = engine.prefill(0, prompt);
        CHECK(relative_difference(got, expected) < 1e-5);
        CHECK(cache.length(0) == length);
        cache.release(0);
    }
    // A prompt in two pieces (9, then 6 more): the second reads 9 cached positions and merges.
    const auto prompt = prompt_of(15, 40, 2);
    const std::vector<std::int32_t> head(prompt.begin(), prompt.begin() + 9), tail(prompt.begin() + 9, prompt.end());
    (void)engine.prefill(1, head);
    const Segment rest{1, tail};
    const auto got = engine.forward(std::span(&rest, 1));
    CHECK(relative_difference(got, full_last_logits(gpt, prompt)) < 1e-5);
    CHECK(cache.length(1) == 15);
}

TEST_CASE("packed prompts of different lengths each get their own last logits", "[infer]") {
    TinyGpt gpt(12);
    KvCache cache(gpt.config.layers, gpt.config.width, 3, gpt.config.seq);
    CachedGpt engine(gpt.model, gpt.config, cache);
    const auto a = prompt_of(3, 40, 5), b = prompt_of(11, 40, 6), c = prompt_of(7, 40, 7);
    const std::vector<Segment> packed{{2, a}, {0, b}, {1, c}};
    const auto logits = engine.forward(packed);
    const std::size_t V = 40;
    CHECK(relative_difference(logits.subspan(0, V), full_last_logits(gpt, a)) < 1e-5);
    CHECK(relative_difference(logits.subspan(V, V), full_last_logits(gpt, b)) < 1e-5);
    CHECK(relative_difference(logits.subspan(2 * V, V), full_last_logits(gpt, c)) < 1e-5);
    CHECK(cache.length(0) == 11);
    CHECK(cache.length(1) == 7);
    CHECK(cache.length(2) == 3);
}

TEST_CASE("cached greedy generation equals re-running the whole sequence, alone and batched", "[infer]") {
    TinyGpt gpt(13);
    const auto prompt = prompt_of(4, 40, 1);
    const auto expected = greedy_by_recomputing(gpt, prompt, 20);  // up to the model's 24 positions
    const std::vector<Request> one{greedy_request(prompt, 20)};
    const auto alone = loom::infer::generate(gpt.model, gpt.config, one);
    REQUIRE(alone.size() == 1);
    CHECK(alone[0].tokens == expected);
    CHECK(alone[0].finish == Finish::length);

    // Requests of lengths 1, 4 and 9 in one batch, finishing at different steps.
    std::vector<Request> batch{greedy_request(prompt_of(1, 40, 3), 12), greedy_request(prompt, 20),
                               greedy_request(prompt_of(9, 40, 4), 5)};
    const auto together = loom::infer::generate(gpt.model, gpt.config, batch);
    CHECK(together[0].tokens == greedy_by_recomputing(gpt, batch[0].prompt, 12));
    CHECK(together[1].tokens == expected);
    CHECK(together[2].tokens == greedy_by_recomputing(gpt, batch[2].prompt, 5));
    // Ten requests decoded together.
    std::vector<Request> ten;
    for (std::int32_t i = 0; i < 10; ++i) ten.push_back(greedy_request(prompt_of(1 + i, 40, i), 6));
    const auto wide = loom::infer::generate(gpt.model, gpt.config, ten);
    for (std::size_t i = 0; i < ten.size(); ++i) CHECK(wide[i].tokens == greedy_by_recomputing(gpt, ten[i].prompt, 6));
    // The model's tokens are not one repeated token: the check above compares something.
    CHECK(std::count(expected.begin(), expected.end(), expected[0]) < static_cast<std::ptrdiff_t>(expected.size()));
}

TEST_CASE("a step's attention split between GEMM threads by sequence gives one thread's bits", "[infer]") {
    // Wide and long enough that 12 decode rows over ~100 cached positions are
    // worth 2 parts (segment_attention.hpp's grain: 2^18 MACs a part, a
    // sequence ~2 x 256 x 100), beside a prompt of 20 rows and a 3-row chain.
    loom_test::ScaledGpt gpt({.layers = 2, .width = 256, .heads = 4, .seq = 128, .vocab = 40}, 19, 2.0f);
    const std::int64_t slots = 14;
    std::vector<std::vector<float>> logits_by_threads;
    for (const int threads : {1, 2, 3}) {
        loom::kernels::host::set_gemm_threads(threads);
        KvCache cache(gpt.config.layers, gpt.config.width, slots, gpt.config.seq);
        CachedGpt engine(gpt.model, gpt.config, cache);
        std::vector<std::vector<std::int32_t>> prompts;
        for (std::int64_t s = 0; s < 12; ++s) prompts.push_back(prompt_of(90 + 2 * s, 40, static_cast<std::int32_t>(s)));
        std::vector<Segment> prefill;
        for (std::int64_t s = 0; s < 12; ++s) prefill.push_back({s, prompts[static_cast<std::size_t>(s)]});
        (void)engine.forward(prefill);
        // One step: 11 single tokens, a 3-token chain in slot 11, a fresh 20-token prompt in slot 12.
        const std::vector<std::int32_t> one{5}, three = prompt_of(3, 40, 30), fresh = prompt_of(20, 40, 31);
        std::vector<Segment> step;
        for (std::int64_t s = 0; s < 11; ++s) step.push_back({s, one});
        step.push_back({11, three});
        step.push_back({12, fresh});
        const auto logits = engine.forward(step, loom::infer::Logits::every);
        logits_by_threads.emplace_back(logits.begin(), logits.end());
    }
    loom::kernels::host::set_gemm_threads(1);
    CHECK(logits_by_threads[1] == logits_by_threads[0]);
    CHECK(logits_by_threads[2] == logits_by_threads[0]);
}

TEST_CASE("continuous batching: a finished request's slot is refilled, and every request gets its own tokens",
          "[infer]") {
    TinyGpt gpt(17);
    std::vector<Request> requests;
    for (std::int32_t i = 0; i < 5; ++i) {
        Request r = greedy_request(prompt_of(1 + 3 * i, 40, i), 2 + 3 * (4 - i));  // short prompts run long
        if (i % 2 == 1)
            r.sampling = Sampling{.temperature = 1.2f, .top_k = 10, .top_p = 0.9f,
                                  .seed = 100u + static_cast<std::uint64_t>(i)};
        requests.push_back(std::move(r));
    }
    std::vector<std::vector<std::int32_t>> alone;
    for (const Request& r : requests)
        alone.push_back(loom::infer::generate(gpt.model, gpt.config, std::span(&r, 1))[0].tokens);
    for (std::int64_t max_batch : {1, 2, 3, 0}) {
        const auto batched = loom::infer::generate(gpt.model, gpt.config, requests, max_batch);
        for (std::size_t i = 0; i < requests.size(); ++i) {
            INFO("max_batch " << max_batch << ", request " << i);
            CHECK(batched[i].tokens == alone[i]);
        }
    }
    // On an engine of 2 slots: the slots are free afterwards, so it runs again.
    KvCache cache(gpt.config.layers, gpt.config.width, 2, gpt.config.seq);
    CachedGpt engine(gpt.model, gpt.config, cache);
    CHECK(loom::infer::generate(engine, requests)[4].tokens == alone[4]);
    CHECK(cache.length(0) == 0);
    CHECK(cache.length(1) == 0);
    CHECK(loom::infer::generate(engine, requests)[3].tokens == alone[3]);
}

TEST_CASE("the paged cache hands out blocks as a sequence grows and takes them back on release", "[infer]") {
    KvCache cache(2, 8, 3, 20, /*block_size=*/4, /*blocks=*/6);
    CHECK(cache.blocks() == 6);
    CHECK(cache.free_blocks() == 6);
    cache.reserve(0, 5);  // positions 0..4: two blocks
    CHECK(std::vector<std::int32_t>(cache.block_table(0).begin(), cache.block_table(0).end()) ==
          std::vector<std::int32_t>{0, 1});
    cache.reserve(1, 4);
    cache.reserve(0, 3);  // 8 positions still fit in two blocks
    CHECK(cache.block_table(0).size() == 2);
    cache.reserve(0, 1);  // the ninth takes block 3
    CHECK(cache.block_table(0).back() == 3);
    CHECK(cache.free_blocks() == 2);
    // Rows of one position are the same memory whichever way they are reached.
    CHECK(cache.row(1, 0, 8) == cache.block_rows(1, 3));
    CHECK(cache.row(0, 1, 3) == cache.block_rows(0, 2) + 3 * cache.row_stride());
    CHECK(message_of([&] { cache.reserve(2, 9); }) ==
          "KvCache: slot 2 needs 3 more blocks of 4 positions but 2 of the 6 are free; release a sequence or build "
          "the cache with more blocks");
    CHECK(cache.length(2) == 0);  // nothing was taken
    CHECK(message_of([&] { (void)cache.row(1, 1, 4); }) ==
          "KvCache: position 4 of slot 1 is not in [0, 4); reserve it first");
    cache.release(0);
    CHECK(cache.free_blocks() == 5);
    cache.reserve(2, 9);
    CHECK(cache.free_blocks() == 2);
    CHECK(message_of([] { KvCache bad(2, 8, 1, 8, 0); }) == "KvCache: block_size = 0 must be at least 1 position");
}

TEST_CASE("paged generation equals recomputation for any block size, and waits for blocks when they run short",
          "[infer]") {
    TinyGpt gpt(18);
    std::vector<Request> requests;
    for (std::int32_t i = 0; i < 4; ++i) requests.push_back(greedy_request(prompt_of(2 + 5 * i, 40, i), 8));
    std::vector<std::vector<std::int32_t>> expected;
    for (const Request& r : requests) expected.push_back(greedy_by_recomputing(gpt, r.prompt, 8));
    for (std::int64_t block_size : {1, 3, 16, 64}) {
        KvCache cache(gpt.config.layers, gpt.config.width, 4, gpt.config.seq, block_size);
        CachedGpt engine(gpt.model, gpt.config, cache);
        const auto done = loom::infer::generate(engine, requests);
        for (std::size_t i = 0; i < requests.size(); ++i) {
            INFO("block size " << block_size << ", request " << i);
            CHECK(done[i].tokens == expected[i]);
        }
        CHECK(cache.free_blocks() == cache.blocks());
    }
    // 4 slots but blocks for 24 positions in blocks of 4: the longest (a prompt
    // of 17 and 8 new: 24 positions, 6 blocks) runs alone, the others when it leaves.
    KvCache tight(gpt.config.layers, gpt.config.width, 4, gpt.config.seq, 4, 6);
    CachedGpt engine(gpt.model, gpt.config, tight);
    const auto done = loom::infer::generate(engine, requests);
    for (std::size_t i = 0; i < requests.size(); ++i) CHECK(done[i].tokens == expected[i]);
    // A forward whose segments together need more blocks than are free grows no slot.
    KvCache few(gpt.config.layers, gpt.config.width, 2, gpt.config.seq, 4, 3);
    CachedGpt short_of_blocks(gpt.model, gpt.config, few);
    const auto five = prompt_of(5, 40, 0), six = prompt_of(6, 40, 1);
    const std::vector<Segment> both{{0, five}, {1, six}};
    CHECK(message_of([&] { (void)short_of_blocks.forward(both); }) ==
          "CachedGpt: this forward needs 4 more blocks of 4 positions but 3 of the 3 are free; release a sequence "
          "or build the cache with more blocks");
    CHECK(few.length(0) == 0);
    CHECK(few.free_blocks() == 3);
    KvCache tiny(gpt.config.layers, gpt.config.width, 4, gpt.config.seq, 4, 5);
    CachedGpt small(gpt.model, gpt.config, tiny);
    CHECK(message_of([&] { (void)loom::infer::generate(small, requests); }) ==
          "generate: request 3 needs 6 blocks of 4 positions but the cache has 5; build it with more blocks");
}

TEST_CASE("sampling is deterministic in the seed, whatever the batch, and top-k 1 is greedy", "[infer]") {
    TinyGpt gpt(14);
    Request r;
    r.prompt = prompt_of(5, 40, 2);
    r.max_new_tokens = 15;
    r.sampling = Sampling{.temperature = 1.5f, .seed = 7};
    const std::vector<Request> one{r};
    const auto first = loom::infer::generate(gpt.model, gpt.config, one);
    const auto again = loom::infer::generate(gpt.model, gpt.config, one);
    CHECK(first[0].tokens == again[0].tokens);
    Request other_seed = r;
    other_seed.sampling.seed = 8;
    Request neighbour = greedy_request(prompt_of(12, 40, 9), 3);
    const std::vector<Request> mixed{neighbour, r, other_seed};
    const auto batched = loom::infer::generate(gpt.model, gpt.config, mixed);
    CHECK(batched[1].tokens == first[0].tokens);
    CHECK(batched[2].tokens != first[0].tokens);

    Request top1 = r;
    top1.sampling.top_k = 1;
    const std::vector<Request> k1{top1}, greedy{greedy_request(r.prompt, 15)};
    CHECK(loom::infer::generate(gpt.model, gpt.config, k1)[0].tokens ==
          loom::infer::generate(gpt.model, gpt.config, greedy)[0].tokens);
}

TEST_CASE("top-k, top-p and temperature keep the tokens they name, at the softmax's frequencies", "[infer]") {
    // Probabilities 0.4, 0.3, 0.2, 0.1 (in a shuffled order of ids).
    const std::vector<float> logits{std::log(0.2f), std::log(0.4f), std::log(0.1f), std::log(0.3f)};
    Sampler sampler;
    const auto frequencies = [&](const Sampling& s) {
        std::vector<int> counts(4, 0);
        const int draws = 4000;
        for (int k = 0; k < draws; ++k)
            ++counts[static_cast<std::size_t>(sampler.pick(logits, s, static_cast<std::uint64_t>(k)))];
        std::vector<double> f;
        for (int c : counts) f.push_back(static_cast<double>(c) / draws);
        return f;
    };
    const auto plain = frequencies(Sampling{.seed = 1});
    CHECK(plain[0] == Approx(0.2).margin(0.03));
    CHECK(plain[1] == Approx(0.4).margin(0.03));
    CHECK(plain[2] == Approx(0.1).margin(0.03));
    CHECK(plain[3] == Approx(0.3).margin(0.03));
    // top-k 2: ids 1 and 3 only, renormalised to 4/7 and 3/7.
    const auto top2 = frequencies(Sampling{.top_k = 2, .seed = 2});
    CHECK(top2[0] == 0.0);
    CHECK(top2[2] == 0.0);
    CHECK(top2[1] == Approx(4.0 / 7).margin(0.03));
    // top-p 0.6: 0.4 is short of it, 0.4 + 0.3 reaches it -> ids 1 and 3.
    const auto nucleus = frequencies(Sampling{.top_p = 0.6f, .seed = 3});
    CHECK(nucleus[0] == 0.0);
    CHECK(nucleus[2] == 0.0);
    CHECK(nucleus[3] == Approx(3.0 / 7).margin(0.03));
    // top-p 0.3: the most likely alone.
    CHECK(frequencies(Sampling{.top_p = 0.3f, .seed = 4})[1] == 1.0);
    // Temperature 0.5 squares the probabilities: 0.16, 0.09, 0.04, 0.01 over 0.30.
    const auto cold = frequencies(Sampling{.temperature = 0.5f, .seed = 5});
    CHECK(cold[1] == Approx(0.16 / 0.30).margin(0.03));
    CHECK(cold[2] == Approx(0.01 / 0.30).margin(0.02));
    // Greedy: the largest logit, the lowest id among equals.
    CHECK(sampler.pick(logits, Sampling{.greedy = true}, 0) == 1);
    const std::vector<float> tied{1.0f, 3.0f, 3.0f};
    CHECK(sampler.pick(tied, Sampling{.greedy = true}, 0) == 1);
    CHECK(sampler.pick(tied, Sampling{.top_k = 1}, 9) == 1);
}

TEST_CASE("a stop token ends a request and the length limit counts new tokens", "[infer]") {
    TinyGpt gpt(15);
    const auto prompt = prompt_of(3, 40, 8);
    const std::vector<Request> free_run{greedy_request(prompt, 12)};
    const auto tokens = loom::infer::generate(gpt.model, gpt.config, free_run)[0].tokens;
    REQUIRE(tokens.size() == 12);
    // The first token (after the first) that did not appear before it: stopping there cuts the run.
    std::size_t at = 1;
    while (at < tokens.size() && std::find(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(at),
                                           tokens[at]) != tokens.begin() + static_cast<std::ptrdiff_t>(at))
        ++at;
    REQUIRE(at < tokens.size());
    Request stopping = greedy_request(prompt, 12);
    stopping.stop_tokens = {tokens[at]};
    const std::vector<Request> with_stop{stopping, greedy_request(prompt, 5), greedy_request(prompt, 1)};
    const auto done = loom::infer::generate(gpt.model, gpt.config, with_stop);
    CHECK(done[0].finish == Finish::stop);
    const auto stop_at = static_cast<std::ptrdiff_t>(at);
    CHECK(done[0].tokens == std::vector<std::int32_t>(tokens.begin(), tokens.begin() + stop_at + 1));
    CHECK(done[1].finish == Finish::length);
    CHECK(done[1].tokens == std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 5));
    CHECK(done[2].tokens == std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 1));
    // The whole cache: a prompt of 10 and 15 new tokens fills the 24 positions exactly.
    const std::vector<Request> full{greedy_request(prompt_of(10, 40, 1), 15)};
    CHECK(loom::infer::generate(gpt.model, gpt.config, full)[0].tokens.size() == 15);
}

TEST_CASE("bad inputs to the engine are named in one line", "[infer]") {
    TinyGpt gpt(16);
    const auto run = [&](Request r) {
        const std::vector<Request> one{std::move(r)};
        return message_of([&] { (void)loom::infer::generate(gpt.model, gpt.config, one); });
    };
    CHECK(run(greedy_request({}, 3)) == "generate: request 0 has an empty prompt; give at least one token");
    CHECK(run(greedy_request(prompt_of(25, 40, 0), 1)) ==
          "generate: request 0's prompt of 25 tokens is longer than the cache's 24 positions per sequence");
    CHECK(run(greedy_request(prompt_of(10, 40, 0), 16)) ==
          "generate: request 0 needs 25 cached positions (a prompt of 10 and 16 new tokens, the last never cached) "
          "but the cache holds 24 per sequence");
    CHECK(run(greedy_request(prompt_of(2, 40, 0), 0)) ==
          "generate: request 0 asks for max_new_tokens = 0; ask for at least 1");
    Request r = greedy_request(prompt_of(2, 40, 0), 2);
    r.sampling = Sampling{.top_p = 0.0f};
    CHECK(run(r) == "Sampling: top_p 0 is not in (0, 1] (1 keeps every token)");
    r.sampling = Sampling{.top_p = 1.5f};
    CHECK(run(r) == "Sampling: top_p 1.5 is not in (0, 1] (1 keeps every token)");
    r.sampling = Sampling{.temperature = 0.0f};
    CHECK(run(r) ==
          "Sampling: temperature 0 must be a finite number > 0 (use greedy = true for the most likely token)");
    r.sampling = Sampling{.temperature = -1.0f};
    CHECK(run(r) ==
          "Sampling: temperature -1 must be a finite number > 0 (use greedy = true for the most likely token)");
    r.sampling = Sampling{.top_k = -2};
    CHECK(run(r) == "Sampling: top_k -2 must be >= 0 (0 keeps every token)");
    CHECK(message_of([&] { (void)loom::infer::generate(gpt.model, gpt.config, std::span<const Request>{}); }) ==
          "generate: no requests");
    const std::vector<Request> fine{greedy_request(prompt_of(2, 40, 0), 2)};
    CHECK(message_of([&] { (void)loom::infer::generate(gpt.model, gpt.config, fine, -1); }) ==
          "generate: max_batch = -1 must be >= 0 (0: every request at once)");

    KvCache cache(gpt.config.layers, gpt.config.width, 2, 8);
    CachedGpt engine(gpt.model, gpt.config, cache);
    const auto nine = prompt_of(9, 40, 0);
    CHECK(message_of([&] { (void)engine.prefill(0, nine); }) ==
          "CachedGpt: slot 0 holds 0 positions and 9 more would exceed the cache's capacity of 8; shorten the "
          "prompt or the generation");
    CHECK(cache.length(0) == 0);  // nothing was reserved
    const std::vector<std::int32_t> bad_token{3, 40};
    CHECK(message_of([&] { (void)engine.prefill(1, bad_token); }) ==
          "CachedGpt: token id 40 at position 1 of slot 1 is outside the vocabulary [0, 40)");
    CHECK(message_of([&] { (void)engine.prefill(2, nine); }) == "KvCache: slot 2 is not in [0, 2)");
    const std::vector<std::int32_t> two{1, 2};
    (void)engine.prefill(0, two);
    CHECK(message_of([&] { (void)engine.prefill(0, two); }) ==
          "CachedGpt: prefill of slot 0 which already holds 2 positions; release it first");
    const std::vector<std::int64_t> slots{0, 0};
    CHECK(message_of([&] { (void)engine.decode(slots, two); }) ==
          "CachedGpt: slot 0 appears twice in one forward; give each sequence one segment");
    CHECK(message_of([&] { (void)engine.decode(std::span(slots).first(1), two); }) ==
          "CachedGpt: decode of 1 slots with 2 tokens; give one token per slot");
    const std::vector<Request> one{greedy_request(two, 2)};
    CHECK(message_of([&] { (void)loom::infer::generate(engine, one); }) ==
          "generate: slot 0 of the cache holds 2 positions; release it first");
    CHECK(message_of([&] { cache.reserve(1, 9); }) ==
          "KvCache: slot 1 holds 0 positions and 9 more would exceed its capacity of 8; shorten the prompt or the "
          "generation, or build the cache with a larger capacity");
    CHECK(message_of([&] {
              KvCache too_long(gpt.config.layers, gpt.config.width, 1, 25);
              CachedGpt e(gpt.model, gpt.config, too_long);
          }) ==
          "CachedGpt: the cache holds 25 positions per slot but the model has position embeddings for 24; build "
          "the cache with capacity <= Config::seq");
    CHECK(message_of([&] {
              KvCache wrong(3, gpt.config.width, 1, 8);
              CachedGpt e(gpt.model, gpt.config, wrong);
          }) ==
          "CachedGpt: the cache is for 3 layers of width 32 but the model has 2 of width 32");
    CHECK(message_of([] { KvCache none(2, 32, 0, 8); }) == "KvCache: slots = 0 must be at least 1");
    CHECK(message_of([] { KvCache none(2, 32, 1, 0); }) == "KvCache: capacity = 0 must be at least 1 position");
    auto unbound = loom::gpt::make_model(gpt.config);
    CHECK(message_of([&] { CachedGpt e(unbound, gpt.config, cache); }) ==
          "CachedGpt: the model's parameters are not bound; give the model a ParamArena (and load or initialise it) "
          "first");
}

}  // namespace LOOM_TEST_FILE
