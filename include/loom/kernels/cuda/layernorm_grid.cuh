// Device mirror of kernels/host/layernorm_grid.hpp: the steps of LayerNorm on
// an Optimus 2D grid between its all-reduces over the grid row. The row sums
// run one thread per row, adding the row's values in the host's order; the
// per-element steps one thread per element. nvcc may contract products into
// FMAs, so results agree with the host's to rounding (within 1e-5), not bit
// for bit. Row-major [rows, C] f32 on the device, queued on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace detail {

template <class T>
__global__ void grid_row_sums_kernel(const T* __restrict__ x, T* __restrict__ sums, std::int64_t rows, std::int64_t C) {
    for (std::int64_t r = grid_index(); r < rows; r += grid_stride()) {
        T sum = 0;
        for (std::int64_t c = 0; c < C; ++c) sum += x[r * C + c];
        sums[r] = sum;
    }
}

template <class T>
__global__ void grid_centered_squares_kernel(const T* __restrict__ x, T* __restrict__ mean, T* __restrict__ squares,
                                             std::int64_t rows, std::int64_t C, T inverse_C) {
    for (std::int64_t r = grid_index(); r < rows; r += grid_stride()) {
        const T m = mean[r] * inverse_C;
        mean[r] = m;
        T sum = 0;
        for (std::int64_t c = 0; c < C; ++c) sum += (x[r * C + c] - m) * (x[r * C + c] - m);
        squares[r] = sum;
    }
}

template <class T>
__global__ void grid_rstd_kernel(T* __restrict__ rstd, std::int64_t rows, T inverse_C, T eps) {
    for (std::int64_t r = grid_index(); r < rows; r += grid_stride()) rstd[r] = T(1) / sqrtf(rstd[r] * inverse_C + eps);
}

template <class T>
__global__ void grid_normalize_kernel(const T* __restrict__ x, const T* __restrict__ gain, const T* __restrict__ shift,
                                      const T* __restrict__ mean, const T* __restrict__ rstd, T* __restrict__ y,
                                      std::int64_t rows, std::int64_t C) {
    for (std::int64_t i = grid_index(); i < rows * C; i += grid_stride()) {
        const std::int64_t r = i / C, c = i % C;
        y[i] = (x[i] - mean[r]) * rstd[r] * gain[c] + shift[c];
    }
}

template <class T>
__global__ void grid_backward_sums_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ gain,
                                          const T* __restrict__ mean, const T* __restrict__ rstd, T* __restrict__ sums,
                                          std::int64_t rows, std::int64_t C) {
    for (std::int64_t r = grid_index(); r < rows; r += grid_stride()) {
        T a = 0, b = 0;
        for (std::int64_t c = 0; c < C; ++c) {
            const T gc = dy[r * C + c] * gain[c];
            a += gc;
            b += gc * ((x[r * C + c] - mean[r]) * rstd[r]);
        }
        sums[r] = a;
        sums[rows + r] = b;
    }
}

template <class T>
__global__ void grid_backward_apply_kernel(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ gain,
                                           const T* __restrict__ mean, const T* __restrict__ rstd,
                                           const T* __restrict__ sums, T* __restrict__ dx, std::int64_t rows,
                                           std::int64_t C, T inverse_C) {
    for (std::int64_t i = grid_index(); i < rows * C; i += grid_stride()) {
        const std::int64_t r = i / C, c = i % C;
        const T g_mean = sums[r] * inverse_C, gx_mean = sums[rows + r] * inverse_C;
        const T xhat = (x[i] - mean[r]) * rstd[r];
        dx[i] = rstd[r] * (dy[i] * gain[c] - g_mean - xhat * gx_mean);
    }
}

}  // namespace detail

inline void layernorm_grid_row_sums(const float* x, float* sums, std::int64_t rows, std::int64_t C,
                                    cudaStream_t stream = nullptr) {
    if (rows <= 0) return;
    detail::grid_row_sums_kernel<float><<<blocks_for(rows), threads_per_block, 0, stream>>>(x, sums, rows, C);
    LOOM_CUDA_CHECK_LAUNCH();
}

inline void layernorm_grid_centered_squares(const float* x, float* mean, float* squares, std::int64_t rows,
                                            std::int64_t C, float inverse_C, cudaStream_t stream = nullptr) {
    if (rows <= 0) return;
    detail::grid_centered_squares_kernel<float>
        <<<blocks_for(rows), threads_per_block, 0, stream>>>(x, mean, squares, rows, C, inverse_C);
    LOOM_CUDA_CHECK_LAUNCH();
}

inline void layernorm_grid_normalize(const float* x, const float* gain, const float* shift, const float* mean,
                                     float* rstd, float* y, std::int64_t rows, std::int64_t C, float inverse_C,
                                     float eps, cudaStream_t stream = nullptr) {
    if (rows <= 0) return;
    detail::grid_rstd_kernel<float><<<blocks_for(rows), threads_per_block, 0, stream>>>(rstd, rows, inverse_C, eps);
    LOOM_CUDA_CHECK_LAUNCH();
    if (C <= 0) return;
    detail::grid_normalize_kernel<float>
        <<<blocks_for(rows * C), threads_per_block, 0, stream>>>(x, gain, shift, mean, rstd, y, rows, C);
    LOOM_CUDA_CHECK_LAUNCH();
}

inline void layernorm_grid_backward_sums(const float* dy, const float* x, const float* gain, const float* mean,
                                         const float* rstd, float* sums, std::int64_t rows, std::int64_t C,
                                         cudaStream_t stream = nullptr) {
    if (rows <= 0) return;
    detail::grid_backward_sums_kernel<float>
        <<<blocks_for(rows), threads_per_block, 0, stream>>>(dy, x, gain, mean, rstd, sums, rows, C);
    LOOM_CUDA_CHECK_LAUNCH();
}

inline void layernorm_grid_backward_apply(const float* dy, const float* x, const float* gain, const float* mean,
                                          const float* rstd, const float* sums, float* dx, std::int64_t rows,
                                          std::int64_t C, float inverse_C, cudaStream_t stream = nullptr) {
    if (rows <= 0 || C <= 0) return;
    detail::grid_backward_apply_kernel<float>
        <<<blocks_for(rows * C), threads_per_block, 0, stream>>>(dy, x, gain, mean, rstd, sums, dx, rows, C, inverse_C);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
