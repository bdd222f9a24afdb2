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
// This slice: a plain draft; several requests run together (one packed
// draft step and one packed verification per round) but all start at once.
// Not here (issue 40): continuous batching (a finished request's slot
// refilled), GliDe's draft, CaPE's tree, trained drafts.
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
    out.assign(logits.size(), 0.0);
    if (sampling.greedy) {
        out[static_cast<std::size_t>(argmax(logits))] = 1.0;
        return;
    }
    Sampler sampler;
    const std::span<const double> weights = sampler.weights(logits, sampling);
    out.assign(weights.begin(), weights.end());
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

namespace speculative_detail {

// One request's state across rounds.
struct Run {
    const Request* request = nullptr;
    std::int64_t slot = 0;
    SpeculativeCompletion done;
    std::vector<std::int32_t> sequence;  // the prompt and every token so far
    std::vector<std::int32_t> proposed;  // this round's drafts
    std::vector<std::int32_t> fed;       // this round's verification input: the last token, then the drafts
    std::vector<std::vector<double>> q;  // the draft's distribution at each proposal (sampled decoding)
    std::int64_t g = 0;                  // drafts this round
    std::int64_t before = 0;             // sequence length at the round's start
    bool running = true;

    // Appends a token; false when the request is complete.
    bool emit(std::int32_t token) {
        done.tokens.push_back(token);
        sequence.push_back(token);
        const auto& stops = request->stop_tokens;
        if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
            done.finish = Finish::stop;
            return false;
        }
        done.finish = Finish::length;
        return static_cast<std::int64_t>(done.tokens.size()) < request->max_new_tokens;
    }
};

// The round's acceptance for one request from the target's g + 1 rows: how
// many drafts are accepted, and the target's own token after them.
struct Verdict {
    std::int64_t accepted = 0;
    std::int32_t own = -1;
};

inline Verdict accept(Run& run, std::span<const float> rows, std::size_t V, std::vector<double>& p,
                      std::vector<double>& residual) {
    const Sampling& sampling = run.request->sampling;
    const auto k0 = static_cast<std::int64_t>(run.done.tokens.size());
    Verdict verdict;
    for (std::int64_t i = 0; i <= run.g; ++i) {
        const std::span<const float> row = rows.subspan(static_cast<std::size_t>(i) * V, V);
        const auto k = static_cast<std::uint64_t>(k0 + i);
        const std::int32_t x = i < run.g ? run.proposed[static_cast<std::size_t>(i)] : -1;
        if (sampling.greedy) {
            const std::int32_t best = argmax(row);
            if (best != x) return {verdict.accepted, best};
            ++verdict.accepted;
            continue;
        }
        sampling_probabilities(row, sampling, p);
        if (i == run.g)  // every draft accepted: the bonus token, from the target alone
            return {verdict.accepted, draw_from(p, RngStream{sampling.seed, k}.uniform(0))};
        const std::vector<double>& qi = run.q[static_cast<std::size_t>(i)];
        const double px = p[static_cast<std::size_t>(x)], qx = qi[static_cast<std::size_t>(x)];
        // u < p/q, written without the division: q(x) > 0 since x was drawn from q.
        if (static_cast<double>(RngStream{sampling.seed, k}.uniform(2)) * qx < px) {
            ++verdict.accepted;
            continue;
        }
        residual.resize(V);
        for (std::size_t v = 0; v < V; ++v) residual[v] = std::max(0.0, p[v] - qi[v]);
        // All zero only if p == q up to rounding, where a rejection has probability ~0: draw from p then.
        const bool empty = std::all_of(residual.begin(), residual.end(), [](double w) { return w <= 0; });
        return {verdict.accepted, draw_from(empty ? p : residual, RngStream{sampling.seed, k}.uniform(0))};
    }
    return verdict;  // not reached: row g always decides
}

}  // namespace speculative_detail

