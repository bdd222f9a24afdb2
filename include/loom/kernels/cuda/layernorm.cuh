// Device mirror of kernels/host/layernorm.hpp: LayerNorm over the last
// dimension, as PyTorch's nn.LayerNorm, with the same functions, arguments
// (device pointers) and argument checks, plus the stream to launch on.
//   forward:         y = (x - mean) * rstd * gain + shift, rstd = 1 / sqrt(var + eps),
//                    var biased and computed as a second pass over the row,
//                    sum((x - mean)^2) / C, never E[x^2] - mean^2;
//   backward_input:  dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), g = dy * gain;
//   backward_weight: dgain[j] += sum_r dy * xhat, dshift[j] += sum_r dy.
//
// Launch shapes. The row kernels give each row a group of threads: a warp
// when C <= 1024 (eight rows per thread block, reduced by warp shuffles
// alone), else a whole 256-thread block (shuffles, then one float per warp in
// shared memory). Each thread sums a strided slice of the row; the slices are
// combined in a fixed tree, so the result depends only on C, never on the
// grid, the GPU or the run. The weight gradient is a column sum over rows: a
// thread block of 1024 owns 32 adjacent columns (a warp reads 128 contiguous
// bytes of a row), its 32 row lanes each sum every 32nd row, and a
// shared-memory tree adds the lanes; no atomics, so it is deterministic, and
// it needs no scratch memory.
//
// Against the host: the same formulas in f32, summed in a different order
// (strided slices and a tree here, 16 lanes there), and nvcc fuses some
// multiply-adds. Expect agreement to a relative ~1e-5 of the values' scale,
// not bit equality.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/cuda/group_reduce.cuh"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace detail {

// The host's checks, word for word (tests compare the messages).
inline void check_layernorm_sizes(std::int64_t rows, std::int64_t C) {
    LOOM_CHECK(rows >= 0, "layernorm: rows = ", rows, " is negative; pass rows >= 0");
    LOOM_CHECK(C >= 1, "layernorm: C = ", C, " normalises nothing; pass C >= 1");
}

template <int RowThreads>
__global__ void layernorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ gain,
                                         const float* __restrict__ shift, float* __restrict__ y,
                                         float* __restrict__ mean, float* __restrict__ rstd, std::int64_t rows,
                                         std::int64_t C, float eps) {
    using Group = RowGroup<RowThreads>;
    __shared__ float shared[threads_per_block / 32];
    const int lane = Group::lane();
    const float inv_C = 1.0f / static_cast<float>(C);
    for (std::int64_t r = Group::first_row(); r < rows; r += Group::row_stride()) {
        const float* xr = x + r * C;
        float* yr = y + r * C;
        float sum = 0.0f;
        for (std::int64_t j = lane; j < C; j += RowThreads) sum += xr[j];
        const float m = group_reduce<RowThreads>(sum, SumOp{}, shared) * inv_C;
        float squares = 0.0f;
        for (std::int64_t j = lane; j < C; j += RowThreads) {
            const float d = xr[j] - m;
            squares += d * d;
        }
        const float var = group_reduce<RowThreads>(squares, SumOp{}, shared) * inv_C;
        const float rs = 1.0f / sqrtf(var + eps);
        for (std::int64_t j = lane; j < C; j += RowThreads) yr[j] = (xr[j] - m) * rs * gain[j] + shift[j];
        if (lane == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
    }
}

template <int RowThreads>
__global__ void layernorm_backward_input_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                                const float* __restrict__ gain, const float* __restrict__ mean,
                                                const float* __restrict__ rstd, float* __restrict__ dx,
                                                std::int64_t rows, std::int64_t C) {
    using Group = RowGroup<RowThreads>;
    __shared__ float shared[threads_per_block / 32];
    const int lane = Group::lane();
    const float inv_C = 1.0f / static_cast<float>(C);
    for (std::int64_t r = Group::first_row(); r < rows; r += Group::row_stride()) {
        const float* dyr = dy + r * C;
        const float* xr = x + r * C;
        float* dxr = dx + r * C;
        const float m = mean[r];
        const float rs = rstd[r];
        float g_sum = 0.0f, gx_sum = 0.0f;
        for (std::int64_t j = lane; j < C; j += RowThreads) {
            const float g = dyr[j] * gain[j];
            g_sum += g;
            gx_sum += g * ((xr[j] - m) * rs);
        }
        const float g_mean = group_reduce<RowThreads>(g_sum, SumOp{}, shared) * inv_C;
        const float gx_mean = group_reduce<RowThreads>(gx_sum, SumOp{}, shared) * inv_C;
        for (std::int64_t j = lane; j < C; j += RowThreads) {
            const float xhat = (xr[j] - m) * rs;
            dxr[j] = rs * (dyr[j] * gain[j] - g_mean - xhat * gx_mean);
        }
    }
}

// 32 columns, so that a warp reads 128 contiguous bytes of a row, x 32 row
// lanes. (8 columns x 32 lanes of 256 threads read 32-byte pieces and ran at
// 0.44 TB/s on an H200: 113 us for a GPT-2 LayerNorm over 8192 rows.)
inline constexpr int layernorm_weight_tile_columns = 32;
inline constexpr int layernorm_weight_threads = 1024;

