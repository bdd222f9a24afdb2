// Device kernels behind loom::comm::Nccl's reductions, the device mirror of
// host_reduce.hpp: bf16/f16 widen to f32 before NCCL adds them and narrow back
// with one round-to-nearest-even; float max goes through order-preserving
// integer keys so NaN propagates; avg divides once, after the sum.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "loom/core/check_cuda.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/host_device.hpp"

namespace loom::comm::detail {

// A float as an int32 whose signed order is the float order (-0 just below
// +0), with every NaN mapped above +Inf. An integer max over keys is then a
// float max that propagates NaN; NCCL's own float max (fmaxf) drops NaN, so a
// diverged rank could hide behind it.
LOOM_HOST_DEVICE constexpr std::int32_t float_order_key(float value) noexcept {
    const auto u = loom::detail::bit_cast<std::uint32_t>(value);
    if ((u & 0x7fff'ffffu) > 0x7f80'0000u) return 0x7fff'ffff;  // every NaN, one key: the quiet NaN 0x7fffffff
    const auto i = static_cast<std::int32_t>(u);
    return i >= 0 ? i : i ^ 0x7fff'ffff;  // negative floats count down from -0
}

LOOM_HOST_DEVICE constexpr float float_from_order_key(std::int32_t key) noexcept {
    return loom::detail::bit_cast<float>(static_cast<std::uint32_t>(key >= 0 ? key : key ^ 0x7fff'ffff));
}

template <class T>
LOOM_HOST_DEVICE constexpr float widen_to_float(T value) noexcept {
    if constexpr (std::is_same_v<T, float>)
        return value;
    else
        return to_float(value);
}

// Grid-stride loops: any count fits in a bounded grid, and 64-bit indices
// keep arrays past 2^31 elements correct.
template <class T>
__global__ void widen_kernel(const T* in, float* out, std::int64_t n) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
        out[i] = widen_to_float(in[i]);
}

template <class T>
__global__ void widen_key_kernel(const T* in, std::int32_t* out, std::int64_t n) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
        out[i] = float_order_key(widen_to_float(in[i]));
}

// Division, not multiplication by 1/n: the serial reference divides, and
// x / 1 is exact, so sums pass through unchanged.
template <class T>
__global__ void narrow_kernel(const float* in, T* out, std::int64_t n, float divisor) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
        out[i] = T(in[i] / divisor);
}

// Exact: the maximum is one of the inputs, so converting it back never rounds.
template <class T>
__global__ void narrow_key_kernel(const std::int32_t* in, T* out, std::int64_t n) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride) {
        const float value = float_from_order_key(in[i]);
        if constexpr (std::is_same_v<T, float>)
            out[i] = value;
        else
            out[i] = T(value);
    }
}

// avg of f32 and integers after NCCL's sum: integer division truncates toward
// zero, as host_reduce.hpp does (ncclAvg premultiplies floats by 1/n instead).
template <class T>
__global__ void divide_kernel(T* data, std::int64_t n, T divisor) {
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
        data[i] = data[i] / divisor;
}

inline constexpr unsigned reduce_block = 256;

// Enough blocks to fill any current GPU; the grid-stride loop does the rest.
[[nodiscard]] inline unsigned reduce_grid(std::int64_t n) {
    return static_cast<unsigned>(std::clamp<std::int64_t>((n + reduce_block - 1) / reduce_block, 1, 4096));
}

template <class Launch>
inline void with_element_type(DType dtype, Launch&& launch) {
    switch (dtype) {
        case DType::f32: launch(float{}); return;
        case DType::bf16: launch(bf16{}); return;
        case DType::f16: launch(f16{}); return;
        case DType::i32: launch(std::int32_t{}); return;
        case DType::i64: launch(std::int64_t{}); return;
    }
    LOOM_FAIL("invalid DType value ", static_cast<int>(dtype), "; valid dtypes are ", loom::detail::valid_dtype_list());
}

// `n` elements of floating `dtype` at `in` to 4-byte accumulators at `out`:
// f32 values for sum and avg, order keys (int32) for max.
inline void launch_widen(DType dtype, const void* in, void* out, std::int64_t n, bool keys, cudaStream_t stream) {
    if (n == 0) return;
    LOOM_CHECK(is_floating(dtype), "widening ", dtype, " is not defined; only f32, bf16 and f16 are staged");
    with_element_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
            if (keys)
                widen_key_kernel<T><<<reduce_grid(n), reduce_block, 0, stream>>>(
                    static_cast<const T*>(in), static_cast<std::int32_t*>(out), n);
            else
                widen_kernel<T><<<reduce_grid(n), reduce_block, 0, stream>>>(static_cast<const T*>(in),
                                                                            static_cast<float*>(out), n);
        }
    });
    LOOM_CUDA_CHECK(cudaGetLastError());
}

// The inverse of launch_widen, dividing f32 sums by `divisor` before the one rounding.
inline void launch_narrow(DType dtype, const void* in, void* out, std::int64_t n, bool keys, float divisor,
                          cudaStream_t stream) {
    if (n == 0) return;
    LOOM_CHECK(is_floating(dtype), "narrowing to ", dtype, " is not defined; only f32, bf16 and f16 are staged");
    with_element_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
            if (keys)
                narrow_key_kernel<T><<<reduce_grid(n), reduce_block, 0, stream>>>(
                    static_cast<const std::int32_t*>(in), static_cast<T*>(out), n);
            else
                narrow_kernel<T><<<reduce_grid(n), reduce_block, 0, stream>>>(static_cast<const float*>(in),
                                                                             static_cast<T*>(out), n, divisor);
        }
    });
    LOOM_CUDA_CHECK(cudaGetLastError());
}

// In place: `data` holds n sums of f32, i32 or i64; each becomes sum / divisor.
inline void launch_divide(DType dtype, void* data, std::int64_t n, int divisor, cudaStream_t stream) {
    if (n == 0 || divisor == 1) return;
    LOOM_CHECK(dtype == DType::f32 || dtype == DType::i32 || dtype == DType::i64, "dividing ", dtype,
               " sums in place is not defined; bf16 and f16 divide while narrowing");
    with_element_type(dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>)
            divide_kernel<T><<<reduce_grid(n), reduce_block, 0, stream>>>(static_cast<T*>(data), n,
                                                                         static_cast<T>(divisor));
    });
    LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::comm::detail
