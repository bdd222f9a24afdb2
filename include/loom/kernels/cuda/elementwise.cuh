// Device mirrors of the elementwise kernels in kernels/host/elementwise.hpp
// that layers and gradient compression call: add, accumulate, add_bias,
// bias_grad, repeat_rows, fill, subtract, mix_momentum and unmix_momentum (f32,
// row-major, raw device pointers, same arguments in the same order, plus the
// stream).
// Each result is bit for bit the host kernel's: add, accumulate and add_bias
// are one rounding per element, and bias_grad adds the rows of each column in
// the host's order (kernels/column_sum_order.hpp), so no reassociation can creep in;
// the momentum mixes spell out their roundings (__fmul_rn, __fadd_rn), so no
// FMA contraction can creep in either.
// The host's reduction helpers (sum_over, max_over, fast_exp) have no mirror
// here: device kernels that reduce bring their own block-level reductions.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "loom/kernels/column_sum_order.hpp"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace detail {

// Kernels are templates on the element type (only float is instantiated), as
// in comm/device_reduce.cuh: a template may be defined in every translation
// unit that includes this header, a plain __global__ function may not.

template <class T>
__global__ void add_kernel(const T* a, const T* b, T* out, std::int64_t n) {
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) out[i] = a[i] + b[i];
}

template <class T>
__global__ void accumulate_kernel(T* __restrict__ into, const T* __restrict__ x, std::int64_t n) {
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) into[i] += x[i];
}

// One thread per element of the [rows, n] matrix; the column index costs a
// 64-bit division, which hides behind the memory traffic (one add per 12
// bytes moved) that bounds this kernel anyway.
template <class T>
__global__ void add_bias_kernel(T* __restrict__ y, const T* __restrict__ bias, std::int64_t rows, std::int64_t n) {
    const std::int64_t count = rows * n;
    for (std::int64_t i = grid_index(); i < count; i += grid_stride()) y[i] += bias[i % n];
}

// The host's order (kernels/column_sum_order.hpp): a block of 32 columns x
// 32 chunks. Warp c adds the rows of chunk c in order, its 32 lanes on 32
// neighbouring columns of a row, so the loads coalesce; then the chunk sums
// meet in shared memory and lane j of warp 0 adds them to dbias[j] in chunk
// order. An empty chunk adds nothing (adding 0 would turn -0 into +0).
template <class T>
__global__ void __launch_bounds__(32 * column_sum_chunks)
    bias_grad_kernel(const T* __restrict__ dy, T* __restrict__ dbias, std::int64_t rows, std::int64_t n,
                     std::int64_t chunk_rows) {
    static_assert(column_sum_chunks == 32, "one warp per chunk, one lane per column");
    __shared__ T chunk_sums[column_sum_chunks][33];  // 33: the column reads of warp 0 hit distinct banks
    const int column = static_cast<int>(threadIdx.x) % 32;
    const int chunk = static_cast<int>(threadIdx.x) / 32;
    const std::int64_t r0 = chunk * chunk_rows;
    const std::int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
    // Uniform over the block: every thread reaches every barrier.
    for (std::int64_t tile = blockIdx.x; tile * 32 < n; tile += gridDim.x) {
        const std::int64_t j = tile * 32 + column;
        T sum = 0;
        if (j < n && r0 < r1) {
            sum = dy[r0 * n + j];
#pragma unroll 8
            for (std::int64_t r = r0 + 1; r < r1; ++r) sum += dy[r * n + j];
        }
        __syncthreads();  // the previous tile's readers are done
        chunk_sums[chunk][column] = sum;
        __syncthreads();
        if (chunk == 0 && j < n) {
            T total = dbias[j];
            for (int c = 0; c < column_sum_chunks && c * chunk_rows < rows; ++c) total += chunk_sums[c][column];
            dbias[j] = total;
        }
    }
}

// y[r, j] = row[j]: copies only, so the host's bits.
template <class T>
__global__ void repeat_rows_kernel(const T* __restrict__ row, T* __restrict__ y, std::int64_t rows, std::int64_t n) {
    const std::int64_t count = rows * n;
    for (std::int64_t i = grid_index(); i < count; i += grid_stride()) y[i] = row[i % n];
}

template <class T>
__global__ void fill_kernel(T* __restrict__ y, T value, std::int64_t n) {
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) y[i] = value;
}

template <class T>
__global__ void subtract_kernel(T* __restrict__ into, const T* __restrict__ x, std::int64_t n) {
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) into[i] -= x[i];
}

