// Device mirror of kernels/host/gelu.hpp: GELU, tanh form (PyTorch's
// gelu(approximate="tanh")), forward and backward, through the same sigmoid
// identity 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)), the same constants (read
// from the host header, so they cannot drift apart), the same clamp of the
// exponent to [-80, 80] and the same order of operations.
//
// Every step except the exponential is written with the round-to-nearest
// intrinsics (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn): nvcc would
// otherwise contract x (c1 + c3 x^2) into FMAs, and an exponent off by one ulp
// near |z| = 80 moves e^z by ~80 ulp. So the exponent equals the host's bit for
// bit, and the one difference left is e^z itself: CUDA's expf (at most 2 ulp
// from exact, CUDA Programming Guide; __expf only under -use_fast_math, which
// loom does not use) against the host's polynomial exp (within 1.01 ulp).
// Tolerance against the host kernels, as tests/cuda/test_kernels_elementwise.cu
// checks it: gelu_forward within a relative 2^-20 (about 8 ulp; y's relative
// error is e^z's, at most ~3 * 2^-23, plus the roundings of 1 + e^z and the
// division); gelu_backward within 2^-20 (|dx| + |dy|): gelu' has a zero near
// x = -0.75 where 1 - t cancels, so only a bound scaled by dy holds there.
// NaN in gives NaN out, as on the host.
// The host reference is the baseline (non-FMA) build of the host loop. The
// x86-64-v3/v4 clones the host dispatches to at run time contract the exponent
// themselves, so they differ from the baseline, and from this kernel, by up to
// about |z| ulp: ~130 where z nears 80 (x near -9, where |gelu| < 1e-26).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/host/gelu.hpp"

namespace loom::kernels::cuda {

namespace detail {

// e^(-2u) for the GELU input x, as host::detail::gelu_exp_minus_2u: the
// exponent x (gelu_c1 + gelu_c3 x^2) clamped to [-80, 80]. A NaN exponent
// fails both comparisons and becomes 80, as on the host; NaN comes back
// through x afterwards.
__device__ inline float gelu_exp_minus_2u(float x) {
    const float z = __fmul_rn(x, __fadd_rn(host::detail::gelu_c1, __fmul_rn(host::detail::gelu_c3, __fmul_rn(x, x))));
    float clamped = z < 80.0f ? z : 80.0f;
    clamped = clamped > -80.0f ? clamped : -80.0f;
    return expf(clamped);
}

// gelu(x) = x / (1 + e^(-2u)), in the host's roundings.
__device__ inline float gelu_value(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, gelu_exp_minus_2u(x))); }

// dx = dy s (1 - x (e s) (gelu_c1 + 3 gelu_c3 x^2)), with e = e^(-2u) and
// s = 1 / (1 + e), multiplied in the host's order.
__device__ inline float gelu_input_grad(float x, float dy) {
    constexpr float three_c3 = 3.0f * host::detail::gelu_c3;  // folded as the host folds 3.0f * gelu_c3
    const float e = gelu_exp_minus_2u(x);
    const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
    const float minus_2du = __fadd_rn(host::detail::gelu_c1, __fmul_rn(three_c3, __fmul_rn(x, x)));
    const float t = __fmul_rn(__fmul_rn(x, __fmul_rn(e, s)), minus_2du);
    return __fmul_rn(dy, __fmul_rn(s, __fsub_rn(1.0f, t)));
}

// Templates for the reason given in elementwise.cuh; f32 only, since the
// intrinsics that pin the rounding are the float ones. With `quads` (every
// pointer 16-byte aligned) a thread takes four elements an iteration, one
// 16-byte load per array and four independent exponentials in flight: one
// element a thread reached only 0.68 of the copy bandwidth on an H200 (each
// needs an expf and an IEEE division). The last n % 4 elements, or all of
// them without `quads`, go one a thread. Each element is computed alike
// either way, so the bits do not depend on the path.

template <class T>
__global__ void gelu_forward_kernel(const T* x, T* y, std::int64_t n, bool quads) {
    static_assert(std::is_same_v<T, float>, "gelu_forward_kernel is f32 only");
    std::int64_t first_single = 0;
    if (quads) {
        const auto* x4 = reinterpret_cast<const float4*>(x);
        auto* y4 = reinterpret_cast<float4*>(y);
        for (std::int64_t i = grid_index(); i < n / 4; i += grid_stride()) {
            float4 v = x4[i];
            v.x = gelu_value(v.x);
            v.y = gelu_value(v.y);
            v.z = gelu_value(v.z);
            v.w = gelu_value(v.w);
            y4[i] = v;
        }
        first_single = n / 4 * 4;
    }
    for (std::int64_t i = first_single + grid_index(); i < n; i += grid_stride()) y[i] = gelu_value(x[i]);
}

template <class T>
__global__ void gelu_backward_kernel(const T* x, const T* dy, T* dx, std::int64_t n, bool quads) {
    static_assert(std::is_same_v<T, float>, "gelu_backward_kernel is f32 only");
    std::int64_t first_single = 0;
    if (quads) {
        const auto* x4 = reinterpret_cast<const float4*>(x);
        const auto* dy4 = reinterpret_cast<const float4*>(dy);
        auto* dx4 = reinterpret_cast<float4*>(dx);
        for (std::int64_t i = grid_index(); i < n / 4; i += grid_stride()) {
            const float4 xv = x4[i];
            const float4 g = dy4[i];
            dx4[i] = make_float4(gelu_input_grad(xv.x, g.x), gelu_input_grad(xv.y, g.y), gelu_input_grad(xv.z, g.z),
                                 gelu_input_grad(xv.w, g.w));
        }
        first_single = n / 4 * 4;
    }
    for (std::int64_t i = first_single + grid_index(); i < n; i += grid_stride()) dx[i] = gelu_input_grad(x[i], dy[i]);
}

// Whether every pointer is 16-byte aligned, for the four-element path.
template <class... Pointers>
[[nodiscard]] inline bool all_16_byte_aligned(Pointers... pointers) noexcept {
    return ((reinterpret_cast<std::uintptr_t>(pointers) % 16 == 0) && ...);
}

}  // namespace detail

// y = gelu(x) for n elements. y may be x (in place).
inline void gelu_forward(const float* x, float* y, std::int64_t n, cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    const bool quads = detail::all_16_byte_aligned(x, y);
    detail::gelu_forward_kernel<float><<<blocks_for(quads ? (n + 3) / 4 : n), threads_per_block, 0, stream>>>(
        x, y, n, quads);
    LOOM_CUDA_CHECK_LAUNCH();
}

// dx = dy * gelu'(x), written (not accumulated). dx may be dy (in place).
inline void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n,
                          cudaStream_t stream = nullptr) {
    if (n <= 0) return;
    const bool quads = detail::all_16_byte_aligned(x, dy, dx);
    detail::gelu_backward_kernel<float><<<blocks_for(quads ? (n + 3) / 4 : n), threads_per_block, 0, stream>>>(
        x, dy, dx, n, quads);
    LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::kernels::cuda
