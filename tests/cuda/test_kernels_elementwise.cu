// The CUDA kernels of kernels/cuda/elementwise.cuh, gelu.cuh and adamw.cuh
// against their host twins on the same seeded random inputs, at sizes that
// are not multiples of anything (1, 7, 1000, 4097) and at 2^20. The tolerance
// of each kernel is stated where it is checked; "bit for bit" means equal
// bits, except that NaN must meet NaN with any payload (x86 keeps an input
// NaN's payload, CUDA returns its canonical NaN).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../support/adamw_case.hpp"
#include "device_support.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/dtype.hpp"
#include "loom/optim/adamw.cuh"
#include "loom/kernels/cuda/elementwise.cuh"
#include "loom/kernels/cuda/gelu.cuh"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/gelu.hpp"
#include "loom/optim/adamw.hpp"

namespace {

namespace device = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_test::bits_of;
using loom_test::DeviceArray;
using loom_test::Mismatches;
using loom_test::Stream;
using loom_test::uniform;

constexpr std::int64_t test_sizes[] = {1, 7, 1000, 4097, std::int64_t{1} << 20};

// [rows, n] shapes for the bias kernels: single rows and columns, odd sizes
// both ways round, and 2^20 elements.
struct MatrixShape {
    std::int64_t rows, n;
};
constexpr MatrixShape test_shapes[] = {{1, 1}, {7, 1}, {1, 7}, {1000, 7}, {7, 1000}, {3, 4097}, {4097, 3}, {1024, 1024}};

// "[i] device 1.5 (0x3fc00000), host ..." for a mismatch report. (snprintf,
// not string concatenation: GCC 12 warns falsely about "..." + std::string.)
std::string mismatch_text(std::size_t i, const char* first_name, float first, const char* second_name, float second) {
    char text[160];
    std::snprintf(text, sizeof text, "[%zu] %s %.9g (0x%08x), %s %.9g (0x%08x)", i, first_name,
                  static_cast<double>(first), std::bit_cast<std::uint32_t>(first), second_name,
                  static_cast<double>(second), std::bit_cast<std::uint32_t>(second));
    return text;
}

// The float's position on the number line in ulps: adjacent floats differ
// by 1, +0 and -0 are both 0, and the largest finite float is 1 from infinity.
std::int64_t ulp_position(float x) {
    const auto u = std::bit_cast<std::uint32_t>(x);
    const std::int64_t magnitude = u & 0x7fff'ffffu;
    return (u >> 31) != 0 ? -magnitude : magnitude;
}

std::int64_t ulp_distance(float a, float b) {
    const std::int64_t d = ulp_position(a) - ulp_position(b);
    return d < 0 ? -d : d;
}

// Element by element: NaN must meet NaN; otherwise close(device, host, i).
template <class Close>
Mismatches compare(const std::vector<float>& device_values, const std::vector<float>& host_values, Close close) {
    Mismatches bad;
    if (device_values.size() != host_values.size()) {
        bad.add("device and host results differ in size");
        return bad;
    }
    for (std::size_t i = 0; i < host_values.size(); ++i) {
        const float d = device_values[i];
        const float h = host_values[i];
        const bool agree = std::isnan(d) || std::isnan(h) ? std::isnan(d) && std::isnan(h) : close(d, h, i);
        if (!agree) bad.add(mismatch_text(i, "device", d, "host", h));
    }
    return bad;
}

Mismatches compare_bits(const std::vector<float>& device_values, const std::vector<float>& host_values) {
    return compare(device_values, host_values, [](float d, float h, std::size_t) { return bits_of(d) == bits_of(h); });
}

}  // namespace

