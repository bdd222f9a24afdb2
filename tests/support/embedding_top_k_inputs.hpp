// Inputs for the embedding and top-k kernel tests, shared by the CUDA tests
// (tests/cuda/test_kernels_embedding_topk.cu) and their runs on simulated
// threads (tests/simulated/test_embedding_top_k_simulated.cpp), so that both
// hold the device code to the host's on the same cases. No CUDA here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "support/comparisons.hpp"

namespace loom_test {

// Values over 2^-12 .. 2^12 of either sign: summed in another order they
// round differently, so equal sums mean the same order, not luck.
inline std::vector<float> wide_range(std::size_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-12, 12);
    std::vector<float> values(n);
    for (float& v : values) v = std::ldexp(normal(rng), exponent(rng));
    return values;
}

struct EmbeddingShape {
    std::int64_t B, T, C, vocab;
};
// One token; a small odd shape; GPT-2's width and vocabulary; T past 1024.
inline constexpr EmbeddingShape embedding_shapes[] = {
    {1, 1, 1, 1}, {2, 7, 5, 11}, {4, 64, 768, 50257}, {3, 1025, 3, 97}};

// Token ids with many repeats: most from a pool of a dozen ids (id 0 and the
// last id among them), the rest anywhere in the vocabulary.
inline std::vector<std::int32_t> repeated_tokens(std::int64_t count, std::int64_t vocab, std::mt19937& rng) {
    std::uniform_int_distribution<std::int64_t> any(0, vocab - 1);
    std::vector<std::int32_t> pool{0, static_cast<std::int32_t>(vocab - 1)};
    while (pool.size() < 12) pool.push_back(static_cast<std::int32_t>(any(rng)));
    std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1);
    std::bernoulli_distribution from_pool(0.7);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
    for (auto& token : tokens) token = from_pool(rng) ? pool[pick(rng)] : static_cast<std::int32_t>(any(rng));
    return tokens;
}

// A vocabulary in three slices (tensor parallelism's embedding): at the
// start, in the middle and at the end, each [start, stop) and not empty (a
// vocabulary of 1 has one).
struct VocabularySlice {
    std::int64_t start, stop;
};
inline std::vector<VocabularySlice> vocabulary_slices(std::int64_t vocab) {
    const std::int64_t third = std::max<std::int64_t>(1, vocab / 3);
    const std::int64_t cuts[] = {0, third, std::min(vocab, 2 * third), vocab};
    std::vector<VocabularySlice> slices;
    for (int i = 0; i < 3; ++i)
        if (cuts[i + 1] > cuts[i]) slices.push_back({cuts[i], cuts[i + 1]});
    return slices;
}

// Inputs for the top-k selection, by kind:
//   0: normals over many scales, with the specials below;
//   1: integers in [-12, 12]: few magnitudes, so the threshold cuts a tie group;
//   2: mostly zeros of both signs (99.5%), so the threshold is 0 and the
//      zeros tie (+0 with -0) by index.
// The specials, where the length allows: NaN with payloads and both signs,
// +-Inf (tied with NaN), +-0, a subnormal, the largest float.
inline std::vector<float> top_k_inputs(std::int64_t n, int kind, std::mt19937& rng) {
    std::vector<float> x(static_cast<std::size_t>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 20), small(-12, 12);
    std::bernoulli_distribution rare(0.005), sign(0.5);
    for (auto& v : x) {
        if (kind == 0)
            v = std::ldexp(normal(rng), exponent(rng));
        else if (kind == 1)
            v = static_cast<float>(small(rng));
        else
            v = rare(rng) ? normal(rng) : (sign(rng) ? -0.0f : 0.0f);
    }
    const std::uint32_t specials[] = {0x7fc0'0000u, 0xffc0'1234u, 0x7f80'0001u, 0x7f80'0000u, 0xff80'0000u,
                                      0x8000'0000u, 0x0000'0000u, 0x0000'0001u, 0x7f7f'ffffu};
    if (kind != 1) {
        std::uniform_int_distribution<std::int64_t> where(0, n - 1);
        for (const std::uint32_t s : specials)
            if (n >= 7) x[static_cast<std::size_t>(where(rng))] = from_bits(s);
    }
    return x;
}

// The host test's hand-picked top-k cases: ties, NaN before any finite value,
// NaN tied with Inf, a NaN's bits travelling as they are, signed zeros.
inline std::vector<std::vector<float>> top_k_hand_picked() {
    const float nan_f = std::numeric_limits<float>::quiet_NaN(), inf_f = std::numeric_limits<float>::infinity();
    return {{1.0f, -3.0f, 3.0f, 2.0f, -3.0f, 3.0f},
            {5.0f, -100.0f, 1.0f, nan_f, 1e30f},
            {nan_f, inf_f, -inf_f},
            {-inf_f, from_bits(0xffc0'1234u), inf_f, 0.0f},
            {1.0f, from_bits(0xffc0'1234u)},
            {0.5f, -7.0f, 0.25f, 6.0f, -0.125f},
            {-0.0f, 0.0f, -0.0f, 0.0f}};
}

}  // namespace loom_test
