// cuda::gemm (kernels/cuda/gemm.cuh, cuBLASLt) against host::gemm (the
// CBLAS) on the same seeded random inputs: every transpose combination, odd
// shapes (1x1x1 to 512x512x512), row strides longer than the rows, alpha and
// beta cases, K = 0 and alpha = 0, sub-matrices at odd addresses, the plan
// cache, and the argument errors (the host's messages, word for word); and
// gemm_bf16_inputs (f32 operands rounded to bf16 on the device) against the
// host's emulation, with the bf16 x bf16 -> f32 tolerance below.
//
// Tolerances, per element of C, relative to the magnitude the sum is made of,
//   bound = |alpha| * sum_k |op(A)_ik| |op(B)_kj| + |beta * C_ij|
// (the beta term only when beta != 0; the sum of magnitudes is itself
// computed by the host gemm on |A| and |B|):
//   f32 x f32 -> f32:     |device - host| <= 1e-5 * bound. Both sides sum the
//       same K products in f32 in different orders (blocked, maybe split-K on
//       the device). Each rounding is at most 2^-24 of a partial sum; for
//       random signs these errors add up to a few 2^-24 of the bound at any K
//       (the worst case, K * 2^-24, is 3e-5 at K = 512 and needs every error
//       to push the same way). 1e-5 is ~170 ulps of the bound: it passes any
//       correct summation order and fails any wrong or missing term.
//   bf16 x bf16 -> f32:   the host multiplies the bf16-rounded inputs in f32.
//       Products of bf16 values are exact in f32, so again only the order of
//       the sum differs, but tensor cores may align and truncate partial
//       sums instead of rounding them (biased errors, growing like
//       sqrt(K) * 2^-24 of the bound: ~1.4e-6 at K = 512); 2e-5 * bound.
//   bf16 x bf16 -> bf16:  the same 2e-5 * bound on the f32 value, plus one
//       bf16 ulp of the result for the final rounding (round to nearest on
//       the device; the host's exact f32 value is compared unrounded).
// Elements that need no arithmetic are compared bit for bit: C's padding
// (never written), and C = beta * C when K = 0 or alpha = 0 (one rounding
// on both sides). The padding of A and B holds NaN: a kernel that read it
// would turn results into NaN.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/message_of.hpp"
#include "device_support.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/dtype.hpp"
#include "loom/kernels/cuda/gemm.cuh"
#include "loom/kernels/cuda/gemm_bf16_inputs.cuh"
#include "loom/kernels/host/gemm.hpp"

