// GliDe's draft (gpt/glide_draft.hpp, infer/cached_glide.hpp): training with
// the target frozen lowers its loss; training's stale mask is exactly what
// the cached engine sees when the target's cache is a block behind; and
// greedy speculative decoding with a GliDe draft returns the target's greedy
// tokens (one request, a batch of different lengths, with and without CaPE).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/exec/serial_trainer.hpp"
#include "loom/gpt/glide_checkpoint.hpp"
#include "loom/gpt/glide_draft.hpp"
#include "loom/infer/cached_glide.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/speculative.hpp"
#include "loom/infer/speculative_batcher.hpp"
#include "loom/kernels/host/gemm_threads.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"
#include "support/scaled_gpt.hpp"

namespace {

namespace gpt = loom::gpt;
namespace nn = loom::nn;
using loom::Shape;
using loom::Tensor;
using loom::infer::CachedGlide;
using loom::infer::CachedGpt;
using loom::infer::KvCache;
using loom::infer::Request;
using loom_test::max_relative_difference;
using loom_test::message_of;
using loom_test::prompt_of;

// A GliDe draft bound to its own arena, weights scaled (as ScaledGpt's) so the cross-attention matters.
struct Glide {
    gpt::Config config;
    gpt::GlideDraft model;
    nn::ParamArena arena;
    Glide(const gpt::Config& shape, const gpt::Config& target, std::uint64_t seed, float scale,
          gpt::CrossScores scores = gpt::CrossScores::plain)
        : config(shape), model(gpt::make_glide_draft(shape, target, 5, scores)), arena(model) {
        arena.initialize(model, seed);
        for (float& v : arena.values()) v *= scale;
    }
};

Request greedy_request(std::int64_t prompt_length, std::int64_t new_tokens, std::int32_t salt, std::int32_t vocab) {
    Request r;
    r.prompt = prompt_of(prompt_length, vocab, salt);
    r.max_new_tokens = new_tokens;
    r.sampling.greedy = true;
    return r;
}

}  // namespace

TEST_CASE("a GliDe draft trained with its target frozen lowers its loss; the target does not move", "[infer][glide]") {
    loom_test::ScaledGpt target({.layers = 2, .width = 32, .heads = 4, .seq = 20, .vocab = 32}, 3, 1.0f);
    const gpt::Config shape{.layers = 1, .width = 16, .heads = 2, .seq = 20, .vocab = 32};
    auto draft = gpt::make_glide_draft(shape, target.config);
    draft.target = &target.model;
    loom::exec::SerialTrainer trainer(draft, loom::host_device, {.adamw = {.lr = 1e-2f}});
    trainer.initialize(2);
    // The draft's Params only: embeddings, its block (self-attention, a 16 -> 32 query and 32 -> 16 output
    // projection, the MLP, three LayerNorms), ln_f and the head; none of the target's.
    CHECK(trainer.parameter_count() == 32 * 16 + 20 * 16 + (16 * 48 + 48 + 16 * 16 + 16) + (16 * 32 + 32 + 32 * 16 + 16) +
                                           (16 * 64 + 64 + 64 * 16 + 16) + 3 * 2 * 16 + 2 * 16 + 32 * 16);
    const std::vector<float> target_before(target.arena.values().begin(), target.arena.values().end());
    // Learnable: the next token is this one + 7.
    std::vector<std::int32_t> tokens(4 * 20), targets(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::int32_t>((i * 7 + i / 20) % 32);
        targets[i] = (tokens[i] + 7) % 32;
    }
    const Tensor x = Tensor::of(tokens.data(), Shape{4, 20}), y = Tensor::of(targets.data(), Shape{4, 20});
    const float first = trainer.step(x, y, 1e-2f);
    CHECK(first == Approx(std::log(32.0)).epsilon(0.05));
    float loss = first;
    for (int step = 0; step < 24; ++step) loss = trainer.step(x, y, 1e-2f);
    INFO("loss " << first << " -> " << loss);
    CHECK(loss < 0.5f * first);
    CHECK(std::vector<float>(target.arena.values().begin(), target.arena.values().end()) == target_before);
}

