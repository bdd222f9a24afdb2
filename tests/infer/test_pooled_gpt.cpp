// Peer memory pooling (infer/pooled_gpt.hpp, infer/block_prefetcher.hpp):
// a GPT whose chosen blocks live in a pool or in a peer replica's memory,
// served with and without the copy thread that stages them ahead, gives the
// resident model's logits bit for bit and its tokens in mixed continuous
// batches; two replicas that each hold half the blocks serve at once on two
// threads; a pass that stops part way resumes; the bytes add up; and every
// bad input is named in one line.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/gpt/model.hpp"
#include "loom/infer/block_prefetcher.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pooled_gpt.hpp"
#include "infer/tensor_parallel_serving_suite.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::infer::BlockHome;
using loom::infer::BlockPrefetcher;
using loom::infer::CachedGpt;
using loom::infer::Completion;
using loom::infer::KvCache;
using loom::infer::PooledGpt;
using loom::infer::PrefetchOptions;
using loom::infer::Request;
using loom::infer::Segment;
using loom_test::message_of;

// Six blocks, so a pool can hold three and a prefetcher look two ahead; the vocabulary of mixed_batch.
struct SixBlocks : loom_test::ScaledGpt {
    SixBlocks() : ScaledGpt({.layers = 6, .width = 32, .heads = 4, .seq = 40, .vocab = 42}, 31, 8.0f) {}
};

std::vector<Completion> generate_on(loom::gpt::Model& model, const loom::gpt::Config& config,
                                    const std::vector<Request>& requests, BlockPrefetcher* prefetcher = nullptr) {
    KvCache cache(config.layers, config.width, 4, config.seq);
    CachedGpt engine(model, config, cache);
    if (prefetcher != nullptr) engine.prefetch_blocks(*prefetcher);
    return loom::infer::generate(engine, requests);
}

void require_same(const std::vector<Completion>& got, const std::vector<Completion>& expected) {
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].tokens == expected[i].tokens);
        CHECK(got[i].finish == expected[i].finish);
    }
}

// Every logit of a prefill of three prompts and five decode steps.
std::vector<float> logits_of(loom::gpt::Model& model, const loom::gpt::Config& config,
                             BlockPrefetcher* prefetcher = nullptr) {
    KvCache cache(config.layers, config.width, 3, config.seq);
    CachedGpt engine(model, config, cache);
    if (prefetcher != nullptr) engine.prefetch_blocks(*prefetcher);
    std::vector<float> all;
    const auto a = loom_test::prompt_of(9, 42, 1), b = loom_test::prompt_of(4, 42, 2);
    const auto c = loom_test::prompt_of(13, 42, 3);
    const Segment prompts[] = {{0, a}, {1, b}, {2, c}};
    auto logits = engine.forward(prompts);
    all.insert(all.end(), logits.begin(), logits.end());
    for (std::int32_t step = 0; step < 5; ++step) {
        const std::int64_t slots[] = {0, 1, 2};
        const std::int32_t tokens[] = {step, static_cast<std::int32_t>(step + 7), static_cast<std::int32_t>(step + 20)};
        logits = engine.decode(slots, tokens);
        all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
}

}  // namespace

