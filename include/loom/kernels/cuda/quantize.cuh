// Device mirrors of kernels/host/quantize.hpp's bf16/f16 casts, int8 blocks
// and 1-bit signs, for gradient compression on the GPU. The packed words are
// the host's, bit for bit: same layout (two casts per word, element i in the
// low half when i is even; int8 and signs: the f32 scales first, then the
// values four per word, or the signs 32 per word, bit i % 32 of word i / 32),
// same rounding, so a buffer packed on one side unpacks on the other and a
// compressed collective moves the same bytes whichever side packed it.
//
// How bit equality with the host is kept:
//   * the enum, the word counts and the bf16/f16 conversions are the host's
//     own (Cast, cast_words, int8_words, sign_words from host/quantize.hpp; the
//     integer-only conversions of core/dtype.hpp, LOOM_HOST_DEVICE), not
//     re-implementations;
//   * every float operation is an explicitly rounded intrinsic (__fmul_rn,
//     __fadd_rn, __fsub_rn, __fdiv_rn, __dadd_rn, __ddiv_rn): nvcc contracts
//     a * b + c into an FMA by default, and the host (baseline x86-64, no FMA)
//     rounds twice;
//   * int8 rounds with rintf, to nearest even: the host's magic-number round
//     for the |v| <= 127.5 it sees, and the same reciprocal 1 / scale;
//   * the NaN scale of an int8 block holding NaN or Inf is the host's quiet
//     NaN 0x7fc00000, not CUDA's canonical 0x7fffffff;
//   * a sign block's scale, its mean |x|, is summed in double in the host's
//     exact order (below), so it is the host's double, rounded the same way.
// One difference remains and is not in the words: where a NaN flows through
// arithmetic (a residual or an unpacked value of a NaN block), x86 keeps the
// operand's payload and the GPU returns its canonical NaN. Both are NaN.
// Compiling with -ftz=true (or --use_fast_math) would flush subnormals and
// break the equality for tiny values; loom builds without it.
//
// Launch shapes: the casts and the unpackers are grid-stride loops over words
// or elements. pack_int8 gives each quantisation block a group of threads, a
// warp when the block holds at most 1024 values, else a whole thread block,
// which finds the block's absmax by a shuffle (and shared-memory) reduction;
// a max is exact in any order, so the scale equals the host's.
//
// pack_signs: the sign words by a warp each (a ballot of 32 consecutive
// values, set for !(x < 0): +0, -0 and NaN included, as on the host; the
// bits past n are 0). The scales by 16 threads per quantisation block, one
// per lane of the host's sum: the host adds |x| in double into 16 lanes
// (lane l takes x[lo + l + 16k] over the whole 16s, in k order), then adds up
// the tail past the last whole 16 in index order, then lanes 0..15 in order,
// and divides by the block's count. Thread l of the group runs lane l's adds
// in the same order; every thread of the group then does the tail and the
// combination itself, in the host's order, with the lanes' partials fetched
// by shuffles. A double sum in a fixed order has one answer, so the scale is
// the host's bit for bit (no reduction tree could promise that: double
// addition does not associate). The price is a chain of block / 16
// dependent adds per thread: fine for blocks up to ~10^5, slow (still
// correct) for one block of millions. A NaN block's scale: the host's
// additions keep the payload of the NaN they meet (the result is a quiet NaN
// with |x|'s payload), so when all NaNs of a block carry one payload the
// device writes exactly that quiet NaN, (bits & 0x7fffffff) | 0x00400000,
// the host's word; where a block holds NaNs with different payloads, which
// one the host keeps depends on its compiler's operand order (it differs
// between -O0 and -O2), and the device keeps the first in the host's
// summation order. A block with +-Inf and no NaN has scale +Inf on both.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/cuda/group_reduce.cuh"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/host/quantize.hpp"

