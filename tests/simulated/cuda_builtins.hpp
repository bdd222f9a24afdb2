// CUDA's keywords, types and built-ins as the warp simulator
// (warp_simulator.hpp) defines them on the host: the qualifiers as nothing
// (__shared__ as a function-local static, NaN-filled in each block),
// threadIdx and friends as the running fiber's, float4, bf16 and its
// conversions, the device's correctly rounded arithmetic, and the NaN fill
// of static __shared__ arrays in each block. Included by
// warp_simulator.hpp after every loom header and the standard library: the
// keywords are macros.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>

#include "loom/core/dtype.hpp"

#define __device__
#define __host__
#define __global__
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n) alignas(n)
// A block runs one at a time, so a function-local static is the running
// block's shared memory. (The kernels' dynamic shared memory is the
// simulated block's buffer instead: extract_device_code.py rewrites it.)
// extract_device_code.py puts loom_sim::fill_static_shared(array, bytes)
// after each such declaration, which fills the array with 0xff bytes when
// the first thread of a block reaches it, as each block's dynamic shared
// memory is filled: a read of what no thread of this block wrote is NaN (or
// -1), not the previous block's value nor a zero that a GPU would not give.
// (A linker section of their own would be simpler, but GCC drops the section
// attribute of a template's function-local statics, which every kernel's
// are.)
#define __shared__ static

namespace loom_sim {

// Blocks started so far, over every launch: which block a static
// __shared__ array was last filled for.
inline long block_serial = 0;
// Static __shared__ arrays filled so far, over every launch (tests count them).
inline long static_shared_fills = 0;

// A static __shared__ array (`bytes` at `array`) as the running block finds
// it: 0xff bytes (NaN as f32, f64 and bf16) the first time one of the
// block's threads reaches its declaration, untouched after that. Every
// declaration in the extracted kernels is followed by a call to this.
inline void fill_static_shared(void* array, std::size_t bytes) {
    static std::map<const void*, long> filled_for;  // the block each array was last filled for
    long& block = filled_for[array];
    if (block == block_serial) return;
    std::memset(array, 0xff, bytes);
    block = block_serial;
    ++static_shared_fills;
}

}  // namespace loom_sim

struct SimulatedDim3 {
    unsigned x = 1, y = 1, z = 1;
};
// The running fiber's (every simulated thread runs on the calling thread).
inline SimulatedDim3 threadIdx, blockIdx;
inline SimulatedDim3 gridDim, blockDim;

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
inline float __bfloat162float(__nv_bfloat16 v) { return loom::detail::bf16_bits_to_float(v.bits); }
inline __nv_bfloat162 __floats2bfloat162_rn(float low, float high) {
    return {loom::detail::float_to_bf16_bits(low), loom::detail::float_to_bf16_bits(high)};
}
// The device's correctly rounded arithmetic, never contracted into an FMA:
// the host's float operations are that (this file is built without FMA
// contraction, -ffp-contract=off).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __double2float_rn(double a) { return static_cast<float>(a); }
inline float __uint_as_float(unsigned bits) { return std::bit_cast<float>(bits); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
using std::isfinite;
using std::isinf;
using std::isnan;
