// Inputs for gradient compression's packers (casts, int8 blocks, signs),
// shared by their CUDA tests (tests/cuda/test_kernels_quantize_norm.cu,
// test_kernels_signs_vocab.cu) and their runs on simulated threads
// (tests/simulated/test_quantize_simulated.cpp), so that both hold the
// device code to the host's on the same cases. No CUDA here.
#pragma once

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <random>
#include <vector>

#include "support/comparisons.hpp"

namespace loom_test {

// n values from `normal`, each block of `block` scaled by 2^e, e drawn from
// `exponent` per block: the block packers' inputs, whose scales change from
// block to block. The distributions are the caller's, to draw on after.
inline std::vector<float> block_scaled_normals(std::int64_t n, std::int64_t block, std::mt19937& rng,
                                               std::normal_distribution<float>& normal,
                                               std::uniform_int_distribution<int>& exponent) {
    std::vector<float> x(static_cast<std::size_t>(n));
    const std::int64_t blocks = (n + block - 1) / block;
    for (std::int64_t b = 0; b < blocks; ++b) {
        const int e = exponent(rng);
        for (std::int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) x[i] = std::ldexp(normal(rng), e);
    }
    return x;
}

// Values that exercise the casts' rounding: zeros, infinities, NaNs with high
// and low payloads, the f16 overflow midpoint and its neighbour, bf16 ties to
// even and to odd, f16 subnormals and the tie to 0, float subnormals, FLT_MAX.
inline std::vector<float> cast_inputs(std::int64_t n, std::mt19937& rng) {
    const std::uint32_t specials[] = {0x0000'0000u, 0x8000'0000u, 0x7f80'0000u, 0xff80'0000u, 0x7fc0'0000u,
                                      0x7f80'0001u, 0xffc0'0001u, 0x477f'e000u, 0x477f'f000u, 0x477f'efffu,
                                      0x3f80'8000u, 0x3f81'8000u, 0x3380'0000u, 0x3300'0000u, 0x32c0'0000u,
                                      0x0000'0001u, 0x807f'ffffu, 0x7f7f'ffffu, 0x3f80'0000u};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-30, 20);
    std::vector<float> x(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
        if (static_cast<std::size_t>(i) < std::size(specials))
            x[i] = std::bit_cast<float>(specials[i]);
        else if (i % 4 == 0)
            x[i] = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));  // every exponent and NaN payload
        else
            x[i] = std::ldexp(normal(rng), exponent(rng));
    }
    return x;
}

// Normal values at a scale that changes from block to block, and, where the
// blocks exist: a NaN (block 1), +Inf (2), -Inf as the last value (3), all
// zeros (4), exact ties x / scale = k + 0.5 with scale 1 (5), a tiny scale (6).
inline std::vector<float> int8_inputs(std::int64_t n, std::int64_t block, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 10);
    std::vector<float> x = block_scaled_normals(n, block, rng, normal, exponent);
    const std::int64_t blocks = (n + block - 1) / block;
    const auto lo = [&](std::int64_t b) { return b * block; };
    const auto hi = [&](std::int64_t b) { return std::min(n, (b + 1) * block); };
    if (blocks > 1) x[(lo(1) + hi(1)) / 2] = std::nanf("");
    if (blocks > 2) x[lo(2)] = INFINITY;
    if (blocks > 3) x[hi(3) - 1] = -INFINITY;
    if (blocks > 4) std::fill(x.begin() + lo(4), x.begin() + hi(4), 0.0f);
    if (blocks > 5) {
        const float ties[] = {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 126.5f, -126.5f, 3.5f};
        x[lo(5)] = 127.0f;
        for (std::int64_t i = lo(5) + 1; i < hi(5); ++i) x[i] = ties[(i - lo(5)) % 8];
    }
    if (blocks > 6)
        for (std::int64_t i = lo(6); i < hi(6); ++i) x[i] = 1e-30f * normal(rng);
    return x;
}

// The blocks the inputs make special, where they exist, and the scale word
// the host writes for each (checked on both sides, so the test is seen to
// reach them).
struct SignSpecial {
    std::int64_t block;
    std::uint32_t scale;  // 0: not checked (a finite mean)
};