TEST_CASE("a pooled GPT gives the resident model's logits bit for bit, staged or read in place", "[infer][pool]") {
    SixBlocks gpt;
    const std::vector<float> expected = logits_of(gpt.model, gpt.config);
    PooledGpt pooled(gpt.config, gpt.arena.values(), {1, 3, 4});
    SECTION("read in place (no prefetcher)") { CHECK(logits_of(pooled.model(), gpt.config) == expected); }
    for (const std::int64_t lookahead : {1, 2}) {
        SECTION("staged " + std::to_string(lookahead) + " ahead") {
            BlockPrefetcher prefetcher(pooled, {.lookahead = lookahead});
            CHECK(logits_of(pooled.model(), gpt.config, &prefetcher) == expected);
            const auto counts = prefetcher.counts();
            CHECK(counts.acquires == 6 * 3);  // a prefill and five decode steps, three pooled blocks each
            CHECK(counts.copies >= counts.acquires);
            CHECK(counts.copied_bytes == counts.copies * pooled.block_floats() * 4);
        }
    }
    SECTION("traced") {
        BlockPrefetcher prefetcher(pooled, {.lookahead = 1, .trace = true});
        CHECK(logits_of(pooled.model(), gpt.config, &prefetcher) == expected);
        // The copy thread runs on (it stages the next pass's blocks), so its count is bracketed.
        const auto copies_before = prefetcher.counts().copies;
        const auto events = prefetcher.trace_events();
        const auto copies_after = prefetcher.counts().copies;
        std::int64_t computed = 0, copied = 0;
        for (const auto& e : events) {
            computed += e.lane == loom::exec::compute_lane && e.category == "forward";
            copied += e.lane == loom::exec::communication_lane && e.category == "copy";
            CHECK(e.duration_us >= 0);
        }
        CHECK(computed == 6 * 6);  // six passes of six blocks, resident ones too
        CHECK(copied >= copies_before);
        CHECK(copied <= copies_after);
        CHECK(std::any_of(events.begin(), events.end(), [](const auto& e) { return e.name == "block 3 (pool)"; }));
        CHECK(std::any_of(events.begin(), events.end(), [](const auto& e) { return e.name == "copy block 4"; }));
    }
    SECTION("under a modelled link") {
        BlockPrefetcher prefetcher(pooled, {.lookahead = 1, .link_bytes_per_second = 2e9});
        CHECK(logits_of(pooled.model(), gpt.config, &prefetcher) == expected);
        // 12 C^2 + 13 C floats at 2 GB/s: each copy at least that long.
        const auto counts = prefetcher.counts();
        CHECK(counts.copy_ns >= counts.copies * (pooled.block_floats() * 4 / 2));
    }
    // Between passes every pooled block is bound back home.
    for (const std::int64_t b : pooled.pooled()) {
        const auto& attention = std::get<1>(pooled.model().blocks[static_cast<std::size_t>(b)].attn.layers);
        CHECK(attention.qkv.weight.value.data<float>() == pooled.block_values(b).data() + 2 * 32);
    }
}

TEST_CASE("a pooled GPT generates the resident model's tokens in mixed continuous batches", "[infer][pool]") {
    SixBlocks gpt;
    for (const bool greedy : {true, false}) {
        const auto requests = loom_test::mixed_batch(greedy);
        const auto expected = generate_on(gpt.model, gpt.config, requests);
        PooledGpt pooled(gpt.config, gpt.arena.values(), {0, 2, 3, 5});
        BlockPrefetcher prefetcher(pooled, {.lookahead = 2});
        require_same(generate_on(pooled.model(), gpt.config, requests, &prefetcher), expected);
    }
}

TEST_CASE("two replicas that each hold half the blocks serve at once from each other's memory", "[infer][pool]") {
    SixBlocks gpt;
    const auto requests = loom_test::mixed_batch(true);
    std::vector<Request> reversed(requests.rbegin(), requests.rend());
    const auto expected_a = generate_on(gpt.model, gpt.config, requests);
    const auto expected_b = generate_on(gpt.model, gpt.config, reversed);
    // A keeps the even blocks, B the odd ones; each pools the other's.
    PooledGpt a(gpt.config, gpt.arena.values(), {1, 3, 5});
    PooledGpt b(gpt.config, gpt.arena.values(), {0, 2, 4});
    a.pool_from(b);
    b.pool_from(a);
    CHECK(a.home(1) == BlockHome::peer);
    CHECK(b.home(1) == BlockHome::resident);
    // Six blocks' weights held once between them; the embeddings and head by both.
    CHECK(a.resident_bytes() + b.resident_bytes() ==
          (gpt.config.parameters() + gpt.config.parameters() - 6 * PooledGpt::gpt_block_floats(gpt.config)) * 4);
    BlockPrefetcher prefetch_b(b, {.lookahead = 1});
    std::vector<Completion> got_b;
    std::thread replica_b([&] { got_b = generate_on(b.model(), gpt.config, reversed, &prefetch_b); });
    // A reads B's blocks while B serves: B's model re-points its own pooled blocks, never A's.
    const auto got_a = generate_on(a.model(), gpt.config, requests);
    replica_b.join();
    require_same(got_a, expected_a);
    require_same(got_b, expected_b);
}