// add, accumulate, add_bias: one IEEE addition per element on both sides, so
// bit for bit. A NaN input must come out NaN.
TEST_CASE("cuda::add equals host::add bit for bit, also in place over either input", "[kernels]") {
    for (const std::int64_t n : test_sizes) {
        CAPTURE(n);
        const auto count = static_cast<std::size_t>(n);
        std::vector<float> a = uniform(count, -4.0f, 4.0f, 11u + static_cast<std::uint32_t>(n));
        const std::vector<float> b = uniform(count, -4.0f, 4.0f, 12u + static_cast<std::uint32_t>(n));
        a[count / 2] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> expected(count);
        host::add(a.data(), b.data(), expected.data(), n);

        DeviceArray<float> da(a), db(b), out(count);
        device::add(da.get(), db.get(), out.get(), n);
        CHECK_NO_MISMATCHES("out of place", compare_bits(out.to_host(), expected));

        DeviceArray<float> over_a(a), over_b(b);
        device::add(over_a.get(), db.get(), over_a.get(), n);
        device::add(da.get(), over_b.get(), over_b.get(), n);
        CHECK_NO_MISMATCHES("in place over a", compare_bits(over_a.to_host(), expected));
        CHECK_NO_MISMATCHES("in place over b", compare_bits(over_b.to_host(), expected));
    }
}

TEST_CASE("cuda::accumulate equals host::accumulate bit for bit", "[kernels]") {
    for (const std::int64_t n : test_sizes) {
        CAPTURE(n);
        const auto count = static_cast<std::size_t>(n);
        std::vector<float> into = uniform(count, -4.0f, 4.0f, 21u + static_cast<std::uint32_t>(n));
        std::vector<float> x = uniform(count, -4.0f, 4.0f, 22u + static_cast<std::uint32_t>(n));
        x[count / 2] = std::numeric_limits<float>::quiet_NaN();
        DeviceArray<float> d_into(into), d_x(x);
        host::accumulate(into.data(), x.data(), n);
        device::accumulate(d_into.get(), d_x.get(), n);
        CHECK_NO_MISMATCHES("accumulate", compare_bits(d_into.to_host(), into));
    }
}

TEST_CASE("cuda::fill sets every element and nothing past them", "[kernels]") {
    for (const std::int64_t n : test_sizes) {
        CAPTURE(n);
        const auto count = static_cast<std::size_t>(n);
        DeviceArray<float> y(count + 1);
        y.fill_bytes(0);
        device::fill(y.get(), -std::numeric_limits<float>::infinity(), n);
        std::vector<float> expected(count + 1, -std::numeric_limits<float>::infinity());
        expected[count] = 0.0f;
        CHECK_NO_MISMATCHES("fill", compare_bits(y.to_host(), expected));
    }
}

TEST_CASE("cuda::add_bias equals host::add_bias bit for bit", "[kernels]") {
    for (const auto [rows, n] : test_shapes) {
        CAPTURE(rows, n);
        std::vector<float> y = uniform(static_cast<std::size_t>(rows * n), -4.0f, 4.0f, 31u + static_cast<std::uint32_t>(rows));
        std::vector<float> bias = uniform(static_cast<std::size_t>(n), -1.0f, 1.0f, 32u + static_cast<std::uint32_t>(n));
        bias[static_cast<std::size_t>(n / 2)] = std::numeric_limits<float>::quiet_NaN();  // a NaN column
        DeviceArray<float> d_y(y), d_bias(bias);
        host::add_bias(y.data(), bias.data(), rows, n);
        device::add_bias(d_y.get(), d_bias.get(), rows, n);
        CHECK_NO_MISMATCHES("add_bias", compare_bits(d_y.to_host(), y));
    }
}

// repeat_rows copies the row into every row of y: the host's loop in
// kernels::repeat_rows (kernels/ops.hpp), bit for bit, NaN payloads included.
TEST_CASE("cuda::repeat_rows equals the host's row copies bit for bit", "[kernels]") {
    for (const auto [rows, n] : test_shapes) {
        CAPTURE(rows, n);
        std::vector<float> row = uniform(static_cast<std::size_t>(n), -1.0f, 1.0f, 33u + static_cast<std::uint32_t>(n));
        row[static_cast<std::size_t>(n / 2)] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> y(static_cast<std::size_t>(rows * n));
        for (std::int64_t r = 0; r < rows; ++r) std::copy(row.begin(), row.end(), y.begin() + r * n);
        DeviceArray<float> d_row(row), d_y(static_cast<std::size_t>(rows * n));
        d_y.fill_bytes(0xff);  // garbage the kernel must overwrite
        device::repeat_rows(d_row.get(), d_y.get(), rows, n);
        CHECK_NO_MISMATCHES("repeat_rows", compare_bits(d_y.to_host(), y));
    }
}

