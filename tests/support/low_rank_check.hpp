// That a matrix's columns came out orthonormal from PowerSGD's Gram-Schmidt
// (kernels/*/low_rank.hpp), as the CUDA test (tests/cuda/
// test_kernels_compression.cu) and the simulated one (tests/simulated/
// test_quantize_simulated.cpp) both check it. CUDA-free.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

namespace loom_test {

// p [rows, cols] row-major: column a . column b within 1e-5 of 1 for a == b
// < rows, else of 0 (with more columns than rows, the rest come out zero).
inline void check_orthonormal_columns(const std::vector<float>& p, std::int64_t rows, std::int64_t cols) {
    for (std::int64_t a = 0; a < cols; ++a)
        for (std::int64_t b = 0; b <= a; ++b) {
            double dot = 0;
            for (std::int64_t r = 0; r < rows; ++r) dot += static_cast<double>(p[r * cols + a]) * p[r * cols + b];
            const double expected = a == b && a < rows ? 1.0 : 0.0;
            CAPTURE(a, b);
            CHECK(std::abs(dot - expected) < 1e-5);
        }
}

}  // namespace loom_test
