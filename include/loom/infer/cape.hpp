// CaPE, confidence-aware proposal expansion (GliDe with a CaPE, Du et al.
// 2024, arXiv 2402.02082): speculative decoding whose target pass checks a
// tree of candidates instead of one chain. The draft proposes gamma greedy
// tokens; at step i, where its confidence p_i (its largest softmax
// probability) is low, it adds more of its next-most-likely tokens at that
// position as alternatives: k_i from bins (p < 0.3: 8, < 0.6: 6, < 0.8: 4,
// else 2 -- the paper's defaults, CapeConfig). The chain with each
// alternative a leaf hanging off it at its depth is a "comb":
//
//     last ── d1 ── d2 ── d3 ── d4        the greedy chain (nodes 0..g)
//       ├─ a1   ├─ b1  ├─ c1  └─ e1       alternatives: leaves, sibling of the
//       ├─ a2   └─ b2  └─ c2    ...       chain token proposed at that step
//       └─ ...
//
// linearised as [last, d1 .. dg, step 0's alternatives, step 1's, ...] with
// parents (CachedGpt's tree segments: each node sees the cache and its
// ancestors, at position = depth), and verified in ONE target pass. Greedy
// acceptance walks from the root while a child carries the target's argmax
// (the chain child or one of the alternatives: they are distinct tokens),
// and adds the target's own next token after the last node reached; the
// target's cache is then compacted to that path (KvCache::keep: no copy when
// the path is a prefix of the chain, one row per layer for an alternative).
// The tokens are the target's greedy tokens, as for vanilla speculation.
//
// Greedy only: a sampled tree acceptance (SpecInfer's multi-draft rejection
// sampling) is not built; SpeculativeBatcher refuses sampled requests when
// CaPE is on. infer/speculative_batcher.hpp runs the rounds.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/infer/sampler.hpp"

namespace loom::infer {

// The bins: a step whose confidence is below thresholds[b] (the first such
// b) gets alternatives[b] extra candidates, one at or above every threshold
// gets alternatives.back().
struct CapeConfig {
    std::vector<double> thresholds{0.3, 0.6, 0.8};
    std::vector<std::int64_t> alternatives{8, 6, 4, 2};

    void validate() const {
        LOOM_CHECK(alternatives.size() == thresholds.size() + 1, "CapeConfig: ", thresholds.size(),
                   " thresholds need ", thresholds.size() + 1, " alternative counts (one per bin), got ",
                   alternatives.size());
        for (std::size_t b = 0; b < thresholds.size(); ++b) {
            LOOM_CHECK(thresholds[b] > 0 && thresholds[b] <= 1, "CapeConfig: threshold ", b, " = ", thresholds[b],
                       " is not a probability in (0, 1]");
            LOOM_CHECK(b == 0 || thresholds[b] > thresholds[b - 1], "CapeConfig: threshold ", b, " = ",
                       thresholds[b], " is not above threshold ", b - 1, " = ", thresholds[b - 1],
                       "; give them increasing");
        }
        for (std::size_t b = 0; b < alternatives.size(); ++b)
            LOOM_CHECK(alternatives[b] >= 0, "CapeConfig: bin ", b, " adds ", alternatives[b],
                       " alternatives; give 0 or more");
    }

