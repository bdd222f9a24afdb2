// Tests for loom/core/rng.hpp: Philox known answers, split invariance of the
// bulk fills (what makes "parallel equals serial" hold), distribution sanity.
#include "loom/core/rng.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <type_traits>
#include <limits>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::PhiloxCounter;
using loom::PhiloxKey;
using loom::RngStream;

struct Kat {
    PhiloxCounter ctr;
    PhiloxKey key;
    PhiloxCounter expected;
};

// Published known answers, "philox4x32 R" lines of Random123's kat_vectors
// (as vendored in DEShawResearch/Random123-Boost, libs/random/test/test_philox.cpp):
// counter (4 words), key (2 words) -> output (4 words).
constexpr Kat kat10[] = {
    {{{0x00000000, 0x00000000, 0x00000000, 0x00000000}}, {{0x00000000, 0x00000000}},
     {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
    {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}},
     {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
    {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}},
     {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
};
constexpr Kat kat7[] = {
    {{{0x00000000, 0x00000000, 0x00000000, 0x00000000}}, {{0x00000000, 0x00000000}},
     {{0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}}},
    {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}},
     {{0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}}},
    {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}},
     {{0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}}},
};

// Compile-time evaluation: the pi-digits vector, and the stream layout.
static_assert(loom::Philox4x32{}(kat10[2].ctr, kat10[2].key) == kat10[2].expected);
static_assert(loom::Philox4x32{}(kat10[0].ctr, kat10[0].key) == kat10[0].expected);
static_assert(loom::Philox4x32R<7>{}(kat7[2].ctr, kat7[2].key) == kat7[2].expected);
static_assert(RngStream{}.bits(1) == 0xe169c58du);  // seed 0, stream 0, block 0 is the all-zero KAT
static_assert(loom::unit_float(0xffffffffu) == 1.0f - 0x1p-24f);
static_assert(loom::unit_float(0u) == 0.0f);
static_assert(loom::stream_id("foobar") == 0x85944171f73967e8ull);

// Bit pattern of a float, so comparisons are exact and NaN-safe.
std::uint32_t float_bits(float x) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

template <class T>
std::vector<std::uint32_t> as_bits(const std::vector<T>& v) {
    std::vector<std::uint32_t> out;
    out.reserve(v.size());
    for (T x : v) {
        if constexpr (std::is_same_v<T, float>) out.push_back(float_bits(x));
        else out.push_back(x);
    }
    return out;
}

// Fills [0, n) in one call, then chunk by chunk along `cuts` into a second
// buffer: the two must agree bit for bit.
template <class T, class Fill>
void check_split_invariance(std::size_t n, const std::vector<std::size_t>& cuts, Fill fill) {
    std::vector<T> whole(n), pieces(n);
    fill(std::span<T>(whole), 0);
    for (std::size_t c = 0; c + 1 < cuts.size(); ++c) {
        INFO("chunk [" << cuts[c] << ", " << cuts[c + 1] << ")");
        fill(std::span<T>(pieces).subspan(cuts[c], cuts[c + 1] - cuts[c]), cuts[c]);
    }
    CHECK(as_bits(whole) == as_bits(pieces));
}

}  // namespace

TEST_CASE("Philox4x32-10 matches Random123's published known answers", "[rng]") {
    for (const Kat& k : kat10) CHECK(loom::Philox4x32{}(k.ctr, k.key) == k.expected);
    for (const Kat& k : kat7) CHECK(loom::Philox4x32R<7>{}(k.ctr, k.key) == k.expected);
}

