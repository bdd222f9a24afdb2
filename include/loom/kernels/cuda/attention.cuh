// Device mirror of kernels/host/attention.hpp: causal multi-head
// self-attention, FlashAttention-2 style, with the same functions, arguments
// (device pointers), layouts and argument checks, plus the stream to launch on.
//   qkv:  [B, T, 3C], C = H*D: q = qkv[b, t, 0:C], k = [C:2C], v = [2C:3C],
//         head h in columns [h*D, (h+1)*D) of each;
//   out:  [B, T, C];  lse: [B, H, T], the log-sum-exp of each query's scaled
//         scores, saved for the backward;  dqkv: [B, T, 3C], written.
// Scale 1/sqrt(D); token t attends to tokens 0..t. No T x T matrix exists:
// the forward keeps a running max and sum per query row (online softmax),
// the backward recomputes the probabilities from the saved log-sum-exp.
//
// Tiles (kernels/cuda/attention_tiles.cuh, with the pieces every kernel
// here is made of): a query tile and a key tile are both 32 rows, one per
// lane of a warp; a thread block is 4 warps, each owning 8 rows of the
// block's tile; the tiles hold 32, 64 or 128 floats per row in shared
// memory, so D > 128 is refused (use the host kernel).
//
// What each block does:
//   forward     one block per (batch, head, query tile). Loads its Q tile,
//               then for every key tile up to the diagonal one (the causal
//               bound) its K and V tiles. Lane j of a warp computes the
//               scores of key j against the warp's 8 query rows; the row max
//               and the row sum of exp(s - max) are warp butterflies; each
//               lane accumulates columns lane, lane+32, ... of the warp's 8
//               output rows, taking p from the lane holding it by a shuffle.
//               Writes out = acc / sum and lse = max + log(sum).
//   dK, dV      one block per (batch, head, key tile); K and V stay in
//               shared memory while the block walks every query tile from
//               the diagonal one to the end: recompute P^T = exp(s - lse),
//               dP^T = V dO^T, dS^T = P^T * (dP^T - D_i), and accumulate
//               dV += P^T dO, dK += dS^T Q in registers; written once.
//   dQ          one block per (batch, head, query tile): a second pass that
//               recomputes P and dS for its queries against the key tiles up
//               to the diagonal and accumulates dQ += dS K in registers.
// D_i = rowsum(dO_i * O_i) (FlashAttention-2's) is computed where it is
// used, by one warp per row from global memory in a fixed order, the same
// function in both backward kernels: it costs 1/32 of a tile's work and
// needs no scratch buffer (the API, like the host's, has none to offer).
//
// Why a second pass for dQ. FlashAttention-2 adds each key tile's share of
// dQ with atomics, whose order (and so whose rounding) changes from run to
// run; per-key-tile partial sums reduced afterwards would need a
// (T/32) x T x D scratch buffer. Recomputing P and dS in a query-major pass
// costs two more tile products (7 instead of 5 per tile pair) but keeps
// every sum in a fixed order with no atomics and no scratch, so the result
// depends on the shape alone: bit for bit the same on every run and every
// grid. Both passes form P and dS with one function (probabilities()), the
// same operands and the same summation order (fmaf is symmetric in its
// factors), so they agree bit for bit on them.
//
// Precision. f32 in, f32 out, f32 arithmetic on the CUDA cores: dot products
// as sequential fmaf over d, sums over keys/queries in key/query order, row
// reductions as warp butterflies, expf and logf. That is the host's formulas
// in another summation order (the host's BLAS, its degree-5 exp); expect
// agreement to ~1e-6 of the values' scale, not bit equality. The next step
// is a tensor-core variant (bf16 or TF32 mma, async copies of the next
// tile), once a GPU is at hand to tune and verify it.
//
// None of this has run on a GPU yet: it compiles for sm_90 and sm_80 and
// its tests (tests/cuda/test_kernels_attention.cu) are built, not run.
#pragma once

