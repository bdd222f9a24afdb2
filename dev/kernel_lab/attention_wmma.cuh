// Kernel lab (dev/kernel_lab/README.md): not shipped, not installed. The
// first tensor-core attention kernels, kept as the reference that the shipped
// mma.sync kernels (include/loom/kernels/cuda/attention_mma.cuh) were
// measured against; bench/gpu/kernels.cu times both (dtype=bf16_wmma), and
// tests/simulated runs this device code on simulated warps against the host's
// emulation. They left include/ because a second complete bf16 attention,
// 3.8 times slower, is not something a user should be offered
// (docs/design.md).
//
// Causal multi-head attention at MatmulPrecision::bf16, its products on the
// tensor cores through wmma: the arithmetic of kernels/host/attention_bf16.hpp.
// Same layouts, arguments, checks and messages as kernels/cuda/attention.cuh
// (f32 qkv in, f32 out, lse and dqkv); what differs is the arithmetic of the
// products, which is the host emulation's:
//
//   forward   S = q k^T on bf16 q, k (f32 sums); the online softmax in f32;
//             P rounded to bf16; out += P v on bf16 P, v
//   backward  dP = dO v^T and S again on bf16 operands; P = exp(S - lse) and
//             dS = P * (dP - D_i) in f32 (D_i from the f32 out and dO);
//             dV += P^T dO, dK += dS^T q, dQ += dS k on bf16 P, dS, dO, q, k
//
// The operands are rounded (to nearest, ties to even) as the tiles are
// copied from global memory into shared memory, so nothing besides the
// kernels' shared memory is needed.
//
// Tiles. A block is 4 warps; a block tile is 64 rows, 16 per warp (the m of
// a 16 x 16 x 16 bf16 wmma fragment). q, k, v and dO tiles are bf16 in shared
// memory, 64 rows x Width columns (Width = 32, 64 or 128: the smallest >= D,
// padded with zeros), rows 8 elements longer than Width so that the
// fragments' rows start in different banks. Each warp forms its 16 x 64 block
// of scores with wmma into shared memory, where two lanes per row apply the
// mask and the softmax (a wmma accumulator's element-to-lane layout is not
// specified, so elementwise work goes through memory rather than relying on
// it) and write P or dS back as bf16 for the next product.
//
//   forward     one block per (batch, head, query tile); the output
//               accumulators are wmma fragments, moved through shared memory
//               once per key tile to be rescaled by the new running max.
//   dK, dV      one block per (batch, head, key tile), walking the query
//               tiles from the diagonal one: dK and dV stay in fragments.
//   dQ          one block per (batch, head, query tile), a second pass over
//               the key tiles up to the diagonal (no atomics, as in
//               attention.cuh: the sums' order depends on the shape alone).
// On the diagonal tile a warp skips the 16 x 16 sub-tiles its rows cannot
// see. On an H200 these kernels passed their tests and ran 4 to 15 times
// behind PyTorch's SDPA (docs/performance.md): the scores' round trip
// through shared memory and the elementwise work two lanes a row are the
// cost. attention_mma.cuh keeps P in registers, FlashAttention-2's layout,
// and ran 3.8 to 3.9 times as fast (run 5).
//
// Needs compute capability 8.0 (bf16 wmma) and, for heads over 64 features,
// up to 121 KiB of shared memory a block; a GPU without either is refused
// with a message (kernels/cuda/attention_bf16_fits.cuh, shared with the mma
// kernels). Included by path from the repository root (bench/gpu/kernels.cu);
// it needs loom's include/ on the include path.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <mma.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loom/core/check_cuda.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/attention.cuh"
#include "loom/kernels/cuda/attention_bf16_fits.cuh"
#include "loom/kernels/cuda/attention_tiles.cuh"

