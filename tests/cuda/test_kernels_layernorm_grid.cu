// The CUDA steps of LayerNorm on an Optimus 2D grid (kernels/cuda/
// layernorm_grid.cuh) against their host twins on the same inputs: each
// step alone, on shapes with one row, one feature, odd sizes and 2^16 rows.
// Tolerance: 1e-5 relative to max(|host|, 1); nvcc may contract the
// products into FMAs where the host rounds twice.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "device_support.hpp"
#include "loom/kernels/cuda/layernorm_grid.cuh"
#include "loom/kernels/host/layernorm_grid.hpp"

namespace {

namespace device = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_test::compare_relative;
using loom_test::DeviceArray;
using loom_test::uniform;

struct Shape2 {
    std::int64_t rows, C;
};
constexpr Shape2 shapes[] = {{1, 1}, {1, 7}, {7, 1}, {33, 48}, {1 << 16, 3}};

}  // namespace

TEST_CASE("the CUDA steps of grid LayerNorm follow the host's within 1e-5", "[kernels][layernorm]") {
    for (const Shape2 s : shapes) {
        INFO(s.rows << " x " << s.C);
        const auto n = static_cast<std::size_t>(s.rows * s.C), rows = static_cast<std::size_t>(s.rows);
        const float inverse_C = 1.0f / static_cast<float>(2 * s.C);  // as if the grid row held 2 ranks
        const std::vector<float> x = uniform(n, -2.0f, 2.0f, 61u), dy = uniform(n, -1.0f, 1.0f, 62u);
        const std::vector<float> gain = uniform(static_cast<std::size_t>(s.C), 0.5f, 1.5f, 63u);
        const std::vector<float> shift = uniform(static_cast<std::size_t>(s.C), -0.5f, 0.5f, 64u);
        const DeviceArray<float> d_x(x), d_dy(dy), d_gain(gain), d_shift(shift);

        // Forward: the row sums, then (from the same "all-reduced" sums on
        // both sides) the centered squares, then the normalisation.
        std::vector<float> sums(rows);
        host::layernorm_grid_row_sums(x.data(), sums.data(), s.rows, s.C);
        DeviceArray<float> d_sums(rows);
        device::layernorm_grid_row_sums(d_x.get(), d_sums.get(), s.rows, s.C);
        CHECK_NO_MISMATCHES("row sums", compare_relative(d_sums.to_host(), sums, 1e-5));

        std::vector<float> mean = sums, squares(rows);
        host::layernorm_grid_centered_squares(x.data(), mean.data(), squares.data(), s.rows, s.C, inverse_C);
        DeviceArray<float> d_mean(sums), d_squares(rows);
        device::layernorm_grid_centered_squares(d_x.get(), d_mean.get(), d_squares.get(), s.rows, s.C, inverse_C);
        CHECK_NO_MISMATCHES("mean", compare_relative(d_mean.to_host(), mean, 1e-5));
        CHECK_NO_MISMATCHES("squares", compare_relative(d_squares.to_host(), squares, 1e-5));

        std::vector<float> rstd = squares, y(n);
        host::layernorm_grid_normalize(x.data(), gain.data(), shift.data(), mean.data(), rstd.data(), y.data(), s.rows,
                                       s.C, inverse_C, 1e-5f);
        DeviceArray<float> d_mean_h(mean), d_rstd(squares), d_y(n);
        device::layernorm_grid_normalize(d_x.get(), d_gain.get(), d_shift.get(), d_mean_h.get(), d_rstd.get(), d_y.get(),
                                         s.rows, s.C, inverse_C, 1e-5f);
        CHECK_NO_MISMATCHES("rstd", compare_relative(d_rstd.to_host(), rstd, 1e-5));
        CHECK_NO_MISMATCHES("y", compare_relative(d_y.to_host(), y, 1e-5));

        // Backward: the two sums, then dx from the same sums on both sides.
        std::vector<float> grad_sums(2 * rows);
        host::layernorm_grid_backward_sums(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(), grad_sums.data(),
                                           s.rows, s.C);
        const DeviceArray<float> d_rstd_h(rstd);
        DeviceArray<float> d_grad_sums(2 * rows);
        device::layernorm_grid_backward_sums(d_dy.get(), d_x.get(), d_gain.get(), d_mean_h.get(), d_rstd_h.get(),
                                             d_grad_sums.get(), s.rows, s.C);
        CHECK_NO_MISMATCHES("backward sums", compare_relative(d_grad_sums.to_host(), grad_sums, 1e-5));

        std::vector<float> dx(n);
        host::layernorm_grid_backward_apply(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(),
                                            grad_sums.data(), dx.data(), s.rows, s.C, inverse_C);
        const DeviceArray<float> d_grad_sums_h(grad_sums);
        DeviceArray<float> d_dx(n);
        device::layernorm_grid_backward_apply(d_dy.get(), d_x.get(), d_gain.get(), d_mean_h.get(), d_rstd_h.get(),
                                              d_grad_sums_h.get(), d_dx.get(), s.rows, s.C, inverse_C);
        CHECK_NO_MISMATCHES("dx", compare_relative(d_dx.to_host(), dx, 1e-5));
    }
}
