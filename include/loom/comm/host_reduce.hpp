// Host reductions for the shared-memory collectives: combine N input arrays
// element by element and store the result into M output arrays in one pass.
// Inputs are combined in rank order, so every rank's copy of the result is the
// same bits; bf16/f16 accumulate in f32 and round once, like the serial run.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "loom/comm/communicator.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

namespace detail {

// The type a reduction accumulates in.
template <class T>
using accumulator_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

template <class T>
[[nodiscard]] inline accumulator_t<T> widen(T value) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
        return to_float(value);
    else
        return value;
}

template <class T>
[[nodiscard]] inline T narrow(accumulator_t<T> value) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
        return T(value);
    else
        return value;
}

template <class A>
[[nodiscard]] inline A max_propagating_nan(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
        if (std::isnan(a)) return a;
        if (std::isnan(b)) return b;
    }
    return a < b ? b : a;
}

// Elements per tile: the accumulator stays in L1 while inputs stream through.
inline constexpr std::size_t reduce_tile = 2048;

// Copies a finished tile to its destination. Streaming (non-temporal) stores
// skip the read-for-ownership of each destination line: for results far
// larger than the caches that is a third of the memory traffic saved.
inline void store_tile(void* out, const void* tile, std::size_t bytes, bool streaming) {
#if defined(__SSE2__)
    if (streaming) {
        auto* to = static_cast<char*>(out);
        const auto* from = static_cast<const char*>(tile);
        const std::size_t head = std::min(bytes, (16 - reinterpret_cast<std::uintptr_t>(to) % 16) % 16);
        std::memcpy(to, from, head);
        std::size_t i = head;
        for (; i + 16 <= bytes; i += 16)
            _mm_stream_si128(reinterpret_cast<__m128i*>(to + i),
                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)));
        std::memcpy(to + i, from + i, bytes - i);
        return;
    }
#endif
    std::memcpy(out, tile, bytes);
}

template <class T>
inline void reduce_typed(std::span<const void* const> inputs, std::span<void* const> outputs, std::size_t offset,
                         std::size_t count, ReduceOp op, bool streaming) {
    using A = accumulator_t<T>;
    alignas(64) A acc[reduce_tile];
    alignas(64) T narrowed[std::is_same_v<T, A> ? 1 : reduce_tile];
    const std::size_t n = inputs.size();
    for (std::size_t begin = 0; begin < count; begin += reduce_tile) {
        const std::size_t len = std::min(reduce_tile, count - begin);
        const T* first = static_cast<const T*>(inputs[0]) + offset + begin;
        for (std::size_t i = 0; i < len; ++i) acc[i] = widen(first[i]);
        for (std::size_t k = 1; k < n; ++k) {
            const T* in = static_cast<const T*>(inputs[k]) + offset + begin;
            if (op == ReduceOp::max) {
                for (std::size_t i = 0; i < len; ++i) acc[i] = max_propagating_nan(acc[i], widen(in[i]));
            } else {
                for (std::size_t i = 0; i < len; ++i) acc[i] += widen(in[i]);
            }
        }
        if (op == ReduceOp::avg) {
            // Division, not multiplication by 1/n: the serial reference divides.
            const A divisor = static_cast<A>(n);
            for (std::size_t i = 0; i < len; ++i) acc[i] /= divisor;
        }
        const void* tile = acc;
        if constexpr (!std::is_same_v<T, A>) {
            for (std::size_t i = 0; i < len; ++i) narrowed[i] = narrow<T>(acc[i]);
            tile = narrowed;
        }
        for (void* out_base : outputs) store_tile(static_cast<T*>(out_base) + offset + begin, tile, len * sizeof(T), streaming);
    }
#if defined(__SSE2__)
    if (streaming) _mm_sfence();  // streamed lines visible before the barrier that publishes them
#endif
}

}  // namespace detail

// out_m[offset + i] = reduce_k(in_k[offset + i]) for i < count, for every
// output m. Outputs may alias inputs element for element (in place): each
// tile is read completely before it is written. `streaming` writes around the
// caches: for results too large to be read back from them anyway.
inline void host_reduce(DType dtype, ReduceOp op, std::span<const void* const> inputs,
                        std::span<void* const> outputs, std::size_t offset, std::size_t count,
                        bool streaming = false) {
    LOOM_CHECK(!inputs.empty(), "host_reduce needs at least one input");
    switch (dtype) {
        case DType::f32: return detail::reduce_typed<float>(inputs, outputs, offset, count, op, streaming);
        case DType::bf16: return detail::reduce_typed<bf16>(inputs, outputs, offset, count, op, streaming);
        case DType::f16: return detail::reduce_typed<f16>(inputs, outputs, offset, count, op, streaming);
        case DType::i32: return detail::reduce_typed<std::int32_t>(inputs, outputs, offset, count, op, streaming);
        case DType::i64: return detail::reduce_typed<std::int64_t>(inputs, outputs, offset, count, op, streaming);
    }
    LOOM_FAIL("host_reduce: unknown dtype ", static_cast<int>(dtype));
}

}  // namespace loom::comm
