// A CPU simulator for warp-level CUDA device code: just enough of CUDA for
// the mma.sync attention kernels (kernels/cuda/attention_mma.cuh) to run on
// the host, so that their indexing, masking, softmax and fragment bookkeeping
// are tested where there is no GPU (CI, this project's machines).
//
// A thread block is 128 host threads; __syncthreads is a barrier over them,
// and a warp's collectives (ldmatrix, mma.sync, __shfl_xor_sync) exchange
// values through per-warp slots between two per-warp barriers. ldmatrix and
// mma.m16n8k16 follow the PTX ISA's documented fragment layouts (lane
// l = 4g + t):
//   ldmatrix .x4: lanes 8i..8i+7 give the rows of matrix i; lane l receives
//     row g, elements 2t and 2t+1 of each (with .trans: rows 2t and 2t+1 of
//     column g);
//   mma A: rows g, g+8, columns 2t.. and 2t+8..; B: rows 2t.., 2t+8.. of
//     column g; C: row g columns 2t, 2t+1, then row g+8.
// What this cannot show: the hardware's own behaviour (an mma's internal
// summation order, timing, bank conflicts, register limits). A kernel that
// passes here computes the right thing if the GPU does what the PTX ISA
// says; the CUDA tests on a GPU (tests/cuda) are still the verification.
//
// Include after every loom header and the standard library: the CUDA
// keywords below are macros.
#pragma once

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "loom/core/dtype.hpp"

#define __device__
#define __global__
#define __launch_bounds__(...)

struct SimulatedDim3 {
    unsigned x = 0;
};
inline thread_local SimulatedDim3 threadIdx, blockIdx;
inline SimulatedDim3 gridDim;

struct float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct uint2 {
    unsigned x, y;
};
struct __nv_bfloat16 {
    std::uint16_t bits;
};
struct __nv_bfloat162 {
    std::uint16_t x, y;  // x in the low half, as CUDA's
};
inline __nv_bfloat16 __float2bfloat16_rn(float v) { return {loom::detail::float_to_bf16_bits(v)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float low, float high) {
    return {loom::detail::float_to_bf16_bits(low), loom::detail::float_to_bf16_bits(high)};
}

namespace loom_sim {

inline constexpr int block_threads = 128;
inline constexpr int warps = block_threads / 32;

// What the threads of the running block share.
struct Block {
    std::barrier<> all{block_threads};
    std::barrier<> warp[warps]{std::barrier<>(32), std::barrier<>(32), std::barrier<>(32), std::barrier<>(32)};
    float floats[block_threads][4]{};
    unsigned words[block_threads][6]{};
    const __nv_bfloat16* rows[block_threads]{};
    unsigned char* shared = nullptr;
    std::size_t shared_bytes = 0;
};
inline Block* running = nullptr;  // one block runs at a time

// ldmatrix rows that were not 16-byte aligned 16-byte pieces of the block's
// shared memory (the hardware's requirement), over every launch so far.
inline std::atomic<long> bad_ldmatrix_rows{0};

inline unsigned char* block_shared() { return running->shared; }
inline void warp_barrier() { running->warp[threadIdx.x / 32].arrive_and_wait(); }

// body() on `blocks` blocks of 128 threads, one block after another, each
// with `shared_bytes` of shared memory filled with 0xff bytes (NaN as f32
// and bf16), so that reading what no thread wrote shows in the results.
template <class Body>
void launch(std::int64_t blocks, std::size_t shared_bytes, Body body) {
    gridDim.x = static_cast<unsigned>(blocks);
    std::vector<unsigned char> shared(shared_bytes);  // operator new: 16-byte aligned, as dynamic shared memory
    for (std::int64_t b = 0; b < blocks; ++b) {
        std::memset(shared.data(), 0xff, shared.size());
        Block block;
        block.shared = shared.data();
        block.shared_bytes = shared.size();
        running = &block;
        std::vector<std::thread> threads;
        threads.reserve(block_threads);
        for (int t = 0; t < block_threads; ++t)
            threads.emplace_back([&body, t, b] {
                threadIdx.x = static_cast<unsigned>(t);
                blockIdx.x = static_cast<unsigned>(b);
                body();
            });
        for (std::thread& thread : threads) thread.join();
        running = nullptr;
    }
}

inline float bf16_value(std::uint16_t bits) { return loom::detail::bf16_bits_to_float(bits); }
inline float low_half(unsigned word) { return bf16_value(static_cast<std::uint16_t>(word & 0xffffu)); }
inline float high_half(unsigned word) { return bf16_value(static_cast<std::uint16_t>(word >> 16)); }
inline unsigned pack(std::uint16_t low, std::uint16_t high) { return low | (static_cast<unsigned>(high) << 16); }

template <bool Transposed>
void ldmatrix_x4(unsigned (&r)[4], const __nv_bfloat16* row) {
    const int me = static_cast<int>(threadIdx.x), base = me / 32 * 32, lane = me % 32, g = lane / 4, t = lane % 4;
    const auto* byte = reinterpret_cast<const unsigned char*>(row);
    if (byte < running->shared || byte + 16 > running->shared + running->shared_bytes ||
        (byte - running->shared) % 16 != 0) {
        ++bad_ldmatrix_rows;
        row = reinterpret_cast<const __nv_bfloat16*>(running->shared);  // read something harmless instead
    }
    running->rows[me] = row;
    warp_barrier();
    for (int i = 0; i < 4; ++i) {
        const __nv_bfloat16* const* matrix = running->rows + base + 8 * i;
        r[i] = Transposed ? pack(matrix[2 * t][g].bits, matrix[2 * t + 1][g].bits)
                          : pack(matrix[g][2 * t].bits, matrix[g][2 * t + 1].bits);
    }
    warp_barrier();
}

// c += a b for the warp: every lane's fragments gathered into A (16 x 16)
// and B (16 x 8), each lane's four results summed over k in order.
inline void mma_m16n8k16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int me = static_cast<int>(threadIdx.x), base = me / 32 * 32, lane = me % 32;
    for (int i = 0; i < 4; ++i) running->words[me][i] = a[i];
    running->words[me][4] = b0;
    running->words[me][5] = b1;
    warp_barrier();
    float A[16][16], B[16][8];
    for (int x = 0; x < 32; ++x) {
        const int g = x / 4, t = x % 4;
        const unsigned* w = running->words[base + x];
        for (int half = 0; half < 2; ++half) {
            A[g + 8 * half][2 * t] = low_half(w[half]);
            A[g + 8 * half][2 * t + 1] = high_half(w[half]);
            A[g + 8 * half][2 * t + 8] = low_half(w[2 + half]);
            A[g + 8 * half][2 * t + 9] = high_half(w[2 + half]);
            B[2 * t + 8 * half][g] = low_half(w[4 + half]);
            B[2 * t + 8 * half + 1][g] = high_half(w[4 + half]);
        }
    }
    warp_barrier();  // every lane has read the slots before any writes them again
    const int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; ++e) {
        const int row = g + 8 * (e / 2), column = 2 * t + e % 2;
        float sum = c[e];
        for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][column];
        c[e] = sum;
    }
}

}  // namespace loom_sim

