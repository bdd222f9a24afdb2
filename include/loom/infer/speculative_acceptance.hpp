// Speculative decoding's rule for one request and one round (Leviathan et
// al. 2023; Chen et al. 2023): how the draft proposes a token, and how the
// target's rows over [last token, d1 ... dg] accept a prefix of the drafts
// and supply one token of its own. infer/speculative_batcher.hpp runs the
// rounds; infer/speculative.hpp is the overview.
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
//
// Random numbers: new token k's draws come from RngStream(seed, k): element 0
// for the target's own draw (a replacement or bonus token), 1 for the draft's
// draw, 2 for the acceptance test. A draft redrawn in a later round (after a
// rejection before it) reuses element 1, which nothing that was kept depended
// on. Deterministic in the seed, whatever the request is batched with; not
// the same tokens as infer::generate's sampled run (the distribution is the
// same, the draws are not).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"
#include "loom/infer/sampler.hpp"

namespace loom::infer {

// What speculative decoding did: the draft's proposals, the target's passes.
struct SpeculativeStats {
    std::int64_t target_passes = 0;  // verification forwards of the target (its prompt prefill not counted)
    std::int64_t drafted = 0;        // draft tokens proposed
    std::int64_t accepted = 0;       // of those, accepted by the target
    std::int64_t alternatives = 0;   // CaPE: of the accepted, alternatives off the greedy chain (infer/cape.hpp)

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

// The draft's proposal for new token `draw` (the request's count of tokens
// before it) from the draft's logits: its argmax when greedy, else a draw
// from q (written to `q`, which the acceptance test reads).
[[nodiscard]] inline std::int32_t propose_draft(std::span<const float> logits, const Sampling& sampling,
                                                std::uint64_t draw, std::vector<double>& q) {
    if (sampling.greedy) return argmax(logits);
    sampling_probabilities(logits, sampling, q);
    return draw_from(q, RngStream{sampling.seed, draw}.uniform(1));
}

// A round's outcome for one request: how many drafts are accepted, and the
// target's own token after them.
struct SpeculativeVerdict {
    std::int64_t accepted = 0;
    std::int32_t own = -1;
};

// Checks the drafts `proposed` (g of them, q[i] the draft's distribution at
// proposal i when sampled) against the target's g + 1 rows of `vocab` logits
// (`rows`: the rows after the last token and after each draft). `first_draw`
// is the request's count of tokens before the round. p and residual are scratch.
[[nodiscard]] inline SpeculativeVerdict verify_drafts(std::span<const std::int32_t> proposed,
                                                      std::span<const std::vector<double>> q,
                                                      std::span<const float> rows, std::size_t vocab,
                                                      const Sampling& sampling, std::uint64_t first_draw,
                                                      std::vector<double>& p, std::vector<double>& residual) {
    const auto g = static_cast<std::int64_t>(proposed.size());
    std::int64_t accepted = 0;
    for (std::int64_t i = 0; i <= g; ++i) {
        const std::span<const float> row = rows.subspan(static_cast<std::size_t>(i) * vocab, vocab);
        const std::uint64_t k = first_draw + static_cast<std::uint64_t>(i);
        const std::int32_t x = i < g ? proposed[static_cast<std::size_t>(i)] : -1;
        if (sampling.greedy) {
            const std::int32_t best = argmax(row);
            if (best != x) return {accepted, best};
            ++accepted;
            continue;
        }
        sampling_probabilities(row, sampling, p);
        if (i == g)  // every draft accepted: the bonus token, from the target alone
            return {accepted, draw_from(p, RngStream{sampling.seed, k}.uniform(0))};
        const std::vector<double>& qi = q[static_cast<std::size_t>(i)];
        const double px = p[static_cast<std::size_t>(x)], qx = qi[static_cast<std::size_t>(x)];
        // u < p/q, written without the division: q(x) > 0 since x was drawn from q.
        if (static_cast<double>(RngStream{sampling.seed, k}.uniform(2)) * qx < px) {
            ++accepted;
            continue;
        }
        residual.resize(vocab);
        for (std::size_t v = 0; v < vocab; ++v) residual[v] = std::max(0.0, p[v] - qi[v]);
        // All zero only if p == q up to rounding, where a rejection has probability ~0: draw from p then.
        const bool empty = std::all_of(residual.begin(), residual.end(), [](double w) { return w <= 0; });
        return {accepted, draw_from(empty ? p : residual, RngStream{sampling.seed, k}.uniform(0))};
    }
    return {accepted, -1};  // not reached: row g always decides
}

}  // namespace loom::infer
