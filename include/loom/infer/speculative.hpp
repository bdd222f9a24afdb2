// Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small
// draft model proposes gamma tokens one at a time, and the target checks all
// of them in ONE forward of gamma + 1 positions (the last accepted token and
// the gamma drafts, CachedGpt's Logits::every). A decode step of a small batch
// reads every weight of the target once whatever the number of rows, so
// where reading the weights is the cost (a GPU, a large model) a pass that
// confirms several tokens costs little more than one that makes one. (On
// loom's host path at config A's size a row's arithmetic is a large part of a
// step: a pass of 3 positions costs 1.0-1.9x one of 1; docs/speculative.md.)
//
// The pieces: infer/speculative_acceptance.hpp, the rule (greedy: drafts
// accepted while they are the target's argmax; sampled: rejection sampling,
// which keeps the target's distribution exactly) and its random numbers;
// infer/speculative_batcher.hpp, the rounds, continuously batched (one packed
// forward per draft step and one packed verification per round, a finished
// request's slot refilled at the next round). Both caches are cut back to
// the accepted tokens after each round (KvCache::truncate).
//
// Here: speculative_generate, a loop over the batcher for a list of requests.
// With a CapeConfig, CaPE's rounds (infer/cape.hpp: a comb of candidates
// per target pass, greedy requests only). With a DraftEngine as the draft,
// any draft model: GliDe's (infer/cached_glide.hpp) reads the target's cache.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/cape.hpp"
#include "loom/infer/draft_engine.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/speculative_acceptance.hpp"
#include "loom/infer/speculative_batcher.hpp"

namespace loom::infer {

struct SpeculativeCompletion {
    std::vector<std::int32_t> tokens;  // the new tokens only
    Finish finish = Finish::length;
    SpeculativeStats stats;
};

// Generates the requests with `target`, `draft` proposing `gamma` tokens per
// target pass, all at once: request i runs in slot i of each engine's cache
// (slots [0, n) must be empty, and both caches must have the free blocks for
// every request at its longest; the slots are released as requests finish,
// and all of them afterwards, even on an error). A loop over
// SpeculativeBatcher, whose rounds pack every running request's draft steps
// and verification. Stop tokens and max_new_tokens as in generate(). A
// request's tokens depend on its seed, not on what it is batched with (to
// rounding). For requests that arrive while others run, or more of them than
// the caches hold at once, use SpeculativeBatcher itself.
// `target` is any Engine (CachedGpt, a user's CachedModel, CachedKraken); `draft` is any DraftEngine (infer/draft_engine.hpp: GliDe's,
// infer/cached_glide.hpp) or a plain engine (below).
[[nodiscard]] inline std::vector<SpeculativeCompletion> speculative_generate(Engine& target, DraftEngine& draft,
                                                                             std::span<const Request> requests,
                                                                             std::int64_t gamma,
                                                                             std::optional<CapeConfig> cape = std::nullopt) {
    LOOM_CHECK(gamma >= 1, "speculative_generate: gamma = ", gamma, " draft tokens per pass; propose at least 1");
    LOOM_CHECK(draft.vocab() == target.vocab(), "speculative_generate: the draft's vocabulary of ",
               draft.vocab(), " tokens is not the target's ", target.vocab(),
               "; the draft must share the target's tokens");
    KvCache& tcache = target.cache();
    KvCache& dcache = draft.cache();
    LOOM_CHECK(&tcache != &dcache,
               "speculative_generate: the target and the draft share one KvCache; give each its own");
    LOOM_CHECK(!requests.empty(), "speculative_generate: no requests");
    const auto n = static_cast<std::int64_t>(requests.size());
    std::int64_t tblocks = 0, dblocks = 0;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        check_request(requests[i], i, tcache.capacity());
        const std::int64_t needed = positions_needed(requests[i]);
        LOOM_CHECK(needed <= dcache.capacity(), "speculative_generate: request ", i, " needs ", needed,
                   " cached positions but the draft's cache holds ", dcache.capacity(),
                   " per sequence; build it (and the draft's Config::seq) at least that long");
        tblocks += tcache.blocks_for(needed);
        dblocks += dcache.blocks_for(needed);
    }
    for (KvCache* cache : {&tcache, &dcache}) {
        const char* who = cache == &tcache ? "target" : "draft";
        LOOM_CHECK(n <= cache->slots(), "speculative_generate: ", n, " requests but the ", who, "'s cache has ",
                   cache->slots(), " slots; run at most that many at once");
        for (std::int64_t s = 0; s < n; ++s)
            LOOM_CHECK(cache->length(s) == 0, "speculative_generate: slot ", s, " of the ", who, "'s cache holds ",
                       cache->length(s), " positions; release it first");
        const std::int64_t blocks = cache == &tcache ? tblocks : dblocks;
        LOOM_CHECK(blocks <= cache->free_blocks(), "speculative_generate: the requests need ", blocks,
                   " blocks of ", cache->block_size(), " positions in the ", who, "'s cache but ",
                   cache->free_blocks(), " are free");
    }
    // n slots and every request's blocks: all start in the first round, request i in slot i.
    SpeculativeBatcher batcher(target, draft, gamma, n, std::move(cape));  // releases slots [0, n) however this ends
    for (const Request& r : requests) (void)batcher.submit(r);  // ids 0, 1, ...: the requests' indices
    std::vector<SpeculativeCompletion> done(requests.size());
    while (!batcher.idle()) {
        for (const SpeculativeBatcher::Event& e : batcher.step()) {
            SpeculativeCompletion& c = done[static_cast<std::size_t>(e.id)];
            c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
            if (e.finish) c.finish = *e.finish;
            c.stats.target_passes += 1;
            c.stats.drafted += e.drafted;
            c.stats.accepted += e.accepted;
            c.stats.alternatives += e.alternatives;
        }
    }
    return done;
}

