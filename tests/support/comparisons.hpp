// How tests compare a kernel's results with a reference's (the CUDA
// kernels' with the host's, on a GPU or on simulated threads): Mismatches and
// CHECK_NO_MISMATCHES, bit-for-bit comparisons of words and floats (NaN
// meeting NaN with any payload where asked), comparisons within a tolerance,
// and seeded uniform and normal random values. Test code only, all inline.
#pragma once

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace loom_test {

inline std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }

// "0x3fc00000": all eight hex digits.
inline std::string hex(std::uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08x", value);
    return text;
}

// Equal bits, except that NaN meets NaN with any payload (x86 keeps a NaN
// operand's payload through arithmetic, the GPU returns its canonical NaN).
inline bool same_bits_or_both_nan(float a, float b) {
    return std::isnan(a) || std::isnan(b) ? std::isnan(a) && std::isnan(b) : bits_of(a) == bits_of(b);
}

// Counts disagreements and keeps the first few, so a broken kernel reports
// once instead of failing a million assertions.
struct Mismatches {
    std::size_t count = 0;
    std::string examples;
    void add(const std::string& what) {
        if (count++ < 5) {
            examples += "; ";
            examples += what;
        }
    }
};

// One CHECK for a whole comparison: `what`, the count and the first few
// mismatches when it fails.
#define CHECK_NO_MISMATCHES(what, mismatches)                                   \
    do {                                                                        \
        const ::loom_test::Mismatches found_ = (mismatches);                    \
        INFO(what << ": " << found_.count << " mismatches" << found_.examples); \
        CHECK(found_.count == 0);                                               \
    } while (false)

// Word for word.
inline Mismatches compare_words(const std::vector<std::uint32_t>& device, const std::vector<std::uint32_t>& reference) {
    Mismatches bad;
    if (device.size() != reference.size()) {
        bad.add("sizes differ");
        return bad;
    }
    for (std::size_t i = 0; i < reference.size(); ++i)
        if (device[i] != reference[i])
            bad.add("word " + std::to_string(i) + ": device " + hex(device[i]) + ", host " + hex(reference[i]));
    return bad;
}

// Equal bits, or (nan_as_nan) NaN meeting NaN with any payload.
inline Mismatches compare_floats(const std::vector<float>& device, const std::vector<float>& reference,
                                 bool nan_as_nan) {
    Mismatches bad;
    if (device.size() != reference.size()) {
        bad.add("sizes differ");
        return bad;
    }
    for (std::size_t i = 0; i < reference.size(); ++i) {
        const float d = device[i], h = reference[i];
        const bool agree = nan_as_nan ? same_bits_or_both_nan(d, h) : bits_of(d) == bits_of(h);
        if (!agree)
            bad.add("element " + std::to_string(i) + ": device " + hex(bits_of(d)) + ", host " + hex(bits_of(h)));
    }
    return bad;
}

// |device - host| <= tolerance(i) for every i (NaN never passes).
inline Mismatches compare_within(const std::vector<float>& device, const std::vector<float>& reference,
                                 const std::function<double(std::size_t)>& tolerance) {
    Mismatches bad;
    if (device.size() != reference.size()) {
        bad.add("sizes differ");
        return bad;
    }
    for (std::size_t i = 0; i < reference.size(); ++i) {
        const double error = std::fabs(static_cast<double>(device[i]) - static_cast<double>(reference[i]));
        if (!(error <= tolerance(i)))
            bad.add("element " + std::to_string(i) + ": device " + std::to_string(device[i]) + ", host " +
                    std::to_string(reference[i]) + ", allowed " + std::to_string(tolerance(i)));
    }
    return bad;
}

// Relative `rtol`, against max(|host|, 1): for values that are O(1).
inline Mismatches compare_relative(const std::vector<float>& device, const std::vector<float>& reference,
                                   double rtol) {
    return compare_within(device, reference, [&](std::size_t i) {
        return rtol * std::max(1.0, std::fabs(static_cast<double>(reference[i])));
    });
}

// n values uniform in [lo, hi), drawn from rng.
inline std::vector<float> uniform(std::size_t n, float lo, float hi, std::mt19937& rng) {
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> values(n);
    for (float& v : values) v = dist(rng);
    return values;
}

// The same from a generator of its own, seeded with `seed`.
inline std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint32_t seed) {
    std::mt19937 rng(seed);
    return uniform(n, lo, hi, rng);
}

// n values from N(mean, stddev), drawn from rng.
inline std::vector<float> normal_values(std::size_t n, std::mt19937& rng, float mean = 0.0f, float stddev = 1.0f) {
    std::normal_distribution<float> normal(mean, stddev);
    std::vector<float> values(n);
    for (float& v : values) v = normal(rng);
    return values;
}

}  // namespace loom_test
