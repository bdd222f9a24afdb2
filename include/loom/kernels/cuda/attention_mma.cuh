// Causal multi-head attention at MatmulPrecision::bf16 in FlashAttention-2's
// register layout: the arithmetic of the host's emulation
// (kernels/host/attention_bf16.hpp), its products as mma.sync.m16n8k16 bf16
// instructions whose f32 results stay in registers, where the softmax reads
// them and turns them into the next product's operand. The first tensor-core
// kernels, on wmma (now dev/kernel_lab/attention_wmma.cuh, not shipped), took
// each block of scores through shared memory instead (a wmma fragment's
// layout is not specified), and an H200 measured them 4 to 15 times behind
// PyTorch's SDPA.
//
//   forward   S = q k^T on bf16 q, k (f32 sums); the online softmax in f32,
//             its shift moved in whole multiples of ln 2 (bf16_softmax_shift);
//             P rounded to bf16; out += P v on bf16 P, v
//   backward  D_i = rowsum(dO * out) once per query row (a pass of its own);
//             S^T = k q^T and dP^T = v dO^T, P = exp(S - lse) and
//             dS = P * (dP - D_i) in f32; dV += P^T dO and dK += dS^T q on
//             bf16 P, dS, dO, q (one block per key tile); then S, dP again and
//             dQ += dS k (one block per query tile: no atomics, so the sums'
//             order depends on the shape alone and the result is
//             deterministic)
//
// The products are mma_fragments.cuh's: mma.sync.m16n8k16 results, whose
// layout PTX specifies, so that two adjacent result blocks of a row band,
// rounded in pairs, are the next product's A operand (as_operand) and P and
// dS never leave registers; ldmatrix (.trans for v, dO, q and k as the
// second operand of P v, P^T dO, dS^T q, dS k) loads the rest.
//
// Tiles. A block is 4 warps and a tile 64 rows, 16 per warp (mma's m). q, k,
// v and dO are rounded to bf16 as they are copied into shared memory, 64 rows
// x Width (32, 64 or 128: the smallest >= D, zero-padded) with rows 8
// elements longer, so that ldmatrix's eight 16-byte rows fall in different
// banks. On the diagonal tile a warp skips the 16-wide blocks its rows
// cannot see; they are masked anyway, so skipping them is exact.
//
// On an H200 (run 5, docs/cuda.md) its tests (tests/cuda/test_kernels_attention_bf16.cu,
// the "mma.sync" cases) passed, compute-sanitizer's racecheck, synccheck and
// memcheck found nothing, and forward + backward ran at 60.7 and 74.9 TFLOP/s
// (seq 1024 and 4096), 3.9 and 3.8 times the wmma kernels. They are what
// attention_*_bf16_inputs (attention_bf16_inputs.cuh) runs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "loom/core/check_cuda.hpp"
#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/cuda/attention.cuh"
#include "loom/kernels/cuda/attention_bf16_fits.cuh"
#include "loom/kernels/cuda/attention_tiles.cuh"
#include "loom/kernels/cuda/mma_fragments.cuh"
#include "loom/kernels/cuda/stream_scratch.cuh"

