// MatmulPrecision::bf16 on the host (kernels/host/gemm.hpp's
// gemm_bf16_inputs, kernels/ops.hpp's precision overload): the product equals
// the f32 GEMM of the operands rounded to bf16, bit for bit when rounding
// into the f32 kernels and up to reassociation with vdpbf16ps, for every
// transpose pair with padded strides; it differs from the f32 product of the
// unrounded operands; it checks its arguments with the f32 GEMM's messages;
// the precision's names parse and print.
#include <catch2/catch.hpp>

#include "support/bf16_product_ways.hpp"
#include "support/gemm_operands.hpp"
#include "support/message_of.hpp"

#include <loom/core/dtype.hpp>
#include <loom/core/rng.hpp>
#include <loom/core/tensor.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/kernels/matmul_precision.hpp>
#include <loom/kernels/ops.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::kernels::MatmulPrecision;
using loom::kernels::host::gemm;
using loom::kernels::host::gemm_bf16_inputs;
using loom::kernels::host::Trans;
using loom_test::message_of;
using loom_test::normal_values;

}  // namespace

TEST_CASE("gemm_bf16_inputs is the f32 GEMM of the operands rounded to bf16, for every transpose pair",
          "[kernels][gemm][bf16]") {
    const std::int64_t M = 7, N = 5, K = 33;
    // Rounding into the f32 kernels: its bits; vdpbf16ps (where this CPU has
    // it): the same exact products summed in another order.
    loom_test::for_each_bf16_product_way([&](bool dot) {
        for (Trans ta : {Trans::no, Trans::yes})
            for (Trans tb : {Trans::no, Trans::yes})
                for (float beta : {0.0f, 1.0f}) {
                    CAPTURE(dot, static_cast<bool>(ta), static_cast<bool>(tb), beta);
                    const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
                    const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
                    const std::int64_t lda = a_cols + 3, ldb = b_cols + 2, ldc = N + 4;
                    const auto A = normal_values(static_cast<std::size_t>(a_rows * lda), 1);
                    const auto B = normal_values(static_cast<std::size_t>(b_rows * ldb), 2);
                    const auto C0 = normal_values(static_cast<std::size_t>(M * ldc), 3);
                    auto C = C0, expected = C0, unrounded = C0;
                    gemm_bf16_inputs(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
                    const auto A16 = loom_test::rounded_to_bf16(A), B16 = loom_test::rounded_to_bf16(B);
                    gemm(ta, tb, M, N, K, 0.5f, A16.data(), lda, B16.data(), ldb, beta, expected.data(), ldc);
                    gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, beta, unrounded.data(), ldc);
                    if (!dot) CHECK(C == expected);  // padding included: it is left as it was
                    for (std::int64_t i = 0; i < M && dot; ++i)
                        for (std::int64_t j = 0; j < ldc; ++j) {
                            const auto at = static_cast<std::size_t>(i * ldc + j);
                            double magnitude = std::fabs(double{C0[at]});
                            for (std::int64_t k = 0; k < K && j < N; ++k)
                                magnitude += 0.5 * std::fabs(double{loom_test::op_at(A16, lda, ta, i, k)} *
                                                             loom_test::op_at(B16, ldb, tb, k, j));
                            CHECK(std::fabs(C[at] - expected[at]) <= 2.0 * (K + 3) * 6e-8 * magnitude);
                        }
                    CHECK(C != unrounded);  // the rounding happened
                    CHECK(C[static_cast<std::size_t>(N)] == C0[static_cast<std::size_t>(N)]);  // a pad element
                }
    });
}

