// MatmulPrecision: the arithmetic of the matrix products layers ask for (every
// Linear, and through it attention's projections and the head; SUMMA's blocks
// on an Optimus 2D grid; attention's own products, kernels/host/
// attention_bf16.hpp). A run-time choice, set per trainer or executor
// (ExecutorOptions::matmul, SerialTrainerOptions::matmul, train_gpt
// --matmul), carried by each micro-batch's Context.
//
//   f32   f32 operands, f32 products and sums (the default). CUDA runs cuBLASLt
//         with CUBLAS_COMPUTE_32F (no TF32), so host and GPU agree up to the
//         order of the sums.
//   bf16  op(A) and op(B) are rounded to bf16 (round to nearest, ties to even:
//         loom::to_bf16), their products accumulated in f32 and C written in
//         f32. A product of two bf16 values is exact in f32, so the only
//         difference from the f32 product of the rounded operands is the order
//         of the sums: the host emulates it exactly that way (round, then
//         sgemm), and CUDA runs bf16 x bf16 -> f32 on tensor cores.
//
// bf16 is what PyTorch's bf16 autocast does to a Linear's inputs, with one
// difference on purpose: the output stays f32 (autocast rounds it to bf16
// too), so the layers after a product (LayerNorm, GELU, softmax, the
// residual stream) see f32 values and the master weights, gradients and
// AdamW moments stay f32. Weights are rounded at each product, so a ZeRO-3
// gather, a tensor-parallel shard or a pipeline stage rounds exactly the
// elements the serial run rounds: parallel equals serial holds per
// precision, up to reassociation, as it does in f32.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

#include "loom/core/error.hpp"

namespace loom::kernels {

enum class MatmulPrecision : std::uint8_t { f32, bf16 };

[[nodiscard]] constexpr const char* name_of(MatmulPrecision p) noexcept {
    return p == MatmulPrecision::bf16 ? "bf16" : "f32";
}

inline std::ostream& operator<<(std::ostream& out, MatmulPrecision p) { return out << name_of(p); }

// "f32" or "bf16"; anything else throws naming the value and the choices.
[[nodiscard]] inline MatmulPrecision parse_matmul_precision(std::string_view text) {
    if (text == "f32") return MatmulPrecision::f32;
    if (text == "bf16") return MatmulPrecision::bf16;
    LOOM_FAIL("matmul precision '", text, "' is not one of: f32, bf16");
}

}  // namespace loom::kernels
