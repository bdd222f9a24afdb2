// Counter-based random numbers (Philox4x32-10): element i of a stream is a pure
// function of (seed, stream, i), so a rank holding elements [a, b) of a tensor
// regenerates exactly the values a serial run has there, without the others.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <span>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/core/host_device.hpp"

namespace loom {

// Plain structs rather than std::array: std::array's members are host-only
// under nvcc unless --expt-relaxed-constexpr is given.
struct PhiloxCounter {
    std::uint32_t w[4];
    friend constexpr bool operator==(const PhiloxCounter&, const PhiloxCounter&) = default;
};
struct PhiloxKey {
    std::uint32_t w[2];
    friend constexpr bool operator==(const PhiloxKey&, const PhiloxKey&) = default;
};

// Philox4x32 with `Rounds` rounds, exactly as Random123 (Salmon et al., SC'11)
// defines it; Rounds = 10 is the Crush-resistant default everyone publishes.
template <int Rounds>
struct Philox4x32R {
    static_assert(Rounds >= 1 && Rounds <= 16, "Random123 defines Philox4x32 for 1 to 16 rounds");

    static constexpr std::uint32_t multiplier0 = 0xD2511F53u;
    static constexpr std::uint32_t multiplier1 = 0xCD9E8D57u;
    static constexpr std::uint32_t weyl0 = 0x9E3779B9u;  // golden ratio
    static constexpr std::uint32_t weyl1 = 0xBB67AE85u;  // sqrt(3) - 1

    [[nodiscard]] LOOM_HOST_DEVICE constexpr PhiloxCounter operator()(PhiloxCounter ctr,
                                                                      PhiloxKey key) const {
        ctr = round(ctr, key);
        for (int r = 1; r < Rounds; ++r) {
            key.w[0] += weyl0;
            key.w[1] += weyl1;
            ctr = round(ctr, key);
        }
        return ctr;
    }

private:
    LOOM_HOST_DEVICE static constexpr PhiloxCounter round(PhiloxCounter c, PhiloxKey k) {
        // 32x32 -> 64 multiply; nvcc lowers it to mul.wide/mul.hi.
        const std::uint64_t p0 = std::uint64_t{multiplier0} * c.w[0];
        const std::uint64_t p1 = std::uint64_t{multiplier1} * c.w[2];
        const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
        const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
        return PhiloxCounter{{hi1 ^ c.w[1] ^ k.w[0], lo1, hi0 ^ c.w[3] ^ k.w[1], lo0}};
    }
};

using Philox4x32 = Philox4x32R<10>;

// Maps 32 random bits to [0, 1) using the top 24 (every value exact in float):
// the largest result is 1 - 2^-24, never 1.0f.
[[nodiscard]] LOOM_HOST_DEVICE constexpr float unit_float(std::uint32_t bits) {
    return static_cast<float>(bits >> 8) * 0x1p-24f;
}

namespace detail {

// Box-Muller on one pair of words: a -> radius, b -> angle. u1 is in (0, 1] so
// log never sees 0; |z| is therefore at most sqrt(48 ln 2) ~ 5.77.
LOOM_HOST_DEVICE inline void box_muller(std::uint32_t a, std::uint32_t b, float& z_cos,
                                        float& z_sin) {
    const float u1 = static_cast<float>((a >> 8) + 1u) * 0x1p-24f;
    const float angle = 6.28318530717958647692f * unit_float(b);
#if defined(__CUDA_ARCH__)
    const float radius = ::sqrtf(-2.0f * ::logf(u1));
    z_cos = radius * ::cosf(angle);
    z_sin = radius * ::sinf(angle);
#else
    const float radius = std::sqrt(-2.0f * std::log(u1));
    z_cos = radius * std::cos(angle);
    z_sin = radius * std::sin(angle);
#endif
}

}  // namespace detail

// FNV-1a 64 of the name's bytes: a stable id for a tensor path such as
// "blocks.3.attn.qkv.weight". Stable across loom versions (tests pin values);
// changing it would change every model's initial weights. Host-only (nvcc does
// not allow string_view in device code): compute ids on the host and pass the
// RngStream to the kernel by value.
[[nodiscard]] constexpr std::uint64_t stream_id(std::string_view name) {
    std::uint64_t hash = 0xcbf29ce484222325ull;
    for (char c : name) {
        hash ^= static_cast<unsigned char>(c);
        hash *= 0x100000001b3ull;
    }
    return hash;
}

// One stream of random numbers: `seed` is the run's seed, `stream` names what
// the numbers are for (a tensor's stream_id, a dropout site). Element i comes
// from Philox4x32-10 block i / 4, word i % 4, with
//   counter = {lo(i/4), hi(i/4), lo(stream), hi(stream)},  key = {lo(seed), hi(seed)}.
// This layout is part of the stable contract, like stream_id.
// Per-element functions run on host and device; the bulk fills are host-only
// (a kernel computes element i directly).
struct RngStream {
    std::uint64_t seed = 0;
    std::uint64_t stream = 0;

    friend constexpr bool operator==(const RngStream&, const RngStream&) = default;

    // The four words for elements [4 * block, 4 * block + 4).
    [[nodiscard]] LOOM_HOST_DEVICE constexpr PhiloxCounter block(std::uint64_t index) const {
        const PhiloxCounter ctr{{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                                 static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}};
        const PhiloxKey key{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}};
        return Philox4x32{}(ctr, key);
    }