#include <cuda_runtime_api.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/cuda/attention_tiles.cuh"
#include "loom/kernels/cuda/group_reduce.cuh"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace attention_detail {

// The host's checks (kernels/attention_shape.hpp), then the device's own
// limit on D.
inline void check_shape(const char* who, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) {
    check_attention_shape(who, B, T, H, D);
    LOOM_CHECK(D <= max_head_size, who, ": head size D = ", D, " exceeds the CUDA kernel's limit of ", max_head_size,
               " (its shared-memory tiles hold 128 floats per row); use the host kernel for larger heads");
}

template <int Chunks>
__global__ void __launch_bounds__(block_threads, 1)
    attention_forward_kernel(const float* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse,
                             std::int64_t T, std::int64_t H, int D, float scale, Items items) {
    constexpr int stride = Tile<Chunks>::stride;
    float* q_tile = shared_tile<Chunks>(0);
    float* k_tile = shared_tile<Chunks>(1);
    float* v_tile = shared_tile<Chunks>(2);
    const Frame f(H, D);
    const int lane = f.lane;
    // Uniform over the block: every thread reaches every barrier.
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const Work w = work_of(item, items, H, true);  // the last (longest) query tiles first
        const float* q = qkv + w.offset(T, f.ld, D);
        const std::int64_t i0 = w.row0;

        __syncthreads();  // the previous item's readers of the tiles are done
        load_tile<Chunks>(q_tile, q, f.ld, i0, T, D);
        // The warp owns query rows i0 + first_row + r, r < 8 (rows at or past
        // T are computed on zeros and never written).
        const int first_row = f.warp * rows_per_warp;
        const int rows_here = rows_in_tile(T, i0);
        float running_max[rows_per_warp], running_sum[rows_per_warp], acc[rows_per_warp][Chunks];
        zero<Chunks>(acc);
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            running_max[r] = -INFINITY;
            running_sum[r] = 0.0f;
        }
        // Key tiles 0..tile: the diagonal one is the last any row sees.
        for (std::int64_t j0 = 0; j0 <= i0; j0 += tile_rows) {
            __syncthreads();  // the previous key tile's readers are done
            load_keys<Chunks>(k_tile, v_tile, q, f, j0, T, D);
            __syncthreads();
            // Lane j holds key j0 + j against the warp's 8 rows, masked by
            // sees() on the diagonal tile.
            const bool diagonal = j0 == i0;
            float p[rows_per_warp];
            dot_rows<Chunks>(p, q_tile + first_row * stride, k_tile + lane * stride, f.quads);
            const bool first = j0 == 0;
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
                const bool seen = sees(diagonal, lane, first_row + r);
                const float s = seen ? scaled(p[r], scale) : -INFINITY;
                // fmaxf ignores a NaN score, as the host's running max does;
                // the NaN then reaches the sum through exp.
                const float tile_max = group_reduce<32>(s, MaxOp{}, static_cast<float*>(nullptr));
                const float new_max = fmaxf(running_max[r], tile_max);
                // Online softmax: what earlier tiles summed against the old
                // max moves to the new one (nothing to move on the first).
                const float rescale = first ? 0.0f : expf(running_max[r] - new_max);
                p[r] = seen ? expf(s - new_max) : 0.0f;
                const float tile_sum = group_reduce<32>(p[r], SumOp{}, static_cast<float*>(nullptr));
                running_sum[r] = running_sum[r] * rescale + tile_sum;
                running_max[r] = new_max;
#pragma unroll
                for (int c = 0; c < Chunks; ++c) acc[r][c] *= rescale;
            }
            // acc += P V over the keys each row sees, in key order: a masked
            // key is skipped, so a NaN in a later token's value never reaches
            // an earlier row.
            accumulate_rows<Chunks>(acc, p, v_tile, rows_in_tile(T, j0),
                                    [&](int r, int j) { return sees(diagonal, j, first_row + r); });
        }
        float* out_head = out + w.offset(T, f.C, D);
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            if (first_row + r >= rows_here) continue;
            const std::int64_t i = i0 + first_row + r;
            const float inverse = 1.0f / running_sum[r];
            store_lane_columns<Chunks>(out_head + i * f.C, D, [&](int c) { return acc[r][c] * inverse; });
            if (lane == 0) lse[w.bh * T + i] = running_max[r] + logf(running_sum[r]);
        }
    }
}