    // Alternatives for a step of this confidence.
    [[nodiscard]] std::int64_t alternatives_for(double confidence) const {
        for (std::size_t b = 0; b < thresholds.size(); ++b)
            if (confidence < thresholds[b]) return alternatives[b];
        return alternatives.back();
    }
};

// The bins from their text, "K@P,...,K" (e.g. "8@0.3,6@0.6,4@0.8,2", the
// defaults): K alternatives below confidence P, the last K at or above every
// P. Checked as CapeConfig::validate checks them; a bad text is named in the
// message, which a front end prefixes with its own name for the setting.
[[nodiscard]] inline CapeConfig parse_cape_bins(std::string_view text) {
    const std::string all(text);
    CapeConfig bins{{}, {}};
    std::istringstream items(all);
    std::string item;
    while (std::getline(items, item, ',')) {
        const auto at = item.find('@');
        LOOM_CHECK(bins.alternatives.empty() || bins.thresholds.size() == bins.alternatives.size(), all,
                   ": only the last bin may go without @P; write K@P,...,K");
        const std::string count = item.substr(0, at);
        char* end = nullptr;
        errno = 0;
        const long long k = std::strtoll(count.c_str(), &end, 10);
        LOOM_CHECK(!count.empty() && *end == '\0' && errno == 0 && k >= 0 && k <= (1 << 20), count,
                   " is not a whole number in 0..", 1 << 20);
        bins.alternatives.push_back(k);
        if (at == std::string::npos) continue;
        const std::string p = item.substr(at + 1);
        const double threshold = std::strtod(p.c_str(), &end);
        LOOM_CHECK(!p.empty() && *end == '\0', p, " is not a number");
        bins.thresholds.push_back(threshold);
    }
    LOOM_CHECK(!bins.alternatives.empty() && bins.thresholds.size() + 1 == bins.alternatives.size(), all,
               " does not end with a bin without @P; write K@P,...,K (e.g. 8@0.3,6@0.6,4@0.8,2)");
    try {
        bins.validate();
    } catch (const Error& e) {
        LOOM_FAIL(all, ": ", e.message());
    }
    return bins;
}

// The bins as parse_cape_bins reads them.
[[nodiscard]] inline std::string to_string(const CapeConfig& bins) {
    std::ostringstream out;
    for (std::size_t b = 0; b < bins.alternatives.size(); ++b) {
        if (b > 0) out << ',';
        out << bins.alternatives[b];
        if (b < bins.thresholds.size()) out << '@' << bins.thresholds[b];
    }
    return out.str();
}

// The draft's largest softmax probability: 1 / sum_v exp(l_v - max l).
[[nodiscard]] inline double draft_confidence(std::span<const float> logits) {
    const float best = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (const float l : logits) total += std::exp(static_cast<double>(l - best));
    return 1.0 / total;
}

// One draft step's candidates: returns the greedy token (the argmax, as
// propose_draft's) and writes to `out` the alternatives, the next-most-likely
// tokens after it (ties: lower id first), as many as the step's confidence
// earns but at most `room` (and at most vocab - 1).
inline std::int32_t cape_step(std::span<const float> logits, const CapeConfig& config, std::int64_t room,
                              std::vector<std::int32_t>& out) {
    const std::int32_t greedy = argmax(logits);
    const auto vocab = static_cast<std::int64_t>(logits.size());
    const std::int64_t k = std::min({config.alternatives_for(draft_confidence(logits)), std::max<std::int64_t>(room, 0),
                                     vocab - 1});
    out.clear();
    if (k == 0) return greedy;
    for (std::int32_t v = 0; v < static_cast<std::int32_t>(vocab); ++v)
        if (v != greedy) out.push_back(v);
    const auto before = [&](std::int32_t a, std::int32_t b) {
        const auto la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
        return la > lb || (la == lb && a < b);
    };
    std::partial_sort(out.begin(), out.begin() + k, out.end(), before);
    out.resize(static_cast<std::size_t>(k));
    return greedy;
}

// A linearised comb: node 0 the last token (parent -1), nodes 1..g the chain,
// then every step's alternatives (step i's hang off node i).
struct CapeTree {
    std::vector<std::int32_t> tokens, parents;
    std::int64_t chain = 0;  // g, the greedy drafts

    void build(std::int32_t last, std::span<const std::int32_t> drafts,
               std::span<const std::vector<std::int32_t>> alternatives) {
        chain = static_cast<std::int64_t>(drafts.size());
        tokens.assign(1, last);
        parents.assign(1, -1);
        for (std::size_t i = 0; i < drafts.size(); ++i) {
            tokens.push_back(drafts[i]);
            parents.push_back(static_cast<std::int32_t>(i));
        }
        for (std::size_t i = 0; i < drafts.size() && i < alternatives.size(); ++i)
            for (const std::int32_t a : alternatives[i]) {
                tokens.push_back(a);
                parents.push_back(static_cast<std::int32_t>(i));
            }
    }
    [[nodiscard]] std::int64_t size() const noexcept { return static_cast<std::int64_t>(tokens.size()); }
};

// A pass's outcome: the nodes accepted (root excluded, root to leaf), and the target's token after them.
struct CapeVerdict {
    std::vector<std::int64_t> path;
    std::int32_t own = -1;
    std::int64_t chain_accepted = 0;  // of the path, nodes on the greedy chain (a prefix of it)
};

// Greedy acceptance over the target's rows (`rows`: one row of `vocab`
// logits per node, the target's distribution after that node): from the
// root, while a child of the current node carries the target's argmax there,
// accept it; then the argmax after the last accepted node is the target's own.
inline void accept_tree_greedy(const CapeTree& tree, std::span<const float> rows, std::size_t vocab,
                               CapeVerdict& verdict) {
    verdict.path.clear();
    verdict.chain_accepted = 0;
    std::int64_t node = 0;
    for (;;) {
        const std::int32_t best = argmax(rows.subspan(static_cast<std::size_t>(node) * vocab, vocab));
        std::int64_t next = -1;
        for (std::int64_t j = node + 1; j < tree.size() && next < 0; ++j)
            if (tree.parents[static_cast<std::size_t>(j)] == node && tree.tokens[static_cast<std::size_t>(j)] == best)
                next = j;
        if (next < 0) {
            verdict.own = best;
            return;
        }
        verdict.path.push_back(next);
        if (next <= tree.chain) ++verdict.chain_accepted;
        node = next;
    }
}

}  // namespace loom::infer
