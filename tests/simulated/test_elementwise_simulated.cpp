// The CUDA elementwise kernels (kernels/cuda/elementwise.cuh, gelu.cuh,
// optim/adamw.cuh, and gemm.cuh's scaling of C) on simulated threads (warp_simulator.hpp), against the
// host kernels they mirror as tests/cuda/test_kernels_elementwise.cu holds a
// GPU to them: bit for bit, GELU within 2^-20. Grids are
// the launchers' and, where a grid-stride or tile loop would otherwise run
// once, capped: bias_grad's loop over column tiles, which on a GPU runs
// only past 4096 tiles (n > 131072), runs here on a grid of 3 blocks.
#include <catch2/catch.hpp>

#include "loom/kernels/column_sum_order.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "loom/kernels/host/gelu.hpp"
#include "loom/optim/adamw.hpp"
#include "support/adamw_case.hpp"
#include "support/comparisons.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "simulated/warp_simulator.hpp"
// The kernels, extracted from their headers by extract_device_code.py at build time.
#include "device_code.inc"

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_sim::Grid;
using loom_test::compare_floats;
using loom_test::normal_values;

constexpr int block = dev::threads_per_block;

// A flat kernel's grid: its launcher's blocks_for(n), at most `cap`.
Grid flat_grid(std::int64_t n, unsigned cap) { return {std::min(dev::blocks_for(n), cap), 1}; }

}  // namespace

TEST_CASE("bias_grad's CUDA kernel on simulated threads adds columns in the host's order and loops over tiles",
          "[simulated][elementwise]") {
    std::mt19937 rng(2701);
    // {rows, n, cap on the grid}: fewer rows than chunks (empty chunks add
    // nothing), rows not a multiple of the chunk, columns past a tile of 32,
    // and grids smaller than the tiles so that each block loops.
    struct Case {
        std::int64_t rows, n;
        unsigned cap;
    };
    const Case cases[] = {{1, 1, 4096}, {5, 33, 4096}, {31, 70, 2}, {100, 200, 3}, {1000, 64, 4096}, {65, 97, 1}};
    for (const Case& c : cases) {
        INFO("rows = " << c.rows << ", n = " << c.n << ", grid cap " << c.cap);
        std::vector<float> dy = normal_values(static_cast<std::size_t>(c.rows * c.n), rng);
        std::vector<float> dbias0 = normal_values(static_cast<std::size_t>(c.n), rng);
        // Column 0 all -0: its sum stays -0 unless an empty chunk adds a +0.
        dbias0[0] = -0.0f;
        for (std::int64_t r = 0; r < c.rows; ++r) dy[static_cast<std::size_t>(r * c.n)] = -0.0f;
        std::vector<float> dbias = dbias0, d_dbias = dbias0;
        host::bias_grad(dy.data(), dbias.data(), c.rows, c.n);
        const auto tiles = static_cast<unsigned>(std::min<std::int64_t>((c.n + 31) / 32, 4096));
        const long fills = loom_sim::static_shared_fills;
        loom_sim::launch(Grid{std::min(tiles, c.cap), 1}, 32 * static_cast<int>(loom::kernels::column_sum_chunks), 0,
                         [&] {
                             dev::detail::bias_grad_kernel<float>(dy.data(), d_dbias.data(), c.rows, c.n,
                                                                  loom::kernels::column_sum_chunk_rows(c.rows));
                         });
        CHECK_NO_MISMATCHES("dbias", compare_floats(d_dbias, dbias, false));
        // The extracted kernel's static chunk_sums start as NaN in each block
        // (extract_device_code.py's fill after the declaration).
        CHECK(loom_sim::static_shared_fills - fills == std::min(tiles, c.cap));
    }
}