namespace loom::kernels::cuda {

// The wire format is shared with the host, so its names are too.
using host::Cast;
using host::cast_words;
using host::int8_words;
using host::sign_words;

namespace detail {

template <Cast To>
__device__ inline std::uint16_t cast_bits(float x) {
    if constexpr (To == Cast::bf16)
        return loom::detail::float_to_bf16_bits(x);
    else
        return loom::detail::float_to_f16_bits(x);
}

template <Cast From>
__device__ inline float uncast_bits(std::uint16_t bits) {
    if constexpr (From == Cast::bf16)
        return loom::detail::bf16_bits_to_float(bits);
    else
        return loom::detail::f16_bits_to_float(bits);
}

// One thread per word: the two elements it holds.
template <Cast To>
__global__ void pack_cast_kernel(const float* __restrict__ x, std::int64_t n, std::uint32_t* __restrict__ words,
                                 float* __restrict__ residual) {
    const std::int64_t word_count = (n + 1) / 2;  // cast_words(n), a host function
    for (std::int64_t w = grid_index(); w < word_count; w += grid_stride()) {
        const std::int64_t i = 2 * w;
        const bool has_high = i + 1 < n;
        const float x_low = x[i];
        const float x_high = has_high ? x[i + 1] : 0.0f;
        const std::uint16_t low = cast_bits<To>(x_low);
        const std::uint16_t high = has_high ? cast_bits<To>(x_high) : std::uint16_t{0};
        words[w] = static_cast<std::uint32_t>(low) | (static_cast<std::uint32_t>(high) << 16);
        if (residual != nullptr) {
            residual[i] = __fsub_rn(x_low, uncast_bits<To>(low));
            if (has_high) residual[i + 1] = __fsub_rn(x_high, uncast_bits<To>(high));
        }
    }
}

template <Cast From>
__global__ void unpack_cast_kernel(const std::uint32_t* __restrict__ words, std::int64_t n, float* __restrict__ out,
                                   float weight, bool add) {
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) {
        const auto bits = static_cast<std::uint16_t>(words[i / 2] >> ((i & 1) * 16));
        const float x = __fmul_rn(weight, uncast_bits<From>(bits));
        out[i] = add ? __fadd_rn(out[i], x) : x;
    }
}

// The host's quiet NaN (std::numeric_limits<float>::quiet_NaN()), bit for bit.
inline constexpr std::uint32_t int8_nan_scale_bits = 0x7fc0'0000u;

// A group of GroupThreads threads per quantisation block, several groups per
// thread block when GroupThreads is a warp. The block's largest |x| is found
// with every non-finite value counted as +Inf, so one max answers both "what
// is the absmax" and "is the block finite" (no finite |x| reaches Inf).
template <int GroupThreads>
__global__ void pack_int8_kernel(const float* __restrict__ x, std::int64_t n, std::int64_t block,
                                 std::uint32_t* __restrict__ words, float* __restrict__ residual) {
    static_assert(GroupThreads == 32 || GroupThreads == threads_per_block,
                  "a group is one warp or the whole thread block");
    constexpr int groups_per_block = threads_per_block / GroupThreads;
    __shared__ float shared[threads_per_block / 32];
    const int lane = static_cast<int>(threadIdx.x) % GroupThreads;
    const std::int64_t blocks = (n + block - 1) / block;
    auto* values = reinterpret_cast<std::int8_t*>(words + blocks);
    // Uniform over each group, so the group's shuffles and barriers see all its threads.
    for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / GroupThreads;
         b < blocks; b += static_cast<std::int64_t>(gridDim.x) * groups_per_block) {
        const std::int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        float largest = 0.0f;
        for (std::int64_t i = lo + lane; i < hi; i += GroupThreads) {
            const float v = x[i];
            largest = fmaxf(largest, isfinite(v) ? fabsf(v) : INFINITY);
        }
        largest = group_reduce<GroupThreads>(largest, MaxOp{}, shared);
        const bool finite = !isinf(largest);
        const float scale = finite ? __fdiv_rn(largest, 127.0f) : __uint_as_float(int8_nan_scale_bits);
        if (lane == 0) words[b] = __float_as_uint(scale);
        const float inverse = scale > 0.0f ? __fdiv_rn(1.0f, scale) : 0.0f;
        for (std::int64_t i = lo + lane; i < hi; i += GroupThreads) {
            const float v = x[i];
            std::int8_t q8 = 0;  // a non-finite block keeps its values 0, as on the host
            if (finite) {
                // The clamp only catches 127.5 from the reciprocal's rounding;
                // written as comparisons, like the host's, so NaN passes through.
                float q = rintf(__fmul_rn(v, inverse));
                q = q > 127.0f ? 127.0f : q;
                q = q < -127.0f ? -127.0f : q;
                q8 = static_cast<std::int8_t>(static_cast<std::int32_t>(q));
            }
            values[i] = q8;
            if (residual != nullptr) residual[i] = __fsub_rn(v, __fmul_rn(static_cast<float>(q8), scale));
        }
        // The host zero-fills the value area, so the bytes that pad the last
        // word are 0 too; the group of the last block writes them.
        if (hi == n && lane < (n + 3) / 4 * 4 - n) values[n + lane] = 0;
    }
}

