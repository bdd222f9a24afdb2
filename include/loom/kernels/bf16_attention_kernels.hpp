// Which CUDA kernels run attention at MatmulPrecision::bf16, chosen when a
// process starts by the environment variable LOOM_CUDA_ATTENTION:
//
//   mma   (the default) kernels/cuda/attention_mma.cuh: mma.sync.m16n8k16
//         products with P and dS kept in registers (FlashAttention-2's
//         layout), D_i formed once per row. On an H200 (run 5): every test
//         passed, and forward + backward ran 3.8 to 3.9 times as fast as wmma.
//   wmma  kernels/cuda/attention_bf16.cuh: 16 x 16 x 16 wmma products, each
//         block of scores through shared memory for the softmax. The first
//         tensor-core kernels; they stay as the reference the mma kernels
//         were measured against, and as a fallback a user can pick.
//
// Both compute what host::attention_*_bf16_inputs emulates, to f32
// reassociation; only their speed should differ. Why an environment variable
// rather than a flag: the choice is the backend's, below every trainer, and a
// benchmark or a profile can compare the two without a rebuild or a new flag
// in every program. A host header (no CUDA) so that its parsing is tested
// where there is no GPU.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <string_view>

#include "loom/core/error.hpp"

namespace loom::kernels {

enum class Bf16AttentionKernels : std::uint8_t { wmma, mma };

[[nodiscard]] constexpr const char* name_of(Bf16AttentionKernels k) noexcept {
    return k == Bf16AttentionKernels::mma ? "mma" : "wmma";
}

inline std::ostream& operator<<(std::ostream& out, Bf16AttentionKernels k) { return out << name_of(k); }

// LOOM_CUDA_ATTENTION's value: unset or empty is the default (mma); anything
// but wmma or mma throws naming the value and the choices.
[[nodiscard]] inline Bf16AttentionKernels parse_bf16_attention_kernels(const char* value) {
    const std::string_view text = value == nullptr ? std::string_view{} : std::string_view{value};
    if (text.empty() || text == "mma") return Bf16AttentionKernels::mma;
    if (text == "wmma") return Bf16AttentionKernels::wmma;
    LOOM_FAIL("LOOM_CUDA_ATTENTION = '", text, "' is not one of: mma (the default), wmma");
}

// The process's choice, read once. A bad value throws at every call, with the
// same message on every rank (every rank reads the same environment).
[[nodiscard]] inline Bf16AttentionKernels bf16_attention_kernels() {
    static const Bf16AttentionKernels chosen = parse_bf16_attention_kernels(std::getenv("LOOM_CUDA_ATTENTION"));
    return chosen;
}

}  // namespace loom::kernels