// bias_grad adds each column's rows in the host's order (column_sum_order.hpp:
// chunks of rows, then the chunk sums in order) into the existing dbias, so the
// sums are bit for bit the host's, however many rows: fewer rows than chunks,
// rows that leave the last chunks short or empty, more columns than one tile,
// and a GPT-2 bias (8192 rows of 768). dbias starts nonzero: the kernel
// accumulates. A column of -0 keeps dbias = -0 (no empty chunk adds +0).
TEST_CASE("cuda::bias_grad accumulates column sums in the host's order, bit for bit", "[kernels]") {
    constexpr MatrixShape more_shapes[] = {{33, 5}, {100, 37}, {8192, 768}};
    std::vector<MatrixShape> shapes(std::begin(test_shapes), std::end(test_shapes));
    shapes.insert(shapes.end(), std::begin(more_shapes), std::end(more_shapes));
    for (const auto [rows, n] : shapes) {
        CAPTURE(rows, n);
        std::vector<float> dy = uniform(static_cast<std::size_t>(rows * n), -2.0f, 2.0f, 41u + static_cast<std::uint32_t>(rows));
        std::vector<float> dbias = uniform(static_cast<std::size_t>(n), -1.0f, 1.0f, 42u + static_cast<std::uint32_t>(n));
        dy[static_cast<std::size_t>((rows / 2) * n + n / 2)] = std::numeric_limits<float>::quiet_NaN();
        if (n > 1) {
            for (std::int64_t r = 0; r < rows; ++r) dy[static_cast<std::size_t>(r * n + n - 1)] = -0.0f;
            dbias[static_cast<std::size_t>(n - 1)] = -0.0f;
        }
        DeviceArray<float> d_dy(dy), d_dbias(dbias);
        host::bias_grad(dy.data(), dbias.data(), rows, n);
        device::bias_grad(d_dy.get(), d_dbias.get(), rows, n);
        const std::vector<float> result = d_dbias.to_host();
        CHECK_NO_MISMATCHES("bias_grad", compare_bits(result, dbias));
        CHECK(std::isnan(result[static_cast<std::size_t>(n / 2)]));
        if (n > 1) CHECK(std::signbit(result[static_cast<std::size_t>(n - 1)]));
    }
}

namespace {

// Inputs where GELU's arithmetic changes regime: NaN, the infinities, signed
// zeros, a subnormal, the largest floats (x^2 overflows), the exponent's
// clamp (x near -9.7), the minimum of gelu (gelu' = 0 near x = -0.75).
std::vector<float> gelu_special_inputs() {
    const float inf = std::numeric_limits<float>::infinity();
    const float big = std::numeric_limits<float>::max();
    return {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f,
            1e-40f, -1e-40f, 1e-30f, -1e-30f, big, -big, 1e20f, -1e20f, 9.7f, -9.7f, -9.8f, -12.0f, -0.75f, -0.7517916f,
            3.0f, -3.0f, 80.0f, -80.0f};
}

// Random inputs over [-12, 12], which covers both saturations and the clamp
// of the exponent, or the special inputs when asked for.
std::vector<float> gelu_inputs(std::int64_t n, std::uint32_t seed) {
    if (n < 0) return gelu_special_inputs();
    return uniform(static_cast<std::size_t>(n), -12.0f, 12.0f, seed);
}

// The sizes plus -1, which stands for the special inputs.
constexpr std::int64_t gelu_cases[] = {-1, 1, 7, 1000, 4097, std::int64_t{1} << 20};

}  // namespace