// A block owns TileColumns adjacent columns; its threads are TileColumns
// columns x (layernorm_weight_threads / TileColumns) row lanes.
template <int TileColumns>
__global__ void __launch_bounds__(layernorm_weight_threads)
    layernorm_backward_weight_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                     const float* __restrict__ mean, const float* __restrict__ rstd,
                                     float* __restrict__ dgain, float* __restrict__ dshift, std::int64_t rows,
                                     std::int64_t C) {
    constexpr int row_lanes = layernorm_weight_threads / TileColumns;
    static_assert(row_lanes * TileColumns == layernorm_weight_threads && (row_lanes & (row_lanes - 1)) == 0,
                  "the row lanes must be a power of two for the tree");
    __shared__ float gain_part[row_lanes][TileColumns];
    __shared__ float shift_part[row_lanes][TileColumns];
    const int column = static_cast<int>(threadIdx.x) % TileColumns;
    const int row_lane = static_cast<int>(threadIdx.x) / TileColumns;
    // Uniform over the block: every thread reaches every barrier.
    for (std::int64_t tile = blockIdx.x; tile * TileColumns < C; tile += gridDim.x) {
        const std::int64_t j = tile * TileColumns + column;
        float g = 0.0f, s = 0.0f;
        if (j < C) {
            // Unrolled so that eight rows' loads are in flight at once (the sums
            // keep their order): one at a time, the 24 blocks of a GPT-2
            // LayerNorm (768 columns) left the bus mostly idle, 107 us a call
            // for 50 MB on an H200.
#pragma unroll 8
            for (std::int64_t r = row_lane; r < rows; r += row_lanes) {
                const float d = dy[r * C + j];
                g += d * ((x[r * C + j] - mean[r]) * rstd[r]);
                s += d;
            }
        }
        __syncthreads();  // the previous tile's readers are done
        gain_part[row_lane][column] = g;
        shift_part[row_lane][column] = s;
        __syncthreads();
        for (int width = row_lanes / 2; width > 0; width /= 2) {
            if (row_lane < width) {
                gain_part[row_lane][column] += gain_part[row_lane + width][column];
                shift_part[row_lane][column] += shift_part[row_lane + width][column];
            }
            __syncthreads();
        }
        if (row_lane == 0 && j < C) {
            dgain[j] += gain_part[0][column];
            dshift[j] += shift_part[0][column];
        }
    }
}


}  // namespace detail

// x, y: [rows, C]; gain, shift: [C]; mean, rstd: [rows], written; all on the
// device. eps >= 0. Outputs must not overlap inputs (here and in the backwards).
inline void layernorm_forward(const float* x, const float* gain, const float* shift, float* y, float* mean,
                              float* rstd, std::int64_t rows, std::int64_t C, float eps,
                              cudaStream_t stream = nullptr) {
    detail::check_layernorm_sizes(rows, C);
    LOOM_CHECK(eps >= 0.0f, "layernorm: eps = ", eps, " is negative (or NaN); pass eps >= 0, e.g. 1e-5");
    if (rows == 0) return;
    if (C <= warp_row_limit)
        detail::layernorm_forward_kernel<32>
            <<<blocks_for(rows * 32), threads_per_block, 0, stream>>>(x, gain, shift, y, mean, rstd, rows, C, eps);
    else
        detail::layernorm_forward_kernel<threads_per_block>
            <<<blocks_for(rows * threads_per_block), threads_per_block, 0, stream>>>(x, gain, shift, y, mean, rstd,
                                                                                    rows, C, eps);
    LOOM_CUDA_CHECK_LAUNCH();
}

// dx = d loss / d x, written, from the forward's mean and rstd.
inline void layernorm_backward_input(const float* dy, const float* x, const float* gain, const float* mean,
                                     const float* rstd, float* dx, std::int64_t rows, std::int64_t C,
                                     cudaStream_t stream = nullptr) {
    detail::check_layernorm_sizes(rows, C);
    if (rows == 0) return;
    if (C <= warp_row_limit)
        detail::layernorm_backward_input_kernel<32>
            <<<blocks_for(rows * 32), threads_per_block, 0, stream>>>(dy, x, gain, mean, rstd, dx, rows, C);
    else
        detail::layernorm_backward_input_kernel<threads_per_block>
            <<<blocks_for(rows * threads_per_block), threads_per_block, 0, stream>>>(dy, x, gain, mean, rstd, dx,
                                                                                    rows, C);
    LOOM_CUDA_CHECK_LAUNCH();
}

// dgain[j] += sum_r dy[r, j] * xhat[r, j];  dshift[j] += sum_r dy[r, j].
// Accumulates, as the host does: zero the gradients first for a plain sum.
inline void layernorm_backward_weight(const float* dy, const float* x, const float* mean, const float* rstd,
                                      float* dgain, float* dshift, std::int64_t rows, std::int64_t C,
                                      cudaStream_t stream = nullptr) {
    detail::check_layernorm_sizes(rows, C);
    if (rows == 0) return;
    constexpr int tile = detail::layernorm_weight_tile_columns;
    // One block per tile of columns, capped: the kernel's tile loop does the rest.
    const std::int64_t tiles = (C + tile - 1) / tile;
    detail::layernorm_backward_weight_kernel<tile>
        <<<static_cast<unsigned int>(std::min<std::int64_t>(tiles, 4096)), detail::layernorm_weight_threads, 0,
           stream>>>(dy, x, mean, rstd, dgain, dshift, rows, C);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
