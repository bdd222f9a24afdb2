// How loom's CUDA kernels are launched: grid-stride loops over 64-bit
// indices (any count fits in a bounded grid, arrays past 2^31 elements stay
// correct), on the caller's stream, with the launch checked at once so a bad
// configuration names the kernel instead of surfacing at the next sync.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
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

// Set-up a launcher needs once per GPU, not once a call: checking that the
// device can run a kernel, raising a kernel's shared-memory limit
// (cudaFuncSetAttribute holds per function and device). The attention
// launchers ran both on every call, five or six runtime calls for each of
// the 24 launcher calls (36 kernels) of a GPT-2 step. Declare one `static`
// per launcher instantiation; set_up(device) runs on the current device
// until it returns normally (a throw leaves the device unmarked, so the next
// call throws the same message). Two rank threads may both run set_up for a
// device the first time: it must be idempotent, as these are. Devices past
// 63 are set up on every call.
class OncePerDevice {
public:
    template <class SetUp>
    void operator()(SetUp&& set_up) {
        int device = 0;
        LOOM_CUDA_CHECK(cudaGetDevice(&device));
        const std::uint64_t bit = device < 64 ? std::uint64_t{1} << device : 0;
        if ((done_.load(std::memory_order_acquire) & bit) != 0) return;
        set_up(device);
        done_.fetch_or(bit, std::memory_order_release);
    }

private:
    std::atomic<std::uint64_t> done_{0};
};

// Throws loom::Error if the launch just made failed (bad configuration,
// missing kernel image for this GPU).
#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())

}  // namespace loom::kernels::cuda