// Normal values at a scale that changes from block to block (2^-30 to 2^30),
// and, where the blocks exist: a default NaN (block 1: scale 0x7fc00000),
// +Inf (2: scale +Inf), -Inf as the last value (3: +Inf), zeros of both signs
// (4: scale 0, every sign bit set), x86's negative default NaN twice (5: the
// host's fabs and quieting make 0x7fc00000), the GPU's canonical NaN and an
// Inf (6: 0x7fffffff), a signalling NaN (7: quieted, 0x7fc00001), two NaNs
// of different payloads (8: NaN, payload unchecked; with block 1 only the
// first, 0x7fc00001), values near FLT_MAX (9: a sum past FLT_MAX, fine in
// double), float subnormals (10: a subnormal mean), magnitudes from 1e-30 to
// 1e30 (11: the double sum rounds). Block 1 puts one value in each block, so
// the two-value blocks keep their first.
inline std::vector<float> sign_inputs(std::int64_t n, std::int64_t block, std::mt19937& rng,
                               std::vector<SignSpecial>& specials, std::int64_t& mixed_nan_block) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-30, 30);
    std::vector<float> x = block_scaled_normals(n, block, rng, normal, exponent);
    const std::int64_t blocks = (n + block - 1) / block;
    const auto lo = [&](std::int64_t b) { return b * block; };
    const auto hi = [&](std::int64_t b) { return std::min(n, (b + 1) * block); };
    // Sets x at the k-th value of block b (counted from its end if k < 0), if the block holds it.
    const auto put = [&](std::int64_t b, std::int64_t k, float v) {
        const std::int64_t i = k >= 0 ? lo(b) + k : hi(b) + k;
        if (i >= lo(b) && i < hi(b)) x[i] = v;
    };
    specials.clear();
    mixed_nan_block = -1;
    if (blocks > 1) {
        put(1, (hi(1) - lo(1)) / 2, std::nanf(""));
        specials.push_back({1, 0x7fc0'0000u});
    }
    if (blocks > 2) {
        put(2, 0, INFINITY);
        specials.push_back({2, 0x7f80'0000u});
    }
    if (blocks > 3) {
        put(3, -1, -INFINITY);
        specials.push_back({3, 0x7f80'0000u});
    }
    if (blocks > 4) {
        for (std::int64_t i = lo(4); i < hi(4); ++i) x[i] = (i % 2 == 0) ? 0.0f : -0.0f;
        specials.push_back({4, 0x0000'0000u});
    }
    if (blocks > 5) {
        put(5, 0, from_bits(0xffc0'0000u));
        put(5, -1, from_bits(0xffc0'0000u));
        specials.push_back({5, 0x7fc0'0000u});
    }
    if (blocks > 6) {
        put(6, 0, from_bits(0x7fff'ffffu));
        put(6, 1, INFINITY);
        specials.push_back({6, 0x7fff'ffffu});
    }
    if (blocks > 7) {
        put(7, -1, from_bits(0x7f80'0001u));
        specials.push_back({7, 0x7fc0'0001u});
    }
    if (blocks > 8) {
        put(8, 0, from_bits(0x7fc0'0001u));
        if (hi(8) - lo(8) >= 2) {
            put(8, -1, from_bits(0x7fc0'0002u));
            mixed_nan_block = 8;
        } else {
            specials.push_back({8, 0x7fc0'0001u});
        }
    }
    if (blocks > 9)
        for (std::int64_t i = lo(9); i < hi(9); ++i) x[i] = (i % 3 == 0 ? -1.0f : 1.0f) * FLT_MAX * (1.0f - 0.001f * static_cast<float>(i % 5));
    if (blocks > 10)
        for (std::int64_t i = lo(10); i < hi(10); ++i) x[i] = 1e-40f * normal(rng);
    if (blocks > 11)
        for (std::int64_t i = lo(11); i < hi(11); ++i) x[i] = std::ldexp(normal(rng), static_cast<int>(i % 200) - 100);
    return x;
}

}  // namespace loom_test
