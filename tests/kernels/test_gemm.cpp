// Host GEMM: every transpose pair against a double-precision loop, with row
// strides longer than the rows, beta 0 (C overwritten, NaN included) and
// beta 1 (accumulated); the argument checks; the BLAS thread knob.
#include <catch2/catch.hpp>

#include "support/gemm_operands.hpp"
#include "support/message_of.hpp"

#include <loom/core/rng.hpp>
#include <loom/kernels/host/gemm.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::kernels::host::gemm;
using loom::kernels::host::Trans;

using loom_test::message_of;
using loom_test::op_at;

// The values this file has always drawn: seed 7.
std::vector<float> normal_values(std::size_t n, std::uint64_t stream) { return loom_test::normal_values(n, stream, 7); }

}  // namespace

TEST_CASE("gemm matches a double-precision product for every transpose pair, padded strides and beta 0 or 1",
          "[kernels][gemm]") {
    const std::int64_t M = 7, N = 5, K = 9;
    const float alpha = 0.75f;
    for (Trans ta : {Trans::no, Trans::yes}) {
        for (Trans tb : {Trans::no, Trans::yes}) {
            for (float beta : {0.0f, 1.0f}) {
                CAPTURE(static_cast<bool>(ta), static_cast<bool>(tb), beta);
                // Stored shapes, each row padded by a few unused columns.
                const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
                const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
                const std::int64_t lda = a_cols + 3, ldb = b_cols + 2, ldc = N + 4;
                const auto A = normal_values(static_cast<std::size_t>(a_rows * lda), 1);
                const auto B = normal_values(static_cast<std::size_t>(b_rows * ldb), 2);
                auto C = normal_values(static_cast<std::size_t>(M * ldc), 3);
                const auto C_before = C;
                if (beta == 0.0f) {
                    // BLAS ignores C's values when beta = 0, NaN included.
                    for (std::int64_t i = 0; i < M; ++i)
                        for (std::int64_t j = 0; j < N; ++j)
                            C[static_cast<std::size_t>(i * ldc + j)] = std::numeric_limits<float>::quiet_NaN();
                }
                gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
                for (std::int64_t i = 0; i < M; ++i) {
                    for (std::int64_t j = 0; j < ldc; ++j) {
                        const auto at = static_cast<std::size_t>(i * ldc + j);
                        if (j >= N) {  // padding: never touched
                            CHECK(C[at] == C_before[at]);
                            continue;
                        }
                        double product = 0.0, magnitude = 0.0;
                        for (std::int64_t k = 0; k < K; ++k) {
                            const double term = op_at(A, lda, ta, i, k) * op_at(B, ldb, tb, k, j);
                            product += term;
                            magnitude += std::fabs(term);
                        }
                        const double expected = alpha * product + (beta == 0.0f ? 0.0 : double{C_before[at]});
                        const double scale = alpha * magnitude + std::fabs(double{C_before[at]});
                        CHECK(std::fabs(C[at] - expected) <= 2e-6 * scale + 1e-12);  // ~K + 2 roundings of 6e-8
                    }
                }
            }
        }
    }
}

TEST_CASE("gemm with K = 0 scales C by beta, and with M = 0 or N = 0 writes nothing", "[kernels][gemm]") {
    std::vector<float> C{1.0f, 2.0f, 3.0f, 4.0f};
    const std::vector<float> unused(1, 5.0f);
    gemm(Trans::no, Trans::no, 2, 2, 0, 1.0f, unused.data(), 1, unused.data(), 2, 0.5f, C.data(), 2);
    CHECK(C == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
    gemm(Trans::no, Trans::no, 0, 2, 3, 1.0f, unused.data(), 3, unused.data(), 2, 0.0f, C.data(), 2);
    gemm(Trans::no, Trans::no, 2, 0, 3, 1.0f, unused.data(), 3, unused.data(), 1, 0.0f, C.data(), 1);
    CHECK(C == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
}

TEST_CASE("gemm rejects negative sizes and row strides shorter than a stored row, naming the value",
          "[kernels][gemm]") {
    std::vector<float> buffer(256, 1.0f);
    const float* x = buffer.data();
    float* c = buffer.data();
    CHECK(message_of([&] { gemm(Trans::no, Trans::no, -1, 4, 4, 1.0f, x, 4, x, 4, 0.0f, c, 4); }) ==
          "gemm: sizes M = -1, N = 4, K = 4 must all be >= 0");
    CHECK(message_of([&] { gemm(Trans::no, Trans::no, 3, 4, 5, 1.0f, x, 4, x, 4, 0.0f, c, 4); }) ==
          "gemm: lda = 4 is shorter than a stored row of A (5 columns with ta = no, M = 3, K = 5); pass lda >= 5");
    CHECK(message_of([&] { gemm(Trans::yes, Trans::no, 3, 4, 5, 1.0f, x, 2, x, 4, 0.0f, c, 4); }) ==
          "gemm: lda = 2 is shorter than a stored row of A (3 columns with ta = yes, M = 3, K = 5); pass lda >= 3");
    CHECK(message_of([&] { gemm(Trans::no, Trans::yes, 3, 4, 5, 1.0f, x, 5, x, 4, 0.0f, c, 4); }) ==
          "gemm: ldb = 4 is shorter than a stored row of B (5 columns with tb = yes, K = 5, N = 4); pass ldb >= 5");
    CHECK(message_of([&] { gemm(Trans::no, Trans::no, 3, 4, 5, 1.0f, x, 5, x, 4, 0.0f, c, 3); }) ==
          "gemm: ldc = 3 is shorter than a row of C (N = 4); pass ldc >= 4");
    CHECK(message_of([&] { gemm(Trans::no, Trans::no, 1, 1, std::int64_t{1} << 31, 1.0f, x, std::int64_t{1} << 31, x,
                                1, 0.0f, c, 1); }) ==
          "gemm: K = 2147483648 exceeds the BLAS's int range (at most 2147483647); split the product");
}

TEST_CASE("set_blas_threads sets what blas_threads reports and refuses fewer than one thread", "[kernels][gemm]") {
    using loom::kernels::host::blas_threads;
    using loom::kernels::host::set_blas_threads;
    const int before = blas_threads();
    REQUIRE(before >= 1);
    set_blas_threads(1);
    CHECK(blas_threads() == 1);
    set_blas_threads(before);
    CHECK(blas_threads() == before);
    CHECK(message_of([] { set_blas_threads(0); }) == "set_blas_threads: threads = 0; pass at least 1");
}

TEST_CASE("measure_sgemm_gflops returns a finite positive rate and checks its arguments", "[kernels][gemm]") {
    using loom::kernels::host::measure_sgemm_gflops;
    const double rate = measure_sgemm_gflops(64, 3);
    CHECK(std::isfinite(rate));
    CHECK(rate > 0.0);
    CHECK(message_of([] { (void)measure_sgemm_gflops(0); }) == "measure_sgemm_gflops: n = 0; pass n >= 1");
    CHECK(message_of([] { (void)measure_sgemm_gflops(8, 0); }) == "measure_sgemm_gflops: reps = 0; pass reps >= 1");
}

}  // namespace LOOM_TEST_FILE