TEST_CASE("RngStream maps (seed, stream, i) onto Philox counter and key as documented", "[rng]") {
    // Element i is word i % 4 of Philox(counter = {lo(i/4), hi(i/4), lo(stream), hi(stream)},
    // key = {lo(seed), hi(seed)}): the pi-digits KAT read through the stream layout.
    const RngStream s{0x299f31d0a4093822ull, 0x0370734413198a2eull};
    CHECK(s.block(0x85a308d3243f6a88ull) == kat10[2].expected);
    // bits() picks word i % 4 of block i / 4: the all-ones KAT has block 2^64 - 1,
    // out of reach of a 64-bit element index, so use the all-zero one.
    const std::uint32_t zero_kat[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    for (std::uint64_t i = 0; i < 4; ++i) CHECK(RngStream{}.bits(i) == zero_kat[i]);
    CHECK(RngStream{}.bits(4) != zero_kat[0]);

    // Pinned outputs (from an independent reference implementation): changing
    // these changes every model's initial weights.
    const RngStream qkv{42, loom::stream_id("blocks.3.attn.qkv.weight")};
    const std::uint32_t expected[8] = {0x052e154a, 0x64d1d3e0, 0x6a13965f, 0x88c9d479,
                                       0xe85b5251, 0xf67f6472, 0xe6aa24f9, 0x7688752a};
    for (std::uint64_t j = 0; j < 8; ++j) CHECK(qkv.bits(j) == expected[j]);
    CHECK(RngStream{(1ull << 40) + 7, (1ull << 33) + 5}.bits((1ull << 36) + 3) == 0xc2094507u);

    // Box-Muller mapping pinned against the same reference in double precision
    // (word 2k -> radius, word 2k+1 -> angle; even element cos, odd sin).
    const double normals[8] = {-2.1942069, 1.7280601, -1.2966557, -0.2841080,
                               0.4283167,  -0.1017450, -0.4442676, 0.1051262};
    for (std::uint64_t j = 0; j < 8; ++j) {
        INFO("element " << j);
        CHECK(qkv.normal(j) == Approx(normals[j]).margin(2e-5));
    }
    CHECK(qkv.uniform(0) == 0x052e15p-24f);  // top 24 bits of 0x052e154a
}

TEST_CASE("stream_id is FNV-1a 64 and stable", "[rng]") {
    // Published FNV-1a 64 test vectors.
    CHECK(loom::stream_id("") == 0xcbf29ce484222325ull);
    CHECK(loom::stream_id("a") == 0xaf63dc4c8601ec8cull);
    CHECK(loom::stream_id("foobar") == 0x85944171f73967e8ull);
    // Pinned tensor paths.
    CHECK(loom::stream_id("blocks.3.attn.qkv.weight") == 0xdf90b5a587f88c61ull);
    CHECK(loom::stream_id("embed.weight") == 0x9ac37bcac2dc8a00ull);
    CHECK(loom::stream_id("blocks.3.attn.qkv.weight") != loom::stream_id("blocks.3.attn.qkv.bias"));
}

TEST_CASE("bulk fills agree with the per-element functions", "[rng]") {
    const RngStream s{7, loom::stream_id("w")};
    std::vector<float> u(37), z(37);
    std::vector<std::uint8_t> m(37);
    const std::uint64_t offset = 1001;  // unaligned: 1001 % 4 == 1
    s.fill_uniform(u, offset);
    s.fill_normal(z, offset);
    s.fill_bernoulli(m, offset, 0.7f);
    for (std::size_t k = 0; k < u.size(); ++k) {
        INFO("k = " << k);
        CHECK(float_bits(u[k]) == float_bits(s.uniform(offset + k)));
        CHECK(float_bits(z[k]) == float_bits(s.normal(offset + k)));
        CHECK(m[k] == (s.keep(offset + k, 0.7f) ? 1 : 0));
    }
}

TEST_CASE("fills of elements 0 to N equal the concatenation of fills of any chunks", "[rng]") {
    const std::size_t n = 1000;
    const std::vector<std::vector<std::size_t>> splits = {
        {0, 3, 7, 250, 251, 999, 1000},
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1000},
        {0, 333, 666, 1000},
        {0, 5, 13, 501, 502, 503, 1000},
    };
    const RngStream streams[] = {{0, 0},
                                 {42, loom::stream_id("blocks.3.attn.qkv.weight")},
                                 {0xdeadbeefcafef00dull, 17},
                                 {1ull << 40, (1ull << 50) + 3}};
    for (const RngStream& s : streams) {
        for (const auto& cuts : splits) {
            INFO(s);
            check_split_invariance<float>(n, cuts, [&](std::span<float> out, std::uint64_t off) {
                s.fill_normal(out, off, 0.5f, 0.02f);
            });
            check_split_invariance<float>(n, cuts, [&](std::span<float> out, std::uint64_t off) {
                s.fill_uniform(out, off, -0.1f, 0.1f);
            });
            check_split_invariance<std::uint8_t>(n, cuts, [&](std::span<std::uint8_t> out, std::uint64_t off) {
                s.fill_bernoulli(out, off, 0.9f);
            });
        }
    }
}