template <int Chunks>
__global__ void __launch_bounds__(block_threads, 1)
    attention_backward_dkdv_kernel(const float* __restrict__ qkv, const float* __restrict__ out,
                                   const float* __restrict__ dout, const float* __restrict__ lse,
                                   float* __restrict__ dqkv, std::int64_t T, std::int64_t H, int D, float scale,
                                   Items items) {
    constexpr int stride = Tile<Chunks>::stride;
    float* k_tile = shared_tile<Chunks>(0);
    float* v_tile = shared_tile<Chunks>(1);
    float* q_tile = shared_tile<Chunks>(2);
    float* dout_tile = shared_tile<Chunks>(3);
    __shared__ float lse_tile[tile_rows];
    __shared__ float out_dot_dout[tile_rows];  // D_i of the query tile
    const Frame f(H, D);
    const int lane = f.lane;
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const Work w = work_of(item, items, H, false);  // the first (longest) key tiles first
        const HeadInputs in = head_inputs(w, qkv, out, dout, lse, T, f, D);
        const std::int64_t j0 = w.row0;

        __syncthreads();
        load_keys<Chunks>(k_tile, v_tile, in.q, f, j0, T, D);
        // The warp owns keys j0 + first_key + r, r < 8.
        const int first_key = f.warp * rows_per_warp;
        float dk[rows_per_warp][Chunks], dv[rows_per_warp][Chunks];
        zero<Chunks>(dk);
        zero<Chunks>(dv);
        // Query tiles from the diagonal one on: earlier queries see none of these keys.
        for (std::int64_t i0 = j0; i0 < T; i0 += tile_rows) {
            __syncthreads();  // the previous query tile's readers are done
            load_tile<Chunks>(q_tile, in.q, f.ld, i0, T, D);
            load_tile<Chunks>(dout_tile, in.dout, f.C, i0, T, D);
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
                const int local = first_key + r;
                const QueryStats stats = query_stats(in, i0 + local, T, f.C, D);
                if (lane == 0) {
                    out_dot_dout[local] = stats.di;
                    lse_tile[local] = stats.lse;
                }
            }
            __syncthreads();
            // Lane l holds query i0 + l against the warp's 8 keys: P^T and
            // dS^T, masked by sees() on the diagonal tile.
            const bool diagonal = i0 == j0;
            const int n_queries = rows_in_tile(T, i0);
            const float lse_q = lse_tile[lane];
            const float di_q = out_dot_dout[lane];
            float p[rows_per_warp], ds[rows_per_warp];
            probabilities<Chunks>(
                p, ds, k_tile + first_key * stride, q_tile + lane * stride, v_tile + first_key * stride,
                dout_tile + lane * stride, f.quads, scale,
                [&](int r) { return sees(diagonal, first_key + r, lane) && lane < n_queries; },
                [&](int) { return lse_q; }, [&](int) { return di_q; });
            // dV += P^T dO, dK += dS^T Q (scaled when written), in query
            // order, skipping the queries a key is masked from (uniform over
            // the warp, as in the forward).
            for (int iq = 0; iq < n_queries; ++iq) {
                float q_value[Chunks], dout_value[Chunks];
                lane_columns<Chunks>(q_value, q_tile, iq);
                lane_columns<Chunks>(dout_value, dout_tile, iq);
#pragma unroll
                for (int r = 0; r < rows_per_warp; ++r) {
                    if (sees(diagonal, first_key + r, iq)) {
                        add_shuffled<Chunks>(dv[r], p[r], iq, dout_value);
                        add_shuffled<Chunks>(dk[r], ds[r], iq, q_value);
                    }
                }
            }
        }
        const int keys_here = rows_in_tile(T, j0);
        float* grad_head = dqkv + w.offset(T, f.ld, D);
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            if (first_key + r >= keys_here) continue;
            float* grad_row = grad_head + (j0 + first_key + r) * f.ld;
            store_lane_columns<Chunks>(grad_row + f.C, D, [&](int c) { return dk[r][c] * scale; });
            store_lane_columns<Chunks>(grad_row + 2 * f.C, D, [&](int c) { return dv[r][c]; });
        }
    }
}