namespace loom::kernels::cuda {

namespace attention_mma_detail {

using attention_detail::Items;
using attention_detail::scaled;
using attention_detail::Work;
using attention_detail::work_of;
using mma_fragments::as_operand;
using mma_fragments::bf16_t;
using mma_fragments::Lane;
using mma_fragments::lane_id;
using mma_fragments::load_a;
using mma_fragments::load_b_columns;
using mma_fragments::load_b_rows;
using mma_fragments::mma;
using mma_fragments::packed;
using mma_fragments::row_max;
using mma_fragments::row_sum;
using mma_fragments::zero;

inline constexpr int warps = 4;
inline constexpr int block_threads = warps * 32;
inline constexpr int band = 16;                 // rows of a warp: mma's m
inline constexpr int tile_rows = warps * band;  // 64 queries or keys
inline constexpr int bands = tile_rows / band;  // 16-wide blocks of a tile's rows (and of a score row)
inline constexpr int score_blocks = tile_rows / 8;  // 8-wide C blocks of a warp's 16 x 64 scores

template <int Width>
struct Tile {
    static_assert(Width == 32 || Width == 64 || Width == 128, "tiles hold 32, 64 or 128 columns");
    // 2 Width + 16 bytes a row (20, 36 or 68 four-byte banks: 4 more than a
    // multiple of 8, mod 32), so eight rows' 16-byte ldmatrix reads start in
    // eight different groups of 4 banks and cover all 32 banks once.
    static constexpr int ld = Width + 8;
    static constexpr int k_steps = Width / 16;  // 16-wide blocks of a row: products over d
    static constexpr int d_blocks = Width / 8;  // 8-wide C blocks of a 16 x Width result
    static constexpr std::size_t bytes = static_cast<std::size_t>(tile_rows) * ld * sizeof(bf16_t);
};

// Shared memory a block of each kernel uses: the forward's q, k and v tiles;
// the dK/dV pass's k, v, q and dO tiles and the query tile's lse and D_i;
// the dQ pass's q, dO, k and v tiles. Launchers and tests read these.
template <int Width>
inline constexpr std::size_t forward_shared_bytes = 3 * Tile<Width>::bytes;
template <int Width>
inline constexpr std::size_t dkdv_shared_bytes = 4 * Tile<Width>::bytes + 2 * tile_rows * sizeof(float);
template <int Width>
inline constexpr std::size_t dq_shared_bytes = 4 * Tile<Width>::bytes;

// Tile `index` of a block's shared memory, the tiles back to back.
template <int Width>
__device__ inline bf16_t* tile_at(unsigned char* shared, int index) {
    return reinterpret_cast<bf16_t*>(shared) + index * tile_rows * Tile<Width>::ld;
}

// c[16 x 64] = rows [16 x Width] times tile[64 x Width]^T, over the 16-wide
// column blocks first..last (the others are left at 0): S = q k^T,
// S^T = k q^T, dP = dO v^T, dP^T = v dO^T. Called by one warp, `rows` its
// band of a tile.
template <int Width>
__device__ inline void product_abt(float (&c)[score_blocks][4], const bf16_t* rows_tile, int row0,
                                   const bf16_t* tile, int first, int last) {
    zero<score_blocks>(c);
#pragma unroll
    for (int kk = 0; kk < Tile<Width>::k_steps; ++kk) {
        unsigned a[4];
        load_a(a, rows_tile, Tile<Width>::ld, row0, kk * 16);
#pragma unroll
        for (int n = 0; n < bands; ++n) {
            if (n < first || n > last) continue;
            unsigned b[4];
            load_b_rows(b, tile, Tile<Width>::ld, n * 16, kk * 16);
            mma(c[2 * n], a, b[0], b[1]);
            mma(c[2 * n + 1], a, b[2], b[3]);
        }
    }
}

// acc[16 x Width] += weights[16 x 64] (bf16 of the f32 c) times tile[64 x
// Width], over the 16-row blocks first..last of the tile (the weights' other
// columns are 0): out += P v, dV += P^T dO, dK += dS^T q, dQ += dS k.
template <int Width>
__device__ inline void accumulate_product(float (&acc)[Tile<Width>::d_blocks][4],
                                          const float (&weights)[score_blocks][4], const bf16_t* tile, int first,
                                          int last) {
#pragma unroll
    for (int kk = 0; kk < bands; ++kk) {
        if (kk < first || kk > last) continue;
        unsigned a[4];
        as_operand(a, weights, kk);
#pragma unroll
        for (int n = 0; n < Tile<Width>::k_steps; ++n) {
            unsigned b[4];
            load_b_columns(b, tile, Tile<Width>::ld, kk * 16, n * 16);
            mma(acc[2 * n], a, b[0], b[1]);
            mma(acc[2 * n + 1], a, b[2], b[3]);
        }
    }
}

// Rows [row0, row0 + 64) of a matrix whose row t starts at src + t * ld_src,
// columns [0, D), rounded to bf16 into a tile; rows at or past T and columns
// at or past D as 0. Four floats a load where `quads` (D % 4 == 0 and src,
// ld_src 16-byte aligned). Called by the whole block.
template <int Width>
__device__ inline void load_rounded(bf16_t* tile, const float* src, std::int64_t ld_src, std::int64_t row0,
                                    std::int64_t T, int D, bool quads) {
    constexpr int ld = Tile<Width>::ld;
    if (quads) {
        constexpr int per_row = Width / 4, per_thread = tile_rows * per_row / block_threads;
        static_assert(tile_rows * per_row % block_threads == 0, "every thread copies as many quads");
#pragma unroll
        for (int i = 0; i < per_thread; ++i) {
            const int index = static_cast<int>(threadIdx.x) + i * block_threads;
            const int r = index / per_row, c = index % per_row * 4;
            const std::int64_t row = row0 + r;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (row < T && c < D) v = *reinterpret_cast<const float4*>(src + row * ld_src + c);
            const uint2 pair{packed(v.x, v.y), packed(v.z, v.w)};
            *reinterpret_cast<uint2*>(tile + r * ld + c) = pair;
        }
        return;
    }
    for (int index = static_cast<int>(threadIdx.x); index < tile_rows * Width; index += block_threads) {
        const int r = index / Width, c = index % Width;
        const std::int64_t row = row0 + r;
        tile[r * ld + c] = __float2bfloat16_rn(row < T && c < D ? src[row * ld_src + c] : 0.0f);
    }
}

// The lane's d-columns of a warp's 16 x Width results times `factor`, to
// row `half` (dst the row's column 0), columns below D.
template <int Width>
__device__ inline void write_row(float* dst, const float (&acc)[Tile<Width>::d_blocks][4], const Lane& at, int half,
                                 int D, float factor) {
#pragma unroll
    for (int n = 0; n < Tile<Width>::d_blocks; ++n)
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
            const int d = at.column(n, pair);
            if (d < D) dst[d] = acc[n][2 * half + pair] * factor;
        }
}

template <int Width>
__global__ void __launch_bounds__(block_threads)
    forward_kernel(const float* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse, std::int64_t T,
                   std::int64_t H, int D, float scale, Items items, bool quads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // refused on the host before the launch: bf16 mma needs sm_80
#else
    extern __shared__ __align__(128) unsigned char attention_mma_shared[];
    bf16_t* q_tile = tile_at<Width>(attention_mma_shared, 0);
    bf16_t* k_tile = tile_at<Width>(attention_mma_shared, 1);
    bf16_t* v_tile = tile_at<Width>(attention_mma_shared, 2);
    const int warp = static_cast<int>(threadIdx.x / 32), row0 = warp * band;
    const Lane at;
    const std::int64_t C = H * D, ld = 3 * C;
    // Uniform over the block: every thread reaches every barrier.
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const Work w = work_of(item, items, H, /*last_first=*/true, tile_rows);
        const float* q = qkv + w.b * T * ld + w.h * D;
        const std::int64_t i0 = w.row0;
        const std::int64_t query[2] = {i0 + row0 + at.row(0), i0 + row0 + at.row(1)};
        __syncthreads();  // the previous item's readers of the tiles are done
        load_rounded<Width>(q_tile, q, ld, i0, T, D, quads);
        float running_max[2] = {-INFINITY, -INFINITY}, running_sum[2] = {0.0f, 0.0f};
        float acc[Tile<Width>::d_blocks][4];
        zero<Tile<Width>::d_blocks>(acc);
        for (std::int64_t j0 = 0; j0 <= i0; j0 += tile_rows) {
            __syncthreads();  // the previous key tile's readers are done
            load_rounded<Width>(k_tile, q + C, ld, j0, T, D, quads);
            load_rounded<Width>(v_tile, q + 2 * C, ld, j0, T, D, quads);
            __syncthreads();
            // On the diagonal tile the warp's queries see key blocks 0..warp only.
            const int last = j0 == i0 ? warp : bands - 1;
            float s[score_blocks][4];
            product_abt<Width>(s, q_tile, row0, k_tile, 0, last);
            float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < score_blocks; ++n)
#pragma unroll
                for (int half = 0; half < 2; ++half)
#pragma unroll
                    for (int pair = 0; pair < 2; ++pair) {
                        float& v = s[n][2 * half + pair];
                        v = j0 + at.column(n, pair) <= query[half] ? scaled(v, scale) : -INFINITY;
                        tile_max[half] = fmaxf(tile_max[half], v);
                    }
            float rescale[2];
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                // Key j0 is seen by every query of the tile: the max is finite.
                // A max that moved moves to a whole multiple of ln 2, as the
                // host's emulation's does (bf16_softmax_shift).
                const float seen_max = row_max(tile_max[half]);
                const float new_max =
                    seen_max > running_max[half] ? bf16_softmax_shift(seen_max) : running_max[half];
                rescale[half] = expf(running_max[half] - new_max);  // 0 on the first tile
                running_max[half] = new_max;
            }
            float sum[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < score_blocks; ++n)
#pragma unroll
                for (int half = 0; half < 2; ++half)
#pragma unroll
                    for (int pair = 0; pair < 2; ++pair) {
                        float& v = s[n][2 * half + pair];
                        v = expf(v - running_max[half]);  // e^-inf = 0 where masked
                        sum[half] += v;                   // the unrounded p, as the host emulation sums
                    }
#pragma unroll
            for (int half = 0; half < 2; ++half)
                running_sum[half] = running_sum[half] * rescale[half] + row_sum(sum[half]);
#pragma unroll
            for (int n = 0; n < Tile<Width>::d_blocks; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[n][e] *= rescale[e / 2];
            accumulate_product<Width>(acc, s, v_tile, 0, last);  // out += P v, P rounded to bf16
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (query[half] >= T) continue;
            write_row<Width>(out + (w.b * T + query[half]) * C + w.h * D, acc, at, half, D,
                             1.0f / running_sum[half]);
            if (at.t == 0) lse[w.bh * T + query[half]] = running_max[half] + logf(running_sum[half]);
        }
    }