inline void __syncthreads() { loom_sim::running->all.arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
    const int me = static_cast<int>(threadIdx.x);
    loom_sim::running->floats[me][0] = value;
    loom_sim::warp_barrier();
    const float theirs = loom_sim::running->floats[me ^ lane_mask][0];
    loom_sim::warp_barrier();
    return theirs;
}

// What the extracted kernels use of kernels/cuda/attention.cuh and
// attention_tiles.cuh, restated for the host (keep in step with those).
namespace loom::kernels::cuda::attention_detail {
struct Items {
    std::int64_t heads, tiles;
    [[nodiscard]] std::int64_t count() const { return heads * tiles; }
};
struct Work {
    std::int64_t row0, bh, b, h;
};
inline Work work_of(std::int64_t item, const Items& items, std::int64_t H, bool last_first, std::int64_t rows) {
    const std::int64_t rank = item / items.heads;
    const std::int64_t tile = last_first ? items.tiles - 1 - rank : rank;
    const std::int64_t bh = item % items.heads;
    return {tile * rows, bh, bh / H, bh % H};
}
inline float scaled(float dot, float scale) { return dot * scale; }
inline float row_dot_warp(const float* out_row, const float* dout_row, int D) {
    float partial = 0.0f;
    for (int d = static_cast<int>(threadIdx.x % 32); d < D; d += 32) partial = std::fma(out_row[d], dout_row[d], partial);
    for (int offset = 16; offset > 0; offset /= 2) partial += __shfl_xor_sync(0xffff'ffffu, partial, offset);
    return partial;
}
}  // namespace loom::kernels::cuda::attention_detail

namespace loom::kernels::cuda::mma_fragments {
using bf16_t = __nv_bfloat16;
inline void ldmatrix_x4(unsigned (&r)[4], const bf16_t* row) { loom_sim::ldmatrix_x4<false>(r, row); }
inline void ldmatrix_x4_trans(unsigned (&r)[4], const bf16_t* row) { loom_sim::ldmatrix_x4<true>(r, row); }
inline void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    loom_sim::mma_m16n8k16(c, a, b0, b1);
}
}  // namespace loom::kernels::cuda::mma_fragments