namespace loom::kernels::cuda {

namespace attention_bf16_detail {

namespace wmma = nvcuda::wmma;
using bf16_t = __nv_bfloat16;
using attention_detail::Items;

inline constexpr int warps = 4;
inline constexpr int block_threads = warps * 32;
inline constexpr int fragment = 16;                    // m = n = k of a bf16 wmma fragment
inline constexpr int tile_rows = warps * fragment;     // 64 queries or keys
inline constexpr int subtiles = tile_rows / fragment;  // 16-wide column blocks of a 64-wide score block
inline constexpr int score_ld = tile_rows + 4;         // f32 row stride of a warp's 16 x 64 scores
inline constexpr int weight_ld = tile_rows + 8;        // bf16 row stride of a warp's 16 x 64 P or dS
inline constexpr unsigned full_mask = 0xffff'ffffu;

using FragmentA = wmma::fragment<wmma::matrix_a, fragment, fragment, fragment, bf16_t, wmma::row_major>;
using FragmentBRows = wmma::fragment<wmma::matrix_b, fragment, fragment, fragment, bf16_t, wmma::row_major>;
using FragmentBColumns = wmma::fragment<wmma::matrix_b, fragment, fragment, fragment, bf16_t, wmma::col_major>;
using Accumulator = wmma::fragment<wmma::accumulator, fragment, fragment, fragment, float>;

// A bf16 tile of 64 rows x Width columns, and a warp's f32 16 x Width block.
template <int Width>
struct Tile {
    static_assert(Width == 32 || Width == 64 || Width == 128, "tiles hold 32, 64 or 128 columns");
    static constexpr int ld = Width + 8;
    static constexpr int blocks = Width / fragment;  // 16-wide column blocks of a row
    static constexpr int out_ld = Width + 4;
    static constexpr std::size_t bytes = static_cast<std::size_t>(tile_rows) * ld * sizeof(bf16_t);
};

// Byte offsets into the dynamic shared memory; every region starts on a
// 32-byte boundary, as wmma's loads and stores require (each size below is a
// multiple of 32 bytes for every Width).
template <int Width>
struct ForwardRegions {
    static constexpr std::size_t q = 0, k = q + Tile<Width>::bytes, v = k + Tile<Width>::bytes,
                                 scores = v + Tile<Width>::bytes,
                                 weights = scores + warps * fragment * score_ld * sizeof(float),
                                 acc = weights + warps * fragment * weight_ld * sizeof(bf16_t),
                                 bytes = acc + warps * fragment * Tile<Width>::out_ld * sizeof(float);
    static_assert(k % 32 == 0 && v % 32 == 0 && scores % 32 == 0 && weights % 32 == 0 && acc % 32 == 0,
                  "wmma needs 32-byte aligned regions");
};

// Both backward passes: k, v, q and dO tiles, the query tile's lse and D_i,
// then per warp a pair of f32 score blocks (S, dP; adjacent, so that the
// pair also holds a 16 x Width block of results on the way out) and the bf16
// P and dS.
template <int Width>
struct BackwardRegions {
    static constexpr std::size_t k = 0, v = k + Tile<Width>::bytes, q = v + Tile<Width>::bytes,
                                 dout = q + Tile<Width>::bytes, lse = dout + Tile<Width>::bytes,
                                 di = lse + tile_rows * sizeof(float), pairs = di + tile_rows * sizeof(float),
                                 probs = pairs + warps * 2 * fragment * score_ld * sizeof(float),
                                 dscores = probs + warps * fragment * weight_ld * sizeof(bf16_t),
                                 bytes = dscores + warps * fragment * weight_ld * sizeof(bf16_t);
    static_assert(2 * score_ld >= Tile<Width>::out_ld, "a warp's score pair holds its 16 x Width results");
    static_assert(v % 32 == 0 && q % 32 == 0 && dout % 32 == 0 && lse % 32 == 0 && pairs % 32 == 0 &&
                      probs % 32 == 0 && dscores % 32 == 0,
                  "wmma needs 32-byte aligned regions");
};

// Per-warp and per-fragment strides, in bytes, stay on 32-byte boundaries too.
static_assert(fragment * score_ld * sizeof(float) % 32 == 0 && fragment * weight_ld * sizeof(bf16_t) % 32 == 0,
              "a warp's score and weight blocks keep wmma's 32-byte alignment");
template <int Width>
inline constexpr bool strides_aligned = fragment * Tile<Width>::ld * sizeof(bf16_t) % 32 == 0 &&
                                        fragment * Tile<Width>::out_ld * sizeof(float) % 32 == 0;
static_assert(strides_aligned<32> && strides_aligned<64> && strides_aligned<128>,
              "16-row blocks of the tiles keep wmma's 32-byte alignment");

template <class T>
__device__ inline T* region(unsigned char* shared, std::size_t offset) {
    return reinterpret_cast<T*>(shared + offset);
}

using attention_detail::Work;
using attention_detail::work_of;

// Rows [row0, row0 + 64) of a matrix whose row t starts at src + t * ld_src,
// columns [0, D), rounded to bf16 into a tile; rows at or past T and columns
// at or past D as 0. Called by the whole block.
template <int Width>
__device__ inline void load_rounded(bf16_t* tile, const float* src, std::int64_t ld_src, std::int64_t row0,
                                    std::int64_t T, int D) {
    for (int index = static_cast<int>(threadIdx.x); index < tile_rows * Width; index += block_threads) {
        const int r = index / Width, c = index % Width;
        const std::int64_t row = row0 + r;
        tile[r * Tile<Width>::ld + c] = __float2bfloat16_rn(row < T && c < D ? src[row * ld_src + c] : 0.0f);
    }
}

// scores[16 x 64] (f32) = a_rows [16 x Width] times b_tile [64 x Width]^T,
// for the 16-wide column blocks first..last (the others are left as they
// were; the callers mask them). The shape of S = Q K^T, S^T = K Q^T and
// dP = dO V^T alike. Called by one warp.
template <int Width>
__device__ inline void product_abt(float* scores, const bf16_t* a_rows, const bf16_t* b_tile, int first, int last) {
    constexpr int ld = Tile<Width>::ld;
    for (int n = first; n <= last; ++n) {
        Accumulator acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int k = 0; k < Tile<Width>::blocks; ++k) {
            FragmentA a;
            FragmentBColumns b;  // B[d][key] = b_tile[key][d]: the tile read column-major
            wmma::load_matrix_sync(a, a_rows + k * fragment, ld);
            wmma::load_matrix_sync(b, b_tile + n * fragment * ld + k * fragment, ld);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(scores + n * fragment, acc, score_ld, wmma::mem_row_major);
    }
}

// acc[16 x Width] += weights[16 x 64] (bf16) times b_tile [64 x Width], over
// the 16-row blocks first..last of b_tile (the weights' other columns are
// zero). The shape of out += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K.
template <int Width>
__device__ inline void accumulate_product(Accumulator (&acc)[Tile<Width>::blocks], const bf16_t* weights,
                                          const bf16_t* b_tile, int first, int last) {
    constexpr int ld = Tile<Width>::ld;
    for (int k = first; k <= last; ++k) {
        FragmentA a;
        wmma::load_matrix_sync(a, weights + k * fragment, weight_ld);
#pragma unroll
        for (int n = 0; n < Tile<Width>::blocks; ++n) {
            FragmentBRows b;
            wmma::load_matrix_sync(b, b_tile + k * fragment * ld + n * fragment, ld);
            wmma::mma_sync(acc[n], a, b, acc[n]);
        }
    }
}

template <int Width>
__device__ inline void zero(Accumulator (&acc)[Tile<Width>::blocks]) {
#pragma unroll
    for (int n = 0; n < Tile<Width>::blocks; ++n) wmma::fill_fragment(acc[n], 0.0f);
}

// The warp's 16 x Width accumulators into `rows` (f32, row stride out_ld).
template <int Width>
__device__ inline void store_rows(float* rows, const Accumulator (&acc)[Tile<Width>::blocks]) {
#pragma unroll
    for (int n = 0; n < Tile<Width>::blocks; ++n)
        wmma::store_matrix_sync(rows + n * fragment, acc[n], Tile<Width>::out_ld, wmma::mem_row_major);
    __syncwarp();
}

// Row `row` (0..15) of the warp's staged results, columns d < D of the
// lane's half, times `factor`, to dst[d]. Two lanes a row.
template <int Width>
__device__ inline void write_half_row(float* dst, const float* rows, int row, int half, int D, float factor) {
    const int begin = half * (Width / 2), end = begin + Width / 2;
    for (int d = begin; d < end && d < D; ++d) dst[d] = rows[row * Tile<Width>::out_ld + d] * factor;
}

template <int Width>
__global__ void __launch_bounds__(block_threads, 1)
    forward_kernel(const float* __restrict__ qkv, float* __restrict__ out, float* __restrict__ lse, std::int64_t T,
                   std::int64_t H, int D, float scale, Items items) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // refused on the host before the launch; bf16 wmma needs sm_80
#else
    using R = ForwardRegions<Width>;
    constexpr int out_ld = Tile<Width>::out_ld;
    extern __shared__ __align__(128) unsigned char attention_bf16_shared[];
    bf16_t* q_tile = region<bf16_t>(attention_bf16_shared, R::q);
    bf16_t* k_tile = region<bf16_t>(attention_bf16_shared, R::k);
    bf16_t* v_tile = region<bf16_t>(attention_bf16_shared, R::v);
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    float* scores = region<float>(attention_bf16_shared, R::scores) + warp * fragment * score_ld;
    bf16_t* weights = region<bf16_t>(attention_bf16_shared, R::weights) + warp * fragment * weight_ld;
    float* staged = region<float>(attention_bf16_shared, R::acc) + warp * fragment * out_ld;
    const int row = lane / 2, half = lane % 2;  // the lane's row of the warp's 16, and its half of the columns
    const std::int64_t C = H * D, ld = 3 * C;
    // Uniform over the block: every thread reaches every barrier.
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const Work w = work_of(item, items, H, /*last_first=*/true, tile_rows);
        const float* q = qkv + w.b * T * ld + w.h * D;
        const std::int64_t i0 = w.row0, query = i0 + warp * fragment + row;
        __syncthreads();  // the previous item's readers of the tiles are done
        load_rounded<Width>(q_tile, q, ld, i0, T, D);
        float running_max = -INFINITY, running_sum = 0.0f;
        Accumulator acc[Tile<Width>::blocks];
        zero<Width>(acc);
        for (std::int64_t j0 = 0; j0 <= i0; j0 += tile_rows) {
            __syncthreads();  // the previous key tile's readers are done
            load_rounded<Width>(k_tile, q + C, ld, j0, T, D);
            load_rounded<Width>(v_tile, q + 2 * C, ld, j0, T, D);
            __syncthreads();
            // On the diagonal tile the warp's queries see key blocks 0..warp only.
            const int last = j0 == i0 ? warp : subtiles - 1;
            product_abt<Width>(scores, q_tile + warp * fragment * Tile<Width>::ld, k_tile, 0, last);
            __syncwarp();
            const int c0 = half * (tile_rows / 2), c1 = c0 + tile_rows / 2;
            float tile_max = -INFINITY;
            for (int c = c0; c < c1; ++c)
                if (j0 + c <= query)
                    tile_max = fmaxf(tile_max, attention_detail::scaled(scores[row * score_ld + c], scale));
            tile_max = fmaxf(tile_max, __shfl_xor_sync(full_mask, tile_max, 1));
            // Key 0 is seen by every query: the first tile makes the max finite.
            // A max that moved moves to a whole multiple of ln 2, as the host's
            // emulation's does (bf16_softmax_shift): then where the tiles
            // happen to begin does not change how P rounds.
            const float new_max = tile_max > running_max ? bf16_softmax_shift(tile_max) : running_max;
            const float rescale = expf(running_max - new_max);  // 0 on the first tile
            float sum = 0.0f;
            for (int c = c0; c < c1; ++c) {
                const float p = j0 + c <= query
                                    ? expf(attention_detail::scaled(scores[row * score_ld + c], scale) - new_max)
                                    : 0.0f;
                sum += p;  // the unrounded p, as the host emulation sums
                weights[row * weight_ld + c] = __float2bfloat16_rn(p);
            }
            sum += __shfl_xor_sync(full_mask, sum, 1);
            __syncwarp();  // every lane's P is in `weights` before the warp's wmma loads read it
            running_sum = running_sum * rescale + sum;
            running_max = new_max;
            // Rescale the accumulators through shared memory, row by row.
            store_rows<Width>(staged, acc);
            for (int d = half * (Width / 2); d < (half + 1) * (Width / 2); ++d) staged[row * out_ld + d] *= rescale;
            __syncwarp();
#pragma unroll
            for (int n = 0; n < Tile<Width>::blocks; ++n)
                wmma::load_matrix_sync(acc[n], staged + n * fragment, out_ld, wmma::mem_row_major);
            accumulate_product<Width>(acc, weights, v_tile, 0, last);
        }
        store_rows<Width>(staged, acc);
        if (query < T) {
            write_half_row<Width>(out + (w.b * T + query) * C + w.h * D, staged, row, half, D, 1.0f / running_sum);
            if (half == 0) lse[w.bh * T + query] = running_max + logf(running_sum);
        }
        __syncwarp();  // staged is read before the next item's stores
    }
#endif
}

