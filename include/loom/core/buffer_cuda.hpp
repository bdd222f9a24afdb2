// Allocator<Cuda>: device memory for Buffer<Cuda> from CUDA's stream-ordered
// pool (cudaMallocAsync), which caches freed blocks so steady-state training
// does not call the driver. Never managed memory. Link loom::cuda.
#pragma once

#include <cuda_runtime_api.h>

#include "loom/core/buffer.hpp"
#include "loom/core/check_cuda.hpp"

namespace loom {

namespace detail {

// Makes `index` the current device for a scope and restores the previous one.
class CudaDeviceScope {
public:
    explicit CudaDeviceScope(int index) {
        LOOM_CUDA_CHECK(cudaGetDevice(&previous_));
        if (previous_ != index) LOOM_CUDA_CHECK(cudaSetDevice(index));
        switched_ = previous_ != index;
    }
    CudaDeviceScope(const CudaDeviceScope&) = delete;
    CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;
    ~CudaDeviceScope() {
        if (switched_) cudaSetDevice(previous_);
    }

private:
    int previous_ = 0;
    bool switched_ = false;
};

}  // namespace detail

template <>
struct Allocator<Cuda> {
    // Allocation and zero-fill are ordered on the legacy default stream, which
    // synchronises with every blocking stream, so any later use sees zeros.
    static void* allocate(std::size_t bytes, Device where) {
        if (bytes == 0) return nullptr;
        detail::CudaDeviceScope scope(where.index);
        void* p = nullptr;
        LOOM_CUDA_CHECK(cudaMallocAsync(&p, bytes, cudaStreamLegacy));
        if (const cudaError_t status = cudaMemsetAsync(p, 0, bytes, cudaStreamLegacy); status != cudaSuccess) {
            cudaFreeAsync(p, cudaStreamLegacy);  // nothing may leak on the error path
            detail::cuda_failed(status, "cudaMemsetAsync(p, 0, bytes, cudaStreamLegacy)",
                                ::loom::SourceLocation::current());
        }
        return p;
    }

    static void deallocate(void* p, std::size_t /*bytes*/, Device where) noexcept {
        if (p == nullptr) return;
        int previous = 0;
        if (cudaGetDevice(&previous) != cudaSuccess) return;
        if (previous != where.index) cudaSetDevice(where.index);
        cudaFreeAsync(p, cudaStreamLegacy);  // a destructor cannot throw; errors surface on the next call
        if (previous != where.index) cudaSetDevice(previous);
    }
};

}  // namespace loom