template <int Chunks>
__global__ void __launch_bounds__(block_threads, 1)
    attention_backward_dq_kernel(const float* __restrict__ qkv, const float* __restrict__ out,
                                 const float* __restrict__ dout, const float* __restrict__ lse,
                                 float* __restrict__ dqkv, std::int64_t T, std::int64_t H, int D, float scale,
                                 Items items) {
    constexpr int stride = Tile<Chunks>::stride;
    float* q_tile = shared_tile<Chunks>(0);
    float* dout_tile = shared_tile<Chunks>(1);
    float* k_tile = shared_tile<Chunks>(2);
    float* v_tile = shared_tile<Chunks>(3);
    const Frame f(H, D);
    const int lane = f.lane;
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const Work w = work_of(item, items, H, true);  // the last (longest) query tiles first
        const HeadInputs in = head_inputs(w, qkv, out, dout, lse, T, f, D);
        const std::int64_t i0 = w.row0;

        __syncthreads();
        load_tile<Chunks>(q_tile, in.q, f.ld, i0, T, D);
        load_tile<Chunks>(dout_tile, in.dout, f.C, i0, T, D);
        // The warp owns query rows i0 + first_row + r, r < 8; their lse and
        // D_i, as the dK/dV pass forms them.
        const int first_row = f.warp * rows_per_warp;
        const int rows_here = rows_in_tile(T, i0);
        QueryStats stats[rows_per_warp];
        float acc[rows_per_warp][Chunks];
        zero<Chunks>(acc);
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r)
            stats[r] = query_stats(in, i0 + first_row + r, T, f.C, D);
        const auto mine = [&](int r) { return first_row + r < rows_here; };
        for (std::int64_t j0 = 0; j0 <= i0; j0 += tile_rows) {
            __syncthreads();
            load_keys<Chunks>(k_tile, v_tile, in.q, f, j0, T, D);
            __syncthreads();
            // Lane j holds key j0 + j against the warp's 8 queries: P and
            // dS, masked as in the forward.
            const bool diagonal = j0 == i0;
            float p[rows_per_warp], ds[rows_per_warp];
            probabilities<Chunks>(
                p, ds, q_tile + first_row * stride, k_tile + lane * stride, dout_tile + first_row * stride,
                v_tile + lane * stride, f.quads, scale,
                [&](int r) { return sees(diagonal, lane, first_row + r) && mine(r); },
                [&](int r) { return stats[r].lse; }, [&](int r) { return stats[r].di; });
            // dQ += dS K (scaled when written), in key order.
            accumulate_rows<Chunks>(acc, ds, k_tile, rows_in_tile(T, j0),
                                    [&](int r, int j) { return sees(diagonal, j, first_row + r) && mine(r); });
        }
        float* grad_head = dqkv + w.offset(T, f.ld, D);
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            if (!mine(r)) continue;
            store_lane_columns<Chunks>(grad_head + (i0 + first_row + r) * f.ld, D,
                                       [&](int c) { return acc[r][c] * scale; });
        }
    }
}