// Generates the requests with `target`, `draft` proposing `gamma` tokens per
// target pass, all at once: request i in slot i of each engine's cache (slots
// [0, n) must be empty; they are released as requests finish, and all of them
// afterwards, even on an error). Each round, the draft's steps and the
// target's verification run every running request's segment in one packed
// forward. Stop tokens and max_new_tokens as in generate(). Near the length
// limit a pass proposes fewer drafts, so that no pass computes a token past it
// and the caches need no more positions than generate() would. A request's
// tokens depend on its seed, not on what it is batched with (to rounding).
// No continuous batching yet: every request starts in the first round.
[[nodiscard]] inline std::vector<SpeculativeCompletion> speculative_generate(CachedGpt& target, CachedGpt& draft,
                                                                             std::span<const Request> requests,
                                                                             std::int64_t gamma) {
    LOOM_CHECK(gamma >= 1, "speculative_generate: gamma = ", gamma, " draft tokens per pass; propose at least 1");
    LOOM_CHECK(draft.config().vocab == target.config().vocab, "speculative_generate: the draft's vocabulary of ",
               draft.config().vocab, " tokens is not the target's ", target.config().vocab,
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
    struct Release {  // slots [0, n) of both caches are free again however this ends
        KvCache& a;
        KvCache& b;
        std::int64_t n;
        ~Release() {
            for (std::int64_t s = 0; s < n; ++s) {
                a.release(s);
                b.release(s);
            }
        }
    } release{tcache, dcache, n};

    const auto V = static_cast<std::size_t>(target.config().vocab);
    std::vector<speculative_detail::Run> runs(requests.size());
    std::vector<Segment> segments;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        runs[i].request = &requests[i];
        runs[i].slot = static_cast<std::int64_t>(i);
        runs[i].sequence = requests[i].prompt;
        // Invariant at the top of a round: the target's cache holds all of a
        // run's sequence but its last token (the one the next pass feeds);
        // the draft's holds a prefix of it.
        if (runs[i].sequence.size() > 1)
            segments.push_back({runs[i].slot, std::span(runs[i].sequence).first(runs[i].sequence.size() - 1)});
    }
    if (!segments.empty()) (void)target.forward(segments);
    std::vector<double> p, residual;
    std::vector<speculative_detail::Run*> drafting;
    for (;;) {
        std::int64_t most = -1;  // the most drafts any running request proposes this round
        for (auto& run : runs) {
            if (!run.running) continue;
            const std::int64_t left = run.request->max_new_tokens - static_cast<std::int64_t>(run.done.tokens.size());
            run.g = std::min(gamma, left - 1);  // a pass yields at most g + 1 tokens
            run.before = static_cast<std::int64_t>(run.sequence.size());
            run.proposed.clear();
            run.q.resize(static_cast<std::size_t>(run.g));
            most = std::max(most, run.g);
        }
        if (most < 0) break;  // nothing running
        // Draft: each feeds what its cache lacks, then its own proposals, one step at a time.
        for (std::int64_t i = 0; i < most; ++i) {
            segments.clear();
            drafting.clear();
            for (auto& run : runs) {
                if (!run.running || run.g <= i) continue;
                const auto held = static_cast<std::size_t>(dcache.length(run.slot));
                segments.push_back(i == 0 ? Segment{run.slot, std::span(run.sequence).subspan(held)}
                                          : Segment{run.slot, std::span(&run.proposed.back(), 1)});
                drafting.push_back(&run);
            }
            const std::span<const float> logits = draft.forward(segments);
            for (std::size_t j = 0; j < drafting.size(); ++j) {
                speculative_detail::Run& run = *drafting[j];
                const std::span<const float> row = logits.subspan(j * V, V);
                const Sampling& sampling = run.request->sampling;
                if (sampling.greedy) {
                    run.proposed.push_back(argmax(row));
                    continue;
                }
                auto& q = run.q[static_cast<std::size_t>(i)];
                sampling_probabilities(row, sampling, q);
                const auto k = static_cast<std::uint64_t>(run.done.tokens.size()) + static_cast<std::uint64_t>(i);
                run.proposed.push_back(draw_from(q, RngStream{sampling.seed, k}.uniform(1)));
            }
        }
        // Target: every running request's last token and drafts in one pass, logits at every position.
        segments.clear();
        for (auto& run : runs) {
            if (!run.running) continue;
            run.fed.assign(1, run.sequence.back());
            run.fed.insert(run.fed.end(), run.proposed.begin(), run.proposed.end());
            segments.push_back({run.slot, run.fed});
        }
        const std::span<const float> rows = target.forward(segments, Logits::every);
        std::size_t offset = 0;
        for (auto& run : runs) {
            if (!run.running) continue;
            const auto count = static_cast<std::size_t>(run.g + 1);
            const speculative_detail::Verdict verdict = speculative_detail::accept(
                run, rows.subspan(offset * V, count * V), V, p, residual);
            offset += count;
            ++run.done.stats.target_passes;
            run.done.stats.drafted += run.g;
            run.done.stats.accepted += verdict.accepted;
            // Keep the accepted drafts' keys and values, drop the rest.
            tcache.truncate(run.slot, run.before + verdict.accepted);
            dcache.truncate(run.slot, std::min(dcache.length(run.slot), run.before + verdict.accepted));
            for (std::int64_t i = 0; i < verdict.accepted && run.running; ++i)
                run.running = run.emit(run.proposed[static_cast<std::size_t>(i)]);
            if (run.running) run.running = run.emit(verdict.own);
            if (!run.running) {  // its blocks are free for the others at once
                tcache.release(run.slot);
                dcache.release(run.slot);
            }
        }
    }
    std::vector<SpeculativeCompletion> done;
    for (auto& run : runs) done.push_back(std::move(run.done));
    return done;
}

// One request (slot 0 of each cache).
[[nodiscard]] inline SpeculativeCompletion speculative_generate(CachedGpt& target, CachedGpt& draft,
                                                                const Request& request, std::int64_t gamma) {
    return std::move(speculative_generate(target, draft, std::span(&request, 1), gamma)[0]);
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