namespace {

namespace device = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom::bf16;
using loom_test::bits_of;
using loom_test::DeviceArray;
using loom_test::message_of;
using loom_test::Mismatches;
using loom_test::Stream;

constexpr float f32_tolerance = 1e-5f;
constexpr float bf16_input_tolerance = 2e-5f;
constexpr float quiet_nan = std::numeric_limits<float>::quiet_NaN();
constexpr float c_padding = -777.0f;  // C's padding: must survive every product unchanged

struct Dims {
    std::int64_t M, N, K;
};
constexpr Dims test_dims[] = {{1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {128, 256, 64}, {512, 512, 512}};

struct Transposes {
    host::Trans host_ta, host_tb;
    device::Trans ta, tb;
};
constexpr Transposes all_transposes[] = {
    {host::Trans::no, host::Trans::no, device::Trans::no, device::Trans::no},
    {host::Trans::no, host::Trans::yes, device::Trans::no, device::Trans::yes},
    {host::Trans::yes, host::Trans::no, device::Trans::yes, device::Trans::no},
    {host::Trans::yes, host::Trans::yes, device::Trans::yes, device::Trans::yes},
};

// alpha, beta, and whether C starts as NaN (which beta = 0 must overwrite).
struct Scenario {
    const char* name;
    float alpha, beta;
    bool c_starts_nan;
};
constexpr Scenario scenarios[] = {
    {"beta = 0 overwrites a C of NaN", 1.0f, 0.0f, true},
    {"beta = 1 accumulates", 1.0f, 1.0f, false},
    {"alpha = -1.5, beta = 0.5", -1.5f, 0.5f, false},
};

// A row-major [rows, cols] matrix with row stride ld = cols + pad, its
// elements uniform in [-1, 1), its padding holding pad_value.
struct Stored {
    std::int64_t rows, cols, ld;
    std::vector<float> values;
};

Stored random_matrix(std::int64_t rows, std::int64_t cols, std::int64_t pad, std::uint32_t seed, float pad_value) {
    Stored m{rows, cols, cols + pad, {}};
    m.values.assign(static_cast<std::size_t>(rows * m.ld), pad_value);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c) m.values[static_cast<std::size_t>(r * m.ld + c)] = dist(rng);
    return m;
}

void fill_live(Stored& m, float value) {
    for (std::int64_t r = 0; r < m.rows; ++r)
        for (std::int64_t c = 0; c < m.cols; ++c) m.values[static_cast<std::size_t>(r * m.ld + c)] = value;
}

// The values as element type T (bf16: rounded to nearest even).
template <class T>
std::vector<T> as_elements(const std::vector<float>& values) {
    if constexpr (std::is_same_v<T, float>) {
        return values;
    } else {
        std::vector<bf16> out(values.size());
        for (std::size_t i = 0; i < values.size(); ++i) out[i] = loom::to_bf16(values[i]);
        return out;
    }
}

// What the device holds for element type T, back in f32 (exact).
template <class T>
std::vector<float> as_stored(const std::vector<float>& values) {
    if constexpr (std::is_same_v<T, float>) {
        return values;
    } else {
        std::vector<float> out(values.size());
        for (std::size_t i = 0; i < values.size(); ++i) out[i] = loom::to_float(loom::to_bf16(values[i]));
        return out;
    }
}

float value_of(float x) { return x; }
float value_of(bf16 x) { return loom::to_float(x); }
std::uint32_t bits_of(bf16 x) { return x.bits; }

std::vector<float> magnitudes(const std::vector<float>& values) {
    std::vector<float> out(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) out[i] = std::fabs(values[i]);
    return out;
}

// One unit in the last place of a bf16 near |x| (8 significant bits).
float bf16_ulp(float x) {
    x = std::fabs(x);
    if (!(x >= std::numeric_limits<float>::min())) return std::ldexp(1.0f, -133);  // subnormal spacing
    int exponent = 0;
    std::frexp(x, &exponent);  // x = m * 2^exponent, m in [0.5, 1)
    return std::ldexp(1.0f, exponent - 8);
}

std::string mismatch_text(std::int64_t row, std::int64_t col, float device_value, float host_value, float allowed) {
    char text[200];
    std::snprintf(text, sizeof text, "C[%lld, %lld] device %.9g (0x%08x), host %.9g (0x%08x), allowed %.3g",
                  static_cast<long long>(row), static_cast<long long>(col), static_cast<double>(device_value),
                  std::bit_cast<std::uint32_t>(device_value), static_cast<double>(host_value),
                  std::bit_cast<std::uint32_t>(host_value), static_cast<double>(allowed));
    return text;
}

// Compares the device's C (all of its storage) with the host's. Live
// elements: within tolerance * bound (+ one bf16 ulp for a bf16 C, and half
// an ulp of the bound more where beta reads C: see below), NaN only
// against NaN; bound = nullptr asks for equal bits. Padding: the initial
// bits, untouched.
template <class Out>
Mismatches compare_c(const std::vector<Out>& got, const std::vector<float>& expected, const Stored& c_before,
                     const std::vector<float>* bound, float tolerance, bool beta_reads_c = false) {
    Mismatches bad;
    for (std::int64_t r = 0; r < c_before.rows; ++r) {
        for (std::int64_t col = 0; col < c_before.ld; ++col) {
            const auto i = static_cast<std::size_t>(r * c_before.ld + col);
            const float d = value_of(got[i]);
            const float h = expected[i];
            if (col >= c_before.cols || bound == nullptr) {
                const bool same = std::isnan(d) || std::isnan(h) ? std::isnan(d) && std::isnan(h)
                                                                 : bits_of(got[i]) == bits_of(as_elements<Out>({h})[0]);
                if (!same) bad.add(mismatch_text(r, col, d, h, 0.0f) + (col >= c_before.cols ? " (padding)" : ""));
                continue;
            }
            float allowed = tolerance * (*bound)[i];
            if constexpr (std::is_same_v<Out, bf16>) {
                allowed += bf16_ulp(std::fmax(std::fabs(d), std::fabs(h)));
                // With beta != 0, cuBLASLt rounds alpha A B to bf16 before it
                // adds beta C, it seems: on an H200, 0.4% to 4% of the
                // elements of beta = 1 products were more than one bf16 ulp
                // off (1.24 ulp, say), never with beta = 0. Half an ulp of
                // |alpha A B| + |beta C| more covers that first rounding.
                if (beta_reads_c) allowed += 0.5f * bf16_ulp((*bound)[i]);
            }
            const bool agree =
                std::isnan(d) || std::isnan(h) ? std::isnan(d) && std::isnan(h) : std::fabs(d - h) <= allowed;
            if (!agree) bad.add(mismatch_text(r, col, d, h, allowed));
        }
    }
    return bad;
}

// One product on both sides: random A and B (rows padded by `pad`, padding
// NaN), C per the scenario, the device's matrices `offset` elements into
// their allocations. In are A's and B's elements on the device, Out C's.
template <class In, class Out>
void check_against_host(device::GemmContext& context, const Dims& dims, const Transposes& t, std::int64_t pad,
                        const Scenario& scenario, std::uint32_t seed, float tolerance, std::size_t offset = 0) {
    const auto [M, N, K] = dims;
    const bool a_trans = t.ta == device::Trans::yes;
    const bool b_trans = t.tb == device::Trans::yes;
    Stored a = random_matrix(a_trans ? K : M, a_trans ? M : K, pad, seed, quiet_nan);
    Stored b = random_matrix(b_trans ? N : K, b_trans ? K : N, pad, seed + 1u, quiet_nan);
    Stored c = random_matrix(M, N, pad, seed + 2u, c_padding);
    if (scenario.c_starts_nan) fill_live(c, quiet_nan);
    // The host computes on exactly the values the device holds.
    a.values = as_stored<In>(a.values);
    b.values = as_stored<In>(b.values);
    c.values = as_stored<Out>(c.values);

    std::vector<float> expected = c.values;
    host::gemm(t.host_ta, t.host_tb, M, N, K, scenario.alpha, a.values.data(), a.ld, b.values.data(), b.ld,
               scenario.beta, expected.data(), c.ld);
    std::vector<float> bound(c.values.size(), 0.0f);
    const std::vector<float> abs_a = magnitudes(a.values), abs_b = magnitudes(b.values);
    host::gemm(t.host_ta, t.host_tb, M, N, K, 1.0f, abs_a.data(), a.ld, abs_b.data(), b.ld, 0.0f, bound.data(), c.ld);
    for (std::size_t i = 0; i < bound.size(); ++i) {
        bound[i] *= std::fabs(scenario.alpha);
        if (scenario.beta != 0.0f) bound[i] += std::fabs(scenario.beta * c.values[i]);
    }

    DeviceArray<In> da(as_elements<In>(a.values), offset), db(as_elements<In>(b.values), offset);
    DeviceArray<Out> dc(as_elements<Out>(c.values), offset);
    device::gemm(t.ta, t.tb, M, N, K, scenario.alpha, da.get(), a.ld, db.get(), b.ld, scenario.beta, dc.get(), c.ld,
                 context);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(context.stream()));
    CHECK_NO_MISMATCHES(scenario.name,
                        compare_c(dc.to_host(), expected, c, &bound, tolerance, scenario.beta != 0.0f));
}

