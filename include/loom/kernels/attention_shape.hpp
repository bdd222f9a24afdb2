// The shape and argument checks of causal multi-head attention, shared by the
// host and the CUDA kernels so both refuse the same inputs with the same
// words, the scale every kernel uses, and the CUDA kernels' own limit on the
// head size. The int
// bound on a qkv row is the host BLAS's; the device keeps it too, so that
// both accept the same shapes.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/core/host_device.hpp"

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

// The whole-sequence kernels' checks (host and CUDA, f32 and bf16): the
// shape, then non-null buffers unless B or T is 0 (nothing to do).
inline void check_attention_forward_arguments(const float* qkv, const float* out, const float* lse, std::int64_t B,
                                              std::int64_t T, std::int64_t H, std::int64_t D) {
    check_attention_shape("attention_forward", B, T, H, D);
    LOOM_CHECK((B == 0 || T == 0) || (qkv != nullptr && out != nullptr && lse != nullptr),
               "attention_forward: qkv, out and lse must all be non-null for B = ", B, ", T = ", T);
}

inline void check_attention_backward_arguments(const float* qkv, const float* out, const float* dout,
                                               const float* lse, const float* dqkv, std::int64_t B, std::int64_t T,
                                               std::int64_t H, std::int64_t D) {
    check_attention_shape("attention_backward", B, T, H, D);
    LOOM_CHECK((B == 0 || T == 0) ||
                   (qkv != nullptr && out != nullptr && dout != nullptr && lse != nullptr && dqkv != nullptr),
               "attention_backward: qkv, out, dout, lse and dqkv must all be non-null for B = ", B, ", T = ", T);
}

// The scores' scale 1/sqrt(D), rounded once to float the same way by every
// attention kernel, host and CUDA, whole-sequence and block.
[[nodiscard]] inline float attention_scale(std::int64_t D) {
    return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
}

// The softmax's shift at MatmulPrecision::bf16: a row's running max m rounded
// up to a whole multiple of ln 2, so that e^(s - shift) moves by a power of
// two when the shift does. Why: P = e^(s - shift) is rounded to bf16 before
// P V reads it, and bf16 rounding commutes with a power of two. The serial
// kernel shifts a row by its running max over its key tiles, a ring block by
// the max over the block's keys; with this shift both round each P to the
// same bf16 value up to a factor 2^k, which their normalisation (or the
// ring's merge) removes. So ring attention at bf16 equals the serial kernel
// to f32 reassociation, as at f32, rather than to half a bf16 step of every
// P, and a device kernel equals the host's emulation whatever its tiles.
// (The f32 rounding of ln 2 * k makes the factor 2^k to about 2^-22 only;
// that decides a rounding just for a P within so much of a bf16 midpoint,
// as reassociation does elsewhere.) Never below m, so e^(s - shift) <= 1
// cannot overflow: where the f32 products round the multiple below m (a
// score within an ulp above a multiple, or beyond 10^8), m itself is the
// shift. -inf, a row that saw nothing, stays -inf; NaN stays NaN.
LOOM_HOST_DEVICE inline float bf16_softmax_shift(float max) {
    const float shift = 0.693147181f * ceilf(max * 1.44269504f);
    return shift < max ? max : shift;
}

}  // namespace loom::kernels