TEST_CASE("normals have mean 0, variance 1 and independent pairs", "[rng]") {
    const std::size_t n = 1'000'000;
    std::vector<float> z(n);
    RngStream{2024, loom::stream_id("normal-sanity")}.fill_normal(z, 0);
    double sum = 0, sum_sq = 0, pair_product = 0, sum_cube = 0;
    std::size_t beyond_196 = 0, not_finite = 0;
    for (std::size_t k = 0; k < n; ++k) {
        const double x = z[k];
        not_finite += !std::isfinite(x);
        sum += x;
        sum_sq += x * x;
        sum_cube += x * x * x;
        if (std::abs(x) > 1.959964) ++beyond_196;
        if (k % 2 == 0) pair_product += x * z[k + 1];  // cos/sin partners
    }
    CHECK(not_finite == 0);
    const double mean = sum / n;
    const double variance = sum_sq / n - mean * mean;
    CHECK(std::abs(mean) < 0.01);
    CHECK(std::abs(variance - 1.0) < 0.01);
    CHECK(std::abs(sum_cube / n) < 0.03);  // skewness ~ 0
    CHECK(std::abs(static_cast<double>(beyond_196) / n - 0.05) < 0.003);
    CHECK(std::abs(pair_product / (n / 2)) < 0.01);  // partners uncorrelated
}

TEST_CASE("uniforms lie in 0 <= u < 1, cover it evenly and use every bit", "[rng]") {
    const std::size_t n = 1'000'000;
    std::vector<float> u(n);
    const RngStream s{99, 3};
    s.fill_uniform(u, 5);  // unaligned start
    float lo = 1.0f, hi = 0.0f;
    double sum = 0;
    std::size_t bins[16] = {}, outside = 0;
    for (float x : u) {
        if (!(x >= 0.0f && x < 1.0f)) {
            ++outside;
            continue;
        }
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        sum += x;
        ++bins[static_cast<std::size_t>(x * 16.0f)];
    }
    CHECK(outside == 0);
    CHECK(lo < 1e-4f);
    CHECK(hi > 1.0f - 1e-4f);
    CHECK(std::abs(sum / n - 0.5) < 0.01);
    for (std::size_t b : bins) CHECK(std::abs(static_cast<double>(b) / n - 1.0 / 16) < 0.002);

    // Every one of the 32 bits is set about half the time (catches a word or
    // half-word picked twice).
    std::size_t ones[32] = {};
    const std::size_t m = 200'000;
    for (std::uint64_t i = 0; i < m; ++i)
        for (int b = 0; b < 32; ++b) ones[b] += (s.bits(i) >> b) & 1u;
    for (int b = 0; b < 32; ++b) {
        INFO("bit " << b);
        CHECK(std::abs(static_cast<double>(ones[b]) / m - 0.5) < 0.01);
    }

    std::vector<float> w(1000);
    s.fill_uniform(w, 0, -3.0f, 5.0f);
    CHECK(std::all_of(w.begin(), w.end(), [](float x) { return x >= -3.0f && x < 5.0f; }));
}

