// The rank-order reduction of DeviceThreadComm (device_thread_comm.cuh): one
// kernel reduces every member's input into every member's output, bit for bit
// with the host ThreadComm. Every element is reduced over the members in order
// 0, 1, ..., n-1, accumulating bf16/f16 in f32 and rounding once, dividing
// once for avg (integers toward zero), max taking the first NaN
// (host_reduce.hpp's max_propagating_nan, not the NCCL path's order keys,
// which would canonicalise NaN payloads and order -0 below +0). Compile with
// nvcc, link loom::cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "loom/comm/communicator.hpp"
#include "loom/comm/device_reduce.cuh"
#include "loom/core/check_cuda.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/host_device.hpp"

namespace loom::comm::detail {

// The most members one device group may have: the reduction kernel takes
// every member's input and output address as one by-value parameter.
inline constexpr int device_group_max_members = 64;

// Kernel parameter: the addresses of one reduction (1 KiB, well under the
// 4 KiB parameter limit of every architecture loom builds for).
struct RankPointers {
    const void* in[device_group_max_members];
    void* out[device_group_max_members];
};

template <class T>
using device_accumulator_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

template <class T>
LOOM_HOST_DEVICE constexpr device_accumulator_t<T> widen_for_reduce(T value) noexcept {
    if constexpr (std::is_integral_v<T>)
        return value;
    else
        return widen_to_float(value);  // device_reduce.cuh
}

template <class T>
LOOM_HOST_DEVICE constexpr T narrow_from_reduce(device_accumulator_t<T> value) noexcept {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
        return T(value);
    else
        return value;
}

// host_reduce.hpp's max_propagating_nan, term for term: the first NaN wins
// (payload kept), otherwise `a < b ? b : a`, so ties of -0 and +0 resolve as
// on the host.
template <class A>
LOOM_HOST_DEVICE constexpr A max_like_host(A a, A b) noexcept {
    if constexpr (std::is_same_v<A, float>) {
        if ((loom::detail::bit_cast<std::uint32_t>(a) & 0x7fff'ffffu) > 0x7f80'0000u) return a;
        if ((loom::detail::bit_cast<std::uint32_t>(b) & 0x7fff'ffffu) > 0x7f80'0000u) return b;
    }
    return a < b ? b : a;
}

// out_m[i] = reduce over k = 0, 1, ..., inputs-1 of in_k[i], for i < count
// and every output m, in host_reduce's order and arithmetic. An output may
// alias an input element for element: each element is read, then written, by
// one thread.
template <class T>
__global__ void rank_order_reduce_kernel(RankPointers p, int inputs, int outputs, std::int64_t count, ReduceOp op) {
    using A = device_accumulator_t<T>;
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
        A acc = widen_for_reduce(static_cast<const T*>(p.in[0])[i]);
        for (int k = 1; k < inputs; ++k) {
            const A x = widen_for_reduce(static_cast<const T*>(p.in[k])[i]);
            acc = op == ReduceOp::max ? max_like_host(acc, x) : acc + x;
        }
        // Division, not multiplication by 1/n, as the host and the serial run.
        if (op == ReduceOp::avg) acc = acc / static_cast<A>(inputs);
        const T result = narrow_from_reduce<T>(acc);
        for (int m = 0; m < outputs; ++m) static_cast<T*>(p.out[m])[i] = result;
    }
}

inline void launch_rank_order_reduce(DType dtype, ReduceOp op, const RankPointers& pointers, int inputs, int outputs,
                                     std::int64_t count, cudaStream_t stream) {
    if (count == 0) return;
    with_element_type(dtype, [&](auto tag) {  // device_reduce.cuh
        using T = decltype(tag);
        rank_order_reduce_kernel<T><<<reduce_grid(count), reduce_block, 0, stream>>>(pointers, inputs, outputs, count, op);
    });
    LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::comm::detail