#endif
}

// D_i = rowsum(dO_i * out_i) of every (batch, head, query): di[bh * T + i],
// one warp a row, in attention_detail::row_dot_warp's order (the D_i of
// dev/kernel_lab's wmma kernels, bit for bit). Both backward kernels read it, so it is formed
// once per row rather than once per (row, key tile).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    row_dots_kernel(const float* __restrict__ out, const float* __restrict__ dout, float* __restrict__ di,
                    std::int64_t B, std::int64_t T, std::int64_t H, int D) {
    const std::int64_t rows = B * H * T, C = H * D;
    const std::int64_t first = (static_cast<std::int64_t>(blockIdx.x) * Threads + threadIdx.x) / 32;
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * (Threads / 32);
    for (std::int64_t r = first; r < rows; r += stride) {  // warp-uniform
        const std::int64_t bh = r / T, i = r % T, b = bh / H, h = bh % H;
        const std::int64_t at = (b * T + i) * C + h * D;
        const float value = attention_detail::row_dot_warp(out + at, dout + at, D);
        if (lane_id() == 0) di[r] = value;
    }
}

// P and dS of a warp's 16 x 64 block from its S (unscaled) and dP, in
// place, f32: where seen(half, column), p = e^(scale S - lse) and
// dS = p (dP - D_i), else 0. lse and D_i from lse_of and di_of(half, column).
template <class Seen, class Lse, class Di>
__device__ inline void probabilities(float (&s)[score_blocks][4], float (&dp)[score_blocks][4], const Lane& at,
                                     float scale, Seen seen, Lse lse_of, Di di_of) {
#pragma unroll
    for (int n = 0; n < score_blocks; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half)
#pragma unroll
            for (int pair = 0; pair < 2; ++pair) {
                const int c = at.column(n, pair), e = 2 * half + pair;
                const bool visible = seen(half, c);
                const float p = visible ? expf(scaled(s[n][e], scale) - lse_of(half, c)) : 0.0f;
                dp[n][e] = visible ? p * (dp[n][e] - di_of(half, c)) : 0.0f;
                s[n][e] = p;
            }
}