template <class In, class Out>
void check_all_shapes(float tolerance, std::uint32_t seed_base) {
    Stream stream;
    device::GemmContext context(stream.get());
    std::uint32_t seed = seed_base;
    for (const Dims& dims : test_dims) {
        for (const Transposes& t : all_transposes) {
            for (const std::int64_t pad : {std::int64_t{0}, std::int64_t{3}}) {
                for (const Scenario& scenario : scenarios) {
                    CAPTURE(dims.M, dims.N, dims.K, device::detail::trans_name(t.ta),
                            device::detail::trans_name(t.tb), pad, scenario.alpha, scenario.beta);
                    check_against_host<In, Out>(context, dims, t, pad, scenario, seed += 3u, tolerance);
                }
            }
        }
    }
}

// gemm_bf16_inputs (kernels/cuda/gemm_bf16_inputs.cuh): f32 A and B on the
// device, rounded there, against the host's gemm_bf16_inputs on the same f32
// values; the bound is made of the rounded magnitudes. Scratch is reused
// across calls (and grows), as in training.
void check_bf16_inputs_against_host(device::GemmContext& context, device::StreamScratch& scratch, const Dims& dims,
                                    const Transposes& t, std::int64_t pad, const Scenario& scenario,
                                    std::uint32_t seed) {
    const auto [M, N, K] = dims;
    const bool a_trans = t.ta == device::Trans::yes;
    const bool b_trans = t.tb == device::Trans::yes;
    const Stored a = random_matrix(a_trans ? K : M, a_trans ? M : K, pad, seed, quiet_nan);
    const Stored b = random_matrix(b_trans ? N : K, b_trans ? K : N, pad, seed + 1u, quiet_nan);
    Stored c = random_matrix(M, N, pad, seed + 2u, c_padding);
    if (scenario.c_starts_nan) fill_live(c, quiet_nan);

    std::vector<float> expected = c.values;
    host::gemm_bf16_inputs(t.host_ta, t.host_tb, M, N, K, scenario.alpha, a.values.data(), a.ld, b.values.data(),
                           b.ld, scenario.beta, expected.data(), c.ld);
    std::vector<float> bound(c.values.size(), 0.0f);
    const std::vector<float> abs_a = magnitudes(as_stored<bf16>(a.values)), abs_b = magnitudes(as_stored<bf16>(b.values));
    host::gemm(t.host_ta, t.host_tb, M, N, K, 1.0f, abs_a.data(), a.ld, abs_b.data(), b.ld, 0.0f, bound.data(), c.ld);
    for (std::size_t i = 0; i < bound.size(); ++i) {
        bound[i] *= std::fabs(scenario.alpha);
        if (scenario.beta != 0.0f) bound[i] += std::fabs(scenario.beta * c.values[i]);
    }
    DeviceArray<float> da(a.values), db(b.values), dc(c.values);
    device::gemm_bf16_inputs(t.ta, t.tb, M, N, K, scenario.alpha, da.get(), a.ld, db.get(), b.ld, scenario.beta,
                             dc.get(), c.ld, context, scratch);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(context.stream()));
    CHECK_NO_MISMATCHES(scenario.name,
                        compare_c(dc.to_host(), expected, c, &bound, bf16_input_tolerance, scenario.beta != 0.0f));
}

}  // namespace