// A backward block's shared memory (BackwardRegions) as both passes use it:
// the tiles and the query tile's statistics, this warp's score pair and bf16
// weights, and the thread's row of the warp's 16 (two lanes a row, a half of
// the columns each).
template <int Width>
struct BackwardShared {
    using R = BackwardRegions<Width>;
    bf16_t *k, *v, *q, *dout;
    float *lse, *di, *scores, *dprobs;
    bf16_t *probs, *dscores;
    int warp, row, half;
    __device__ explicit BackwardShared(unsigned char* shared)
        : k(region<bf16_t>(shared, R::k)),
          v(region<bf16_t>(shared, R::v)),
          q(region<bf16_t>(shared, R::q)),
          dout(region<bf16_t>(shared, R::dout)),
          lse(region<float>(shared, R::lse)),
          di(region<float>(shared, R::di)),
          warp(static_cast<int>(threadIdx.x / 32)),
          row(static_cast<int>(threadIdx.x % 32) / 2),
          half(static_cast<int>(threadIdx.x % 2)) {
        scores = region<float>(shared, R::pairs) + warp * 2 * fragment * score_ld;
        dprobs = scores + fragment * score_ld;
        probs = region<bf16_t>(shared, R::probs) + warp * fragment * weight_ld;
        dscores = region<bf16_t>(shared, R::dscores) + warp * fragment * weight_ld;
    }
};