// dK and dV of one key tile, over the query tiles from the diagonal one.
// Shared memory: k, v, q, dO tiles, then the query tile's lse and D_i.
template <int Width>
__global__ void __launch_bounds__(block_threads)
    backward_dkdv_kernel(const float* __restrict__ qkv, const float* __restrict__ dout, const float* __restrict__ lse,
                         const float* __restrict__ di, float* __restrict__ dqkv, std::int64_t T, std::int64_t H, int D,
                         float scale, Items items, bool quads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    extern __shared__ __align__(128) unsigned char attention_mma_shared[];
    bf16_t* k_tile = tile_at<Width>(attention_mma_shared, 0);
    bf16_t* v_tile = tile_at<Width>(attention_mma_shared, 1);
    bf16_t* q_tile = tile_at<Width>(attention_mma_shared, 2);
    bf16_t* dout_tile = tile_at<Width>(attention_mma_shared, 3);
    float* lse_rows = reinterpret_cast<float*>(tile_at<Width>(attention_mma_shared, 4));
    float* di_rows = lse_rows + tile_rows;
    const int warp = static_cast<int>(threadIdx.x / 32), row0 = warp * band;
    const Lane at;
    const std::int64_t C = H * D, ld = 3 * C;
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        // The first key tiles see the most queries: started first.
        const Work w = work_of(item, items, H, /*last_first=*/false, tile_rows);
        const float* q_head = qkv + w.b * T * ld + w.h * D;
        const float* dout_head = dout + w.b * T * C + w.h * D;
        const std::int64_t j0 = w.row0;
        const std::int64_t key[2] = {j0 + row0 + at.row(0), j0 + row0 + at.row(1)};
        __syncthreads();
        load_rounded<Width>(k_tile, q_head + C, ld, j0, T, D, quads);
        load_rounded<Width>(v_tile, q_head + 2 * C, ld, j0, T, D, quads);
        float dk[Tile<Width>::d_blocks][4], dv[Tile<Width>::d_blocks][4];
        zero<Tile<Width>::d_blocks>(dk);
        zero<Tile<Width>::d_blocks>(dv);
        for (std::int64_t i0 = j0; i0 < T; i0 += tile_rows) {
            __syncthreads();  // the previous query tile's readers are done
            load_rounded<Width>(q_tile, q_head, ld, i0, T, D, quads);
            load_rounded<Width>(dout_tile, dout_head, C, i0, T, D, quads);
            if (threadIdx.x < tile_rows) {
                const std::int64_t i = i0 + threadIdx.x;
                lse_rows[threadIdx.x] = i < T ? lse[w.bh * T + i] : 0.0f;
                di_rows[threadIdx.x] = i < T ? di[w.bh * T + i] : 0.0f;
            }
            __syncthreads();
            // On the diagonal tile query blocks before the warp's keys see none of them.
            const int first = i0 == j0 ? warp : 0;
            float s[score_blocks][4], dp[score_blocks][4];
            product_abt<Width>(s, k_tile, row0, q_tile, first, bands - 1);      // S^T = k q^T
            product_abt<Width>(dp, v_tile, row0, dout_tile, first, bands - 1);  // dP^T = v dO^T
            probabilities(
                s, dp, at, scale,
                [&](int half, int c) { return key[half] <= i0 + c && i0 + c < T; },
                [&](int, int c) { return lse_rows[c]; }, [&](int, int c) { return di_rows[c]; });
            accumulate_product<Width>(dv, s, dout_tile, first, bands - 1);  // dV += P^T dO
            accumulate_product<Width>(dk, dp, q_tile, first, bands - 1);    // dK += dS^T q
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (key[half] >= T) continue;
            float* grad_row = dqkv + (w.b * T + key[half]) * ld + w.h * D;
            write_row<Width>(grad_row + C, dk, at, half, D, scale);
            write_row<Width>(grad_row + 2 * C, dv, at, half, D, 1.0f);
        }
    }
