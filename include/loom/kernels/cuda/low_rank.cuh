// Device mirror of kernels/host/low_rank.hpp: PowerSGD's Gram-Schmidt
// orthonormalisation of the columns of a tall matrix P [rows, cols]
// (row-major, device memory), in place, with the host's algorithm step for
// step: modified Gram-Schmidt run twice per column, dot products in double,
// a dependent column replaced by the first unit basis vector that keeps at
// least half its length. One block of threads works through the columns in
// order (each column depends on the finished ones), every dot product a
// block-wide sum in double. The sums run in a different order from the
// host's, so results agree to rounding, not bit for bit. P is small (rows x
// the PowerSGD rank), so one block is enough; the GEMMs around it dominate.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/host/low_rank.hpp"

namespace loom::kernels::cuda {

namespace detail {

inline constexpr int orthonormalize_threads = 256;

// The sum of every thread's `value`, returned to all threads of the block.
template <class T>
__device__ T block_sum(T value, T* shared) {
    shared[threadIdx.x] = value;
    __syncthreads();
    for (int width = blockDim.x / 2; width > 0; width /= 2) {
        if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
        __syncthreads();
    }
    const T total = shared[0];
    __syncthreads();  // shared may be reused at once
    return total;
}

template <class T>
__device__ double squared_norm(const T* p, std::int64_t rows, std::int64_t cols, std::int64_t c, double* shared) {
    double part = 0;
    for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x)
        part += static_cast<double>(p[r * cols + c]) * static_cast<double>(p[r * cols + c]);
    return block_sum(part, shared);
}

// Column c minus its projections on columns [0, c), twice; the squared norm left.
template <class T>
__device__ double project_out_earlier(T* p, std::int64_t rows, std::int64_t cols, std::int64_t c, double* shared) {
    for (int pass = 0; pass < 2; ++pass)
        for (std::int64_t prior = 0; prior < c; ++prior) {
            double part = 0;
            for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x)
                part += static_cast<double>(p[r * cols + c]) * static_cast<double>(p[r * cols + prior]);
            const double dot = block_sum(part, shared);
            for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x)
                p[r * cols + c] = static_cast<T>(p[r * cols + c] - dot * p[r * cols + prior]);
            __syncthreads();
        }
    return squared_norm(p, rows, cols, c, shared);
}

template <class T>
__global__ void orthonormalize_columns_kernel(T* p, std::int64_t rows, std::int64_t cols, double ratio) {
    __shared__ double shared[orthonormalize_threads];
    for (std::int64_t c = 0; c < cols; ++c) {
        const double before = squared_norm(p, rows, cols, c, shared);
        double norm = project_out_earlier(p, rows, cols, c, shared);
        if (!(norm > ratio * ratio * before) || norm == 0) {
            norm = 0;
            for (std::int64_t k = 0; k < rows && norm < 0.25; ++k) {  // a unit vector keeps >= 1/2 of its length
                for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x)
                    p[r * cols + c] = r == (c + k) % rows ? T(1) : T(0);
                __syncthreads();
                norm = project_out_earlier(p, rows, cols, c, shared);
            }
            if (norm < 0.25) norm = 0;  // more columns than rows: nothing orthogonal is left
        }
        const double scale = norm > 0 ? 1.0 / sqrt(norm) : 0.0;
        for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x)
            p[r * cols + c] = static_cast<T>(p[r * cols + c] * scale);
        __syncthreads();
    }
}

}  // namespace detail

// P [rows, cols] on the device: its columns become orthonormal (see the top).
inline void orthonormalize_columns(float* p, std::int64_t rows, std::int64_t cols, cudaStream_t stream = nullptr) {
    LOOM_CHECK(rows >= 0 && cols >= 0, "orthonormalize_columns: a ", rows, " x ", cols, " matrix");
    if (rows == 0 || cols == 0) return;
    detail::orthonormalize_columns_kernel<float><<<1, detail::orthonormalize_threads, 0, stream>>>(
        p, rows, cols, host::dependent_column_ratio);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