template <class T>
__global__ void mix_momentum_kernel(T* __restrict__ grad, const T* __restrict__ m, std::int64_t n, T beta1) {
    const T rest = 1.0f - beta1;
    for (std::int64_t i = grid_index(); i < n; i += grid_stride())
        grad[i] = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(rest, grad[i]));
}

template <class T>
__global__ void unmix_momentum_kernel(T* __restrict__ grad, const T* __restrict__ m, std::int64_t n, T beta1) {
    const T rest = 1.0f - beta1;
    for (std::int64_t i = grid_index(); i < n; i += grid_stride())
        grad[i] = __fdiv_rn(__fsub_rn(grad[i], __fmul_rn(beta1, m[i])), rest);
}

}  // namespace detail

// out = a + b for n elements. out may be a or b (a residual add in place).
inline void add(const float* a, const float* b, float* out, std::int64_t n, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    detail::add_kernel<float><<<blocks_for(n), threads_per_block, 0, stream>>>(a, b, out, n);
    LOOM_CUDA_CHECK_LAUNCH();
}

// into += x (gradient accumulation); into and x do not overlap.
inline void accumulate(float* into, const float* x, std::int64_t n, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    detail::accumulate_kernel<float><<<blocks_for(n), threads_per_block, 0, stream>>>(into, x, n);
    LOOM_CUDA_CHECK_LAUNCH();
}

// y[r, j] += bias[j] for a [rows, n] matrix y; y and bias do not overlap.
inline void add_bias(float* y, const float* bias, std::int64_t rows, std::int64_t n,
                     cudaStream_t stream = nullptr) {
    if (rows <= 0 || n <= 0) return;
    detail::add_bias_kernel<float><<<blocks_for(rows * n), threads_per_block, 0, stream>>>(y, bias, rows, n);
    LOOM_CUDA_CHECK_LAUNCH();
}

// dbias[j] += sum over r of dy[r, j] (accumulated, as on the host), in the
// host's order (kernels/column_sum_order.hpp); dy and dbias do not overlap.
inline void bias_grad(const float* dy, float* dbias, std::int64_t rows, std::int64_t n,
                      cudaStream_t stream = nullptr) {
    if (rows <= 0 || n <= 0) return;
    const auto tiles = static_cast<unsigned int>(std::min<std::int64_t>((n + 31) / 32, 4096));
    detail::bias_grad_kernel<float><<<tiles, 32 * column_sum_chunks, 0, stream>>>(dy, dbias, rows, n,
                                                                                  column_sum_chunk_rows(rows));
    LOOM_CUDA_CHECK_LAUNCH();
}

// y[r, :] = row for each of `rows` rows of n (a Linear's bias before the
// GEMM accumulates onto it); row and y do not overlap.
inline void repeat_rows(const float* row, float* y, std::int64_t rows, std::int64_t n, cudaStream_t stream = nullptr) {
    if (rows <= 0 || n <= 0) return;
    detail::repeat_rows_kernel<float><<<blocks_for(rows * n), threads_per_block, 0, stream>>>(row, y, rows, n);
    LOOM_CUDA_CHECK_LAUNCH();
}

// y[0, n) = value (the runtime's fill_floats).
inline void fill(float* y, float value, std::int64_t n, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    detail::fill_kernel<float><<<blocks_for(n), threads_per_block, 0, stream>>>(y, value, n);
    LOOM_CUDA_CHECK_LAUNCH();
}

// into -= x; into and x do not overlap.
inline void subtract(float* into, const float* x, std::int64_t n, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    detail::subtract_kernel<float><<<blocks_for(n), threads_per_block, 0, stream>>>(into, x, n);
    LOOM_CUDA_CHECK_LAUNCH();
}

// grad = beta1 m + (1 - beta1) grad (1-bit Adam's momentum-to-be).
inline void mix_momentum(float* grad, const float* m, std::int64_t n, float beta1, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    detail::mix_momentum_kernel<float><<<blocks_for(n), threads_per_block, 0, stream>>>(grad, m, n, beta1);
    LOOM_CUDA_CHECK_LAUNCH();
}

// grad = (grad - beta1 m) / (1 - beta1): the averaged momentum back to a gradient.
inline void unmix_momentum(float* grad, const float* m, std::int64_t n, float beta1, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    detail::unmix_momentum_kernel<float><<<blocks_for(n), threads_per_block, 0, stream>>>(grad, m, n, beta1);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