template <class Kernel>
void allow_shared(Kernel* kernel, std::size_t bytes) {
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <int Chunks>
void forward(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T, std::int64_t H, int D,
             float scale, cudaStream_t stream) {
    const Items items{B * H, (T + tile_rows - 1) / tile_rows};
    constexpr std::size_t bytes = shared_bytes<Chunks>(3);
    static OncePerDevice set_up;
    set_up([](int) { allow_shared(attention_forward_kernel<Chunks>, bytes); });
    attention_forward_kernel<Chunks>
        <<<blocks_for_items(items.count()), block_threads, bytes, stream>>>(qkv, out, lse, T, H, D, scale, items);
    LOOM_CUDA_CHECK_LAUNCH();
}

template <int Chunks>
void backward(const float* qkv, const float* out, const float* dout, const float* lse, float* dqkv, std::int64_t B,
              std::int64_t T, std::int64_t H, int D, float scale, cudaStream_t stream) {
    const Items items{B * H, (T + tile_rows - 1) / tile_rows};
    constexpr std::size_t bytes = shared_bytes<Chunks>(4);
    const unsigned int blocks = blocks_for_items(items.count());
    static OncePerDevice set_up;
    set_up([](int) {
        allow_shared(attention_backward_dkdv_kernel<Chunks>, bytes);
        allow_shared(attention_backward_dq_kernel<Chunks>, bytes);
    });
    attention_backward_dkdv_kernel<Chunks>
        <<<blocks, block_threads, bytes, stream>>>(qkv, out, dout, lse, dqkv, T, H, D, scale, items);
    LOOM_CUDA_CHECK_LAUNCH();
    attention_backward_dq_kernel<Chunks>
        <<<blocks, block_threads, bytes, stream>>>(qkv, out, dout, lse, dqkv, T, H, D, scale, items);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace attention_detail

namespace attention_detail {

// The checks every entry point makes, with the host's messages and in its
// order, then the device's limit on D. False when there is nothing to do (B
// or T is 0).
[[nodiscard]] inline bool check_forward(const float* qkv, const float* out, const float* lse, std::int64_t B,
                                        std::int64_t T, std::int64_t H, std::int64_t D) {
    check_attention_forward_arguments(qkv, out, lse, B, T, H, D);
    check_shape("attention_forward", B, T, H, D);
    return B != 0 && T != 0;
}

[[nodiscard]] inline bool check_backward(const float* qkv, const float* out, const float* dout, const float* lse,
                                         const float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                                         std::int64_t D) {
    check_attention_backward_arguments(qkv, out, dout, lse, dqkv, B, T, H, D);
    check_shape("attention_backward", B, T, H, D);
    return B != 0 && T != 0;
}

// launch.template operator()<Chunks>() for the tiles that hold D (32 * Chunks
// columns, Chunks = 1, 2 or 4).
template <class Launch>
void for_head_size(std::int64_t D, Launch&& launch) {
    if (D <= 32)
        launch.template operator()<1>();
    else if (D <= 64)
        launch.template operator()<2>();
    else
        launch.template operator()<4>();
}

}  // namespace attention_detail

// Causal multi-head self-attention, as host::attention_forward: qkv [B, T, 3C]
// in, out [B, T, C] and lse [B, H, T] written, all on the device; D <= 128.
// out and lse must not overlap qkv.
inline void attention_forward(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                              std::int64_t H, std::int64_t D, cudaStream_t stream = nullptr) {
    if (!attention_detail::check_forward(qkv, out, lse, B, T, H, D)) return;
    attention_detail::for_head_size(D, [&]<int Chunks>() {
        attention_detail::forward<Chunks>(qkv, out, lse, B, T, H, static_cast<int>(D), attention_scale(D),
                                          stream);
    });
}

// dqkv [B, T, 3C], written (not accumulated), from the forward's out and lse,
// as host::attention_backward. Two launches on `stream`: dK and dV, then dQ.
// dqkv must not overlap the inputs.
inline void attention_backward(const float* qkv, const float* out, const float* dout, const float* lse, float* dqkv,
                               std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                               cudaStream_t stream = nullptr) {
    if (!attention_detail::check_backward(qkv, out, dout, lse, dqkv, B, T, H, D)) return;
    attention_detail::for_head_size(D, [&]<int Chunks>() {
        attention_detail::backward<Chunks>(qkv, out, dout, lse, dqkv, B, T, H, static_cast<int>(D),
                                           attention_scale(D), stream);
    });
}

}  // namespace loom::kernels::cuda
