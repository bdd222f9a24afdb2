// The argument checks every GEMM entry point makes, host and CUDA alike, so
// that a bad size or leading dimension gets one message whichever backend
// runs the product (the tests compare the backends' messages): sizes are
// >= 0, and each leading dimension covers a stored row of its operand.
// Matrices are row-major; op(X) = X or X^T as stored (kernels/trans.hpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/trans.hpp"

namespace loom::kernels {

// "yes" or "no", as the messages name a transpose.
[[nodiscard]] inline const char* trans_name(Trans t) { return t == Trans::yes ? "yes" : "no"; }

// C (M x N) = op(A) (M x K) op(B) (K x N), with rows lda, ldb and ldc apart.
inline void check_gemm_arguments(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda,
                                 std::int64_t ldb, std::int64_t ldc) {
    LOOM_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: sizes M = ", M, ", N = ", N, ", K = ", K, " must all be >= 0");
    const std::int64_t a_cols = ta == Trans::no ? K : M;
    const std::int64_t b_cols = tb == Trans::no ? N : K;
    LOOM_CHECK(lda >= std::max<std::int64_t>(1, a_cols), "gemm: lda = ", lda, " is shorter than a stored row of A (",
               a_cols, " columns with ta = ", trans_name(ta), ", M = ", M, ", K = ", K, "); pass lda >= ",
               std::max<std::int64_t>(1, a_cols));
    LOOM_CHECK(ldb >= std::max<std::int64_t>(1, b_cols), "gemm: ldb = ", ldb, " is shorter than a stored row of B (",
               b_cols, " columns with tb = ", trans_name(tb), ", K = ", K, ", N = ", N, "); pass ldb >= ",
               std::max<std::int64_t>(1, b_cols));
    LOOM_CHECK(ldc >= std::max<std::int64_t>(1, N), "gemm: ldc = ", ldc, " is shorter than a row of C (N = ", N,
               "); pass ldc >= ", std::max<std::int64_t>(1, N));
}

}  // namespace loom::kernels