// The whole draft's backward (embeddings, both blocks' self-attention, cross-attention and MLP, the head)
// against central differences of its loss, every third parameter; the target's keys and values are inputs.
TEST_CASE("a GliDe draft's loss gradient matches finite differences through every layer, plain and recency scores",
          "[infer][glide]") {
  for (const gpt::CrossScores scores : {gpt::CrossScores::plain, gpt::CrossScores::recency}) {
    INFO(gpt::name_of(scores) << " scores");
    loom_test::ScaledGpt target({.layers = 2, .width = 12, .heads = 2, .seq = 12, .vocab = 11}, 8, 4.0f);
    Glide draft({.layers = 2, .width = 8, .heads = 2, .seq = 12, .vocab = 11}, target.config, 9, 3.0f, scores);
    draft.model.target = &target.model;
    std::vector<std::int32_t> tokens = prompt_of(2 * 12, 11, 2), targets = prompt_of(2 * 12, 11, 5);
    const Tensor x = Tensor::of(tokens.data(), Shape{2, 12}), y = Tensor::of(targets.data(), Shape{2, 12});
    nn::Context ctx;
    draft.arena.zero_grads();
    (void)nn::forward_backward(draft.model, ctx, x, y);
    const std::vector<float> analytic(draft.arena.grads().begin(), draft.arena.grads().end());
    double num = 0, den = 0;
    const float h = 1e-2f;
    for (std::size_t i = 0; i < analytic.size(); i += 3) {
        float& v = draft.arena.values()[i];
        const float keep = v;
        v = keep + h;
        const double up = nn::evaluate(draft.model, ctx, x, y);
        v = keep - h;
        const double down = nn::evaluate(draft.model, ctx, x, y);
        v = keep;
        const double d = (up - down) / (2.0 * h);
        num += (d - analytic[i]) * (d - analytic[i]);
        den += d * d;
    }
    INFO("relative error " << std::sqrt(num / den) << " over " << analytic.size() / 3 << " parameters");
    CHECK(den > 0);
    CHECK(std::sqrt(num / den) < 2e-2);
  }
}

TEST_CASE("training's stale mask is what the cached GliDe draft sees with the target's cache a block behind (both scores)",
          "[infer][glide]") {
  for (const gpt::CrossScores scores : {gpt::CrossScores::plain, gpt::CrossScores::recency}) {
    INFO(gpt::name_of(scores) << " scores");
    // A 3-layer target and a 2-layer draft: draft block i reads target layer 1 + i.
    loom_test::ScaledGpt target({.layers = 3, .width = 24, .heads = 3, .seq = 16, .vocab = 30}, 5, 1.0f);
    Glide draft({.layers = 2, .width = 16, .heads = 2, .seq = 16, .vocab = 30}, target.config, 6, 6.0f, scores);
    draft.model.target = &target.model;
    CHECK(draft.model.target_layer(0) == 1);
    CHECK(draft.model.target_layer(1) == 2);
    const std::int64_t T = 13;
    std::vector<std::int32_t> tokens = prompt_of(T, 30, 4);
    nn::Context ctx;
    const Tensor logits = draft.model.logits(ctx, Tensor::of(tokens.data(), Shape{1, T}));
    // The attached memory is the target's own qkv of layer 1 + i (its keys C floats in).
    for (std::size_t i = 0; i < 2; ++i) {
        auto& attention = std::get<1>(target.model.blocks[1 + i].attn.layers);
        const Tensor qkv = draft.model.target_context->saved<nn::CausalSelfAttention::Saved>(&attention).qkv;
        CHECK(ctx.saved<nn::CrossAttention::Attached>(&draft.model.cross_attention(i)).memory.keys ==
              qkv.data<float>() + 24);
    }
    // Decode the sequence token by token, as speculative rounds would: when the draft reads position t, the
    // target's cache holds the first 5 * floor(t / 5) positions. Then again with it one position fresher,
    // which the mask must have hidden.
    std::int64_t differs = 0;
    for (const std::int64_t extra : {0, 1}) {
        KvCache tcache(3, 24, 1, 16, 4), dcache(2, 16, 1, 16, 4);
        CachedGpt t_engine(target.model, target.config, tcache);
        CachedGlide d_engine(draft.model, draft.config, dcache, tcache);
        for (std::int64_t t = 0; t < T; ++t) {
            const std::int64_t stale = t / 5 * 5 + extra, held = tcache.length(0);
            if (stale > held) {
                const loom::infer::Segment more{0, std::span(tokens).subspan(static_cast<std::size_t>(held),
                                                                             static_cast<std::size_t>(stale - held))};
                (void)t_engine.forward(std::span(&more, 1));
            }
            const loom::infer::Segment one{0, std::span(tokens).subspan(static_cast<std::size_t>(t), 1)};
            const std::span<const float> cached = d_engine.forward(std::span(&one, 1));
            const std::span<const float> trained(logits.data<float>() + t * 30, 30);
            INFO("query " << t << ", target cache of " << stale);
            if (extra == 0) CHECK(max_relative_difference(cached, trained) < 1e-4);
            else if (max_relative_difference(cached, trained) > 1e-3) ++differs;
        }
    }
    // A cache one position fresher than the mask allows changes the logits: the mask is not vacuous.
    CHECK(differs >= 10);
  }
}

