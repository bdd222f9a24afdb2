// The CUDA elementwise kernels (kernels/cuda/elementwise.cuh) on simulated
// threads (warp_simulator.hpp), bit for bit against the host kernels they
// mirror, as tests/cuda/test_kernels_elementwise.cu asks of a GPU. Grids are
// the launchers' and, where a grid-stride or tile loop would otherwise run
// once, capped: bias_grad's loop over column tiles, which on a GPU runs
// only past 4096 tiles (n > 131072), runs here on a grid of 3 blocks.
#include <catch2/catch.hpp>

#include "loom/kernels/column_sum_order.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "support/comparisons.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
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
        loom_sim::launch(Grid{std::min(tiles, c.cap), 1}, 32 * static_cast<int>(loom::kernels::column_sum_chunks), 0,
                         [&] {
                             dev::detail::bias_grad_kernel<float>(dy.data(), d_dbias.data(), c.rows, c.n,
                                                                  loom::kernels::column_sum_chunk_rows(c.rows));
                         });
        CHECK_NO_MISMATCHES("dbias", compare_floats(d_dbias, dbias, false));
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