TEST_CASE("the flat CUDA elementwise kernels on simulated threads equal the host's bit for bit",
          "[simulated][elementwise]") {
    std::mt19937 rng(2702);
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{255}, std::int64_t{1000}}) {
        for (const unsigned cap : {4096u, 1u}) {
            INFO("n = " << n << ", grid cap " << cap);
            const Grid grid = flat_grid(n, cap);
            const std::vector<float> a = normal_values(static_cast<std::size_t>(n), rng);
            const std::vector<float> b = normal_values(static_cast<std::size_t>(n), rng);

            std::vector<float> want(a.size()), got(a.size(), NAN);
            host::add(a.data(), b.data(), want.data(), n);
            loom_sim::launch_each(grid, block,
                                  [&] { dev::detail::add_kernel<float>(a.data(), b.data(), got.data(), n); });
            CHECK_NO_MISMATCHES("add", compare_floats(got, want, false));

            want = a;
            got = a;
            host::accumulate(want.data(), b.data(), n);
            loom_sim::launch_each(grid, block, [&] { dev::detail::accumulate_kernel<float>(got.data(), b.data(), n); });
            CHECK_NO_MISMATCHES("accumulate", compare_floats(got, want, false));

            want = a;
            got = a;
            host::subtract(want.data(), b.data(), n);
            loom_sim::launch_each(grid, block, [&] { dev::detail::subtract_kernel<float>(got.data(), b.data(), n); });
            CHECK_NO_MISMATCHES("subtract", compare_floats(got, want, false));

            for (const float beta1 : {0.9f, 0.0f}) {
                want = a;
                got = a;
                host::mix_momentum(want.data(), b.data(), n, beta1);
                loom_sim::launch_each(grid, block,
                                      [&] { dev::detail::mix_momentum_kernel<float>(got.data(), b.data(), n, beta1); });
                CHECK_NO_MISMATCHES("mix_momentum", compare_floats(got, want, false));
                host::unmix_momentum(want.data(), b.data(), n, beta1);
                loom_sim::launch_each(
                    grid, block, [&] { dev::detail::unmix_momentum_kernel<float>(got.data(), b.data(), n, beta1); });
                CHECK_NO_MISMATCHES("unmix_momentum", compare_floats(got, want, false));
            }

            got.assign(a.size(), NAN);
            loom_sim::launch_each(grid, block, [&] { dev::detail::fill_kernel<float>(got.data(), -0.0f, n); });
            CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f && std::signbit(v); }));
        }
    }
    // The [rows, n] kernels: a bias added to every row, and a row repeated.
    for (const auto& [rows, n] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {7, 33}, {40, 100}}) {
        for (const unsigned cap : {4096u, 1u}) {
            INFO("rows = " << rows << ", n = " << n << ", grid cap " << cap);
            const Grid grid = flat_grid(rows * n, cap);
            const std::vector<float> y0 = normal_values(static_cast<std::size_t>(rows * n), rng);
            const std::vector<float> bias = normal_values(static_cast<std::size_t>(n), rng);
            std::vector<float> want = y0, got = y0;
            host::add_bias(want.data(), bias.data(), rows, n);
            loom_sim::launch_each(grid, block,
                                  [&] { dev::detail::add_bias_kernel<float>(got.data(), bias.data(), rows, n); });
            CHECK_NO_MISMATCHES("add_bias", compare_floats(got, want, false));
            for (std::int64_t r = 0; r < rows; ++r) std::copy(bias.begin(), bias.end(), want.begin() + r * n);
            got.assign(want.size(), NAN);
            loom_sim::launch_each(grid, block,
                                  [&] { dev::detail::repeat_rows_kernel<float>(bias.data(), got.data(), rows, n); });
            CHECK_NO_MISMATCHES("repeat_rows", compare_floats(got, want, false));
        }
    }
}

namespace {

// GELU's regime changes (as tests/cuda/test_kernels_elementwise.cu): NaN,
// the infinities, signed zeros, subnormals, the largest floats, the
// exponent's clamp near -9.7 and gelu's minimum near -0.75; then uniform
// values over [-12, 12].
std::vector<float> gelu_inputs(std::int64_t n, std::mt19937& rng) {
    const float inf = std::numeric_limits<float>::infinity(), big = std::numeric_limits<float>::max();
    std::vector<float> x = {NAN,     -NAN,    inf,    -inf,   0.0f,   -0.0f, 1e-40f, -1e-40f, 1e-30f, -1e-30f, big,
                            -big,    1e20f,   -1e20f, 9.7f,   -9.7f,  -9.8f, -12.0f, -0.75f,  -0.7517916f,
                            3.0f,    -3.0f,   80.0f,  -80.0f};
    std::uniform_real_distribution<float> uniform(-12.0f, 12.0f);
    for (std::int64_t i = 0; i < n; ++i) x.push_back(uniform(rng));
    return x;
}

// Equal bits, or both NaN.
loom_test::Mismatches same_or_both_nan(const std::vector<float>& a, const std::vector<float>& b) {
    return loom_test::compare_floats(a, b, /*nan_as_nan=*/true);
}

// gelu_forward's or gelu_backward's launch: four elements a thread where
// every pointer is 16-byte aligned, else one.
template <class Kernel>
void gelu_launch(std::int64_t n, bool quads, Kernel kernel) {
    loom_sim::launch_each(Grid{dev::blocks_for(quads ? (n + 3) / 4 : n), 1}, block, kernel);
}

}  // namespace