// The query tile's lse and D_i = rowsum(dO * out) (f32, from global memory),
// 16 rows per warp; 0 for rows at or past T, whose p is masked anyway.
__device__ inline void load_query_stats(float* lse_rows, float* di_rows, const float* lse_head, const float* out_head,
                                        const float* dout_head, std::int64_t i0, std::int64_t T, std::int64_t C,
                                        int D) {
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    for (int r = warp * fragment; r < (warp + 1) * fragment; ++r) {
        const std::int64_t i = i0 + r;
        const float di = i < T ? attention_detail::row_dot_warp(out_head + i * C, dout_head + i * C, D) : 0.0f;
        if (lane == 0) {
            di_rows[r] = di;
            lse_rows[r] = i < T ? lse_head[i] : 0.0f;
        }
    }
}

// P and dS of the warp's 16 rows x the lane's half of 64 columns, from its
// scores S (unscaled) and dP, as bf16 weights for the next products; entries
// not seen are 0. lse and di of each entry come from the functions given.
template <class Seen, class Lse, class Di>
__device__ inline void probabilities(bf16_t* probs, bf16_t* dscores, const float* scores, const float* dprobs, int row,
                                     int half, float scale, Seen seen, Lse lse_of, Di di_of) {
    for (int c = half * (tile_rows / 2); c < (half + 1) * (tile_rows / 2); ++c) {
        const bool s = seen(c);
        const float p = s ? expf(attention_detail::scaled(scores[row * score_ld + c], scale) - lse_of(c)) : 0.0f;
        const float ds = s ? p * (dprobs[row * score_ld + c] - di_of(c)) : 0.0f;
        if (probs != nullptr) probs[row * weight_ld + c] = __float2bfloat16_rn(p);
        dscores[row * weight_ld + c] = __float2bfloat16_rn(ds);
    }
}