#endif
}

// dQ of one query tile, over the key tiles up to the diagonal one.
// Shared memory: q, dO, k, v tiles.
template <int Width>
__global__ void __launch_bounds__(block_threads)
    backward_dq_kernel(const float* __restrict__ qkv, const float* __restrict__ dout, const float* __restrict__ lse,
                       const float* __restrict__ di, float* __restrict__ dqkv, std::int64_t T, std::int64_t H, int D,
                       float scale, Items items, bool quads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    extern __shared__ __align__(128) unsigned char attention_mma_shared[];
    bf16_t* q_tile = tile_at<Width>(attention_mma_shared, 0);
    bf16_t* dout_tile = tile_at<Width>(attention_mma_shared, 1);
    bf16_t* k_tile = tile_at<Width>(attention_mma_shared, 2);
    bf16_t* v_tile = tile_at<Width>(attention_mma_shared, 3);
    const int warp = static_cast<int>(threadIdx.x / 32), row0 = warp * band;
    const Lane at;
    const std::int64_t C = H * D, ld = 3 * C;
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const Work w = work_of(item, items, H, /*last_first=*/true, tile_rows);
        const float* q_head = qkv + w.b * T * ld + w.h * D;
        const float* dout_head = dout + w.b * T * C + w.h * D;
        const std::int64_t i0 = w.row0;
        const std::int64_t query[2] = {i0 + row0 + at.row(0), i0 + row0 + at.row(1)};
        float lse_row[2], di_row[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const bool real = query[half] < T;
            lse_row[half] = real ? lse[w.bh * T + query[half]] : 0.0f;
            di_row[half] = real ? di[w.bh * T + query[half]] : 0.0f;
        }
        __syncthreads();
        load_rounded<Width>(q_tile, q_head, ld, i0, T, D, quads);
        load_rounded<Width>(dout_tile, dout_head, C, i0, T, D, quads);
        float dq[Tile<Width>::d_blocks][4];
        zero<Tile<Width>::d_blocks>(dq);
        for (std::int64_t j0 = 0; j0 <= i0; j0 += tile_rows) {
            __syncthreads();  // the previous key tile's readers are done
            load_rounded<Width>(k_tile, q_head + C, ld, j0, T, D, quads);
            load_rounded<Width>(v_tile, q_head + 2 * C, ld, j0, T, D, quads);
            __syncthreads();
            const int last = j0 == i0 ? warp : bands - 1;
            float s[score_blocks][4], dp[score_blocks][4];
            product_abt<Width>(s, q_tile, row0, k_tile, 0, last);      // S = q k^T
            product_abt<Width>(dp, dout_tile, row0, v_tile, 0, last);  // dP = dO v^T
            probabilities(
                s, dp, at, scale, [&](int half, int c) { return j0 + c <= query[half] && query[half] < T; },
                [&](int half, int) { return lse_row[half]; }, [&](int half, int) { return di_row[half]; });
            accumulate_product<Width>(dq, dp, k_tile, 0, last);  // dQ += dS k
        }
#pragma unroll
        for (int half = 0; half < 2; ++half)
            if (query[half] < T)
                write_row<Width>(dqkv + (w.b * T + query[half]) * ld + w.h * D, dq, at, half, D, scale);
    }
