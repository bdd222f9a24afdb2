// The shape checks of causal multi-head attention, shared by the host and the
// CUDA kernels so both refuse the same shapes with the same words, and the
// CUDA kernels' own limit on the head size. The int
// bound on a qkv row is the host BLAS's; the device keeps it too, so that
// both accept the same shapes.
#pragma once

#include <climits>
#include <cstdint>

#include "loom/core/error.hpp"

namespace loom::kernels {

// The largest head size D the CUDA attention kernels take: their shared-memory
// tiles hold 128 floats per row (kernels/cuda/attention_tiles.cuh), and the
// sequence-parallel block kernels keep a row in registers
// (kernels/cuda/attention_blocks.cuh); both use this value. Named here,
// in the host core, so host code (train_gpt's flag checks) can refuse a model
// before a run starts rather than at its first attention call.
inline constexpr std::int64_t cuda_attention_max_head_size = 128;

inline void check_attention_shape(const char* who, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) {
    LOOM_CHECK(B >= 0, who, ": batch size B = ", B, " must be >= 0");
    LOOM_CHECK(T >= 0, who, ": sequence length T = ", T, " must be >= 0");
    LOOM_CHECK(H >= 1, who, ": head count H = ", H, " must be >= 1");
    LOOM_CHECK(D >= 1, who, ": head size D = ", D, " must be >= 1");
    // The BLAS takes int leading dimensions; a qkv row is 3 * H * D floats.
    LOOM_CHECK(H <= INT_MAX / 3 / D, who, ": qkv row width 3*H*D = 3*", H, "*", D,
               " exceeds the BLAS's int range (at most ", INT_MAX, ")");
}

}  // namespace loom::kernels
