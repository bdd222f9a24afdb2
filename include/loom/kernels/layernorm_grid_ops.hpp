// The steps of LayerNorm on an Optimus 2D grid (kernels/host/layernorm_grid.hpp)
// on Tensors wherever they live, as kernels/ops.hpp does for the whole-row
// kernels: host tensors run the host loops, a device's run its backend's entries (kernels/kernel_table.hpp).
// x, y, dy, dx: [rows, C]; mean, rstd: [rows]; sums: [2, rows].
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/kernels/kernel_list.hpp"
#include "loom/kernels/host/layernorm_grid.hpp"
#include "loom/kernels/ops.hpp"

namespace loom::kernels {


inline void layernorm_grid_row_sums(const Tensor& x, const Tensor& sums, std::int64_t rows, std::int64_t C) {
    const Device d = detail::common_device("layernorm_grid_row_sums", {&x, &sums});
    run<kernel::layernorm_grid_row_sums>(d, detail::ptr<float>(x), detail::ptr<float>(sums), rows, C);
}

inline void layernorm_grid_centered_squares(const Tensor& x, const Tensor& mean, const Tensor& squares,
                                            std::int64_t rows, std::int64_t C, float inverse_C) {
    const Device d = detail::common_device("layernorm_grid_centered_squares", {&x, &mean, &squares});
    run<kernel::layernorm_grid_centered_squares>(d, detail::ptr<float>(x), detail::ptr<float>(mean), detail::ptr<float>(squares), rows, C, inverse_C);
}

inline void layernorm_grid_normalize(const Tensor& x, const Tensor& gain, const Tensor& shift, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& y, std::int64_t rows, std::int64_t C,
                                     float inverse_C, float eps) {
    const Device d = detail::common_device("layernorm_grid_normalize", {&x, &gain, &shift, &mean, &rstd, &y});
    run<kernel::layernorm_grid_normalize>(d, detail::ptr<float>(x), detail::ptr<float>(gain), detail::ptr<float>(shift), detail::ptr<float>(mean), detail::ptr<float>(rstd), detail::ptr<float>(y), rows, C, inverse_C, eps);
}

inline void layernorm_grid_backward_sums(const Tensor& dy, const Tensor& x, const Tensor& gain, const Tensor& mean,
                                         const Tensor& rstd, const Tensor& sums, std::int64_t rows, std::int64_t C) {
    const Device d = detail::common_device("layernorm_grid_backward_sums", {&dy, &x, &gain, &mean, &rstd, &sums});
    run<kernel::layernorm_grid_backward_sums>(d, detail::ptr<float>(dy), detail::ptr<float>(x), detail::ptr<float>(gain), detail::ptr<float>(mean), detail::ptr<float>(rstd), detail::ptr<float>(sums), rows, C);
}

inline void layernorm_grid_backward_apply(const Tensor& dy, const Tensor& x, const Tensor& gain, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& sums, const Tensor& dx, std::int64_t rows,
                                          std::int64_t C, float inverse_C) {
    const Device d =
        detail::common_device("layernorm_grid_backward_apply", {&dy, &x, &gain, &mean, &rstd, &sums, &dx});
    run<kernel::layernorm_grid_backward_apply>(d, detail::ptr<float>(dy), detail::ptr<float>(x), detail::ptr<float>(gain), detail::ptr<float>(mean), detail::ptr<float>(rstd), detail::ptr<float>(sums), detail::ptr<float>(dx), rows, C, inverse_C);
}

}  // namespace loom::kernels