TEST_CASE("a GliDe draft's step split between GEMM threads by sequence gives one thread's bits", "[infer][glide]") {
    // 12 sequences over ~100 target positions of width 256: the self- and
    // cross-attention are worth 2 parts (a part: 2^18 MACs; a sequence's
    // cross-attention ~2 x 100 x 256).
    loom_test::ScaledGpt target({.layers = 2, .width = 256, .heads = 4, .seq = 128, .vocab = 30}, 7, 1.0f);
    Glide draft({.layers = 1, .width = 64, .heads = 4, .seq = 128, .vocab = 30}, target.config, 8, 3.0f);
    draft.model.target = &target.model;
    const std::int64_t slots = 12;
    std::vector<std::vector<std::int32_t>> prompts;
    for (std::int64_t s = 0; s < slots; ++s) prompts.push_back(prompt_of(90 + 2 * s, 30, static_cast<std::int32_t>(s)));
    std::vector<std::vector<float>> by_threads;
    for (const int threads : {1, 2, 3}) {
        loom::kernels::host::set_gemm_threads(threads);
        KvCache tcache(2, 256, slots, 128, 16), dcache(1, 64, slots, 128, 16);
        CachedGpt t_engine(target.model, target.config, tcache);
        CachedGlide d_engine(draft.model, draft.config, dcache, tcache);
        std::vector<loom::infer::Segment> prefill;
        for (std::int64_t s = 0; s < slots; ++s) prefill.push_back({s, prompts[static_cast<std::size_t>(s)]});
        (void)t_engine.forward(prefill);
        (void)d_engine.forward(prefill);
        // A draft step: one token per sequence, two for the last (a chain).
        const std::vector<std::int32_t> one{5}, two{6, 7};
        std::vector<loom::infer::Segment> step;
        for (std::int64_t s = 0; s + 1 < slots; ++s) step.push_back({s, one});
        step.push_back({slots - 1, two});
        const std::span<const float> logits = d_engine.forward(step);
        by_threads.emplace_back(logits.begin(), logits.end());
    }
    loom::kernels::host::set_gemm_threads(1);
    CHECK(by_threads[1] == by_threads[0]);
    CHECK(by_threads[2] == by_threads[0]);
}

