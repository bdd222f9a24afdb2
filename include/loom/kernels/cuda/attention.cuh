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
// Tiles. A query tile and a key tile are both 32 rows (one per lane of a
// warp); a thread block is 4 warps (128 threads), each warp owning 8 rows of
// the block's tile. The tiles live in dynamic shared memory, 32 rows x a
// capacity of 32, 64 or 128 floats (the smallest >= D; the kernels are
// instantiated for each, so registers hold D/32 columns per lane), rows
// padded by 4 floats so that a lane reading its own row as float4 meets no
// bank conflict. D > 128 is refused (use the host kernel).
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
// grid. Both passes form P and dS with the same code, same operands and the
// same summation order (fmaf is symmetric in its factors), so they agree bit
// for bit on them.
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

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/cuda/group_reduce.cuh"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace attention_detail {

// Rows of a query tile and of a key tile: one per lane.
inline constexpr int tile_rows = 32;
inline constexpr int warps = 4;
inline constexpr int block_threads = warps * 32;
// Rows of a tile each warp owns.
inline constexpr int rows_per_warp = tile_rows / warps;
// The largest head size the tiles hold.
inline constexpr std::int64_t max_head_size = 128;
// Registers: left to its occupancy heuristics, ptxas caps these kernels at
// 96-168 registers and spills a few words; __launch_bounds__(128, 1) lets it
// keep everything in registers (150-228 per thread, no spills, CUDA 13).
// Shared memory alone allows 3-4 blocks per SM at D = 128; which of the two
// to trade is a measurement for a GPU.
// Grid-stride loops over (batch, head, tile) cover the rest.
inline constexpr std::int64_t max_blocks = 65535;

// A tile of 32 rows holding up to 32 * Chunks columns, in shared memory.
template <int Chunks>
struct Tile {
    static_assert(Chunks == 1 || Chunks == 2 || Chunks == 4, "tiles hold 32, 64 or 128 columns");
    static constexpr int width = 32 * Chunks;
    // 4 floats of padding: lane l's float4 at row l starts in bank 4l mod 32,
    // so each quarter-warp's 16-byte loads cover all 32 banks once.
    static constexpr int stride = width + 4;
    static constexpr int floats = tile_rows * stride;
};

// The host's checks, word for word (the tests compare the messages), then
// the device's own limit on D. The host's int bound on 3*H*D is kept so
// that both accept the same shapes below D = 128.
inline void check_shape(const char* who, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) {
    LOOM_CHECK(B >= 0, who, ": batch size B = ", B, " must be >= 0");
    LOOM_CHECK(T >= 0, who, ": sequence length T = ", T, " must be >= 0");
    LOOM_CHECK(H >= 1, who, ": head count H = ", H, " must be >= 1");
    LOOM_CHECK(D >= 1, who, ": head size D = ", D, " must be >= 1");
    LOOM_CHECK(H <= INT_MAX / 3 / D, who, ": qkv row width 3*H*D = 3*", H, "*", D,
               " exceeds the BLAS's int range (at most ", INT_MAX, ")");
    LOOM_CHECK(D <= max_head_size, who, ": head size D = ", D, " exceeds the CUDA kernel's limit of ", max_head_size,
               " (its shared-memory tiles hold 128 floats per row); use the host kernel for larger heads");
}

// Rows [row0, row0 + 32) of a matrix whose row t starts at src + t * ld,
// columns [0, D), into tile[32][stride]. Rows at or past T and columns at
// or past D read as 0, so the float4 dot products may run over the padding.
// Called by the whole block.
template <int Chunks>
__device__ inline void load_tile(float* tile, const float* src, std::int64_t ld, std::int64_t row0, std::int64_t T,
                                 int D) {
    constexpr int width = Tile<Chunks>::width;
    for (int index = static_cast<int>(threadIdx.x); index < tile_rows * width; index += block_threads) {
        const int r = index / width;
        const int c = index % width;
        const std::int64_t row = row0 + r;
        tile[r * Tile<Chunks>::stride + c] = row < T && c < D ? src[row * ld + c] : 0.0f;
    }
}