    [[nodiscard]] LOOM_HOST_DEVICE constexpr std::uint32_t bits(std::uint64_t i) const {
        return block(i / 4).w[i % 4];
    }

    // In [0, 1) with 24 random bits; never 1.0f.
    [[nodiscard]] LOOM_HOST_DEVICE constexpr float uniform(std::uint64_t i) const {
        return unit_float(bits(i));
    }

    // Standard normal. Elements pair up within their Philox block: 4k and 4k+1
    // share words 0 and 1 (cos and sin of one Box-Muller draw), 4k+2 and 4k+3
    // share words 2 and 3. Bit-identical wherever the same math library runs
    // (every host rank of a job); CUDA's logf/cosf may differ in the last bits.
    [[nodiscard]] LOOM_HOST_DEVICE float normal(std::uint64_t i) const {
        const PhiloxCounter words = block(i / 4);
        const unsigned first = static_cast<unsigned>(i % 4) & ~1u;
        float z_cos = 0.0f, z_sin = 0.0f;
        detail::box_muller(words.w[first], words.w[first + 1], z_cos, z_sin);
        return (i % 2 == 0) ? z_cos : z_sin;
    }

    // Dropout: true (keep) with probability keep_prob; keep_prob >= 1 keeps all.
    [[nodiscard]] LOOM_HOST_DEVICE constexpr bool keep(std::uint64_t i, float keep_prob) const {
        return uniform(i) < keep_prob;
    }

    // out[k] = lo + (hi - lo) * uniform(offset + k). The affine step rounds in
    // float, so hi itself can appear when lo and hi differ greatly in scale.
    void fill_uniform(std::span<float> out, std::uint64_t offset, float lo = 0.0f, float hi = 1.0f) const {
        LOOM_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "fill_uniform needs finite lo <= hi, got lo = ",
                   lo, ", hi = ", hi);
        const float width = hi - lo;
        fill_blocks(out, offset, [&](std::uint64_t b, float (&v)[4]) {
            const PhiloxCounter words = block(b);
            for (int j = 0; j < 4; ++j) v[j] = lo + width * unit_float(words.w[j]);
        });
    }

    // out[k] = mean + stddev * normal(offset + k).
    void fill_normal(std::span<float> out, std::uint64_t offset, float mean = 0.0f, float stddev = 1.0f) const {
        LOOM_CHECK(std::isfinite(mean) && std::isfinite(stddev) && stddev >= 0.0f,
                   "fill_normal needs a finite mean and a finite stddev >= 0, got mean = ", mean, ", stddev = ", stddev);
        fill_blocks(out, offset, [&](std::uint64_t b, float (&v)[4]) {
            const PhiloxCounter words = block(b);
            detail::box_muller(words.w[0], words.w[1], v[0], v[1]);
            detail::box_muller(words.w[2], words.w[3], v[2], v[3]);
            for (float& z : v) z = mean + stddev * z;
        });
    }

    // out[k] = keep(offset + k, keep_prob) ? 1 : 0: a dropout mask.
    void fill_bernoulli(std::span<std::uint8_t> out, std::uint64_t offset, float keep_prob) const {
        LOOM_CHECK(keep_prob >= 0.0f && keep_prob <= 1.0f,
                   "fill_bernoulli needs a keep probability in [0, 1], got ", keep_prob);
        fill_blocks(out, offset, [&](std::uint64_t b, std::uint8_t (&v)[4]) {
            const PhiloxCounter words = block(b);
            for (int j = 0; j < 4; ++j) v[j] = unit_float(words.w[j]) < keep_prob ? 1 : 0;
        });
    }

private:
    // Writes elements [offset, offset + out.size()) with one Philox call per
    // block of four, trimming the first and last block when unaligned.
    template <class T, class MakeBlock>
    static void fill_blocks(std::span<T> out, std::uint64_t offset, MakeBlock make_block) {
        LOOM_CHECK(out.size() <= std::numeric_limits<std::uint64_t>::max() - offset, "fill of ",
                   out.size(), " elements from offset ", offset, " ends past 2^64 - 1");
        std::size_t k = 0;
        std::uint64_t i = offset;
        while (k < out.size()) {
            T v[4];
            make_block(i / 4, v);
            const std::size_t first = static_cast<std::size_t>(i % 4);
            const std::size_t take = std::min<std::size_t>(4 - first, out.size() - k);
            for (std::size_t t = 0; t < take; ++t) out[k + t] = v[first + t];
            k += take;
            i += take;
        }
    }
};

inline std::ostream& operator<<(std::ostream& os, const PhiloxCounter& c) {
    constexpr char digits[] = "0123456789abcdef";
    os << '{';
    for (int j = 0; j < 4; ++j) {
        char text[9] = {};
        for (int d = 0; d < 8; ++d) text[d] = digits[(c.w[j] >> (28 - 4 * d)) & 0xfu];
        os << (j ? " " : "") << text;
    }
    return os << '}';
}

// Prints "RngStream{seed=42, stream=0x...}": the stream in hex, as ids are hashes.
inline std::ostream& operator<<(std::ostream& os, const RngStream& s) {
    const auto flags = os.flags();
    os << "RngStream{seed=" << std::dec << s.seed << ", stream=0x" << std::hex << s.stream << '}';
    os.flags(flags);
    return os;
}

}  // namespace loom
