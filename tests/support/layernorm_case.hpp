// One LayerNorm kernel test case: seeded inputs, the host's results, and the
// weight gradients' tolerances, shared by the CUDA test
// (tests/cuda/test_kernels_quantize_norm.cu, on a GPU) and the simulated one
// (tests/simulated/test_row_kernels_simulated.cpp) so that both hold the
// kernels to the same inputs and bounds. CUDA-free.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "loom/kernels/host/layernorm.hpp"
#include "support/comparisons.hpp"

namespace loom_test {

struct LayerNormCase {
    std::int64_t rows, C;
    // Inputs: x ~ N(3, 2), gain ~ N(1, 0.1), shift ~ N(0, 0.1), dy ~ N(0, 1),
    // and the weight gradients' nonzero starting values (the kernel adds).
    std::vector<float> x, gain, shift, dy, dgain0, dshift0;
    // The host's: forward, input gradient, weight gradients added onto dgain0, dshift0.
    std::vector<float> y, mean, rstd, dx, dgain, dshift;

    LayerNormCase(std::int64_t rows_, std::int64_t C_, float eps, std::mt19937& rng) : rows(rows_), C(C_) {
        const auto size = static_cast<std::size_t>(rows * C), columns = static_cast<std::size_t>(C);
        x = normal_values(size, rng, 3.0f, 2.0f);
        gain = normal_values(columns, rng, 1.0f, 0.1f);
        shift = normal_values(columns, rng, 0.0f, 0.1f);
        dy = normal_values(size, rng);
        dgain0 = normal_values(columns, rng);
        dshift0 = normal_values(columns, rng);
        y.resize(size);
        mean.resize(static_cast<std::size_t>(rows));
        rstd.resize(static_cast<std::size_t>(rows));
        dx.resize(size);
        dgain = dgain0;
        dshift = dshift0;
        namespace host = loom::kernels::host;
        host::layernorm_forward(x.data(), gain.data(), shift.data(), y.data(), mean.data(), rstd.data(), rows, C,
                                eps);
        host::layernorm_backward_input(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(), dx.data(), rows,
                                       C);
        host::layernorm_backward_weight(dy.data(), x.data(), mean.data(), rstd.data(), dgain.data(), dshift.data(),
                                        rows, C);
    }

    // Column j's bound for dgain and for dshift: `column_rtol` times its
    // |starting value| plus the sum over rows of |each term| (dy xhat, dy).
    struct ColumnBounds {
        std::vector<double> gain, shift;
    };
    [[nodiscard]] ColumnBounds column_bounds(double column_rtol) const {
        const auto columns = static_cast<std::size_t>(C);
        ColumnBounds b{std::vector<double>(columns), std::vector<double>(columns)};
        for (std::int64_t j = 0; j < C; ++j) {
            b.gain[j] = std::fabs(dgain0[j]);
            b.shift[j] = std::fabs(dshift0[j]);
        }
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t j = 0; j < C; ++j) {
                const double d = dy[r * C + j];
                const double xhat = (static_cast<double>(x[r * C + j]) - mean[r]) * rstd[r];
                b.gain[j] += std::fabs(d * xhat);
                b.shift[j] += std::fabs(d);
            }
        for (std::int64_t j = 0; j < C; ++j) {
            b.gain[j] *= column_rtol;
            b.shift[j] *= column_rtol;
        }
        return b;
    }
};

}  // namespace loom_test
