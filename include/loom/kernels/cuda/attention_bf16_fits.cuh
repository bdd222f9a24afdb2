// Whether a GPU can run the bf16 tensor-core attention kernels
// (kernels/cuda/attention_mma.cuh) at a head size: they need bf16 tensor
// cores (compute capability 8.0) and, for heads over 64 features, more shared
// memory per block than some of those GPUs give one (8.6, 8.9 and 12.x:
// 99 KiB). A GPU without either is refused on the host, with a message that
// names what to use instead, rather than trapping in the kernel. Its own
// header because the reference kernels of dev/kernel_lab/attention_wmma.cuh
// ask the same question of the same GPUs, and must not be what the shipped
// kernels include for it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loom/core/check_cuda.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels::cuda::attention_detail {

// Throws, naming `who` (the operation) and the GPU, unless GPU `device` has
// bf16 tensor cores and gives a block `shared_bytes` of shared memory (D is
// only named). The launchers call it once per device (OncePerDevice).
inline void check_bf16_device_fits(const char* who, std::int64_t D, std::size_t shared_bytes, int device) {
    int major = 0, minor = 0, shared_limit = 0;
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    LOOM_CHECK(major >= 8, who, ": bf16 attention needs bf16 tensor cores (compute capability 8.0 or newer); GPU ",
               device, " has ", major, ".", minor, "; use f32 products (MatmulPrecision::f32)");
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    LOOM_CHECK(shared_bytes <= static_cast<std::size_t>(shared_limit), who, ": bf16 attention at head size D = ", D,
               " needs ", shared_bytes, " bytes of shared memory per block; GPU ", device, " gives at most ",
               shared_limit, "; use heads of 64 or fewer features, or f32 products (MatmulPrecision::f32)");
}

}  // namespace loom::kernels::cuda::attention_detail