template <bool Add>
__global__ void unpack_int8_kernel(const std::uint32_t* __restrict__ words, std::int64_t n, std::int64_t block,
                                   float* __restrict__ out, float weight) {
    const std::int64_t blocks = (n + block - 1) / block;
    const auto* values = reinterpret_cast<const std::int8_t*>(words + blocks);
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) {
        const float scale = __fmul_rn(weight, __uint_as_float(words[i / block]));
        const float x = __fmul_rn(static_cast<float>(values[i]), scale);
        out[i] = Add ? __fadd_rn(out[i], x) : x;
    }
}

// The lanes of the host's mean |x| (the `double lanes[16]` of pack_signs).
inline constexpr int sign_lanes = 16;

// A warp per sign word: bit k of word w is element 32 w + k, set for
// !(x < 0); the bits past n are 0. The loop is uniform over each warp. (A
// template, only on float, as the kernels of elementwise.cuh: a template may
// be defined in every translation unit that includes this header, a plain
// __global__ function may not.)
template <class T>
__global__ void pack_sign_bits_kernel(const T* __restrict__ x, std::int64_t n, std::uint32_t* __restrict__ signs) {
    const std::int64_t word_count = (n + 31) / 32;
    const int lane = static_cast<int>(threadIdx.x) % 32;
    for (std::int64_t w = grid_index() / 32; w < word_count; w += grid_stride() / 32) {
        const std::int64_t i = 32 * w + lane;
        const bool set = i < n && !(x[i] < T{0});
        const std::uint32_t bits = __ballot_sync(0xffff'ffffu, set);
        if (lane == 0) signs[w] = bits;
    }
}

// |x| by clearing the sign bit, as the host's std::fabs does, so a NaN keeps
// its payload. PTX leaves abs.f32 of a NaN unspecified: with fabsf here, the
// scales of NaN blocks came out as the canonical 0x7fffffff on an H200, where
// the host's keep the payload (0x7fc00000, 0x7fc00001).
__device__ inline float magnitude_keeping_payload(float x) {
    return __uint_as_float(__float_as_uint(x) & 0x7fff'ffffu);
}

// Lanes = 16 threads per quantisation block (a half-warp; the loop is
// uniform over it, and its shuffles name only its own threads). Thread l runs
// the host's lane l; the tail and the combination are run by every thread of
// the group in the host's order, so each holds the host's sum and scale.
template <int Lanes>
__global__ void pack_sign_scales_kernel(const float* __restrict__ x, std::int64_t n, std::int64_t block,
                                        std::uint32_t* __restrict__ words, float* __restrict__ residual) {
    static_assert(Lanes == sign_lanes, "the host's lanes, or the sum is not the host's");
    constexpr int L = Lanes;
    constexpr int groups_per_block = threads_per_block / L;
    const int lane = static_cast<int>(threadIdx.x) % L;
    const unsigned int half_warp = 0xffffu << (static_cast<int>(threadIdx.x) % 32 / L * L);
    const std::int64_t blocks = (n + block - 1) / block;
    for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / L; b < blocks;
         b += static_cast<std::int64_t>(gridDim.x) * groups_per_block) {
        const std::int64_t lo = b * block, hi = lo + block < n ? lo + block : n;
        const std::int64_t whole = lo + (hi - lo) / L * L;
        // The first NaN |x| each sum meets (0: none), for the host's payload.
        double partial = 0.0;
        std::uint32_t partial_nan = 0;
        for (std::int64_t i = lo + lane; i < whole; i += L) {
            const float a = magnitude_keeping_payload(x[i]);
            if (partial_nan == 0 && isnan(a)) partial_nan = __float_as_uint(a);
            partial = __dadd_rn(partial, static_cast<double>(a));
        }
        double sum = 0.0;
        std::uint32_t sum_nan = 0;
        for (std::int64_t i = whole; i < hi; ++i) {
            const float a = magnitude_keeping_payload(x[i]);
            if (sum_nan == 0 && isnan(a)) sum_nan = __float_as_uint(a);
            sum = __dadd_rn(sum, static_cast<double>(a));
        }
        for (int l = 0; l < L; ++l) {
            const double lane_sum = __shfl_sync(half_warp, partial, l, L);
            const std::uint32_t lane_nan = __shfl_sync(half_warp, partial_nan, l, L);
            if (sum_nan == 0) sum_nan = lane_nan;
            sum = __dadd_rn(sum, lane_sum);
        }
        float scale = __double2float_rn(__ddiv_rn(sum, static_cast<double>(hi - lo)));
        // NaN exactly when the block holds one (|x| >= 0: no Inf - Inf), and
        // then sum_nan is the NaN the host's additions kept, made quiet.
        if (isnan(scale)) scale = __uint_as_float(sum_nan | 0x0040'0000u);
        if (lane == 0) words[b] = __float_as_uint(scale);
        if (residual != nullptr)
            for (std::int64_t i = lo + lane; i < hi; i += L) {
                const float v = x[i];
                residual[i] = __fsub_rn(v, v < 0.0f ? -scale : scale);
            }
    }
}

template <bool Add>
__global__ void unpack_signs_kernel(const std::uint32_t* __restrict__ words, std::int64_t n, std::int64_t block,
                                    float* __restrict__ out, float weight) {
    const std::int64_t blocks = (n + block - 1) / block;
    const std::uint32_t* signs = words + blocks;
    for (std::int64_t i = grid_index(); i < n; i += grid_stride()) {
        const float scale = __fmul_rn(weight, __uint_as_float(words[i / block]));
        const auto bit = static_cast<std::int32_t>((signs[i >> 5] >> (i & 31)) & 1u);
        const float x = __fmul_rn(static_cast<float>(2 * bit - 1), scale);
        out[i] = Add ? __fadd_rn(out[i], x) : x;
    }
}

}  // namespace detail

// x: n floats on the device; words: cast_words(n) on the device, written;
// residual (optional): n floats, x - unpack(pack(x)).
inline void pack_cast(Cast to, const float* x, std::int64_t n, std::uint32_t* words, float* residual = nullptr,
                      cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    const unsigned int grid = blocks_for(cast_words(n));
    if (to == Cast::bf16)
        detail::pack_cast_kernel<Cast::bf16><<<grid, threads_per_block, 0, stream>>>(x, n, words, residual);
    else
        detail::pack_cast_kernel<Cast::f16><<<grid, threads_per_block, 0, stream>>>(x, n, words, residual);
    LOOM_CUDA_CHECK_LAUNCH();
}

// out[i] = weight * x[i] (add: out[i] += weight * x[i]), all on the device.
inline void unpack_cast(Cast from, const std::uint32_t* words, std::int64_t n, float* out, float weight = 1.0f,
                        bool add = false, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    const unsigned int grid = blocks_for(n);
    if (from == Cast::bf16)
        detail::unpack_cast_kernel<Cast::bf16><<<grid, threads_per_block, 0, stream>>>(words, n, out, weight, add);
    else
        detail::unpack_cast_kernel<Cast::f16><<<grid, threads_per_block, 0, stream>>>(words, n, out, weight, add);
    LOOM_CUDA_CHECK_LAUNCH();
}

// x: n floats; words: int8_words(n, block), written; residual (optional): n
// floats. One f32 scale per block, absmax / 127 (NaN when the block holds NaN
// or Inf), then round-to-nearest-even(x / scale) as int8.
inline void pack_int8(const float* x, std::int64_t n, std::int64_t block, std::uint32_t* words,
                      float* residual = nullptr, cudaStream_t stream = nullptr) {
    LOOM_CHECK(block >= 1, "pack_int8: a block of ", block, " values; it must hold at least 1");
    if (n <= 0) return;
    const std::int64_t blocks = (n + block - 1) / block;
    if (block <= 1024)
        detail::pack_int8_kernel<32><<<blocks_for(blocks * 32), threads_per_block, 0, stream>>>(x, n, block, words,
                                                                                                residual);
    else
        detail::pack_int8_kernel<threads_per_block>
            <<<blocks_for(blocks * threads_per_block), threads_per_block, 0, stream>>>(x, n, block, words, residual);
    LOOM_CUDA_CHECK_LAUNCH();
}

// out[i] = weight * scale * value[i] (add: +=), all on the device.
inline void unpack_int8(const std::uint32_t* words, std::int64_t n, std::int64_t block, float* out,
                        float weight = 1.0f, bool add = false, cudaStream_t stream = nullptr) {
    LOOM_CHECK(block >= 1, "unpack_int8: a block of ", block, " values; it must hold at least 1");
    if (n <= 0) return;
    const unsigned int grid = blocks_for(n);
    if (add)
        detail::unpack_int8_kernel<true><<<grid, threads_per_block, 0, stream>>>(words, n, block, out, weight);
    else
        detail::unpack_int8_kernel<false><<<grid, threads_per_block, 0, stream>>>(words, n, block, out, weight);
    LOOM_CUDA_CHECK_LAUNCH();
}

// x: n floats; words: sign_words(n, block), written; residual (optional): n
// floats, x - unpack(pack(x)). One f32 scale per block, the block's mean |x|
// (NaN when it holds NaN, +Inf when it holds +-Inf and no NaN), then one bit
// per value, set for x >= 0 (and for NaN). Two launches on `stream`.
inline void pack_signs(const float* x, std::int64_t n, std::int64_t block, std::uint32_t* words,
                       float* residual = nullptr, cudaStream_t stream = nullptr) {
    LOOM_CHECK(block >= 1, "pack_signs: a block of ", block, " values; it must hold at least 1");
    if (n <= 0) return;
    const std::int64_t blocks = (n + block - 1) / block;
    detail::pack_sign_bits_kernel<float><<<blocks_for((n + 31) / 32 * 32), threads_per_block, 0, stream>>>(
        x, n, words + blocks);
    LOOM_CUDA_CHECK_LAUNCH();
    detail::pack_sign_scales_kernel<detail::sign_lanes>
        <<<blocks_for(blocks * detail::sign_lanes), threads_per_block, 0, stream>>>(x, n, block, words, residual);
    LOOM_CUDA_CHECK_LAUNCH();
}

// out[i] = weight * (bit ? scale : -scale) (add: +=), all on the device.
inline void unpack_signs(const std::uint32_t* words, std::int64_t n, std::int64_t block, float* out,
                         float weight = 1.0f, bool add = false, cudaStream_t stream = nullptr) {
    LOOM_CHECK(block >= 1, "unpack_signs: a block of ", block, " values; it must hold at least 1");
    if (n <= 0) return;
    const unsigned int grid = blocks_for(n);
    if (add)
        detail::unpack_signs_kernel<true><<<grid, threads_per_block, 0, stream>>>(words, n, block, out, weight);
    else
        detail::unpack_signs_kernel<false><<<grid, threads_per_block, 0, stream>>>(words, n, block, out, weight);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