template <int Width>
__global__ void __launch_bounds__(block_threads, 1)
    backward_dkdv_kernel(const float* __restrict__ qkv, const float* __restrict__ out,
                         const float* __restrict__ dout, const float* __restrict__ lse, float* __restrict__ dqkv,
                         std::int64_t T, std::int64_t H, int D, float scale, Items items) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    extern __shared__ __align__(128) unsigned char attention_bf16_shared[];
    const BackwardShared<Width> m(attention_bf16_shared);
    constexpr int ld_tile = Tile<Width>::ld;
    const std::int64_t C = H * D, ld = 3 * C;
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        // The first key tiles see the most queries: started first.
        const Work w = work_of(item, items, H, /*last_first=*/false, tile_rows);
        const float* q_head = qkv + w.b * T * ld + w.h * D;
        const float* out_head = out + w.b * T * C + w.h * D;
        const float* dout_head = dout + w.b * T * C + w.h * D;
        const std::int64_t j0 = w.row0, key = j0 + m.warp * fragment + m.row;
        __syncthreads();
        load_rounded<Width>(m.k, q_head + C, ld, j0, T, D);
        load_rounded<Width>(m.v, q_head + 2 * C, ld, j0, T, D);
        Accumulator dk[Tile<Width>::blocks], dv[Tile<Width>::blocks];
        zero<Width>(dk);
        zero<Width>(dv);
        for (std::int64_t i0 = j0; i0 < T; i0 += tile_rows) {
            __syncthreads();  // the previous query tile's readers are done
            load_rounded<Width>(m.q, q_head, ld, i0, T, D);
            load_rounded<Width>(m.dout, dout_head, C, i0, T, D);
            load_query_stats(m.lse, m.di, lse + w.bh * T, out_head, dout_head, i0, T, C, D);
            __syncthreads();
            // On the diagonal tile query blocks before the warp's keys see none of them.
            const int first = i0 == j0 ? m.warp : 0;
            const bf16_t* my_keys = m.k + m.warp * fragment * ld_tile;
            const bf16_t* my_values = m.v + m.warp * fragment * ld_tile;
            product_abt<Width>(m.scores, my_keys, m.q, first, subtiles - 1);       // S^T = K Q^T
            product_abt<Width>(m.dprobs, my_values, m.dout, first, subtiles - 1);  // dP^T = V dO^T
            __syncwarp();
            probabilities(
                m.probs, m.dscores, m.scores, m.dprobs, m.row, m.half, scale,
                [&](int c) { return key <= i0 + c && i0 + c < T; }, [&](int c) { return m.lse[c]; },
                [&](int c) { return m.di[c]; });
            __syncwarp();
            accumulate_product<Width>(dv, m.probs, m.dout, first, subtiles - 1);  // dV += P^T dO
            accumulate_product<Width>(dk, m.dscores, m.q, first, subtiles - 1);   // dK += dS^T Q
        }
        // Out through the warp's score pair: dV, then dK times the scale.
        float* grad_row = dqkv + (w.b * T + key) * ld + w.h * D;
        __syncwarp();
        store_rows<Width>(m.scores, dv);
        if (key < T) write_half_row<Width>(grad_row + 2 * C, m.scores, m.row, m.half, D, 1.0f);
        __syncwarp();
        store_rows<Width>(m.scores, dk);
        if (key < T) write_half_row<Width>(grad_row + C, m.scores, m.row, m.half, D, scale);
        __syncwarp();
    }