TEST_CASE("gemm_bf16_inputs rounds to nearest with ties to even, and keeps infinities and NaN", "[kernels][gemm][bf16]") {
    // 1 + 2^-8 is halfway between bf16's 1 and 1 + 2^-7: ties to even gives 1;
    // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: it goes up.
    const std::vector<float> a{1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f};
    const std::vector<float> b{1.0f, 1.0f, 1.0f};
    std::vector<float> c(3, 0.0f);
    // C[3, 1] = A[3, 1] * B[1, 1].
    gemm_bf16_inputs(Trans::no, Trans::no, 3, 1, 1, 1.0f, a.data(), 1, b.data(), 1, 0.0f, c.data(), 1);
    CHECK(c == std::vector<float>{1.0f, 1.0f + 0x1p-6f, 1.0f});
    const std::vector<float> special{std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
    std::vector<float> d(2, 0.0f);
    gemm_bf16_inputs(Trans::no, Trans::no, 2, 1, 1, 1.0f, special.data(), 1, b.data(), 1, 0.0f, d.data(), 1);
    CHECK(d[0] == std::numeric_limits<float>::infinity());
    CHECK(std::isnan(d[1]));
}

TEST_CASE("gemm_bf16_inputs checks its arguments with the f32 GEMM's messages, and K = 0 scales C",
          "[kernels][gemm][bf16]") {
    std::vector<float> buffer(64, 1.0f);
    const float* x = buffer.data();
    float* c = buffer.data();
    CHECK(message_of([&] { gemm_bf16_inputs(Trans::no, Trans::no, -1, 4, 4, 1.0f, x, 4, x, 4, 0.0f, c, 4); }) ==
          "gemm: sizes M = -1, N = 4, K = 4 must all be >= 0");
    CHECK(message_of([&] { gemm_bf16_inputs(Trans::no, Trans::no, 3, 4, 5, 1.0f, x, 4, x, 4, 0.0f, c, 4); }) ==
          "gemm: lda = 4 is shorter than a stored row of A (5 columns with ta = no, M = 3, K = 5); pass lda >= 5");
    CHECK(message_of([&] { gemm_bf16_inputs(Trans::no, Trans::yes, 3, 4, 5, 1.0f, x, 5, x, 4, 0.0f, c, 4); }) ==
          "gemm: ldb = 4 is shorter than a stored row of B (5 columns with tb = yes, K = 5, N = 4); pass ldb >= 5");
    std::vector<float> scaled{1.5f, -2.0f};
    gemm_bf16_inputs(Trans::no, Trans::no, 1, 2, 0, 1.0f, x, 1, x, 2, 2.0f, scaled.data(), 2);
    CHECK(scaled == std::vector<float>{3.0f, -4.0f});
}

TEST_CASE("kernels::gemm at a MatmulPrecision: f32 is the plain product, bf16 rounds the operands",
          "[kernels][gemm][bf16]") {
    const std::int64_t M = 4, N = 3, K = 17;
    auto A = normal_values(static_cast<std::size_t>(M * K), 4), B = normal_values(static_cast<std::size_t>(K * N), 5);
    std::vector<float> c32(static_cast<std::size_t>(M * N)), c16(c32.size()), want32(c32.size()), want16(c32.size());
    using loom::Tensor;
    const auto tA = Tensor::of(A.data(), {M * K}), tB = Tensor::of(B.data(), {K * N});
    loom::kernels::gemm(MatmulPrecision::f32, Trans::no, Trans::no, M, N, K, 1.0f, tA, K, tB, N, 0.0f,
                        Tensor::of(c32.data(), {M * N}), N);
    loom::kernels::gemm(MatmulPrecision::bf16, Trans::no, Trans::no, M, N, K, 1.0f, tA, K, tB, N, 0.0f,
                        Tensor::of(c16.data(), {M * N}), N);
    gemm(Trans::no, Trans::no, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, want32.data(), N);
    gemm_bf16_inputs(Trans::no, Trans::no, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, want16.data(), N);
    CHECK(c32 == want32);
    CHECK(c16 == want16);
    CHECK(c16 != c32);
}

TEST_CASE("MatmulPrecision parses and prints f32 and bf16, and names a bad value and the choices",
          "[kernels][gemm][bf16]") {
    CHECK(loom::kernels::parse_matmul_precision("f32") == MatmulPrecision::f32);
    CHECK(loom::kernels::parse_matmul_precision("bf16") == MatmulPrecision::bf16);
    std::ostringstream out;
    out << MatmulPrecision::bf16 << " " << MatmulPrecision::f32;
    CHECK(out.str() == "bf16 f32");
    CHECK(message_of([] { (void)loom::kernels::parse_matmul_precision("fp8"); }) ==
          "matmul precision 'fp8' is not one of: f32, bf16");
    CHECK(message_of([] { (void)loom::kernels::parse_matmul_precision(""); }) ==
          "matmul precision '' is not one of: f32, bf16");
}

}  // namespace LOOM_TEST_FILE