TEST_CASE("cuda::gemm_bf16_inputs rounds f32 operands on the device and equals host::gemm_bf16_inputs within 2e-5",
          "[kernels][gemm][bf16]") {
    Stream stream;
    device::GemmContext context(stream.get());
    device::StreamScratch scratch;
    std::uint32_t seed = 5000u;
    // pad 3: strided rows, the rounding's row kernel; pad 0: contiguous
    // operands, its flat pass where the columns are a multiple of 8.
    for (const std::int64_t pad : {3, 0})
        for (const Dims& dims : test_dims)
            for (const Transposes& t : all_transposes)
                for (const Scenario& scenario : scenarios) {
                    CAPTURE(pad, dims.M, dims.N, dims.K, device::detail::trans_name(t.ta),
                            device::detail::trans_name(t.tb), scenario.alpha, scenario.beta);
                    check_bf16_inputs_against_host(context, scratch, dims, t, pad, scenario, seed += 3u);
                }
    CHECK(scratch.capacity() >= 2 * 512 * 512 * sizeof(bf16));  // grew to the largest call's operands
    // Argument errors are the f32 GEMM's, raised before anything is queued.
    CHECK(message_of([&] {
              device::gemm_bf16_inputs(device::Trans::no, device::Trans::no, 3, 4, 5, 1.0f, nullptr, 4, nullptr, 4,
                                       0.0f, nullptr, 4, context, scratch);
          }) == "gemm: lda = 4 is shorter than a stored row of A (5 columns with ta = no, M = 3, K = 5); pass lda >= 5");
}