TEST_CASE("a replica pools from a peer known only by its resident buffer, held in storage the caller gives",
          "[infer][pool]") {
    SixBlocks gpt;
    const auto requests = loom_test::mixed_batch(false);
    const auto expected = generate_on(gpt.model, gpt.config, requests);
    // What another process would map: the peer's resident values in memory the caller owns.
    const std::vector<std::int64_t> peer_pools{0, 3};
    std::vector<float> storage(static_cast<std::size_t>(PooledGpt::resident_floats(gpt.config, peer_pools)));
    PooledGpt peer(gpt.config, gpt.arena.values(), peer_pools, std::span<float>(storage));
    CHECK(peer.block_values(1).data() == storage.data() + (42 + 40) * 32);  // after the embeddings
    PooledGpt mine(gpt.config, gpt.arena.values(), {1, 2, 4, 5});
    mine.pool_from(storage, peer_pools);
    CHECK(mine.block_values(4).data() == peer.block_values(4).data());
    BlockPrefetcher prefetcher(mine, {.lookahead = 1});
    require_same(generate_on(mine.model(), gpt.config, requests, &prefetcher), expected);
}

TEST_CASE("a prefetcher stages each pooled block's values and resumes a pass that stopped part way", "[infer][pool]") {
    SixBlocks gpt;
    PooledGpt pooled(gpt.config, gpt.arena.values(), {1, 2, 4, 5});
    BlockPrefetcher prefetcher(pooled, {.lookahead = 2});
    const auto staged_equals_home = [&](std::int64_t b) {
        const loom::gpt::Block& block = prefetcher.acquire(b);
        const float* at = std::get<0>(block.attn.layers).gain.value.data<float>();
        const auto home = pooled.block_values(b);
        const bool moved = at != home.data();
        return moved && std::equal(home.begin(), home.end(), at);
    };
    CHECK(staged_equals_home(1));
    prefetcher.release(1);
    CHECK(staged_equals_home(2));
    // The pass stops holding block 2; the next asks for block 1 again.
    CHECK(staged_equals_home(1));
    prefetcher.release(1);
    // It stops again after block 1; the next one starts at block 4 (block 2 skipped).
    CHECK(staged_equals_home(4));
    prefetcher.release(4);
    // A resident block comes as it is.
    CHECK(&prefetcher.acquire(3) == &pooled.model().blocks[3]);
    prefetcher.release(3);
    CHECK(message_of([&] { prefetcher.release(2); }) ==
          "BlockPrefetcher: release of block 2 which is not the block acquired (none)");
    CHECK(prefetcher.staging_bytes() == 3 * pooled.block_floats() * 4);
}

TEST_CASE("a pooled GPT's bytes add up and it prints where its blocks are", "[infer][pool]") {
    SixBlocks gpt;
    PooledGpt pooled(gpt.config, gpt.arena.values(), {4, 1});
    const std::int64_t block = PooledGpt::gpt_block_floats(gpt.config) * 4;
    CHECK(pooled.pooled() == std::vector<std::int64_t>{1, 4});
    CHECK(pooled.pooled_bytes() == 2 * block);
    CHECK(pooled.resident_bytes() + pooled.pooled_bytes() == gpt.config.parameters() * 4);
    std::ostringstream printed;
    printed << pooled;
    CHECK(printed.str() == "PooledGpt(6 blocks, pooled {1,4} in pool, " + std::to_string(pooled.resident_bytes()) +
                               " bytes resident, " + std::to_string(2 * block) + " pooled)");
    BlockPrefetcher prefetcher(pooled, {.lookahead = 1, .link_bytes_per_second = 16e9});
    std::ostringstream staged;
    staged << prefetcher;
    CHECK(staged.str() == "BlockPrefetcher(Prefetch(lookahead=1, link=16 GB/s), 2 staging buffers of " +
                              std::to_string(block) + " bytes)");
}

