// GELU, tanh form, as PyTorch's gelu(approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
// Computed through the identity 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)): one
// vectorisable exp instead of a libm tanh (a call per element GCC cannot
// vectorise), and no cancellation in 1 + tanh(u) for negative x, so the result
// keeps its relative accuracy where the literal formula loses it.
#pragma once

#include <cstdint>

#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/gemm_threads.hpp"

namespace loom::kernels::host {

namespace detail {

// -2u = x (gelu_c1 + gelu_c3 x^2), the exponent of the sigmoid form.
inline constexpr float gelu_c1 = static_cast<float>(-2.0 * 0.7978845608028654);             // -2 sqrt(2/pi)
inline constexpr float gelu_c3 = static_cast<float>(-2.0 * 0.7978845608028654 * 0.044715);  // -2 sqrt(2/pi) 0.044715

// e^(-2u) for the GELU input x. The exponent is clamped to [-80, 80], inside
// exp_in_range's domain: at -80 the sigmoid is 1 to float precision; at 80
// (x below about -9.7) it is 1.8e-35, still a normal float, so no subnormal
// ever enters the arithmetic (the true value is smaller still; the difference
// is below 1e-33). A NaN x gives e^80 here and NaN through x afterwards.
[[nodiscard]] LOOM_KERNEL_INLINE float gelu_exp_minus_2u(float x) {
    const float z = x * (gelu_c1 + gelu_c3 * (x * x));
    float zc = blend(z < 80.0f, z, 80.0f);
    zc = blend(zc > -80.0f, zc, -80.0f);
    return exp_in_range(zc);
}

// Elements per thread's range: below this, waking a second thread costs more than it saves.
inline constexpr std::int64_t gelu_elements_per_range = std::int64_t{1} << 14;

LOOM_KERNEL_DISPATCH inline void gelu_forward_elements(const float* x, float* y, std::int64_t n) noexcept {
    for (std::int64_t i = 0; i < n; ++i) {
        const float xi = x[i];
        y[i] = xi / (1.0f + gelu_exp_minus_2u(xi));
    }
}

// With E = e^(-2u) and s = 1 / (1 + E):  gelu'(x) = s (1 + 2 x (1 - s) u'(x)),
// where 1 - s = E s exactly (no cancellation) and 2 u'(x) = -(gelu_c1 + 3 gelu_c3 x^2).
LOOM_KERNEL_DISPATCH inline void gelu_backward_elements(const float* x, const float* dy, float* dx,
                                                        std::int64_t n) noexcept {
    for (std::int64_t i = 0; i < n; ++i) {
        const float xi = x[i];
        const float e = gelu_exp_minus_2u(xi);
        const float s = 1.0f / (1.0f + e);
        const float minus_2du = gelu_c1 + 3.0f * gelu_c3 * (xi * xi);
        dx[i] = dy[i] * (s * (1.0f - xi * (e * s) * minus_2du));
    }
}

}  // namespace detail

// y = gelu(x) for n elements. y may be x (in place). Elements are
// independent: a rank with GEMM threads runs ranges of them side by side.
inline void gelu_forward(const float* x, float* y, std::int64_t n) {
    run_in_ranges(n, [&](std::int64_t first, std::int64_t end) {
        detail::gelu_forward_elements(x + first, y + first, end - first);
    }, detail::gelu_elements_per_range);
}

// dx = dy * gelu'(x), written (not accumulated). dx may be dy (in place).
inline void gelu_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
    run_in_ranges(n, [&](std::int64_t first, std::int64_t end) {
        detail::gelu_backward_elements(x + first, dy + first, dx + first, end - first);
    }, detail::gelu_elements_per_range);
}

}  // namespace loom::kernels::host