TEST_CASE("cuda::gemm f32 equals host::gemm within 1e-5 of sum |a||b|: transposes, odd shapes, padded rows",
          "[kernels][gemm]") {
    check_all_shapes<float, float>(f32_tolerance, 1000u);
}

TEST_CASE("cuda::gemm bf16 x bf16 -> f32 equals host::gemm on the rounded inputs within 2e-5 of sum |a||b|",
          "[kernels][gemm]") {
    check_all_shapes<bf16, float>(bf16_input_tolerance, 2000u);
}

TEST_CASE("cuda::gemm bf16 x bf16 -> bf16 is within 2e-5 of sum |a||b| plus one bf16 ulp of host::gemm (1.5 with beta)",
          "[kernels][gemm]") {
    check_all_shapes<bf16, bf16>(bf16_input_tolerance, 3000u);
}

// K = 0 and alpha = 0 scale C by beta without reading A or B (BLAS's rule,
// which the host's OpenBLAS follows): beta = 0 writes zeros over NaN, beta =
// 1 leaves C alone, any other beta is one multiplication per element. So bit
// for bit, against the host for an f32 C and against beta * C rounded to
// bf16 for a bf16 C.
TEST_CASE("cuda::gemm with K = 0 or alpha = 0 scales C by beta, bit for bit, reading neither A nor B",
          "[kernels][gemm]") {
    Stream stream;
    device::GemmContext context(stream.get());
    const Dims dims{33, 65, 17};
    std::uint32_t seed = 4000u;
    for (const float beta : {0.0f, 1.0f, 0.5f, -3.0f}) {
        for (const bool k_zero : {true, false}) {
            CAPTURE(beta, k_zero);
            const std::int64_t K = k_zero ? 0 : dims.K;
            const float alpha = k_zero ? 1.0f : 0.0f;
            // A and B all NaN: reading them would show. (K = 0: one NaN row each.)
            Stored a = random_matrix(dims.M, std::max<std::int64_t>(K, 1), 0, seed += 3u, quiet_nan);
            Stored b = random_matrix(std::max<std::int64_t>(K, 1), dims.N, 0, seed + 1u, quiet_nan);
            fill_live(a, quiet_nan);
            fill_live(b, quiet_nan);
            Stored c = random_matrix(dims.M, dims.N, 2, seed + 2u, c_padding);
            if (beta == 0.0f) fill_live(c, quiet_nan);

            std::vector<float> expected = c.values;
            host::gemm(host::Trans::no, host::Trans::no, dims.M, dims.N, K, alpha, a.values.data(), a.ld,
                       b.values.data(), b.ld, beta, expected.data(), c.ld);

            DeviceArray<float> da(a.values), db(b.values), dc(c.values);
            device::gemm(device::Trans::no, device::Trans::no, dims.M, dims.N, K, alpha, da.get(), a.ld, db.get(),
                         b.ld, beta, dc.get(), c.ld, context);
            stream.synchronize();
            CHECK_NO_MISMATCHES("f32 C", compare_c(dc.to_host(), expected, c, nullptr, 0.0f));

            // bf16 A, B and C: the same rule, C rounded once after scaling.
            const std::vector<float> c_rounded = as_stored<bf16>(c.values);
            std::vector<float> expected_bf16(c_rounded.size());
            for (std::int64_t r = 0; r < c.rows; ++r) {
                for (std::int64_t col = 0; col < c.ld; ++col) {
                    const auto i = static_cast<std::size_t>(r * c.ld + col);
                    const bool live = col < c.cols;
                    expected_bf16[i] = !live ? c_rounded[i] : beta == 0.0f ? 0.0f : beta * c_rounded[i];
                }
            }
            DeviceArray<bf16> da16(as_elements<bf16>(a.values)), db16(as_elements<bf16>(b.values));
            DeviceArray<bf16> dc16(as_elements<bf16>(c.values));
            device::gemm(device::Trans::no, device::Trans::no, dims.M, dims.N, K, alpha, da16.get(), a.ld,
                         db16.get(), b.ld, beta, dc16.get(), c.ld, context);
            stream.synchronize();
            CHECK_NO_MISMATCHES("bf16 C", compare_c(dc16.to_host(), expected_bf16, c, nullptr, 0.0f));
        }
    }
    CHECK(context.cache_size() == 0);  // nothing went to cuBLASLt
}