TEST_CASE("greedy speculative decoding with a GliDe draft returns the target's greedy tokens", "[infer][glide]") {
    loom_test::ScaledGpt target({.layers = 2, .width = 32, .heads = 4, .seq = 48, .vocab = 40}, 21, 8.0f);
    Glide draft({.layers = 1, .width = 16, .heads = 2, .seq = 48, .vocab = 40}, target.config, 7, 8.0f);
    SECTION("one request, gamma 1, 2 and 4, with and without CaPE") {
        for (const std::int64_t prompt : {1, 5})
            for (const std::int64_t gamma : {1, 2, 4})
                for (const bool cape : {false, true}) {
                    const Request request = greedy_request(prompt, 20, 3, 40);
                    const auto expected = loom::infer::generate(target.model, target.config, std::span(&request, 1));
                    KvCache tcache(2, 32, 1, 48, 4), dcache(1, 16, 1, 48, 4);
                    CachedGpt t(target.model, target.config, tcache);
                    CachedGlide d(draft.model, draft.config, dcache, tcache);
                    const auto out = cape ? loom::infer::speculative_generate(t, d, request, gamma,
                                                                              loom::infer::CapeConfig{})
                                          : loom::infer::speculative_generate(t, d, request, gamma);
                    INFO("prompt " << prompt << ", gamma " << gamma << (cape ? ", CaPE" : ""));
                    CHECK(out.tokens == expected[0].tokens);
                    CHECK(out.stats.accepted + out.stats.target_passes == 20);
                    CHECK(tcache.free_blocks() == tcache.blocks());
                    CHECK(dcache.free_blocks() == dcache.blocks());
                }
    }
    SECTION("a batch of requests of different lengths, continuously on fewer slots, with and without CaPE") {
        std::vector<Request> requests;
        for (std::int32_t i = 0; i < 5; ++i)
            requests.push_back(greedy_request(1 + 3 * i, 6 + 5 * i, i + 1, 40));
        requests[2].stop_tokens = {7};
        const auto expected = loom::infer::generate(target.model, target.config, requests);
        for (const bool cape : {false, true})
            for (const std::int64_t slots : {5, 2}) {
                KvCache tcache(2, 32, slots, 48, 4), dcache(1, 16, slots, 48, 4);
                CachedGpt t(target.model, target.config, tcache);
                CachedGlide d(draft.model, draft.config, dcache, tcache);
                std::vector<std::vector<std::int32_t>> got(requests.size());
                {
                    loom::infer::SpeculativeBatcher batcher(
                        t, d, 3, 0, cape ? std::optional(loom::infer::CapeConfig{}) : std::nullopt);
                    for (const Request& r : requests) (void)batcher.submit(r);
                    while (!batcher.idle())
                        for (const auto& e : batcher.step())
                            got[e.id].insert(got[e.id].end(), e.tokens.begin(), e.tokens.end());
                }
                for (std::size_t i = 0; i < requests.size(); ++i) {
                    INFO("request " << i << " on " << slots << " slots" << (cape ? ", CaPE" : ""));
                    CHECK(got[i] == expected[i].tokens);
                }
                CHECK(tcache.free_blocks() == tcache.blocks());
                CHECK(dcache.free_blocks() == dcache.blocks());
            }
    }
}

TEST_CASE("GliDe's draft names its bad inputs", "[infer][glide]") {
    const gpt::Config target_shape{.layers = 2, .width = 24, .heads = 3, .seq = 16, .vocab = 30};
    CHECK(message_of([&] {
              (void)gpt::make_glide_draft({.layers = 1, .width = 16, .heads = 2, .seq = 16, .vocab = 31}, target_shape);
          }) == "GlideDraft: the draft's vocabulary of 31 tokens is not the target's 30; the draft must share the "
                "target's tokens");
    CHECK(message_of([&] {
              (void)gpt::make_glide_draft({.layers = 3, .width = 16, .heads = 2, .seq = 16, .vocab = 30}, target_shape);
          }) == "GlideDraft: 3 draft layers read target layers 2 - 3 + i, but the target has only 2; give the draft at "
                "most as many layers as the target");
    loom_test::ScaledGpt target(target_shape, 1, 1.0f), other({.layers = 3, .width = 24, .heads = 3, .seq = 16, .vocab = 30}, 1, 1.0f);
    Glide draft({.layers = 1, .width = 16, .heads = 2, .seq = 16, .vocab = 30}, target_shape, 2, 1.0f);
    std::vector<std::int32_t> tokens(6, 1);
    nn::Context ctx;
    CHECK(message_of([&] { (void)draft.model.logits(ctx, Tensor::of(tokens.data(), Shape{1, 6})); }) ==
          "GlideDraft: no target; set draft.target to the frozen gpt::Model whose keys and values it reads");
    draft.model.target = &other.model;
    CHECK(message_of([&] { (void)draft.model.logits(ctx, Tensor::of(tokens.data(), Shape{1, 6})); }) ==
          "GlideDraft: the target has 3 layers but the draft was made for 2");
    KvCache tcache(2, 24, 2, 16, 4), wrong(3, 24, 2, 16, 4), dcache(1, 16, 2, 16, 4), few(1, 16, 3, 16, 4);
    CHECK(message_of([&] { CachedGlide d(draft.model, draft.config, dcache, wrong); }) ==
          "CachedGlide: the target's cache is for 3 layers of width 24 but the draft was made for a target of 2 "
          "layers of width 24");
    CHECK(message_of([&] { CachedGlide d(draft.model, draft.config, few, tcache); }) ==
          "CachedGlide: the draft's cache has 3 slots but the target's only 2; a request has the same slot in both");
    CHECK(message_of([&] { CachedGlide d(draft.model, draft.config, dcache, dcache); }) ==
          "CachedGlide: the draft's cache is the target's; give the draft its own");
    CachedGlide d(draft.model, draft.config, dcache, tcache);
    const std::vector<std::int32_t> parents{-1, 0};
    const loom::infer::Segment tree{0, std::span(tokens).first(2), parents};
    CHECK(message_of([&] { (void)d.forward(std::span(&tree, 1)); }) ==
          "CachedGlide: the segment of slot 0 is a tree; a draft runs chains of at least one token");
    // A batcher whose target is not the one the GliDe engine reads.
    KvCache other_cache(2, 24, 2, 16, 4);
    CachedGpt t(target.model, target.config, other_cache);
    CHECK(message_of([&] { loom::infer::SpeculativeBatcher b(t, d, 2); }) ==
          "SpeculativeBatcher: the draft reads another target's KvCache; build its engine on the cache of the target "
          "it drafts for");
}