#endif
}

// Four floats a load when D % 4 == 0 and every matrix starts 16-byte aligned
// (rows are then 16-byte multiples apart too: 3C or C floats).
[[nodiscard]] inline bool quads_fit(std::int64_t D, std::initializer_list<const float*> matrices) {
    if (D % 4 != 0) return false;
    for (const float* m : matrices)
        if (reinterpret_cast<std::uintptr_t>(m) % 16 != 0) return false;
    return true;
}

[[nodiscard]] inline Items items_of(std::int64_t B, std::int64_t T, std::int64_t H) {
    return Items{B * H, (T + tile_rows - 1) / tile_rows};
}

template <int Width>
void forward(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T, std::int64_t H, int D,
             float scale, cudaStream_t stream) {
    const Items items = items_of(B, T, H);
    constexpr std::size_t bytes = forward_shared_bytes<Width>;
    static OncePerDevice set_up;
    set_up([D](int device) {
        attention_detail::check_bf16_device_fits("attention_forward", D, bytes, device);
        attention_detail::allow_shared(forward_kernel<Width>, bytes);
    });
    forward_kernel<Width><<<attention_detail::blocks_for_items(items.count()), block_threads, bytes, stream>>>(
        qkv, out, lse, T, H, D, scale, items, quads_fit(D, {qkv}));
    LOOM_CUDA_CHECK_LAUNCH();
}