// acc[r] = sum over d of warp_rows[r][d] * lane_row[d], for the warp's 8 rows
// (the same for every lane: broadcast reads) against the lane's own row, d in
// order over `quads` float4s. fmaf(a, b, c) == fmaf(b, a, c) bit for bit, so
// swapping which operand is the warp's and which the lane's gives the same
// sums: the dK/dV and dQ passes rely on it.
template <int Chunks>
__device__ inline void dot_rows(float (&acc)[rows_per_warp], const float* warp_rows, const float* lane_row,
                                int quads) {
    constexpr int stride = Tile<Chunks>::stride;
#pragma unroll
    for (int r = 0; r < rows_per_warp; ++r) acc[r] = 0.0f;
    const auto* mine = reinterpret_cast<const float4*>(lane_row);
    for (int q4 = 0; q4 < quads; ++q4) {
        const float4 b = mine[q4];
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            const float4 a = reinterpret_cast<const float4*>(warp_rows + r * stride)[q4];
            acc[r] = fmaf(a.x, b.x, acc[r]);
            acc[r] = fmaf(a.y, b.y, acc[r]);
            acc[r] = fmaf(a.z, b.z, acc[r]);
            acc[r] = fmaf(a.w, b.w, acc[r]);
        }
    }
}

// A score: the dot product times 1/sqrt(D), rounded on its own as the host's
// BLAS (alpha times the sum) does. __fmul_rn is never fused with the
// subtraction that follows, so every kernel forms the same bits from the
// same dot product, whatever nvcc's contraction does elsewhere.
__device__ inline float scaled(float dot, float scale) { return __fmul_rn(dot, scale); }

// How many of the 32 rows starting at `start` (< T) exist.
__device__ inline int rows_in_tile(std::int64_t T, std::int64_t start) {
    const std::int64_t left = T - start;
    return left < tile_rows ? static_cast<int>(left) : tile_rows;
}

// FlashAttention-2's D_i = sum_d out[d] * dout[d] for one row, by one warp:
// lane l sums d = l, l + 32, ... in order, then a butterfly (every lane gets
// the same bits). Called with warp-uniform arguments.
__device__ inline float row_dot_warp(const float* out_row, const float* dout_row, int D) {
    float partial = 0.0f;
    for (int d = static_cast<int>(threadIdx.x % 32); d < D; d += 32) partial = fmaf(out_row[d], dout_row[d], partial);
    return group_reduce<32>(partial, SumOp{}, static_cast<float*>(nullptr));
}

// The work items of a launch: (tile rank, batch * H + head), tile rank
// major, so that the longest tiles of every head are started first.
struct Items {
    std::int64_t heads;  // B * H
    std::int64_t tiles;  // ceil(T / 32)
    [[nodiscard]] __host__ __device__ std::int64_t count() const { return heads * tiles; }
};

inline unsigned int blocks_for_items(std::int64_t items) {
    return static_cast<unsigned int>(std::clamp<std::int64_t>(items, 1, max_blocks));
}

