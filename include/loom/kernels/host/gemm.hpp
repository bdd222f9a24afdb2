// Host GEMM: C = alpha * op(A) * op(B) + beta * C, in f32 or with operands
// rounded to bf16 first (MatmulPrecision::bf16). Row-major, f32; lda/ldb/ldc
// are the row strides of the matrices as stored. Runs loom's own packed
// micro-kernels at this CPU's instruction level by default, or the CBLAS the
// build found (OpenBLAS by preference, cmake/LoomBlas.cmake) with
// LOOM_HOST_GEMM=blas: kernels/host/gemm_dispatch.hpp. Also the knobs a
// trainer needs around it: the thread count, and a measurement of this
// machine's sgemm peak for benchmarks to compare against.
#pragma once

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <vector>

#include <cblas.h>

#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/gemm_arguments.hpp"
#include "loom/kernels/host/gemm_dispatch.hpp"
#include "loom/kernels/host/gemm_threads.hpp"
#include "loom/kernels/trans.hpp"

// OpenBLAS's cblas.h includes openblas_config.h, which defines OPENBLAS_VERSION
// and declares the thread controls: call them directly (a strong reference
// also works in static links). With another CBLAS header, reach them through
// weak declarations on ELF: they are non-null exactly when the OpenBLAS
// library is what got linked (another CBLAS is then simply not configured).
#if defined(OPENBLAS_VERSION)
#define LOOM_BLAS_THREADS_DIRECT 1
#elif defined(__GNUC__) && defined(__ELF__)
#define LOOM_BLAS_THREADS_WEAK 1
extern "C" {
void openblas_set_num_threads(int threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}
#endif

namespace loom::kernels::host {

using kernels::Trans;  // op(X) = X or X^T, as stored row-major (kernels/trans.hpp)

namespace detail {

// CBLAS takes int sizes (LP64 builds); larger ones would wrap silently.
inline void check_blas_int(const char* what, std::int64_t value) {
    LOOM_CHECK(value <= INT_MAX, "gemm: ", what, " = ", value, " exceeds the BLAS's int range (at most ", INT_MAX,
               "); split the product");
}

// The argument checks every GEMM entry point makes (kernels/gemm_arguments.hpp,
// the CUDA GEMM's too), then the BLAS's int range. (Its own name: an
// unqualified check_gemm_arguments would also find the shared one through Trans.)
inline void check_blas_gemm_arguments(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                                      std::int64_t lda, std::int64_t ldb, std::int64_t ldc) {
    kernels::check_gemm_arguments(ta, tb, M, N, K, lda, ldb, ldc);
    check_blas_int("M", M);
    check_blas_int("N", N);
    check_blas_int("K", K);
    check_blas_int("lda", lda);
    check_blas_int("ldb", ldb);
    check_blas_int("ldc", ldc);
}

// A stored [rows, cols] matrix with row stride ld, each element rounded to
// bf16 (loom::to_bf16: to nearest, ties to even) and widened back, rows
// out_ld apart: packed by default, or at the input's own strides (out_ld = ld)
// where a caller indexes the copy as it would the original. Only the first
// cols of each row are read and written.
[[nodiscard]] inline std::vector<float> rounded_to_bf16(const float* x, std::int64_t rows, std::int64_t cols,
                                                        std::int64_t ld, std::int64_t out_ld = -1) {
    if (out_ld < 0) out_ld = cols;
    std::vector<float> out(rows > 0 ? static_cast<std::size_t>((rows - 1) * out_ld + cols) : 0);
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
            out[static_cast<std::size_t>(r * out_ld + c)] = to_float(to_bf16(x[r * ld + c]));
    return out;
}

}  // namespace detail

// C[M, N] = alpha * op(A)[M, K] * op(B)[K, N] + beta * C. A is stored [M, K]
// (ta = no) or [K, M] (ta = yes), B [K, N] or [N, K]; each row stride must
// cover its stored row. beta = 0 overwrites C (any NaN there included), as BLAS
// specifies; K = 0 scales C by beta. With loom's kernels C[i][j] is the same
// bits however M and N are split (between threads, tensor-parallel shards).
inline void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const float* A,
                 std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
    detail::check_blas_gemm_arguments(ta, tb, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0) return;  // nothing to write; some BLAS builds reject the call outright
    gemm_detail::dispatched_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The same product at MatmulPrecision::bf16 (kernels/matmul_precision.hpp):
// every element of A and B rounded to bf16 (nearest even), then the f32 sum
// of their exact products, into the f32 C. loom's kernels round the operands
// as they pack them and run the f32 micro-kernels (the same bits as the f32
// GEMM of rounded copies, at the f32 rate), or, asked for on a CPU with
// AVX512_BF16, bf16 dot products (vdpbf16ps, set_bf16_dot_products); the
// BLAS path rounds into copies and calls sgemm. All are the host's emulation
// of a tensor-core bf16 GEMM, equal to it up to the order of the sums.
inline void gemm_bf16_inputs(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                             const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                             std::int64_t ldc) {
    detail::check_blas_gemm_arguments(ta, tb, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0) return;
    const HostGemm choice = host_gemm();
    if (choice.backend == HostGemmBackend::loom) {
        gemm_detail::loom_product(choice, true, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
    const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
    const std::vector<float> a = detail::rounded_to_bf16(A, a_rows, a_cols, lda);
    const std::vector<float> b = detail::rounded_to_bf16(B, b_rows, b_cols, ldb);
    gemm(ta, tb, M, N, K, alpha, a.data(), std::max<std::int64_t>(1, a_cols), b.data(),
         std::max<std::int64_t>(1, b_cols), beta, C, ldc);
}

// y[r, :] = row for each of `rows` rows of n (a bias before an accumulating
// product).
inline void repeat_rows(const float* row, float* y, std::int64_t rows, std::int64_t n) {
    for (std::int64_t r = 0; r < rows; ++r) std::copy_n(row, n, y + r * n);
}

// C[M, N] = alpha op(A) op(B) + bias[N] on every row, at f32 or, with
// bf16_inputs, as gemm_bf16_inputs: a Linear's forward. loom's kernels add
// the bias in the product's own pass (the first k block's tiles read the bias
// row where they would read C); the BLAS path writes the bias rows first and
// multiplies onto them (beta = 1). Both are fma(1, bias, alpha * acc) at the
// first k block: the same bits. A device may add it in its epilogue (CUDA:
// cuBLASLt's), equal up to the order of the sums. C's rows are contiguous
// (ldc = N).
inline void gemm_bias(bool bf16_inputs, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                      float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                      const float* bias, float* C, std::int64_t ldc) {
    LOOM_CHECK(ldc == N, "gemm_bias: ldc = ", ldc, " but the bias rows are written contiguously; pass ldc = N = ", N);
    const HostGemm choice = host_gemm();
    if (choice.backend == HostGemmBackend::loom) {
        detail::check_blas_gemm_arguments(ta, tb, M, N, K, lda, ldb, ldc);
        if (M == 0 || N == 0) return;
        gemm_detail::loom_product(choice, bf16_inputs, ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc, bias);
        return;
    }
    repeat_rows(bias, C, M, N);
    if (bf16_inputs)
        gemm_bf16_inputs(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc);
    else
        gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc);
}

// Threads one host GEMM may use, for loom's kernels (set_gemm_threads) and the
// BLAS alike (OpenBLAS: openblas_set_num_threads; nothing more with another
// BLAS). Rank threads that each run their own GEMMs want 1 here, so ranks do
// not oversubscribe the cores between them.
inline void set_blas_threads(int threads) {
    LOOM_CHECK(threads >= 1, "set_blas_threads: threads = ", threads, "; pass at least 1");
    set_gemm_threads(threads);
#if defined(LOOM_BLAS_THREADS_DIRECT)
    openblas_set_num_threads(threads);
#elif defined(LOOM_BLAS_THREADS_WEAK)
    if (openblas_set_num_threads != nullptr) openblas_set_num_threads(threads);
#endif
}

// The BLAS's current thread count: OpenBLAS's own answer, else 1.
[[nodiscard]] inline int blas_threads() {
#if defined(LOOM_BLAS_THREADS_DIRECT)
    return openblas_get_num_threads();
#elif defined(LOOM_BLAS_THREADS_WEAK)
    return openblas_get_num_threads != nullptr ? openblas_get_num_threads() : 1;
#else
    return 1;
#endif
}

// This machine's single-precision GEMM rate right now, in GFLOP/s (2 n^3 flops
// per n x n x n product), with the BLAS's current thread count: the median of
// `reps` timed products after one untimed warm-up. For benchmarks, which report
// their own rate as a fraction of it; the machine's other load counts too,
// which is the point of measuring instead of quoting a datasheet.
[[nodiscard]] inline double measure_sgemm_gflops(std::int64_t n = 1024, int reps = 5) {
    LOOM_CHECK(n >= 1, "measure_sgemm_gflops: n = ", n, "; pass n >= 1");
    LOOM_CHECK(reps >= 1, "measure_sgemm_gflops: reps = ", reps, "; pass reps >= 1");
    const auto size = static_cast<std::size_t>(n * n);
    // Values of order 1 that stay away from subnormals whatever n is.
    std::vector<float> a(size), b(size), c(size, 0.0f);
    for (std::size_t i = 0; i < size; ++i) {
        a[i] = 0.5f + static_cast<float>(i % 7) * 0.125f;
        b[i] = 1.0f - static_cast<float>(i % 5) * 0.125f;
    }
    const float alpha = 1.0f / static_cast<float>(n);
    gemm(Trans::no, Trans::no, n, n, n, alpha, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
    std::vector<double> seconds(static_cast<std::size_t>(reps));
    for (double& s : seconds) {
        const auto start = std::chrono::steady_clock::now();
        gemm(Trans::no, Trans::no, n, n, n, alpha, a.data(), n, b.data(), n, 0.0f, c.data(), n);
        s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds.size() % 2 == 1
                               ? seconds[seconds.size() / 2]
                               : 0.5 * (seconds[seconds.size() / 2 - 1] + seconds[seconds.size() / 2]);
    const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
    return flops / median * 1e-9;
}

}  // namespace loom::kernels::host