TEST_CASE("a GliDe draft's checkpoint reads back into the same values and refuses another target's shape",
          "[infer][glide]") {
    const gpt::Config target_shape{.layers = 2, .width = 24, .heads = 3, .seq = 16, .vocab = 30};
    const gpt::Config shape{.layers = 2, .width = 16, .heads = 2, .seq = 16, .vocab = 30};
    Glide saved(shape, target_shape, 4, 1.0f), loaded(shape, target_shape, 5, 1.0f);
    const auto path = std::filesystem::temp_directory_path() / "loom_test_glide_draft.safetensors";
    gpt::save_glide_draft(path, shape, target_shape, saved.arena);
    CHECK(std::vector<float>(saved.arena.values().begin(), saved.arena.values().end()) !=
          std::vector<float>(loaded.arena.values().begin(), loaded.arena.values().end()));
    gpt::load_glide_draft(path, shape, target_shape, loaded.arena);
    CHECK(std::vector<float>(saved.arena.values().begin(), saved.arena.values().end()) ==
          std::vector<float>(loaded.arena.values().begin(), loaded.arena.values().end()));
    gpt::Config wider = target_shape;
    wider.width = 48;
    CHECK(message_of([&] { gpt::load_glide_draft(path, shape, wider, loaded.arena); }) ==
          "GliDe checkpoint " + path.string() +
              ": target_width is 24 but 48 was asked for; give the draft's and the target's shapes it was trained with");
    // The scores travel with the file: a plain file reads as plain, and a recency draft's is refused as plain.
    CHECK(gpt::glide_cross_scores(path) == gpt::CrossScores::plain);
    Glide recent(shape, target_shape, 6, 1.0f, gpt::CrossScores::recency);
    CHECK(recent.model.cross_scores() == gpt::CrossScores::recency);
    gpt::save_glide_draft(path, shape, target_shape, recent.arena, gpt::CrossScores::recency);
    CHECK(gpt::glide_cross_scores(path) == gpt::CrossScores::recency);
    CHECK(message_of([&] { gpt::load_glide_draft(path, shape, target_shape, loaded.arena); }) ==
          "GliDe checkpoint " + path.string() +
              ": cross_scores is recency but plain was asked for; build the draft with the file's scores "
              "(gpt::glide_cross_scores)");
    gpt::load_glide_draft(path, shape, target_shape, loaded.arena, gpt::CrossScores::recency);
    CHECK(std::vector<float>(recent.arena.values().begin(), recent.arena.values().end()) ==
          std::vector<float>(loaded.arena.values().begin(), loaded.arena.values().end()));
    std::filesystem::remove(path);
}
