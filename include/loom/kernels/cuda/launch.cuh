// How loom's CUDA kernels are launched: grid-stride loops over 64-bit
// indices (any count fits in a bounded grid, arrays past 2^31 elements stay
// correct), on the caller's stream, with the launch checked at once so a bad
// configuration names the kernel instead of surfacing at the next sync.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "loom/core/check_cuda.hpp"

namespace loom::kernels::cuda {

inline constexpr int threads_per_block = 256;

// Enough blocks to cover n elements with one per thread, capped: the loops
// stride over the rest, and a few thousand blocks fill any current GPU.
[[nodiscard]] inline unsigned int blocks_for(std::int64_t n) noexcept {
    const std::int64_t blocks = (n + threads_per_block - 1) / threads_per_block;
    return static_cast<unsigned int>(std::clamp<std::int64_t>(blocks, 1, 4096));
}

// The first index of this thread and the stride of a grid-stride loop.
__device__ inline std::int64_t grid_index() {
    return blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
}
__device__ inline std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

// Throws loom::Error if the launch just made failed (bad configuration,
// missing kernel image for this GPU).
#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())

}  // namespace loom::kernels::cuda