TEST_CASE("cuda::gemm with M = 0 or N = 0 writes nothing and needs no pointers", "[kernels][gemm]") {
    Stream stream;
    device::GemmContext context(stream.get());
    const float* no_floats = nullptr;
    const bf16* no_bf16 = nullptr;
    CHECK_NOTHROW(device::gemm(device::Trans::no, device::Trans::no, 0, 5, 3, 1.0f, no_floats, 3, no_floats, 5, 0.0f,
                               static_cast<float*>(nullptr), 5, context));
    CHECK_NOTHROW(device::gemm(device::Trans::yes, device::Trans::yes, 5, 0, 3, 1.0f, no_floats, 5, no_floats, 3,
                               0.0f, static_cast<float*>(nullptr), 1, context));
    CHECK_NOTHROW(device::gemm(device::Trans::no, device::Trans::no, 0, 0, 0, 1.0f, no_bf16, 1, no_bf16, 1, 0.0f,
                               static_cast<bf16*>(nullptr), 1, context));
    stream.synchronize();
    CHECK(context.cache_size() == 0);
    CHECK(context.heuristic_queries() == 0);
}

// cuBLASLt assumes 256-byte aligned matrices unless told otherwise; the
// context passes each pointer's alignment to the heuristic and keys its plans
// on it. Matrices one element into their allocations (4-byte aligned f32,
// 2-byte aligned bf16) must work and get their own plans.
TEST_CASE("cuda::gemm on sub-matrices at odd addresses: correct, with plans of their own", "[kernels][gemm]") {
    Stream stream;
    device::GemmContext context(stream.get());
    const Dims dims{128, 256, 64};
    const Transposes& t = all_transposes[1];
    const Scenario& scenario = scenarios[2];

    check_against_host<float, float>(context, dims, t, 0, scenario, 5000u, f32_tolerance);
    CHECK(context.cache_size() == 1);
    check_against_host<float, float>(context, dims, t, 0, scenario, 5003u, f32_tolerance, 1);
    CHECK(context.cache_size() == 2);
    check_against_host<bf16, float>(context, dims, t, 0, scenario, 5006u, bf16_input_tolerance);
    check_against_host<bf16, float>(context, dims, t, 0, scenario, 5009u, bf16_input_tolerance, 1);
    check_against_host<bf16, bf16>(context, dims, t, 0, scenario, 5012u, bf16_input_tolerance, 1);
    check_against_host<bf16, bf16>(context, {7, 5, 3}, all_transposes[2], 1, scenario, 5015u, bf16_input_tolerance, 3);
    CHECK(context.cache_size() == 6);
}

