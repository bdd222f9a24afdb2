// Whether a GEMM operand is used as stored or transposed: one enumeration for
// the host and the CUDA GEMM alike, so a layer passes the same value to
// either backend. Matrices are row-major; op(X) = X or X^T as stored.
#pragma once

namespace loom::kernels {

enum class Trans : bool { no, yes };

}  // namespace loom::kernels
