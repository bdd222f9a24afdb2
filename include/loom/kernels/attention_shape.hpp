// The shape checks of causal multi-head attention, shared by the host and the
// CUDA kernels so both refuse the same shapes with the same words. The int
// bound on a qkv row is the host BLAS's; the device keeps it too, so that
// both accept the same shapes.
#pragma once

#include <climits>
#include <cstdint>

#include "loom/core/error.hpp"

namespace loom::kernels {

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