template <int Width>
void backward(const float* qkv, const float* out, const float* dout, const float* lse, float* dqkv, std::int64_t B,
              std::int64_t T, std::int64_t H, int D, float scale, StreamScratch& scratch, cudaStream_t stream) {
    const Items items = items_of(B, T, H);
    constexpr std::size_t dkdv_bytes = dkdv_shared_bytes<Width>;
    constexpr std::size_t dq_bytes = dq_shared_bytes<Width>;
    static OncePerDevice set_up;
    set_up([D](int device) {
        attention_detail::check_bf16_device_fits("attention_backward", D, dkdv_bytes, device);
        attention_detail::allow_shared(backward_dkdv_kernel<Width>, dkdv_bytes);
        attention_detail::allow_shared(backward_dq_kernel<Width>, dq_bytes);
    });
    const bool quads = quads_fit(D, {qkv, dout});
    StreamScratchUse use(scratch, stream);
    auto* di = static_cast<float*>(scratch.acquire(static_cast<std::size_t>(B * H * T) * sizeof(float), stream));
    const std::int64_t row_blocks = (B * H * T + block_threads / 32 - 1) / (block_threads / 32);
    row_dots_kernel<block_threads>
        <<<attention_detail::blocks_for_items(row_blocks), block_threads, 0, stream>>>(out, dout, di, B, T, H, D);
    LOOM_CUDA_CHECK_LAUNCH();
    const unsigned int blocks = attention_detail::blocks_for_items(items.count());
    backward_dkdv_kernel<Width>
        <<<blocks, block_threads, dkdv_bytes, stream>>>(qkv, dout, lse, di, dqkv, T, H, D, scale, items, quads);
    LOOM_CUDA_CHECK_LAUNCH();
    backward_dq_kernel<Width>
        <<<blocks, block_threads, dq_bytes, stream>>>(qkv, dout, lse, di, dqkv, T, H, D, scale, items, quads);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace attention_mma_detail

// Causal multi-head self-attention at MatmulPrecision::bf16 on mma.sync, as
// host::attention_forward_bf16_inputs: qkv [B, T, 3C] in, out [B, T, C] and
// lse [B, H, T] written, all f32 on the device; D <= 128.
inline void attention_forward_bf16_mma(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                                       std::int64_t H, std::int64_t D, cudaStream_t stream = nullptr) {
    if (!attention_detail::check_forward(qkv, out, lse, B, T, H, D)) return;
    attention_detail::for_head_size(D, [&]<int Chunks>() {
        attention_mma_detail::forward<32 * Chunks>(qkv, out, lse, B, T, H, static_cast<int>(D), attention_scale(D),
                                                   stream);
    });
}

// dqkv [B, T, 3C], written, as host::attention_backward_bf16_inputs. Three
// launches on `stream`: D_i, dK and dV, then dQ; D_i lives in `scratch`
// (B H T floats).
inline void attention_backward_bf16_mma(const float* qkv, const float* out, const float* dout, const float* lse,
                                        float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                                        StreamScratch& scratch, cudaStream_t stream = nullptr) {
    if (!attention_detail::check_backward(qkv, out, dout, lse, dqkv, B, T, H, D)) return;
    attention_detail::for_head_size(D, [&]<int Chunks>() {
        attention_mma_detail::backward<32 * Chunks>(qkv, out, dout, lse, dqkv, B, T, H, static_cast<int>(D),
                                                    attention_scale(D), scratch, stream);
    });
}

}  // namespace loom::kernels::cuda
