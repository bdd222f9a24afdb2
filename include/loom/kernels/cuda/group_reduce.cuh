// Groups of threads working on one row, and the reduction over a group that
// every row- or block-wise CUDA kernel of loom uses (layernorm's sums,
// cross-entropy's max and sum, int8's absmax). A row of up to warp_row_limit
// values gets a warp, a longer one the whole thread block. The reduction is
// a warp butterfly, then, when the group is the whole thread block, the
// warps' results combined in warp order through shared memory. The order
// is fixed, so results depend only on the group's size, never on timing, and
// every thread of the group gets the same bits (the butterfly combines each
// pair in both orders, and these operations commute exactly).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

// Rows of up to this many values get a warp each; longer rows a thread block.
inline constexpr std::int64_t warp_row_limit = 1024;

// The rows a group of RowThreads threads visits in a grid-stride loop:
// uniform over the group, so its shuffles and barriers always see all of its
// threads.
template <int RowThreads>
struct RowGroup {
    static_assert(RowThreads == 32 || RowThreads == threads_per_block, "a row's group is one warp or the whole block");
    static constexpr int rows_per_block = threads_per_block / RowThreads;

    __device__ static int lane() { return static_cast<int>(threadIdx.x) % RowThreads; }
    __device__ static std::int64_t first_row() {
        return static_cast<std::int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / RowThreads;
    }
    __device__ static std::int64_t row_stride() { return static_cast<std::int64_t>(gridDim.x) * rows_per_block; }
};

struct SumOp {
    template <class T>
    __device__ T operator()(T a, T b) const {
        return a + b;
    }
};
// fmaxf: NaN loses. Callers that must keep NaN map it to +Inf first.
struct MaxOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinOp {
    template <class T>
    __device__ T operator()(T a, T b) const {
        return a < b ? a : b;
    }
};

// op over the GroupThreads threads of a group: a warp (32), or the whole
// thread block with `shared` holding one T per warp.
template <int GroupThreads, class T, class Op>
__device__ inline T group_reduce(T value, Op op, T* shared) {
    static_assert(GroupThreads % 32 == 0, "a group is whole warps");
    for (int offset = 16; offset > 0; offset /= 2) value = op(value, __shfl_xor_sync(0xffff'ffffu, value, offset));
    if constexpr (GroupThreads > 32) {
        __syncthreads();  // the previous reduction's readers of `shared` are done
        if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
        __syncthreads();
        value = shared[0];
        for (int w = 1; w < GroupThreads / 32; ++w) value = op(value, shared[w]);
    }
    return value;
}

}  // namespace loom::kernels::cuda