TEST_CASE("GELU's CUDA kernels on simulated threads are within 2^-20 of the host's, four a thread or one",
          "[simulated][elementwise]") {
    // The CUDA test's tolerances: y within 2^-20 relative, dx within 2^-20
    // (|dx| + |dy|); NaN where the host has NaN. The exponent is bit for bit
    // the host's; e^z is the host's expf here, the host kernel's own
    // polynomial there.
    std::mt19937 rng(2703);
    for (const std::int64_t extra : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, std::int64_t{4097}}) {
        const std::vector<float> x = gelu_inputs(extra, rng);
        const auto n = static_cast<std::int64_t>(x.size());
        CAPTURE(n);
        std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
        std::vector<float> dy(x.size());
        for (float& v : dy) v = uniform(rng);
        std::vector<float> y(x.size()), dx(x.size());
        host::gelu_forward(x.data(), y.data(), n);
        host::gelu_backward(x.data(), dy.data(), dx.data(), n);

        // Aligned (std::vector's data: 16 bytes) and one float in.
        std::vector<float> x_off(x.size() + 1), dy_off(x.size() + 1);
        std::copy(x.begin(), x.end(), x_off.begin() + 1);
        std::copy(dy.begin(), dy.end(), dy_off.begin() + 1);
        std::vector<float> y4(x.size(), 0.5f), y1(x.size() + 1, 0.5f), dx4(x.size(), 0.5f), dx1(x.size() + 1, 0.5f);
        REQUIRE(dev::detail::all_16_byte_aligned(x.data(), y4.data(), dy.data(), dx4.data()));
        REQUIRE(!dev::detail::all_16_byte_aligned(x_off.data() + 1, y1.data() + 1));
        gelu_launch(n, true, [&] { dev::detail::gelu_forward_kernel<float>(x.data(), y4.data(), n, true); });
        gelu_launch(n, false,
                    [&] { dev::detail::gelu_forward_kernel<float>(x_off.data() + 1, y1.data() + 1, n, false); });
        gelu_launch(n, true,
                    [&] { dev::detail::gelu_backward_kernel<float>(x.data(), dy.data(), dx4.data(), n, true); });
        gelu_launch(n, false, [&] {
            dev::detail::gelu_backward_kernel<float>(x.data(), dy_off.data() + 1, dx1.data() + 1, n, false);
        });
        y1.erase(y1.begin());
        dx1.erase(dx1.begin());
        CHECK_NO_MISMATCHES("gelu_forward, four a thread against one", same_or_both_nan(y4, y1));
        CHECK_NO_MISMATCHES("gelu_backward, four a thread against one", same_or_both_nan(dx4, dx1));
        loom_test::Mismatches forward, backward;
        for (std::size_t i = 0; i < x.size(); ++i) {
            const auto near = [](float d, float h, double scale) {
                return (std::isnan(d) && std::isnan(h)) || d == h ||
                       std::fabs(static_cast<double>(d) - static_cast<double>(h)) <= std::ldexp(scale, -20);
            };
            if (!near(y4[i], y[i], std::fabs(static_cast<double>(y[i]))))
                forward.add("x = " + std::to_string(x[i]) + ": " + std::to_string(y4[i]) + " against " +
                            std::to_string(y[i]));
            if (!near(dx4[i], dx[i], std::fabs(static_cast<double>(dx[i])) + std::fabs(static_cast<double>(dy[i]))))
                backward.add("x = " + std::to_string(x[i]) + ": " + std::to_string(dx4[i]) + " against " +
                              std::to_string(dx[i]));
        }
        CHECK_NO_MISMATCHES("gelu_forward", forward);
        CHECK_NO_MISMATCHES("gelu_backward", backward);
    }
}