// A plain engine as the draft (loom's GPT, a user's model).
[[nodiscard]] inline std::vector<SpeculativeCompletion> speculative_generate(Engine& target, Engine& draft,
                                                                             std::span<const Request> requests,
                                                                             std::int64_t gamma,
                                                                             std::optional<CapeConfig> cape = std::nullopt) {
    PlainDraft plain(draft);
    return speculative_generate(target, static_cast<DraftEngine&>(plain), requests, gamma, std::move(cape));
}

// One request (slot 0 of each cache).
[[nodiscard]] inline SpeculativeCompletion speculative_generate(Engine& target, DraftEngine& draft,
                                                                const Request& request, std::int64_t gamma,
                                                                std::optional<CapeConfig> cape = std::nullopt) {
    return std::move(speculative_generate(target, draft, std::span(&request, 1), gamma, std::move(cape))[0]);
}
[[nodiscard]] inline SpeculativeCompletion speculative_generate(Engine& target, Engine& draft,
                                                                const Request& request, std::int64_t gamma,
                                                                std::optional<CapeConfig> cape = std::nullopt) {
    return std::move(speculative_generate(target, draft, std::span(&request, 1), gamma, std::move(cape))[0]);
}

// The same on caches of its own (one slot each, as long as the request needs).
[[nodiscard]] inline SpeculativeCompletion speculative_generate(gpt::Model& target_model,
                                                                const gpt::Config& target_config,
                                                                gpt::Model& draft_model,
                                                                const gpt::Config& draft_config,
                                                                const Request& request, std::int64_t gamma,
                                                                std::optional<CapeConfig> cape = std::nullopt) {
    check_request(request, 0, target_config.seq);
    const std::int64_t needed = positions_needed(request);
    LOOM_CHECK(needed <= draft_config.seq, "speculative_generate: the request needs ", needed,
               " positions but the draft's Config::seq is ", draft_config.seq,
               "; use a draft with at least the target's sequence length");
    KvCache tcache(target_config.layers, target_config.width, 1, needed);
    KvCache dcache(draft_config.layers, draft_config.width, 1, needed);
    CachedGpt target(target_model, target_config, tcache);
    CachedGpt draft(draft_model, draft_config, dcache);
    return speculative_generate(target, draft, request, gamma, std::move(cape));
}

}  // namespace loom::infer
