// kernels::gemm_bias, a Linear's forward (y = x W^T + b), on the GPU through
// the CUDA backend, which adds the bias in cuBLASLt's epilogue
// (kernels/cuda/gemm.cuh), against the host, which writes the bias rows and
// accumulates the product onto them. f32 and bf16 products; the sums' order
// differs, so each element is allowed 2e-5 of sum_k |a||b| + |bias|, the
// GEMM tests' bound. Shapes with M and N multiples of 8 and without (the
// bf16 product then goes through its padded scratch, bias included), a bias
// at an address cuBLASLt's epilogue does not take (the fallback, bias rows
// then the product, for f32 at both shapes and bf16 at the aligned one; the
// padded bf16 product copies the bias to an aligned scratch first), and
// K = 0 (the bias rows, bit for bit). C starts as NaN
// bytes: it is written, never read. Host C++ (g++): only the backend's
// translation unit is nvcc's. Skipped with the rest when no GPU is present.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "loom/core/device_buffer.hpp"
#include "loom/kernels/ops.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::Shape;
using loom::Tensor;
using loom::kernels::MatmulPrecision;
using loom::kernels::Trans;

std::vector<float> normal_values(std::int64_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
}

loom::DeviceBuffer on_gpu(const std::vector<float>& values) {
    loom::DeviceBuffer buffer(loom::DType::f32, Shape{static_cast<std::int64_t>(values.size())}, loom::cuda_device(0));
    loom::copy_tensor(buffer.tensor(), Tensor::of(values.data(), Shape{buffer.tensor().numel()}));
    return buffer;
}

// y[M, N] = x[M, K] W[N, K]^T + bias on the host and on the GPU; the bias
// read from `bias_offset` floats into its buffer.
void check_biased_product(MatmulPrecision precision, std::int64_t M, std::int64_t N, std::int64_t K,
                          std::int64_t bias_offset) {
    CAPTURE(precision == MatmulPrecision::bf16 ? "bf16" : "f32", M, N, K, bias_offset);
    std::vector<float> x = normal_values(M * K, 11), w = normal_values(N * K, 12),
                       bias_storage = normal_values(N + bias_offset, 13);
    const std::vector<float> bias(bias_storage.begin() + bias_offset, bias_storage.end());
    std::vector<float> host(static_cast<std::size_t>(M * N), std::numeric_limits<float>::quiet_NaN());
    loom::kernels::gemm_bias(precision, Trans::no, Trans::yes, M, N, K, Tensor::of(x.data(), Shape{M, K}), K,
                             Tensor::of(w.data(), Shape{N, K}), K,
                             Tensor::of(bias_storage.data() + bias_offset, Shape{N}), Tensor::of(host.data(), Shape{M, N}));

    const loom::DeviceBuffer gx = on_gpu(x), gw = on_gpu(w), gbias = on_gpu(bias_storage),
                             gy = on_gpu(std::vector<float>(host.size(), std::numeric_limits<float>::quiet_NaN()));
    const Tensor bias_view = gbias.tensor().slice(0, bias_offset, bias_offset + N);
    loom::kernels::gemm_bias(precision, Trans::no, Trans::yes, M, N, K, gx.tensor().reshape(Shape{M, K}), K,
                             gw.tensor().reshape(Shape{N, K}), K, bias_view, gy.tensor().reshape(Shape{M, N}));
    const std::vector<float> gpu = loom::to_host<float>(gy.tensor());

    std::int64_t off = 0;  // elements past the bound
    for (std::int64_t r = 0; r < M; ++r)
        for (std::int64_t c = 0; c < N; ++c) {
            double scale = std::abs(bias[static_cast<std::size_t>(c)]);
            for (std::int64_t k = 0; k < K; ++k)
                scale += std::abs(x[static_cast<std::size_t>(r * K + k)] * w[static_cast<std::size_t>(c * K + k)]);
            const auto i = static_cast<std::size_t>(r * N + c);
            if (!(std::abs(gpu[i] - host[i]) <= 2e-5 * scale)) ++off;
        }
    CHECK(off == 0);
}

}  // namespace

TEST_CASE("gemm_bias on the GPU adds the bias in the product's pass and equals the host's bias rows plus product",
          "[device][gemm]") {
    for (const MatmulPrecision precision : {MatmulPrecision::f32, MatmulPrecision::bf16}) {
        check_biased_product(precision, 64, 96, 40, 0);   // every dimension a multiple of 8
        check_biased_product(precision, 37, 50, 19, 0);   // M and N odd: bf16 goes through the padded scratch
        check_biased_product(precision, 64, 96, 40, 1);   // a bias 4 bytes off alignment: the fallback
        check_biased_product(precision, 37, 50, 19, 3);
    }
}

TEST_CASE("gemm_bias with K = 0 writes the bias rows, bit for bit", "[device][gemm]") {
    for (const MatmulPrecision precision : {MatmulPrecision::f32, MatmulPrecision::bf16}) {
        const std::int64_t M = 5, N = 7;
        const std::vector<float> bias = normal_values(N, 21);
        const loom::DeviceBuffer gx = on_gpu(std::vector<float>(1)), gw = on_gpu(std::vector<float>(1)),
                                 gbias = on_gpu(bias),
                                 gy = on_gpu(std::vector<float>(M * N, std::numeric_limits<float>::quiet_NaN()));
        loom::kernels::gemm_bias(precision, Trans::no, Trans::yes, M, N, 0, gx.tensor().slice(0, 0, 0), 1,
                                 gw.tensor().slice(0, 0, 0), 1, gbias.tensor(), gy.tensor().reshape(Shape{M, N}));
        const std::vector<float> y = loom::to_host<float>(gy.tensor());
        for (std::int64_t r = 0; r < M; ++r)
            for (std::int64_t c = 0; c < N; ++c)
                CHECK(y[static_cast<std::size_t>(r * N + c)] == bias[static_cast<std::size_t>(c)]);
    }
}

}  // namespace LOOM_TEST_FILE