// The heuristic runs once per distinct product; repeats (other alpha, beta,
// pointers of the same alignment) reuse the plan, and give the same bits.
TEST_CASE("GemmContext caches one plan per shape, transposes and dtypes, and reuses it", "[kernels][gemm]") {
    Stream stream;
    device::GemmContext context(stream.get());
    CHECK(context.stream() == stream.get());
    CHECK(context.workspace_bytes() == device::default_gemm_workspace_bytes);
    CHECK(context.cache_size() == 0);

    const std::int64_t M = 128, N = 256, K = 64;
    const Stored a = random_matrix(M, K, 0, 6000u, quiet_nan);
    const Stored b = random_matrix(K, N, 0, 6001u, quiet_nan);
    DeviceArray<float> da(a.values), db(b.values), c1(static_cast<std::size_t>(M * N)),
        c2(static_cast<std::size_t>(M * N));
    const auto run = [&](float alpha, float beta, DeviceArray<float>& c) {
        device::gemm(device::Trans::no, device::Trans::no, M, N, K, alpha, da.get(), K, db.get(), N, beta, c.get(),
                     N, context);
    };
    run(1.0f, 0.0f, c1);
    CHECK(context.cache_size() == 1);
    CHECK(context.heuristic_queries() == 1);
    run(1.0f, 0.0f, c2);
    run(0.5f, 1.0f, c2);
    run(1.0f, 0.0f, c2);
    CHECK(context.cache_size() == 1);
    CHECK(context.heuristic_queries() == 1);
    stream.synchronize();
    const std::vector<float> first = c1.to_host();
    const auto check_same_bits = [&](const std::vector<float>& again, const char* what) {
        Mismatches bad;
        for (std::size_t i = 0; i < first.size(); ++i)
            if (bits_of(first[i]) != bits_of(again[i]))
                bad.add(mismatch_text(static_cast<std::int64_t>(i) / N, static_cast<std::int64_t>(i) % N, again[i],
                                      first[i], 0.0f));
        CHECK_NO_MISMATCHES(what, bad);
    };
    check_same_bits(c2.to_host(), "the same product again (same plan, same stream)");

    // Another shape (N / 2 columns, same strides), a transpose, other dtypes: new plans.
    device::gemm(device::Trans::no, device::Trans::no, M, N / 2, K, 1.0f, da.get(), K, db.get(), N, 0.0f, c1.get(), N,
                 context);
    CHECK(context.cache_size() == 2);
    // A * A^T: [M, M] from A's [M, K] rows, written into C's first M columns.
    device::gemm(device::Trans::no, device::Trans::yes, M, M, K, 1.0f, da.get(), K, da.get(), K, 0.0f, c1.get(), N,
                 context);
    CHECK(context.cache_size() == 3);
    DeviceArray<bf16> a16(as_elements<bf16>(a.values)), b16(as_elements<bf16>(b.values)),
        c16(static_cast<std::size_t>(M * N));
    device::gemm(device::Trans::no, device::Trans::no, M, N, K, 1.0f, a16.get(), K, b16.get(), N, 0.0f, c1.get(), N,
                 context);
    CHECK(context.cache_size() == 4);
    device::gemm(device::Trans::no, device::Trans::no, M, N, K, 1.0f, a16.get(), K, b16.get(), N, 0.0f, c16.get(), N,
                 context);
    device::gemm(device::Trans::no, device::Trans::no, M, N, K, 2.0f, a16.get(), K, b16.get(), N, 1.0f, c16.get(), N,
                 context);
    CHECK(context.cache_size() == 5);
    CHECK(context.heuristic_queries() == 5);

    // A moved context keeps its plans; a cleared one queries again.
    device::GemmContext moved(std::move(context));
    CHECK(moved.cache_size() == 5);
    CHECK(moved.stream() == stream.get());
    device::gemm(device::Trans::no, device::Trans::no, M, N, K, 1.0f, da.get(), K, db.get(), N, 0.0f, c2.get(), N,
                 moved);
    CHECK(moved.cache_size() == 5);
    CHECK(moved.heuristic_queries() == 5);
    stream.synchronize();
    check_same_bits(c2.to_host(), "the same product through the moved context");
    moved.clear_cache();
    CHECK(moved.cache_size() == 0);
    device::gemm(device::Trans::no, device::Trans::no, M, N, K, 1.0f, da.get(), K, db.get(), N, 0.0f, c2.get(), N,
                 moved);
    CHECK(moved.cache_size() == 1);
    CHECK(moved.heuristic_queries() == 6);
    stream.synchronize();
}