// The CUDA test's case: three steps from zero moments with new gradients
// each step (over 23 decades, so some products are subnormal), a NaN
// gradient from step 2 on, a configuration that freezes the variance after
// step 2; params, m and v bit for bit (both sides round each operation once:
// this file is built without FMA contraction, as loom's host code is), and
// the bf16 copy equal to to_bf16 of the params.
TEST_CASE("the CUDA AdamW kernel on simulated threads equals optim::adamw_step bit for bit, with the bf16 copy",
          "[simulated][elementwise]") {
    for (const auto& config : loom_test::adamw_test_configs())
        for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}, std::int64_t{4097},
                                     std::int64_t{1} << 20})
            for (const unsigned cap : {4096u, 3u}) {
                CAPTURE(n, config.freeze_variance_after, cap);
                const auto count = static_cast<std::size_t>(n);
                std::vector<float> p = loom_test::uniform(count, -1.0f, 1.0f, 71u + static_cast<std::uint32_t>(n));
                std::vector<float> m(count, 0.0f), v(count, 0.0f);
                std::vector<float> sim_p = p, sim_m = m, sim_v = v, plain_p = p, plain_m = m, plain_v = v;
                loom::bf16 nan_bits;
                nan_bits.bits = 0xffff;  // the copy starts as NaN: every element must be written
                std::vector<loom::bf16> copy(count, nan_bits);
                for (std::int64_t step = 1; step <= 3; ++step) {
                    CAPTURE(step);
                    std::vector<float> g = loom_test::adamw_gradients(count, 72u + static_cast<std::uint32_t>(n * 3 + step));
                    if (step >= 2) g[count / 2] = std::numeric_limits<float>::quiet_NaN();
                    loom::optim::adamw_step(p, g, m, v, step, config);
                    const auto scalars = loom::optim::detail::adamw_scalars(config, step);
                    loom_sim::launch_each(flat_grid(n, cap), block, [&] {
                        loom::optim::cuda::detail::adamw_kernel<true>(sim_p.data(), g.data(), sim_m.data(),
                                                                      sim_v.data(), copy.data(), n, scalars);
                    });
                    loom_sim::launch_each(flat_grid(n, cap), block, [&] {
                        loom::optim::cuda::detail::adamw_kernel<false>(plain_p.data(), g.data(), plain_m.data(),
                                                                       plain_v.data(), nullptr, n, scalars);
                    });
                    CHECK_NO_MISMATCHES("params", compare_floats(sim_p, p, false));
                    CHECK_NO_MISMATCHES("m", compare_floats(sim_m, m, false));
                    CHECK_NO_MISMATCHES("v", compare_floats(sim_v, v, false));
                    CHECK_NO_MISMATCHES("params (no bf16 copy)", compare_floats(plain_p, p, false));
                    CHECK_NO_MISMATCHES("m (no bf16 copy)", compare_floats(plain_m, m, false));
                    CHECK_NO_MISMATCHES("v (no bf16 copy)", compare_floats(plain_v, v, false));
                    std::vector<float> rounded(count), copied(count);
                    for (std::size_t i = 0; i < count; ++i) {
                        rounded[i] = loom::to_float(loom::to_bf16(p[i]));
                        copied[i] = loom::to_float(copy[i]);
                    }
                    CHECK_NO_MISMATCHES("bf16 copy", compare_floats(copied, rounded, false));
                }
            }
}

// Where no product is made (K = 0 or alpha = 0) the device GEMM scales C by
// beta itself: over the [M, N] part of C only (row stride ldc > N), beta = 0
// writing zeros over NaN, as the host's BLAS does for K = 0 (f32, against
// host::gemm); bf16 C the same, rounded once.
TEST_CASE("the CUDA GEMM's beta scaling on simulated threads equals the host GEMM with K = 0",
          "[simulated][elementwise]") {
    std::mt19937 rng(2702);
    constexpr std::int64_t M = 37, N = 50, ldc = 53;
    for (const float beta : {0.0f, 1.0f, 0.5f, -3.0f})
        for (const unsigned cap : {4096u, 3u}) {
            CAPTURE(beta, cap);
            std::vector<float> c = normal_values(static_cast<std::size_t>(M * ldc), rng);
            c[5] = std::numeric_limits<float>::quiet_NaN();
            c[static_cast<std::size_t>(ldc + 7)] = std::numeric_limits<float>::infinity();
            std::vector<float> want = c, got = c;
            const float unused = 0.0f;
            host::gemm(host::Trans::no, host::Trans::no, M, N, 0, 1.0f, &unused, 1, &unused, N, beta, want.data(), ldc);
            loom_sim::launch_each(flat_grid(M * N, cap), block,
                                  [&] { dev::detail::gemm_scale_kernel<float>(got.data(), M, N, ldc, beta); });
            CHECK_NO_MISMATCHES("C", compare_floats(got, want, false));

            std::vector<loom::bf16> c16(c.size()), got16;
            for (std::size_t i = 0; i < c.size(); ++i) c16[i] = loom::to_bf16(c[i]);
            got16 = c16;
            loom_sim::launch_each(flat_grid(M * N, cap), block,
                                  [&] { dev::detail::gemm_scale_kernel<loom::bf16>(got16.data(), M, N, ldc, beta); });
            std::vector<float> got_wide(c.size()), want_wide(c.size());
            for (std::int64_t i = 0; i < M * ldc; ++i) {
                const auto k = static_cast<std::size_t>(i);
                const bool in_c = i % ldc < N;
                const float x = loom::to_float(c16[k]);
                want_wide[k] = !in_c ? x : loom::to_float(loom::to_bf16(beta == 0.0f ? 0.0f : beta * x));
                got_wide[k] = loom::to_float(got16[k]);
            }
            CHECK_NO_MISMATCHES("bf16 C", compare_floats(got_wide, want_wide, false));
        }
}
