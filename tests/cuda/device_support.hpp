// What the CUDA tests in tests/cuda share: DeviceArray (one cudaMalloc
// allocation, filled from and copied back to host vectors), Stream (one CUDA
// stream, blocking or not), and, from support/comparisons.hpp, the pieces the
// kernel tests compare device results with host ones by. Test code only, all
// inline; include it as "device_support.hpp" from a file in tests/cuda.
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
#include "support/comparisons.hpp"

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

}  // namespace loom_test