TEST_CASE("dropout masks keep the requested fraction", "[rng]") {
    const RngStream s{5, loom::stream_id("dropout")};
    std::vector<std::uint8_t> m(200'000);
    for (float p : {0.1f, 0.5f, 0.9f}) {
        s.fill_bernoulli(m, 3, p);
        std::size_t kept = 0;
        for (auto x : m) kept += x;
        INFO("keep probability " << p);
        CHECK(std::abs(static_cast<double>(kept) / static_cast<double>(m.size()) - p) < 0.01);
    }
    // keep(i, p) is uniform(i) < p, strictly: p equal to the draw drops it.
    for (std::uint64_t i = 0; i < 8; ++i) {
        const float u = s.uniform(i);
        CHECK_FALSE(s.keep(i, u));
        CHECK(s.keep(i, std::nextafter(u, 2.0f)));
        std::uint8_t one[1] = {7};
        s.fill_bernoulli(one, i, u);
        CHECK(one[0] == 0);
    }
    s.fill_bernoulli(m, 0, 0.0f);
    CHECK(std::count(m.begin(), m.end(), std::uint8_t{0}) == static_cast<std::ptrdiff_t>(m.size()));
    s.fill_bernoulli(m, 0, 1.0f);
    CHECK(std::count(m.begin(), m.end(), std::uint8_t{1}) == static_cast<std::ptrdiff_t>(m.size()));
}

TEST_CASE("different seeds, streams and positions give different numbers", "[rng]") {
    const auto first = [](const RngStream& s) {
        std::vector<std::uint32_t> v(64);
        for (std::uint64_t i = 0; i < v.size(); ++i) v[i] = s.bits(i);
        return v;
    };
    const auto base = first({1, 2});
    CHECK(base != first({2, 1}));                // seed and stream are not interchangeable
    CHECK(base != first({1, 3}));
    CHECK(base != first({1 + (1ull << 32), 2}));  // high word of the seed is used
    CHECK(base != first({1, 2 + (1ull << 32)}));  // high word of the stream is used
    const RngStream s{1, 2};
    CHECK(s.bits(0) != s.bits(1ull << 34));      // high word of the block index is used
    CHECK(first({1, 2}) == base);                // and the same inputs repeat
}

TEST_CASE("bad fill arguments fail with a one-line message naming the value", "[rng]") {
    const RngStream s{1, 1};
    std::vector<float> f(4);
    std::vector<std::uint8_t> m(4);
    CHECK_THROWS_WITH(s.fill_uniform(f, 0, 2.0f, 1.0f),
                      Catch::Contains("lo <= hi") && Catch::Contains("lo = 2") && Catch::Contains("hi = 1"));
    CHECK_THROWS_WITH(s.fill_normal(f, 0, 0.0f, -1.0f), Catch::Contains("stddev >= 0, got mean = 0, stddev = -1"));
    CHECK_THROWS_WITH(s.fill_normal(f, 0, std::numeric_limits<float>::quiet_NaN(), 1.0f),
                      Catch::Contains("got mean = nan"));
    CHECK_THROWS_WITH(s.fill_uniform(f, 0, 0.0f, std::numeric_limits<float>::infinity()),
                      Catch::Contains("finite lo <= hi, got lo = 0, hi = inf"));
    CHECK_THROWS_WITH(s.fill_bernoulli(m, 0, 1.5f), Catch::Contains("in [0, 1], got 1.5"));
    // The end index offset + size must fit in 64 bits.
    CHECK_THROWS_WITH(s.fill_normal(f, ~std::uint64_t{0} - 2, 0.0f, 1.0f),
                      Catch::Contains("4 elements from offset 18446744073709551613"));
    CHECK_NOTHROW(s.fill_normal(std::span<float>(f).first(2), ~std::uint64_t{0} - 2, 0.0f, 1.0f));
}

TEST_CASE("RngStream and PhiloxCounter print themselves", "[rng]") {
    std::ostringstream os;
    os << RngStream{42, 0xdf90b5a587f88c61ull} << ' ' << kat10[2].expected << ' ' << 10;
    CHECK(os.str() == "RngStream{seed=42, stream=0xdf90b5a587f88c61} {d16cfe09 94fdcceb 5001e420 24126ea1} 10");
}

}  // namespace LOOM_TEST_FILE