#endif
}

template <int Width>
__global__ void __launch_bounds__(block_threads, 1)
    backward_dq_kernel(const float* __restrict__ qkv, const float* __restrict__ out, const float* __restrict__ dout,
                       const float* __restrict__ lse, float* __restrict__ dqkv, std::int64_t T, std::int64_t H, int D,
                       float scale, Items items) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    extern __shared__ __align__(128) unsigned char attention_bf16_shared[];
    const BackwardShared<Width> m(attention_bf16_shared);
    constexpr int ld_tile = Tile<Width>::ld;
    const std::int64_t C = H * D, ld = 3 * C;
    for (std::int64_t item = blockIdx.x; item < items.count(); item += gridDim.x) {
        const Work w = work_of(item, items, H, /*last_first=*/true, tile_rows);
        const float* q_head = qkv + w.b * T * ld + w.h * D;
        const float* out_head = out + w.b * T * C + w.h * D;
        const float* dout_head = dout + w.b * T * C + w.h * D;
        const std::int64_t i0 = w.row0, query = i0 + m.warp * fragment + m.row;
        __syncthreads();
        load_rounded<Width>(m.q, q_head, ld, i0, T, D);
        load_rounded<Width>(m.dout, dout_head, C, i0, T, D);
        load_query_stats(m.lse, m.di, lse + w.bh * T, out_head, dout_head, i0, T, C, D);
        Accumulator dq[Tile<Width>::blocks];
        zero<Width>(dq);
        for (std::int64_t j0 = 0; j0 <= i0; j0 += tile_rows) {
            __syncthreads();  // the previous key tile's readers are done (and the stats written)
            load_rounded<Width>(m.k, q_head + C, ld, j0, T, D);
            load_rounded<Width>(m.v, q_head + 2 * C, ld, j0, T, D);
            __syncthreads();
            const int last = j0 == i0 ? m.warp : subtiles - 1;
            product_abt<Width>(m.scores, m.q + m.warp * fragment * ld_tile, m.k, 0, last);     // S = Q K^T
            product_abt<Width>(m.dprobs, m.dout + m.warp * fragment * ld_tile, m.v, 0, last);  // dP = dO V^T
            __syncwarp();
            const float lse_row = m.lse[m.warp * fragment + m.row], di_row = m.di[m.warp * fragment + m.row];
            probabilities(
                nullptr, m.dscores, m.scores, m.dprobs, m.row, m.half, scale,
                [&](int c) { return j0 + c <= query && query < T; }, [&](int) { return lse_row; },
                [&](int) { return di_row; });
            __syncwarp();
            accumulate_product<Width>(dq, m.dscores, m.k, 0, last);  // dQ += dS K
        }
        __syncwarp();
        store_rows<Width>(m.scores, dq);
        if (query < T)
            write_half_row<Width>(dqkv + (w.b * T + query) * ld + w.h * D, m.scores, m.row, m.half, D, scale);
        __syncwarp();
    }
