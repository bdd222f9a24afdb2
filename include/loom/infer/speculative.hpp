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
// Acceptance, position by position:
// - greedy: a draft token is accepted while it is the target's argmax; at
//   the first that is not, the target's argmax is taken instead. The tokens
//   are the target's greedy tokens (to the float rounding of a pass over
//   several positions, which tests with clear-cut logits never see).
// - sampled: draft token x (drawn from the draft's distribution q) is
//   accepted with probability min(1, p(x) / q(x)), p the target's
//   distribution; the first rejected one is replaced by a draw from
//   normalize(max(0, p - q)). When all are accepted the target's last row
//   gives one more token (the bonus). The output has exactly the target's
//   distribution (the papers' theorem; tests/infer/test_speculative.cpp's
//   chi-square). p and q are the request's Sampling (temperature, top-k,
//   top-p) applied to each model's logits.
// Both caches are then cut back to the accepted tokens (KvCache::truncate):
// the rejected drafts' keys and values are dropped.
//
// Random numbers: new token k's draws come from RngStream(seed, k): element 0
// for the target's own draw (a replacement or bonus token), 1 for the draft's
// draw, 2 for the acceptance test. A draft redrawn in a later round (after a
// rejection before it) reuses element 1, which nothing that was kept depended
// on. Deterministic in the seed; not the same tokens as infer::generate's
// sampled run (the distribution is the same, the draws are not).
//
// This slice: batch 1, a plain draft. Not here (issue 40): batched requests
// in the continuous batcher, GliDe's draft, CaPE's tree, trained drafts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/sampler.hpp"

namespace loom::infer {

// What a speculative run did: the draft's proposals, the target's passes.
struct SpeculativeStats {
    std::int64_t target_passes = 0;  // verification forwards of the target (its prompt prefill not counted)
    std::int64_t drafted = 0;        // draft tokens proposed
    std::int64_t accepted = 0;       // of those, accepted by the target

    // Mean tokens a target pass yields: its accepted drafts and the one token
    // the target itself supplies (replacement or bonus). gamma + 1 when every
    // draft is accepted; 1 is plain decoding.
    [[nodiscard]] double tokens_per_pass() const noexcept {
        return target_passes == 0 ? 0.0
                                  : static_cast<double>(accepted + target_passes) / static_cast<double>(target_passes);
    }
    [[nodiscard]] double acceptance_rate() const noexcept {
        return drafted == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(drafted);
    }
};

struct SpeculativeCompletion {
    std::vector<std::int32_t> tokens;  // the new tokens only
    Finish finish = Finish::length;
    SpeculativeStats stats;
};

// The distribution Sampler::pick draws from for these logits: one-hot at the
// argmax when greedy, else softmax(logits / temperature) restricted to the
// top k (ties: lower id first), then to the fewest most likely tokens whose
// share reaches top_p, renormalised. Written to `out` (resized to the vocabulary).
inline void sampling_probabilities(std::span<const float> logits, const Sampling& sampling, std::vector<double>& out) {
    const auto V = static_cast<std::int64_t>(logits.size());
    out.assign(logits.size(), 0.0);
    if (sampling.greedy) {
        out[static_cast<std::size_t>(argmax(logits))] = 1.0;
        return;
    }
    const float top = *std::max_element(logits.begin(), logits.end());
    for (std::int64_t v = 0; v < V; ++v)
        out[static_cast<std::size_t>(v)] = std::exp((logits[static_cast<std::size_t>(v)] - top) / sampling.temperature);
    const std::int64_t k = sampling.top_k == 0 ? V : std::min(sampling.top_k, V);
    if (k < V || sampling.top_p < 1.0f) {
        std::vector<std::int32_t> order(logits.size());
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int32_t a, std::int32_t b) {
            const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
            return la > lb || (la == lb && a < b);
        });
        double kept_total = 0;
        const auto at = [&](std::int64_t i) -> double& {
            return out[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
        };
        for (std::int64_t i = 0; i < k; ++i) kept_total += at(i);
        const double target = static_cast<double>(sampling.top_p) * kept_total;
        std::int64_t kept = 0;
        double running = 0;
        while (kept < k) {
            running += at(kept);
            ++kept;
            if (running >= target) break;
        }
        for (std::int64_t i = kept; i < V; ++i) at(i) = 0.0;
    }
    const double total = std::accumulate(out.begin(), out.end(), 0.0);
    for (double& p : out) p /= total;
}