// Tolerance: relative 2^-20 (about 8 ulp). Both sides compute the exponent z
// bit for bit (the CUDA kernel pins every rounding) and differ only in e^z:
// CUDA's expf is within 2 ulp of exact, the host's polynomial within 1.01 ulp,
// so the two differ by at most ~3 * 2^-23 relative; y = x / (1 + e^z) carries
// at most that relative error plus the roundings of 1 + e^z and of the
// division on either side, ~5 * 2^-23 < 2^-20 in all. (A host-side simulation
// of the kernel, std::exp perturbed by up to 2 ulp standing in for expf, used
// about half of this budget on 6 million inputs.) The host
// kernel here is its baseline build: nvcc compiles this file without the
// host's CPU dispatch, whose FMA clones contract the exponent and differ by
// up to about |z| ulp (~130 near x = -9, where |gelu| < 1e-26). NaN stays
// NaN, +-inf stay +-inf, as the host tests check.
namespace {

// The same bits, or NaN on both sides: for comparing two device paths.
bool same_bits_or_both_nan_at(float a, float b, std::size_t) {
    return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) || (std::isnan(a) && std::isnan(b));
}

}  // namespace

TEST_CASE("cuda::gelu_forward is within 2^-20 relative of host::gelu_forward, NaN and infinities included", "[kernels]") {
    Stream stream;
    for (const std::int64_t size : gelu_cases) {
        std::vector<float> x = gelu_inputs(size, 51u + static_cast<std::uint32_t>(size));
        const auto n = static_cast<std::int64_t>(x.size());
        CAPTURE(n, size < 0);
        std::vector<float> expected(x.size());
        host::gelu_forward(x.data(), expected.data(), n);

        DeviceArray<float> d_x(x), d_y(x.size()), in_place(x);
        // One float into their allocations: not 16-byte aligned, so one element a thread.
        DeviceArray<float> unaligned_x(x, 1), unaligned_y(x.size(), 1);
        device::gelu_forward(d_x.get(), d_y.get(), n, stream.get());
        device::gelu_forward(in_place.get(), in_place.get(), n, stream.get());
        device::gelu_forward(unaligned_x.get(), unaligned_y.get(), n, stream.get());
        stream.synchronize();
        CHECK_NO_MISMATCHES("gelu_forward, four elements a thread against one",
                            compare(unaligned_y.to_host(), d_y.to_host(), same_bits_or_both_nan_at));
        const auto close = [](float d, float h, std::size_t) {
            return d == h || std::fabs(static_cast<double>(d) - static_cast<double>(h)) <=
                                 std::ldexp(std::fabs(static_cast<double>(h)), -20);
        };
        CHECK_NO_MISMATCHES("gelu_forward", compare(d_y.to_host(), expected, close));
        CHECK_NO_MISMATCHES("gelu_forward in place", compare(in_place.to_host(), expected, close));
        if (size < 0) {
            CHECK(std::isnan(d_y.to_host()[0]));  // NaN in, NaN out
        }
    }
}

// Tolerance: 2^-20 (|dx| + |dy|). The exponent is bit for bit the host's
// again and e^z differs by a few ulp (see above), which s = 1 / (1 + e^z)
// and t = x e^z s (c1 + 3 c3 x^2) carry as a few ulp of relative error each.
// But dx = dy s (1 - t) cancels where gelu' crosses zero (near x = -0.75), so
// a purely relative bound cannot hold there; since s <= 1 and s |t| <= 0.25
// for every x, the absolute error stays below ~2^-22 |dy| plus a few ulp of
// dx. (The simulation described above used about a quarter of this budget.)
TEST_CASE("cuda::gelu_backward is within 2^-20 (|dx| + |dy|) of host::gelu_backward", "[kernels]") {
    Stream stream;
    for (const std::int64_t size : gelu_cases) {
        const std::vector<float> x = gelu_inputs(size, 61u + static_cast<std::uint32_t>(size));
        const auto n = static_cast<std::int64_t>(x.size());
        CAPTURE(n, size < 0);
        const std::vector<float> dy = size < 0 ? std::vector<float>(x.size(), 1.0f)
                                               : uniform(x.size(), -2.0f, 2.0f, 62u + static_cast<std::uint32_t>(size));
        std::vector<float> expected(x.size());
        host::gelu_backward(x.data(), dy.data(), expected.data(), n);

        DeviceArray<float> d_x(x), d_dy(dy), d_dx(x.size()), in_place(dy);
        DeviceArray<float> unaligned_dy(dy, 1), unaligned_dx(x.size(), 1);
        device::gelu_backward(d_x.get(), d_dy.get(), d_dx.get(), n, stream.get());
        device::gelu_backward(d_x.get(), in_place.get(), in_place.get(), n, stream.get());
        device::gelu_backward(d_x.get(), unaligned_dy.get(), unaligned_dx.get(), n, stream.get());
        stream.synchronize();
        CHECK_NO_MISMATCHES("gelu_backward, four elements a thread against one",
                            compare(unaligned_dx.to_host(), d_dx.to_host(), same_bits_or_both_nan_at));
        const auto close = [&dy](float d, float h, std::size_t i) {
            const double scale = std::fabs(static_cast<double>(h)) + std::fabs(static_cast<double>(dy[i]));
            return d == h || std::fabs(static_cast<double>(d) - static_cast<double>(h)) <= std::ldexp(scale, -20);
        };
        CHECK_NO_MISMATCHES("gelu_backward", compare(d_dx.to_host(), expected, close));
        CHECK_NO_MISMATCHES("gelu_backward in place", compare(in_place.to_host(), expected, close));
        if (size < 0) {
            CHECK(std::isnan(d_dx.to_host()[0]));  // NaN in, NaN out
        }
    }
}

