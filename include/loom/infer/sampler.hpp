// Choosing the next token from one position's logits: greedy (the largest
// logit, the lowest id among equals), or a draw from the softmax at a
// temperature, restricted to the top k logits and then to the smallest set of
// most likely tokens whose probability reaches top_p (nucleus sampling).
//
// Deterministic in the seed, whatever else is generated beside it: draw k of
// a request (its k-th new token) uses RngStream(seed, k).uniform(0), as
// gpt::sample does, so a request's tokens do not depend on the batch it runs
// in. The draw walks the kept tokens in id order and subtracts exp((logit -
// max) / temperature) until the uniform is spent, gpt::sample's rule: with no
// top-k or top-p it picks what gpt::sample picks from the same logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"

namespace loom::infer {

struct Sampling {
    bool greedy = false;       // the largest logit; the fields below are then unused (but still checked)
    float temperature = 1.0f;  // > 0: logits are divided by it
    std::int64_t top_k = 0;    // keep the k largest logits; 0 keeps all
    float top_p = 1.0f;        // in (0, 1]: keep the most likely tokens until their probability reaches it
    std::uint64_t seed = 0;

    void validate() const {
        LOOM_CHECK(std::isfinite(temperature) && temperature > 0.0f, "Sampling: temperature ", temperature,
                   " must be a finite number > 0 (use greedy = true for the most likely token)");
        LOOM_CHECK(top_k >= 0, "Sampling: top_k ", top_k, " must be >= 0 (0 keeps every token)");
        LOOM_CHECK(top_p > 0.0f && top_p <= 1.0f, "Sampling: top_p ", top_p,
                   " is not in (0, 1] (1 keeps every token)");
    }
};

// The largest logit's id (the lowest among equal ones).
[[nodiscard]] inline std::int32_t argmax(std::span<const float> logits) {
    LOOM_CHECK(!logits.empty(), "argmax: no logits");
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Picks tokens; holds scratch so that a decode step allocates nothing.
class Sampler {
public:
    // The token for draw `draw` (the request's count of tokens so far) from `logits`.
    [[nodiscard]] std::int32_t pick(std::span<const float> logits, const Sampling& sampling, std::uint64_t draw) {
        sampling.validate();
        if (sampling.greedy) return argmax(logits);
        const auto V = static_cast<std::int64_t>(logits.size());
        (void)weights(logits, sampling);
        double u = static_cast<double>(RngStream{sampling.seed, draw}.uniform(0)) * total_;
        std::int32_t chosen = -1;
        for (std::int64_t v = 0; v < V; ++v) {
            if (!keep_[static_cast<std::size_t>(v)]) continue;
            chosen = static_cast<std::int32_t>(v);  // the last kept token takes what rounding leaves
            u -= weights_[static_cast<std::size_t>(v)];
            if (u <= 0) break;
        }
        return chosen;
    }

    // The unnormalised weights a sampled (not greedy) pick draws from, by
    // token id: exp((logit - max) / temperature), 0 for the tokens top-k and
    // top-p drop. Valid until the next call; speculative decoding's
    // rejection rule reads them (infer/speculative.hpp).
    [[nodiscard]] std::span<const double> weights(std::span<const float> logits, const Sampling& sampling) {
        const auto V = static_cast<std::int64_t>(logits.size());
        LOOM_CHECK(V >= 1, "Sampler: no logits");
        const float top = *std::max_element(logits.begin(), logits.end());
        weights_.resize(logits.size());
        total_ = 0;
        for (std::int64_t v = 0; v < V; ++v) {
            const double w = std::exp((logits[static_cast<std::size_t>(v)] - top) / sampling.temperature);
            weights_[static_cast<std::size_t>(v)] = w;
            total_ += w;
        }
        keep_.assign(logits.size(), true);
        const std::int64_t k = sampling.top_k == 0 ? V : std::min(sampling.top_k, V);
        if (k < V || sampling.top_p < 1.0f) {
            total_ = restrict(logits, k, sampling.top_p);
            for (std::size_t v = 0; v < weights_.size(); ++v)
                if (!keep_[v]) weights_[v] = 0;
        }
        return weights_;
    }

private:
    // Keeps the k most likely tokens (ties: lower id first), then of those
    // the fewest whose probability reaches top_p; returns their total weight.
    double restrict(std::span<const float> logits, std::int64_t k, float top_p) {
        order_.resize(logits.size());
        std::iota(order_.begin(), order_.end(), 0);
        const auto more_likely = [&](std::int32_t a, std::int32_t b) {
            const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
            return la > lb || (la == lb && a < b);
        };
        std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), more_likely);
        double kept_total = 0;
        for (std::int64_t i = 0; i < k; ++i) kept_total += weight_of(i);
        // top_p is a share of the top-k distribution (renormalised), as in Hugging Face's warpers.
        const double target = static_cast<double>(top_p) * kept_total;
        std::int64_t kept = 0;
        double running = 0;
        while (kept < k) {
            running += weight_of(kept);
            ++kept;
            if (running >= target) break;
        }
        std::fill(keep_.begin(), keep_.end(), false);
        for (std::int64_t i = 0; i < kept; ++i)
            keep_[static_cast<std::size_t>(order_[static_cast<std::size_t>(i)])] = true;
        return running;
    }

    // The weight of the i-th most likely token (after the sort).
    [[nodiscard]] double weight_of(std::int64_t i) const {
        return weights_[static_cast<std::size_t>(order_[static_cast<std::size_t>(i)])];
    }

    std::vector<double> weights_;
    double total_ = 0;  // of the kept weights, summed as pick walks them
    std::vector<bool> keep_;
    std::vector<std::int32_t> order_;
};

}  // namespace loom::infer