#endif
}

[[nodiscard]] inline Items items_of(std::int64_t B, std::int64_t T, std::int64_t H) {
    return Items{B * H, (T + tile_rows - 1) / tile_rows};
}

template <int Width>
void forward(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T, std::int64_t H, int D,
             float scale, cudaStream_t stream) {
    const Items items = items_of(B, T, H);
    constexpr std::size_t bytes = ForwardRegions<Width>::bytes;
    static OncePerDevice set_up;
    set_up([D](int device) {
        attention_detail::check_bf16_device_fits("attention_forward", D, bytes, device);
        attention_detail::allow_shared(forward_kernel<Width>, bytes);
    });
    forward_kernel<Width><<<attention_detail::blocks_for_items(items.count()), block_threads, bytes, stream>>>(
        qkv, out, lse, T, H, D, scale, items);
    LOOM_CUDA_CHECK_LAUNCH();
}

template <int Width>
void backward(const float* qkv, const float* out, const float* dout, const float* lse, float* dqkv, std::int64_t B,
              std::int64_t T, std::int64_t H, int D, float scale, cudaStream_t stream) {
    const Items items = items_of(B, T, H);
    constexpr std::size_t bytes = BackwardRegions<Width>::bytes;
    static OncePerDevice set_up;
    set_up([D](int device) {
        attention_detail::check_bf16_device_fits("attention_backward", D, bytes, device);
        attention_detail::allow_shared(backward_dkdv_kernel<Width>, bytes);
        attention_detail::allow_shared(backward_dq_kernel<Width>, bytes);
    });
    const unsigned int blocks = attention_detail::blocks_for_items(items.count());
    backward_dkdv_kernel<Width>
        <<<blocks, block_threads, bytes, stream>>>(qkv, out, dout, lse, dqkv, T, H, D, scale, items);
    LOOM_CUDA_CHECK_LAUNCH();
    backward_dq_kernel<Width>
        <<<blocks, block_threads, bytes, stream>>>(qkv, out, dout, lse, dqkv, T, H, D, scale, items);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace attention_bf16_detail

// Causal multi-head self-attention at MatmulPrecision::bf16 on wmma, as
// host::attention_forward_bf16_inputs: qkv [B, T, 3C] in, out [B, T, C] and
// lse [B, H, T] written, all f32 on the device; D <= 128.
inline void attention_forward_bf16_wmma(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                                        std::int64_t H, std::int64_t D, cudaStream_t stream = nullptr) {
    if (!attention_detail::check_forward(qkv, out, lse, B, T, H, D)) return;
    attention_detail::for_head_size(D, [&]<int Chunks>() {
        attention_bf16_detail::forward<32 * Chunks>(qkv, out, lse, B, T, H, static_cast<int>(D),
                                                    attention_scale(D), stream);
    });
}

// dqkv [B, T, 3C], written, as host::attention_backward_bf16_inputs. Two
// launches on `stream`: dK and dV, then dQ.
inline void attention_backward_bf16_wmma(const float* qkv, const float* out, const float* dout, const float* lse,
                                         float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                                         cudaStream_t stream = nullptr) {
    if (!attention_detail::check_backward(qkv, out, dout, lse, dqkv, B, T, H, D)) return;
    attention_detail::for_head_size(D, [&]<int Chunks>() {
        attention_bf16_detail::backward<32 * Chunks>(qkv, out, dout, lse, dqkv, B, T, H, static_cast<int>(D),
                                                     attention_scale(D), stream);
    });
}

}  // namespace loom::kernels::cuda