namespace {

// Whether the host compiler may fuse a * b + c into one FMA here: only where
// the target has a fast fmaf (__FP_FAST_FMAF), which baseline x86-64, loom's
// build target, does not. Without it AdamW is compared bit for bit; with it,
// within the tolerance of adamw_close.
#if defined(__FP_FAST_FMAF)
constexpr bool host_may_contract = true;
#else
constexpr bool host_may_contract = false;
#endif

// Used only when the host may contract (see host_may_contract): m, v and p
// within 4 ulp, or within 2^-22 of the magnitude of the terms that were
// added (m and p can cancel to near zero, where ulps mean nothing).
bool adamw_close(float d, float h, float term_magnitude) {
    return ulp_distance(d, h) <= 4 ||
           std::fabs(static_cast<double>(d) - static_cast<double>(h)) <= std::ldexp(static_cast<double>(term_magnitude), -22);
}

}  // namespace

// AdamW: bit for bit. Both sides run the same operations in the same order
// with IEEE rounding and no contraction (see optim/adamw.cuh), so
// params, m and v agree exactly after every step, and the bf16 compute copy
// equals loom::to_bf16 of the host's params. Three steps from zero moments,
// new gradients each step, a NaN gradient from step 2 on (p, m and v turn
// NaN on both sides); one configuration freezes the variance after step 2.
TEST_CASE("cuda::adamw_update equals optim::adamw_step bit for bit, with the bf16 copy", "[kernels]") {
    for (const auto& config : loom_test::adamw_test_configs()) {
        for (const std::int64_t n : test_sizes) {
            CAPTURE(n, config.freeze_variance_after);
            const auto count = static_cast<std::size_t>(n);
            std::vector<float> p = uniform(count, -1.0f, 1.0f, 71u + static_cast<std::uint32_t>(n));
            std::vector<float> m(count, 0.0f), v(count, 0.0f);
            DeviceArray<float> d_p(p), d_m(m), d_v(v), d_p2(p), d_m2(m), d_v2(v), d_g(count);
            DeviceArray<loom::bf16> d_copy(count);

            for (std::int64_t step = 1; step <= 3; ++step) {
                CAPTURE(step);
                std::vector<float> g = loom_test::adamw_gradients(count, 72u + static_cast<std::uint32_t>(n * 3 + step));
                if (step >= 2) g[count / 2] = std::numeric_limits<float>::quiet_NaN();
                LOOM_CUDA_CHECK(cudaMemcpy(d_g.get(), g.data(), count * sizeof(float), cudaMemcpyHostToDevice));
                const std::vector<float> p_before = p, m_before = m;

                loom::optim::adamw_step(p, g, m, v, step, config);
                const auto scalars = loom::optim::detail::adamw_scalars(config, step);
                loom::optim::cuda::adamw_update_with_bf16_copy(d_p.get(), d_g.get(), d_m.get(), d_v.get(), d_copy.get(), n, scalars);
                loom::optim::cuda::adamw_update(d_p2.get(), d_g.get(), d_m2.get(), d_v2.get(), n, scalars);

                if constexpr (!host_may_contract) {
                    CHECK_NO_MISMATCHES("params", compare_bits(d_p.to_host(), p));
                    CHECK_NO_MISMATCHES("m", compare_bits(d_m.to_host(), m));
                    CHECK_NO_MISMATCHES("v", compare_bits(d_v.to_host(), v));
                    CHECK_NO_MISMATCHES("params (no bf16 copy)", compare_bits(d_p2.to_host(), p));
                    CHECK_NO_MISMATCHES("m (no bf16 copy)", compare_bits(d_m2.to_host(), m));
                    CHECK_NO_MISMATCHES("v (no bf16 copy)", compare_bits(d_v2.to_host(), v));
                } else {
                    const auto m_close = [&](float d, float h, std::size_t i) {
                        return adamw_close(d, h, std::fabs(scalars.beta1 * m_before[i]) +
                                                     std::fabs(scalars.one_minus_beta1 * g[i]));
                    };
                    const auto v_close = [](float d, float h, std::size_t) { return ulp_distance(d, h) <= 4; };
                    const auto p_close = [&](float d, float h, std::size_t i) {
                        const float denom = std::sqrt(v[i]) / scalars.bias_correction2_sqrt + scalars.eps;
                        return adamw_close(d, h, std::fabs(scalars.decay * p_before[i]) +
                                                     std::fabs(scalars.neg_step_size * m[i] / denom));
                    };
                    CHECK_NO_MISMATCHES("params", compare(d_p.to_host(), p, p_close));
                    CHECK_NO_MISMATCHES("m", compare(d_m.to_host(), m, m_close));
                    CHECK_NO_MISMATCHES("v", compare(d_v.to_host(), v, v_close));
                    CHECK_NO_MISMATCHES("params (no bf16 copy)", compare(d_p2.to_host(), p, p_close));
                }

                const std::vector<loom::bf16> copy = d_copy.to_host();
                const std::vector<float> device_p = d_p.to_host();
                Mismatches bad_copy;
                for (std::size_t i = 0; i < count; ++i) {
                    // The copy must be the rounding of the device's own params
                    // (same code as the host's to_bf16) and, when the params
                    // are bit for bit the host's, the rounding of those too.
                    const std::uint16_t expected = loom::to_bf16(host_may_contract ? device_p[i] : p[i]).bits;
                    const float copy_value = loom::to_float(copy[i]);
                    const bool agree = std::isnan(device_p[i]) ? std::isnan(copy_value) : copy[i].bits == expected;
                    if (!agree)
                        bad_copy.add(mismatch_text(i, "bf16 copy", copy_value, "expected",
                                                   loom::to_float(loom::bf16::from_bits(expected))));
                }
                CHECK_NO_MISMATCHES("bf16 copy", bad_copy);
                if (step >= 2) {
                    CHECK(std::isnan(device_p[count / 2]));
                    CHECK(std::isnan(d_m.to_host()[count / 2]));
                }
            }
        }
    }
}

TEST_CASE("the CUDA kernels launch nothing for zero elements", "[kernels]") {
    const auto scalars = loom::optim::detail::adamw_scalars(loom::optim::AdamWConfig{}, 1);
    CHECK_NOTHROW(device::add(nullptr, nullptr, nullptr, 0));
    CHECK_NOTHROW(device::accumulate(nullptr, nullptr, 0));
    CHECK_NOTHROW(device::add_bias(nullptr, nullptr, 0, 5));
    CHECK_NOTHROW(device::repeat_rows(nullptr, nullptr, 0, 5));
    CHECK_NOTHROW(device::add_bias(nullptr, nullptr, 5, 0));
    CHECK_NOTHROW(device::bias_grad(nullptr, nullptr, 0, 5));
    CHECK_NOTHROW(device::gelu_forward(nullptr, nullptr, 0));
    CHECK_NOTHROW(device::gelu_backward(nullptr, nullptr, nullptr, 0));
    CHECK_NOTHROW(loom::optim::cuda::adamw_update(nullptr, nullptr, nullptr, nullptr, 0, scalars));
    CHECK_NOTHROW(loom::optim::cuda::adamw_update_with_bf16_copy(nullptr, nullptr, nullptr, nullptr, nullptr, 0, scalars));
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}