// cuBLASLt has algorithms that need no workspace; a context without one
// (workspace_bytes = 0) must still multiply, on the legacy default stream.
TEST_CASE("a GemmContext without workspace, on the default stream, still multiplies correctly",
          "[kernels][gemm]") {
    device::GemmContext context(nullptr, 0);
    CHECK(context.workspace_bytes() == 0);
    CHECK(context.workspace() == nullptr);
    check_against_host<float, float>(context, {512, 512, 512}, all_transposes[3], 0, scenarios[2], 7000u,
                                     f32_tolerance);
    check_against_host<bf16, bf16>(context, {512, 512, 512}, all_transposes[0], 0, scenarios[1], 7003u,
                                   bf16_input_tolerance);
}

// The same arguments are refused with the same sentence as on the host,
// before anything reaches the device or the plan cache.
TEST_CASE("cuda::gemm refuses bad sizes and strides with host::gemm's messages", "[kernels][gemm]") {
    Stream stream;
    device::GemmContext context(stream.get());
    std::vector<float> scratch(64, 0.0f);
    DeviceArray<float> d(scratch);
    DeviceArray<bf16> d16(as_elements<bf16>(scratch));
    struct Bad {
        bool ta, tb;
        std::int64_t M, N, K, lda, ldb, ldc;
    };
    const Bad cases[] = {
        {false, false, -1, 2, 2, 2, 2, 2},  // negative size
        {false, false, 2, 2, -3, 1, 2, 2},  // negative K
        {false, false, 2, 3, 4, 3, 3, 3},   // lda < K
        {true, false, 5, 3, 4, 4, 3, 3},    // lda < M (A transposed)
        {false, false, 2, 3, 4, 4, 2, 3},   // ldb < N
        {false, true, 2, 3, 4, 4, 3, 3},    // ldb < K (B transposed)
        {false, false, 2, 3, 4, 4, 3, 2},   // ldc < N
        {false, false, 2, 0, 4, 4, 0, 0},   // ld 0 even when nothing is stored
    };
    for (const Bad& bad : cases) {
        CAPTURE(bad.ta, bad.tb, bad.M, bad.N, bad.K, bad.lda, bad.ldb, bad.ldc);
        const auto host_ta = bad.ta ? host::Trans::yes : host::Trans::no;
        const auto host_tb = bad.tb ? host::Trans::yes : host::Trans::no;
        const auto ta = bad.ta ? device::Trans::yes : device::Trans::no;
        const auto tb = bad.tb ? device::Trans::yes : device::Trans::no;
        const std::string expected = message_of([&] {
            host::gemm(host_ta, host_tb, bad.M, bad.N, bad.K, 1.0f, scratch.data(), bad.lda, scratch.data(), bad.ldb,
                       0.0f, scratch.data(), bad.ldc);
        });
        REQUIRE_THAT(expected, Catch::StartsWith("gemm: "));
        CHECK(message_of([&] {
                  device::gemm(ta, tb, bad.M, bad.N, bad.K, 1.0f, d.get(), bad.lda, d.get(), bad.ldb, 0.0f, d.get(),
                               bad.ldc, context);
              }) == expected);
        CHECK(message_of([&] {
                  device::gemm(ta, tb, bad.M, bad.N, bad.K, 1.0f, d16.get(), bad.lda, d16.get(), bad.ldb, 0.0f,
                               d.get(), bad.ldc, context);
              }) == expected);
        CHECK(message_of([&] {
                  device::gemm(ta, tb, bad.M, bad.N, bad.K, 1.0f, d16.get(), bad.lda, d16.get(), bad.ldb, 0.0f,
                               d16.get(), bad.ldc, context);
              }) == expected);
    }
    stream.synchronize();
    CHECK(context.cache_size() == 0);
    CHECK(scratch == std::vector<float>(64, 0.0f));
}
