// What the CUDA tests in tests/cuda share: DeviceArray (one cudaMalloc
// allocation, filled from and copied back to host vectors), Stream (one CUDA
// stream, blocking or not), and the pieces the kernel tests compare device
// results with host ones by: Mismatches and CHECK_NO_MISMATCHES, bit-for-bit
// comparisons of words and floats (NaN meeting NaN with any payload where
// asked), comparisons within a tolerance, and seeded uniform and normal
// random values. Test code only, all inline;
// include it as "device_support.hpp" from a file in tests/cuda.
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "loom/core/check_cuda.hpp"

namespace loom_test {

// Owns one cudaMalloc allocation of n elements, handed out `offset` elements
// in (so a matrix can start at an address that is not 256-byte aligned).
template <class T>
class DeviceArray {
public:
    explicit DeviceArray(std::size_t n, std::size_t offset = 0) : size_(n), offset_(offset) {
        LOOM_CUDA_CHECK(cudaMalloc(&base_, (n + offset) * sizeof(T)));
    }
    explicit DeviceArray(const std::vector<T>& host_values, std::size_t offset = 0)
        : DeviceArray(host_values.size(), offset) {
        LOOM_CUDA_CHECK(cudaMemcpy(get(), host_values.data(), size_ * sizeof(T), cudaMemcpyHostToDevice));
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    ~DeviceArray() { cudaFree(base_); }

    T* get() const { return base_ + offset_; }
    // Every byte set to `byte`: garbage the kernel under test must overwrite.
    void fill_bytes(int byte) { LOOM_CUDA_CHECK(cudaMemset(get(), byte, size_ * sizeof(T))); }
    // Synchronous: waits for the whole device first. cudaMemcpy is ordered
    // only on the legacy default stream, which non-blocking streams do not
    // synchronise with, so it alone would not wait for their kernels.
    std::vector<T> to_host() const {
        LOOM_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<T> host_values(size_);
        LOOM_CUDA_CHECK(cudaMemcpy(host_values.data(), get(), size_ * sizeof(T), cudaMemcpyDeviceToHost));
        return host_values;
    }

private:
    T* base_ = nullptr;
    std::size_t size_;
    std::size_t offset_;
};

// Owns a CUDA stream, so the launchers' stream argument is exercised too.
// cudaStreamDefault (the default) makes a blocking stream, ordered with the
// legacy default stream; cudaStreamNonBlocking one that does not synchronise
// with it (launch on it only after uploads_done()).
class Stream {
public:
    explicit Stream(unsigned int flags = cudaStreamDefault) {
        LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, flags));
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    ~Stream() { cudaStreamDestroy(stream_); }

    cudaStream_t get() const { return stream_; }
    void synchronize() const { LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

private:
    cudaStream_t stream_ = nullptr;
};

// cudaMemcpy from pageable memory may return before its data reaches the
// device, ordered only on the legacy stream, which a non-blocking stream does
// not wait for: wait for the uploads before launching on one.
inline void uploads_done() { LOOM_CUDA_CHECK(cudaDeviceSynchronize()); }

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