template <int Chunks>
__global__ void __launch_bounds__(block_threads, 1)
    attention_forward_kernel(const float* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse,
                             std::int64_t T, std::int64_t H, int D, float scale, Items items) {
    constexpr int stride = Tile<Chunks>::stride;
    extern __shared__ float4 attention_shared[];  // float4: 16-byte aligned rows
    float* q_tile = reinterpret_cast<float*>(attention_shared);
    float* k_tile = q_tile + Tile<Chunks>::floats;
    float* v_tile = k_tile + Tile<Chunks>::floats;
    const int warp = static_cast<int>(threadIdx.x / 32);
    const int lane = static_cast<int>(threadIdx.x % 32);
    const std::int64_t C = H * D;
    const std::int64_t ld = 3 * C;
    const int quads = (D + 3) / 4;
    // Uniform over the block: every thread reaches every barrier.
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const std::int64_t tile = items.tiles - 1 - item / items.heads;  // the last (longest) query tiles first
        const std::int64_t bh = item % items.heads;
        const std::int64_t b = bh / H;
        const std::int64_t h = bh % H;
        const float* q = qkv + b * T * ld + h * D;
        const float* k = q + C;
        const float* v = q + 2 * C;
        const std::int64_t i0 = tile * tile_rows;

        __syncthreads();  // the previous item's readers of the tiles are done
        load_tile<Chunks>(q_tile, q, ld, i0, T, D);
        // The warp owns query rows i0 + first_row + r, r < 8 (rows at or past
        // T are computed on zeros and never written).
        const int first_row = warp * rows_per_warp;
        const int rows_here = rows_in_tile(T, i0);
        float running_max[rows_per_warp], running_sum[rows_per_warp], acc[rows_per_warp][Chunks];
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            running_max[r] = -INFINITY;
            running_sum[r] = 0.0f;
#pragma unroll
            for (int c = 0; c < Chunks; ++c) acc[r][c] = 0.0f;
        }
        // Key tiles 0..tile: the diagonal one is the last any row sees.
        for (std::int64_t j0 = 0; j0 <= i0; j0 += tile_rows) {
            __syncthreads();  // the previous key tile's readers are done
            load_tile<Chunks>(k_tile, k, ld, j0, T, D);
            load_tile<Chunks>(v_tile, v, ld, j0, T, D);
            __syncthreads();
            // Lane j holds key j0 + j against the warp's 8 rows. Below the
            // diagonal tile every row sees every key; on it, row i0 + x sees
            // keys i0 .. i0 + x.
            const bool diagonal = j0 == i0;
            float p[rows_per_warp];
            dot_rows<Chunks>(p, q_tile + first_row * stride, k_tile + lane * stride, quads);
            const bool first = j0 == 0;
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
                const bool seen = !diagonal || lane <= first_row + r;
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
            // acc += P V over the keys each row sees, in key order. A masked
            // key is skipped, not multiplied by 0: a NaN in a later token's
            // value never reaches an earlier row. The condition is uniform
            // over the warp (its row against the loop's key), so the shuffle
            // always has all 32 lanes.
            const int n_keys = rows_in_tile(T, j0);
            for (int j = 0; j < n_keys; ++j) {
                float value[Chunks];
#pragma unroll
                for (int c = 0; c < Chunks; ++c) value[c] = v_tile[j * stride + lane + 32 * c];
#pragma unroll
                for (int r = 0; r < rows_per_warp; ++r) {
                    if (!diagonal || j <= first_row + r) {
                        const float pj = __shfl_sync(0xffff'ffffu, p[r], j);
#pragma unroll
                        for (int c = 0; c < Chunks; ++c) acc[r][c] = fmaf(pj, value[c], acc[r][c]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            if (first_row + r >= rows_here) continue;
            const std::int64_t i = i0 + first_row + r;
            const float inverse = 1.0f / running_sum[r];
            float* out_row = out + (b * T + i) * C + h * D;
#pragma unroll
            for (int c = 0; c < Chunks; ++c) {
                const int d = lane + 32 * c;
                if (d < D) out_row[d] = acc[r][c] * inverse;
            }
            if (lane == 0) lse[bh * T + i] = running_max[r] + logf(running_sum[r]);
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
    extern __shared__ float4 attention_shared[];
    float* k_tile = reinterpret_cast<float*>(attention_shared);
    float* v_tile = k_tile + Tile<Chunks>::floats;
    float* q_tile = v_tile + Tile<Chunks>::floats;
    float* dout_tile = q_tile + Tile<Chunks>::floats;
    __shared__ float lse_tile[tile_rows];
    __shared__ float out_dot_dout[tile_rows];  // D_i of the query tile
    const int warp = static_cast<int>(threadIdx.x / 32);
    const int lane = static_cast<int>(threadIdx.x % 32);
    const std::int64_t C = H * D;
    const std::int64_t ld = 3 * C;
    const int quads = (D + 3) / 4;
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const std::int64_t tile = item / items.heads;  // the first (longest) key tiles first
        const std::int64_t bh = item % items.heads;
        const std::int64_t b = bh / H;
        const std::int64_t h = bh % H;
        const float* q = qkv + b * T * ld + h * D;
        const float* out_head = out + b * T * C + h * D;
        const float* dout_head = dout + b * T * C + h * D;
        const float* lse_head = lse + bh * T;
        const std::int64_t j0 = tile * tile_rows;

        __syncthreads();
        load_tile<Chunks>(k_tile, q + C, ld, j0, T, D);
        load_tile<Chunks>(v_tile, q + 2 * C, ld, j0, T, D);
        // The warp owns keys j0 + first_key + r, r < 8.
        const int first_key = warp * rows_per_warp;
        float dk[rows_per_warp][Chunks], dv[rows_per_warp][Chunks];
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
#pragma unroll
            for (int c = 0; c < Chunks; ++c) dk[r][c] = dv[r][c] = 0.0f;
        }
        // Query tiles from the diagonal one on: earlier queries see none of these keys.
        for (std::int64_t i0 = j0; i0 < T; i0 += tile_rows) {
            __syncthreads();  // the previous query tile's readers are done
            load_tile<Chunks>(q_tile, q, ld, i0, T, D);
            load_tile<Chunks>(dout_tile, dout_head, C, i0, T, D);
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
                const int local = warp * rows_per_warp + r;
                const std::int64_t i = i0 + local;
                float di = 0.0f, lse_i = 0.0f;
                if (i < T) {  // uniform over the warp
                    di = row_dot_warp(out_head + i * C, dout_head + i * C, D);
                    lse_i = lse_head[i];
                }
                if (lane == 0) {
                    out_dot_dout[local] = di;
                    lse_tile[local] = lse_i;
                }
            }
            __syncthreads();
            // Lane l holds query i0 + l against the warp's 8 keys: P^T and
            // dS^T. Past the diagonal tile every query sees every key; on
            // it, key j0 + x is seen by queries j0 + x and later.
            const bool diagonal = i0 == j0;
            const int n_queries = rows_in_tile(T, i0);
            const float lse_q = lse_tile[lane];
            const float di_q = out_dot_dout[lane];
            float p[rows_per_warp], ds[rows_per_warp];
            dot_rows<Chunks>(p, k_tile + first_key * stride, q_tile + lane * stride, quads);
            dot_rows<Chunks>(ds, v_tile + first_key * stride, dout_tile + lane * stride, quads);
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
                const bool seen = (!diagonal || first_key + r <= lane) && lane < n_queries;
                p[r] = seen ? expf(scaled(p[r], scale) - lse_q) : 0.0f;
                ds[r] = p[r] * (ds[r] - di_q);
            }
            // dV += P^T dO, dK += dS^T Q (scaled when written), in query
            // order, skipping the queries a key is masked from (uniform over
            // the warp, as in the forward).
            for (int iq = 0; iq < n_queries; ++iq) {
                float q_value[Chunks], dout_value[Chunks];
#pragma unroll
                for (int c = 0; c < Chunks; ++c) {
                    q_value[c] = q_tile[iq * stride + lane + 32 * c];
                    dout_value[c] = dout_tile[iq * stride + lane + 32 * c];
                }
#pragma unroll
                for (int r = 0; r < rows_per_warp; ++r) {
                    if (!diagonal || first_key + r <= iq) {
                        const float pq = __shfl_sync(0xffff'ffffu, p[r], iq);
                        const float dsq = __shfl_sync(0xffff'ffffu, ds[r], iq);
#pragma unroll
                        for (int c = 0; c < Chunks; ++c) {
                            dv[r][c] = fmaf(pq, dout_value[c], dv[r][c]);
                            dk[r][c] = fmaf(dsq, q_value[c], dk[r][c]);
                        }
                    }
                }
            }
        }
        const int keys_here = rows_in_tile(T, j0);
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            if (first_key + r >= keys_here) continue;
            float* grad_row = dqkv + (b * T + j0 + first_key + r) * ld + h * D;
#pragma unroll
            for (int c = 0; c < Chunks; ++c) {
                const int d = lane + 32 * c;
                if (d < D) {
                    grad_row[C + d] = dk[r][c] * scale;
                    grad_row[2 * C + d] = dv[r][c];
                }
            }
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
    extern __shared__ float4 attention_shared[];
    float* q_tile = reinterpret_cast<float*>(attention_shared);
    float* dout_tile = q_tile + Tile<Chunks>::floats;
    float* k_tile = dout_tile + Tile<Chunks>::floats;
    float* v_tile = k_tile + Tile<Chunks>::floats;
    const int warp = static_cast<int>(threadIdx.x / 32);
    const int lane = static_cast<int>(threadIdx.x % 32);
    const std::int64_t C = H * D;
    const std::int64_t ld = 3 * C;
    const int quads = (D + 3) / 4;
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const std::int64_t tile = items.tiles - 1 - item / items.heads;  // the last (longest) query tiles first
        const std::int64_t bh = item % items.heads;
        const std::int64_t b = bh / H;
        const std::int64_t h = bh % H;
        const float* q = qkv + b * T * ld + h * D;
        const float* out_head = out + b * T * C + h * D;
        const float* dout_head = dout + b * T * C + h * D;
        const std::int64_t i0 = tile * tile_rows;

        __syncthreads();
        load_tile<Chunks>(q_tile, q, ld, i0, T, D);
        load_tile<Chunks>(dout_tile, dout_head, C, i0, T, D);
        // The warp's 8 query rows, their lse and D_i (the same function and
        // operands as the dK/dV pass: the same bits).
        // The warp owns query rows i0 + first_row + r, r < 8.
        const int first_row = warp * rows_per_warp;
        const int rows_here = rows_in_tile(T, i0);
        float lse_row[rows_per_warp], di_row[rows_per_warp], acc[rows_per_warp][Chunks];
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            lse_row[r] = 0.0f;
            di_row[r] = 0.0f;
            if (first_row + r < rows_here) {  // uniform over the warp
                const std::int64_t i = i0 + first_row + r;
                di_row[r] = row_dot_warp(out_head + i * C, dout_head + i * C, D);
                lse_row[r] = lse[bh * T + i];
            }
#pragma unroll
            for (int c = 0; c < Chunks; ++c) acc[r][c] = 0.0f;
        }
        for (std::int64_t j0 = 0; j0 <= i0; j0 += tile_rows) {
            __syncthreads();
            load_tile<Chunks>(k_tile, q + C, ld, j0, T, D);
            load_tile<Chunks>(v_tile, q + 2 * C, ld, j0, T, D);
            __syncthreads();
            // Lane j holds key j0 + j against the warp's 8 queries: P and
            // dS, masked as in the forward.
            const bool diagonal = j0 == i0;
            float p[rows_per_warp], ds[rows_per_warp];
            dot_rows<Chunks>(p, q_tile + first_row * stride, k_tile + lane * stride, quads);
            dot_rows<Chunks>(ds, dout_tile + first_row * stride, v_tile + lane * stride, quads);
#pragma unroll
            for (int r = 0; r < rows_per_warp; ++r) {
                const bool seen = (!diagonal || lane <= first_row + r) && first_row + r < rows_here;
                p[r] = seen ? expf(scaled(p[r], scale) - lse_row[r]) : 0.0f;
                ds[r] = p[r] * (ds[r] - di_row[r]);
            }
            // dQ += dS K (scaled when written), in key order.
            const int n_keys = rows_in_tile(T, j0);
            for (int j = 0; j < n_keys; ++j) {
                float k_value[Chunks];
#pragma unroll
                for (int c = 0; c < Chunks; ++c) k_value[c] = k_tile[j * stride + lane + 32 * c];
#pragma unroll
                for (int r = 0; r < rows_per_warp; ++r) {
                    if ((!diagonal || j <= first_row + r) && first_row + r < rows_here) {
                        const float dsj = __shfl_sync(0xffff'ffffu, ds[r], j);
#pragma unroll
                        for (int c = 0; c < Chunks; ++c) acc[r][c] = fmaf(dsj, k_value[c], acc[r][c]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r) {
            if (first_row + r >= rows_here) continue;
            float* grad_row = dqkv + (b * T + i0 + first_row + r) * ld + h * D;
#pragma unroll
            for (int c = 0; c < Chunks; ++c) {
                const int d = lane + 32 * c;
                if (d < D) grad_row[d] = acc[r][c] * scale;
            }
        }
    }
}

// Shared memory per block, in tiles: Q, K, V for the forward; K, V, Q, dO
// (or Q, dO, K, V) for the backward passes. At D <= 128: 50688 and 67584
// bytes, past the 48 KiB a launch gets without opting in.
template <int Chunks>
inline constexpr std::size_t shared_bytes(int tiles) {
    return static_cast<std::size_t>(tiles) * Tile<Chunks>::floats * sizeof(float);
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
    allow_shared(attention_forward_kernel<Chunks>, bytes);
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
    allow_shared(attention_backward_dkdv_kernel<Chunks>, bytes);
    attention_backward_dkdv_kernel<Chunks>
        <<<blocks, block_threads, bytes, stream>>>(qkv, out, dout, lse, dqkv, T, H, D, scale, items);
    LOOM_CUDA_CHECK_LAUNCH();
    allow_shared(attention_backward_dq_kernel<Chunks>, bytes);
    attention_backward_dq_kernel<Chunks>
        <<<blocks, block_threads, bytes, stream>>>(qkv, out, dout, lse, dqkv, T, H, D, scale, items);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace attention_detail

// Causal multi-head self-attention, as host::attention_forward: qkv [B, T, 3C]
// in, out [B, T, C] and lse [B, H, T] written, all on the device; D <= 128.
// out and lse must not overlap qkv.
inline void attention_forward(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                              std::int64_t H, std::int64_t D, cudaStream_t stream = nullptr) {
    attention_detail::check_shape("attention_forward", B, T, H, D);
    if (B == 0 || T == 0) return;
    LOOM_CHECK(qkv != nullptr && out != nullptr && lse != nullptr,
               "attention_forward: qkv, out and lse must all be non-null for B = ", B, ", T = ", T);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    const int d = static_cast<int>(D);
    if (D <= 32)
        attention_detail::forward<1>(qkv, out, lse, B, T, H, d, scale, stream);
    else if (D <= 64)
        attention_detail::forward<2>(qkv, out, lse, B, T, H, d, scale, stream);
    else
        attention_detail::forward<4>(qkv, out, lse, B, T, H, d, scale, stream);
}

// dqkv [B, T, 3C], written (not accumulated), from the forward's out and lse,
// as host::attention_backward. Two launches on `stream`: dK and dV, then dQ.
// dqkv must not overlap the inputs.
inline void attention_backward(const float* qkv, const float* out, const float* dout, const float* lse, float* dqkv,
                               std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                               cudaStream_t stream = nullptr) {
    attention_detail::check_shape("attention_backward", B, T, H, D);
    if (B == 0 || T == 0) return;
    LOOM_CHECK(qkv != nullptr && out != nullptr && dout != nullptr && lse != nullptr && dqkv != nullptr,
               "attention_backward: qkv, out, dout, lse and dqkv must all be non-null for B = ", B, ", T = ", T);
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    const int d = static_cast<int>(D);
    if (D <= 32)
        attention_detail::backward<1>(qkv, out, dout, lse, dqkv, B, T, H, d, scale, stream);
    else if (D <= 64)
        attention_detail::backward<2>(qkv, out, dout, lse, dqkv, B, T, H, d, scale, stream);
    else
        attention_detail::backward<4>(qkv, out, dout, lse, dqkv, B, T, H, d, scale, stream);
}

}  // namespace loom::kernels::cuda
