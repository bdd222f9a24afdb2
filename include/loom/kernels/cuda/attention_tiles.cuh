// The tile machinery of the CUDA attention kernels (kernels/cuda/attention.cuh):
// what a tile is, how a block loads one, the dot products and shuffled
// accumulations over it, the causal mask, and how a launch's work items map
// to (batch, head, tile). Every kernel of attention.cuh is written with these
// pieces, so the forward and both backward passes share one copy of each.
//
// Tiles. A query tile and a key tile are both 32 rows (one per lane of a
// warp); a thread block is 4 warps (128 threads), each warp owning 8 rows of
// the block's tile. The tiles live in dynamic shared memory, 32 rows x a
// capacity of 32, 64 or 128 floats (the smallest >= D; the kernels are
// instantiated for each, so registers hold D/32 columns per lane), rows
// padded by 4 floats so that a lane reading its own row as float4 meets no
// bank conflict. D > 128 is refused (use the host kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/cuda/group_reduce.cuh"

namespace loom::kernels::cuda::attention_detail {

// Rows of a query tile and of a key tile: one per lane.
inline constexpr int tile_rows = 32;
inline constexpr int warps = 4;
inline constexpr int block_threads = warps * 32;
// Rows of a tile each warp owns.
inline constexpr int rows_per_warp = tile_rows / warps;
// The largest head size the tiles hold (named in the host core, for host-side checks).
inline constexpr std::int64_t max_head_size = cuda_attention_max_head_size;
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

// Shared memory per block for `tiles` tiles: Q, K, V for the forward; K, V,
// Q, dO (or Q, dO, K, V) for the backward passes. At D <= 128: 50688 and
// 67584 bytes, past the 48 KiB a launch gets without opting in.
template <int Chunks>
inline constexpr std::size_t shared_bytes(int tiles) {
    return static_cast<std::size_t>(tiles) * Tile<Chunks>::floats * sizeof(float);
}

// Tile `index` of the block's dynamic shared memory.
template <int Chunks>
__device__ inline float* shared_tile(int index) {
    extern __shared__ float4 attention_shared[];  // float4: 16-byte aligned rows
    return reinterpret_cast<float*>(attention_shared) + index * Tile<Chunks>::floats;
}

// What every kernel derives from its arguments: its warp and lane, C = H*D,
// the row width ld = 3C of qkv, and the float4s a dot product over D spans.
struct Frame {
    int warp, lane;
    std::int64_t C, ld;
    int quads;
    __device__ Frame(std::int64_t H, int D)
        : warp(static_cast<int>(threadIdx.x / 32)), lane(static_cast<int>(threadIdx.x % 32)), C(H * D), ld(3 * C),
          quads((D + 3) / 4) {}
};

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

// One work item: the first row of its tile, its (batch, head) and where that
// head starts in a [B, T, width] tensor.
struct Work {
    std::int64_t row0, bh, b, h;
    [[nodiscard]] __device__ std::int64_t offset(std::int64_t T, std::int64_t width, int D) const {
        return b * T * width + h * D;
    }
};

// Item `item` of `items`: the tiles of the longest work first, which are
// the last query tiles (last_first) or the first key tiles. Tiles are
// `rows` rows (these kernels' 32; the bf16 kernels' 64).
__device__ inline Work work_of(std::int64_t item, const Items& items, std::int64_t H, bool last_first,
                               std::int64_t rows = tile_rows) {
    const std::int64_t rank = item / items.heads;
    const std::int64_t tile = last_first ? items.tiles - 1 - rank : rank;
    const std::int64_t bh = item % items.heads;
    return {tile * rows, bh, bh / H, bh % H};
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

// The K and V tiles of keys [j0, j0 + 32) of the head whose q starts at q.
template <int Chunks>
__device__ inline void load_keys(float* k_tile, float* v_tile, const float* q, const Frame& f, std::int64_t j0,
                                 std::int64_t T, int D) {
    load_tile<Chunks>(k_tile, q + f.C, f.ld, j0, T, D);
    load_tile<Chunks>(v_tile, q + 2 * f.C, f.ld, j0, T, D);
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

// The causal mask, within a pair of tiles: below (or past) the diagonal tile
// every query sees every key; on it, query x sees keys up to x.
__device__ inline bool sees(bool diagonal, int key, int query) { return !diagonal || key <= query; }

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

// One head's rows in the backward's inputs: q (its k and v C and 2C
// further, rows ld apart), out and dout (rows C apart) and lse (one per row).
struct HeadInputs {
    const float* q;
    const float* out;
    const float* dout;
    const float* lse;
};
__device__ inline HeadInputs head_inputs(const Work& w, const float* qkv, const float* out, const float* dout,
                                         const float* lse, std::int64_t T, const Frame& f, int D) {
    return {qkv + w.offset(T, f.ld, D), out + w.offset(T, f.C, D), dout + w.offset(T, f.C, D), lse + w.bh * T};
}

// What the backward needs of query row i: its saved log-sum-exp and
// D_i = rowsum(dO_i * O_i); both 0 for a row at or past T, whose p is never
// used. Called with warp-uniform arguments, so both passes form the same
// bits.
struct QueryStats {
    float lse, di;
};
__device__ inline QueryStats query_stats(const HeadInputs& in, std::int64_t i, std::int64_t T, std::int64_t C, int D) {
    QueryStats stats{0.0f, 0.0f};
    if (i < T) {
        stats.di = row_dot_warp(in.out + i * C, in.dout + i * C, D);
        stats.lse = in.lse[i];
    }
    return stats;
}

// The backward's P and dS of the warp's 8 rows against the lane's row:
// p = exp(scaled(Q.K) - lse) where seen(r), else 0, and ds = p * (dO.V - D_i).
// The dK/dV pass (rows: keys; lane: a query) and the dQ pass (rows: queries;
// lane: a key) both call this with their tiles' rows swapped, so they form
// the same bits (dot_rows' sums do not depend on which side is the warp's).
template <int Chunks, class Seen, class Lse, class Di>
__device__ inline void probabilities(float (&p)[rows_per_warp], float (&ds)[rows_per_warp], const float* warp_score,
                                     const float* lane_score, const float* warp_grad, const float* lane_grad,
                                     int quads, float scale, Seen seen, Lse lse, Di di) {
    dot_rows<Chunks>(p, warp_score, lane_score, quads);
    dot_rows<Chunks>(ds, warp_grad, lane_grad, quads);
#pragma unroll
    for (int r = 0; r < rows_per_warp; ++r) {
        p[r] = seen(r) ? expf(scaled(p[r], scale) - lse(r)) : 0.0f;
        ds[r] = p[r] * (ds[r] - di(r));
    }
}

// The lane's columns lane, lane + 32, ... of row `row` of a tile.
template <int Chunks>
__device__ inline void lane_columns(float (&values)[Chunks], const float* tile, int row) {
    const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
    for (int c = 0; c < Chunks; ++c) values[c] = tile[row * Tile<Chunks>::stride + lane + 32 * c];
}

// acc += w * values, w the `weight` of lane `from` (called by the whole warp).
template <int Chunks>
__device__ inline void add_shuffled(float (&acc)[Chunks], float weight, int from, const float (&values)[Chunks]) {
    const float w = __shfl_sync(0xffff'ffffu, weight, from);
#pragma unroll
    for (int c = 0; c < Chunks; ++c) acc[c] = fmaf(w, values[c], acc[c]);
}

// acc[r] += weight[r] (lane j's) * row j of the tile, over rows j < n in
// order, for the (r, j) that take(r, j) admits. A row not taken is skipped,
// not multiplied by 0: a NaN in it reaches no accumulator that should not
// see it. take must be uniform over the warp, so each shuffle has all 32
// lanes.
template <int Chunks, class Take>
__device__ inline void accumulate_rows(float (&acc)[rows_per_warp][Chunks], const float (&weight)[rows_per_warp],
                                       const float* tile, int n, Take take) {
    for (int j = 0; j < n; ++j) {
        float values[Chunks];
        lane_columns<Chunks>(values, tile, j);
#pragma unroll
        for (int r = 0; r < rows_per_warp; ++r)
            if (take(r, j)) add_shuffled<Chunks>(acc[r], weight[r], j, values);
    }
}

template <int Chunks>
__device__ inline void zero(float (&acc)[rows_per_warp][Chunks]) {
#pragma unroll
    for (int r = 0; r < rows_per_warp; ++r) {
#pragma unroll
        for (int c = 0; c < Chunks; ++c) acc[r][c] = 0.0f;
    }
}

// row[d] = value(c) for the lane's columns d = lane + 32c < D.
template <int Chunks, class Value>
__device__ inline void store_lane_columns(float* row, int D, Value value) {
    const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
    for (int c = 0; c < Chunks; ++c) {
        const int d = lane + 32 * c;
        if (d < D) row[d] = value(c);
    }
}

}  // namespace loom::kernels::cuda::attention_detail