TEST_CASE("pooling refuses bad input in one line", "[infer][pool]") {
    SixBlocks gpt;
    const auto values = gpt.arena.values();
    CHECK(message_of([&] { PooledGpt p(gpt.config, values.first(10), {1}); }) ==
          "PooledGpt: 10 values given but GPT(layers=6, width=32, heads=4, seq=40, vocab=42) has " +
              std::to_string(gpt.config.parameters()) + "; give the whole model's values in serial order");
    CHECK(message_of([&] { PooledGpt p(gpt.config, values, {1, 6}); }) ==
          "PooledGpt: pooled block 6 does not exist; the model has blocks 0..5");
    CHECK(message_of([&] { PooledGpt p(gpt.config, values, {3, 3}); }) ==
          "PooledGpt: block 3 is pooled twice; list each block once");
    PooledGpt peer(gpt.config, values, {2});
    PooledGpt two(gpt.config, values, {1, 2});
    CHECK(message_of([&] { two.pool_from(peer); }) ==
          "PooledGpt: block 2 is pooled here but the peer pools it too; pool only blocks the peer keeps resident");
    loom::gpt::Config other = gpt.config;
    other.heads = 2;
    PooledGpt other_model(other, values, {1});
    CHECK(message_of([&] { other_model.pool_from(peer); }) ==
          "PooledGpt: the peer serves GPT(layers=6, width=32, heads=4, seq=40, vocab=42) but this model is "
          "GPT(layers=6, width=32, heads=2, seq=40, vocab=42); pool blocks with a replica of the same model");
    CHECK(two.home(1) == BlockHome::pool);  // a refused pool_from changes nothing
    std::vector<float> short_buffer(10);
    CHECK(message_of([&] { two.pool_from(short_buffer, {0}); }) ==
          "PooledGpt: the peer's resident values are 10 floats but a replica of GPT(layers=6, width=32, heads=4, "
          "seq=40, vocab=42) pooling 1 blocks holds " +
              std::to_string(PooledGpt::resident_floats(gpt.config, std::vector<std::int64_t>{0})) +
              "; give the peer's resident buffer whole");
    CHECK(message_of([&] { PooledGpt p(gpt.config, values, {1}, std::span<float>(short_buffer)); }) ==
          "PooledGpt: 10 floats of resident storage for " +
              std::to_string(PooledGpt::resident_floats(gpt.config, std::vector<std::int64_t>{1})) +
              " resident values; give resident_floats(config, pooled) of them");
    CHECK(message_of([&] { BlockPrefetcher p(peer, {}); }) ==
          "BlockPrefetcher: 1 pooled block; prefetching needs at least 2 (with fewer, read the pooled block in "
          "place: no prefetcher)");
    PooledGpt three(gpt.config, values, {0, 1, 2});
    CHECK(message_of([&] { BlockPrefetcher p(three, {.lookahead = 3}); }) ==
          "BlockPrefetcher: lookahead 3 is not in 1..2 (the pooled blocks but one; with 3 staged every pooled "
          "block would stay in the engine's memory)");
    CHECK(message_of([&] { BlockPrefetcher p(three, {.lookahead = 0}); }) ==
          "BlockPrefetcher: lookahead 0 is not in 1..2 (the pooled blocks but one; with 3 staged every pooled "
          "block would stay in the engine's memory)");
    CHECK(message_of([&] { BlockPrefetcher p(three, {.lookahead = 1, .link_bytes_per_second = -1}); }) ==
          "BlockPrefetcher: link rate -1 bytes/s is negative; give 0 (no link model) or a rate");
    BlockPrefetcher prefetcher(three, {.lookahead = 1});
    KvCache cache(gpt.config.layers, gpt.config.width, 1, gpt.config.seq);
    CachedGpt engine(gpt.model, gpt.config, cache);
    CHECK(message_of([&] { engine.prefetch_blocks(prefetcher); }) ==
          "CachedGpt: the prefetcher stages another model's blocks; give it the PooledGpt whose model() this "
          "engine runs");
    CHECK(message_of([&] { (void)three.home(-1); }) == "PooledGpt: block -1 does not exist; the model has blocks 0..5");
}

}  // namespace LOOM_TEST_FILE