// The token a uniform u in [0, 1) picks from `weights` (not necessarily
// normalised), walking ids in order as Sampler does.
[[nodiscard]] inline std::int32_t draw_from(std::span<const double> weights, double u) {
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    double left = u * total;
    std::int32_t chosen = -1;
    for (std::size_t v = 0; v < weights.size(); ++v) {
        if (weights[v] <= 0) continue;
        chosen = static_cast<std::int32_t>(v);  // the last positive weight takes what rounding leaves
        left -= weights[v];
        if (left <= 0) break;
    }
    LOOM_CHECK(chosen >= 0, "draw_from: every weight is zero");
    return chosen;
}

// Generates `request` with `target`, `draft` proposing `gamma` tokens per
// target pass, in slot 0 of each engine's cache (which must be empty; both are
// released afterwards, even on an error). Stop tokens and max_new_tokens as
// in generate(). Near the length limit a pass proposes fewer drafts, so that
// no pass computes a token past it and the caches need no more positions than
// generate() would.
[[nodiscard]] inline SpeculativeCompletion speculative_generate(CachedGpt& target, CachedGpt& draft,
                                                                const Request& request, std::int64_t gamma) {
    LOOM_CHECK(gamma >= 1, "speculative_generate: gamma = ", gamma, " draft tokens per pass; propose at least 1");
    LOOM_CHECK(draft.config().vocab == target.config().vocab, "speculative_generate: the draft's vocabulary of ",
               draft.config().vocab, " tokens is not the target's ", target.config().vocab,
               "; the draft must share the target's tokens");
    KvCache& tcache = target.cache();
    KvCache& dcache = draft.cache();
    LOOM_CHECK(&tcache != &dcache,
               "speculative_generate: the target and the draft share one KvCache; give each its own");
    check_request(request, 0, tcache.capacity());
    const std::int64_t needed = positions_needed(request);
    LOOM_CHECK(needed <= dcache.capacity(), "speculative_generate: the request needs ", needed,
               " cached positions but the draft's cache holds ", dcache.capacity(),
               " per sequence; build it (and the draft's Config::seq) at least that long");
    for (KvCache* cache : {&tcache, &dcache}) {
        const char* who = cache == &tcache ? "target" : "draft";
        LOOM_CHECK(cache->length(0) == 0, "speculative_generate: slot 0 of the ", who, "'s cache holds ",
                   cache->length(0), " positions; release it first");
        LOOM_CHECK(cache->blocks_for(needed) <= cache->free_blocks(), "speculative_generate: the request needs ",
                   cache->blocks_for(needed), " blocks of ", cache->block_size(), " positions in the ", who,
                   "'s cache but ", cache->free_blocks(), " are free");
    }
    struct Release {  // slot 0 of both caches is free again however this ends
        KvCache& a;
        KvCache& b;
        ~Release() {
            a.release(0);
            b.release(0);
        }
    } release{tcache, dcache};

    const Sampling& sampling = request.sampling;
    const bool greedy = sampling.greedy;
    const auto V = static_cast<std::size_t>(target.config().vocab);
    SpeculativeCompletion done;
    std::vector<std::int32_t> sequence = request.prompt;  // the prompt and every token so far
    // Invariant at the top of a round: the target's cache holds all of
    // `sequence` but its last token (the pending one the next pass feeds);
    // the draft's holds a prefix of it.
    if (sequence.size() > 1) {
        const Segment head{0, std::span(sequence).first(sequence.size() - 1)};
        (void)target.forward(std::span(&head, 1));
    }
    std::vector<std::int32_t> proposed;
    std::vector<std::vector<double>> q;  // the draft's distribution at each proposal
    std::vector<double> p, residual;
    // Emits a token; false when the request is complete.
    const auto emit = [&](std::int32_t token) {
        done.tokens.push_back(token);
        sequence.push_back(token);
        if (std::find(request.stop_tokens.begin(), request.stop_tokens.end(), token) != request.stop_tokens.end()) {
            done.finish = Finish::stop;
            return false;
        }
        done.finish = Finish::length;
        return static_cast<std::int64_t>(done.tokens.size()) < request.max_new_tokens;
    };
    for (bool more = true; more;) {
        const auto k0 = static_cast<std::int64_t>(done.tokens.size());  // index of this round's first new token
        const std::int64_t left = request.max_new_tokens - k0;
        const std::int64_t g = std::min(gamma, left - 1);  // a pass yields at most g + 1 tokens
        const auto before = static_cast<std::int64_t>(sequence.size());
        // Draft: feed what its cache lacks, then its own proposals, one at a time.
        proposed.clear();
        q.resize(static_cast<std::size_t>(std::max<std::int64_t>(g, 0)));
        for (std::int64_t i = 0; i < g; ++i) {
            const std::int64_t held = dcache.length(0);
            const Segment feed = i == 0 ? Segment{0, std::span(sequence).subspan(static_cast<std::size_t>(held))}
                                        : Segment{0, std::span(&proposed.back(), 1)};
            const std::span<const float> logits = draft.forward(std::span(&feed, 1));
            const auto k = static_cast<std::uint64_t>(k0 + i);
            if (greedy) {
                proposed.push_back(argmax(logits));
            } else {
                sampling_probabilities(logits, sampling, q[static_cast<std::size_t>(i)]);
                proposed.push_back(draw_from(q[static_cast<std::size_t>(i)], RngStream{sampling.seed, k}.uniform(1)));
            }
        }
        // Target: the pending token and the proposals in one pass, logits at every position.
        std::vector<std::int32_t> fed{sequence.back()};
        fed.insert(fed.end(), proposed.begin(), proposed.end());
        const Segment verify{0, fed};
        const std::span<const float> rows = target.forward(std::span(&verify, 1), Logits::every);
        ++done.stats.target_passes;
        done.stats.drafted += g;
        std::int64_t accepted = 0;
        std::int32_t own = -1;  // the target's token: a replacement, or the bonus after g acceptances
        for (std::int64_t i = 0; i <= g && own < 0; ++i) {
            const std::span<const float> row = rows.subspan(static_cast<std::size_t>(i) * V, V);
            const auto k = static_cast<std::uint64_t>(k0 + i);
            const std::int32_t x = i < g ? proposed[static_cast<std::size_t>(i)] : -1;
            if (greedy) {
                const std::int32_t best = argmax(row);
                if (best == x) ++accepted;
                else own = best;
                continue;
            }
            sampling_probabilities(row, sampling, p);
            if (i == g) {  // every draft accepted: the bonus token, from the target alone
                own = draw_from(p, RngStream{sampling.seed, k}.uniform(0));
                break;
            }
            const std::vector<double>& qi = q[static_cast<std::size_t>(i)];
            const double px = p[static_cast<std::size_t>(x)], qx = qi[static_cast<std::size_t>(x)];
            // u < p/q, written without the division: q(x) > 0 since x was drawn from q.
            if (static_cast<double>(RngStream{sampling.seed, k}.uniform(2)) * qx < px) {
                ++accepted;
                continue;
            }
            residual.resize(V);
            for (std::size_t v = 0; v < V; ++v) residual[v] = std::max(0.0, p[v] - qi[v]);
            // All zero only if p == q up to rounding, where a rejection has probability ~0: draw from p then.
            const bool empty = std::all_of(residual.begin(), residual.end(), [](double w) { return w <= 0; });
            own = draw_from(empty ? p : residual, RngStream{sampling.seed, k}.uniform(0));
        }
        done.stats.accepted += accepted;
        // Keep the accepted drafts' keys and values, drop the rest.
        tcache.truncate(0, before + accepted);
        dcache.truncate(0, std::min(dcache.length(0), before + accepted));
        for (std::int64_t i = 0; i < accepted && more; ++i) more = emit(proposed[static_cast<std::size_t>(i)]);
        if (more) more = emit(own);
    }
    return done;
}

// The same on caches of its own (one slot each, as long as the request needs).
[[nodiscard]] inline SpeculativeCompletion speculative_generate(gpt::Model& target_model,
                                                                const gpt::Config& target_config,
                                                                gpt::Model& draft_model,
                                                                const gpt::Config& draft_config,
                                                                const Request& request, std::int64_t gamma) {
    check_request(request, 0, target_config.seq);
    const std::int64_t needed = positions_needed(request);
    LOOM_CHECK(needed <= draft_config.seq, "speculative_generate: the request needs ", needed,
               " positions but the draft's Config::seq is ", draft_config.seq,
               "; use a draft with at least the target's sequence length");
    KvCache tcache(target_config.layers, target_config.width, 1, needed);
    KvCache dcache(draft_config.layers, draft_config.width, 1, needed);
    CachedGpt target(target_model, target_config, tcache);
    CachedGpt draft(draft_model, draft_config, dcache);
    return speculative_generate(target, draft, request, gamma);
}

}  // namespace loom::infer
