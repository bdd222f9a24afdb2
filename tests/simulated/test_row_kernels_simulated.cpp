// The CUDA row passes on simulated threads (warp_simulator.hpp): layernorm's
// three kernels and grid LayerNorm's steps (layernorm_grid.cuh),
// cross-entropy's (whole rows, the target check, the loss sum and the
// vocabulary slices) and the bf16 rounding of GEMM operands, each against
// the host kernel it mirrors, with the tolerances of the CUDA tests
// (tests/cuda/test_kernels_quantize_norm.cu, test_kernels_layernorm_grid.cu,
// test_kernels_signs_vocab.cu, test_kernels_gemm.cu). Their grids are the
// launchers' own (restated here where the launcher is one line,
// rounding_launch's where it is not) and, for some shapes, smaller ones, so
// that the grid-stride loops run too. Every output starts as NaN (or a
// sentinel), so an element no thread wrote fails, and so does one written
// past the end.
//
// Why on the CPU: these kernels changed (loads issued four or eight ahead)
// in a session without a GPU; here their indexing, their loops' edges and
// their reductions run in CI.
#include <catch2/catch.hpp>

#include "loom/core/dtype.hpp"
#include "loom/kernels/host/cross_entropy.hpp"
#include "loom/kernels/host/layernorm.hpp"
#include "loom/kernels/host/layernorm_grid.hpp"
#include "support/comparisons.hpp"
#include "support/layernorm_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "simulated/warp_simulator.hpp"
// The kernels, extracted from their headers by extract_device_code.py at build time.
#include "device_code.inc"

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_test::compare_relative;
using loom_test::compare_within;
using loom_test::normal_values;
using loom_sim::Grid;

constexpr int block = dev::threads_per_block;

std::vector<float> nans(std::int64_t n) { return std::vector<float>(static_cast<std::size_t>(n), NAN); }

// A row kernel's grid, as its launcher's: blocks_for(rows * RowThreads),
// or at most `cap` blocks so that each group loops over several rows.
Grid row_grid(std::int64_t rows, int row_threads, unsigned cap) {
    return {std::min(dev::blocks_for(rows * row_threads), cap), 1};
}

template <int RowThreads>
void layernorm_rows(const std::vector<float>& x, const std::vector<float>& gain, const std::vector<float>& shift,
                    const std::vector<float>& dy, const std::vector<float>& mean, const std::vector<float>& rstd,
                    std::vector<float>& y, std::vector<float>& d_mean, std::vector<float>& d_rstd,
                    std::vector<float>& dx, std::int64_t rows, std::int64_t C, float eps, unsigned cap) {
    const Grid grid = row_grid(rows, RowThreads, cap);
    loom_sim::launch(grid, block, 0, [&] {
        dev::detail::layernorm_forward_kernel<RowThreads>(x.data(), gain.data(), shift.data(), y.data(),
                                                          d_mean.data(), d_rstd.data(), rows, C, eps);
    });
    // The backward reads the host's statistics, so each kernel is compared on
    // identical inputs, as on a GPU.
    loom_sim::launch(grid, block, 0, [&] {
        dev::detail::layernorm_backward_input_kernel<RowThreads>(dy.data(), x.data(), gain.data(), mean.data(),
                                                                 rstd.data(), dx.data(), rows, C);
    });
}

}  // namespace

TEST_CASE("layernorm's CUDA kernels on simulated threads match the host layernorm", "[simulated][layernorm]") {
    constexpr double rtol = 1e-5, column_rtol = 1e-6;
    constexpr float eps = 1e-5f;
    std::mt19937 rng(2611);
    // {rows, C, cap on the row kernels' grid, cap on the weight kernel's}:
    // warp rows (C <= 1024) and block rows; the caps make the grid-stride
    // loops over rows and over column tiles run; rows not a multiple of the
    // weight kernel's 32 row lanes nor of its unrolling by 8.
    struct Case {
        std::int64_t rows, C;
        unsigned row_cap, tile_cap;
    };
    const Case cases[] = {{1, 1, 4096, 4096}, {3, 7, 4096, 4096}, {37, 100, 2, 4096}, {300, 64, 4096, 1},
                          {5, 1500, 2, 3},    {2, 1025, 4096, 4096}, {64, 768, 4096, 5}};
    for (const Case& c : cases) {
        const std::int64_t rows = c.rows, C = c.C;
        INFO("rows = " << rows << ", C = " << C << ", caps " << c.row_cap << " and " << c.tile_cap);
        const loom_test::LayerNormCase lc(rows, C, eps, rng);
        const std::vector<float>& x = lc.x;
        const std::vector<float>& gain = lc.gain;
        const std::vector<float>& dy = lc.dy;
        const std::vector<float>& mean = lc.mean;
        const std::vector<float>& rstd = lc.rstd;

        std::vector<float> d_y = nans(rows * C), d_mean = nans(rows), d_rstd = nans(rows), d_dx = nans(rows * C);
        if (C <= dev::warp_row_limit)
            layernorm_rows<32>(x, gain, lc.shift, dy, mean, rstd, d_y, d_mean, d_rstd, d_dx, rows, C, eps, c.row_cap);
        else
            layernorm_rows<block>(x, gain, lc.shift, dy, mean, rstd, d_y, d_mean, d_rstd, d_dx, rows, C, eps,
                                  c.row_cap);
        constexpr int tile = dev::detail::layernorm_weight_tile_columns;
        std::vector<float> d_dgain = lc.dgain0, d_dshift = lc.dshift0;
        const auto tiles = static_cast<unsigned>((C + tile - 1) / tile);
        loom_sim::launch(Grid{std::min({tiles, 4096u, c.tile_cap}), 1}, dev::detail::layernorm_weight_threads, 0, [&] {
            dev::detail::layernorm_backward_weight_kernel<tile>(dy.data(), x.data(), mean.data(), rstd.data(),
                                                                d_dgain.data(), d_dshift.data(), rows, C);
        });

        CHECK_NO_MISMATCHES("mean", compare_relative(d_mean, mean, rtol));
        CHECK_NO_MISMATCHES("rstd", compare_relative(d_rstd, rstd, rtol));
        CHECK_NO_MISMATCHES("y", compare_relative(d_y, lc.y, rtol));
        // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gain: the host
        // kernel may fuse g's product into the subtraction (an FMA), as nvcc
        // does on a GPU; compiled for the host here, these kernels round g
        // first. rstd multiplies that rounding: with C = 1 the row's variance
        // is 0 and rstd = 1 / sqrt(eps) = 316. So dx is allowed rtol plus
        // two float ulps of each term, times rstd.
        CHECK_NO_MISMATCHES("dx", compare_within(d_dx, lc.dx, [&](std::size_t i) {
            const auto r = static_cast<std::int64_t>(i) / C;
            const auto j = static_cast<std::size_t>(static_cast<std::int64_t>(i) % C);
            double g_mean = 0.0, gx_mean = 0.0;
            for (std::int64_t k = 0; k < C; ++k) {
                const double g = static_cast<double>(dy[r * C + k]) * gain[k];
                g_mean += std::fabs(g) / static_cast<double>(C);
                gx_mean += std::fabs(g * (x[r * C + k] - mean[r]) * rstd[r]) / static_cast<double>(C);
            }
            const double xhat = std::fabs((static_cast<double>(x[i]) - mean[r]) * rstd[r]);
            const double terms = std::fabs(static_cast<double>(dy[i]) * gain[j]) + g_mean + xhat * gx_mean;
            return rtol * std::max(1.0, std::fabs(static_cast<double>(lc.dx[i]))) + 0x1p-22 * rstd[r] * terms;
        }));
        const loom_test::LayerNormCase::ColumnBounds bounds = lc.column_bounds(column_rtol);
        CHECK_NO_MISMATCHES("dgain",
                            compare_within(d_dgain, lc.dgain, [&](std::size_t j) { return bounds.gain[j]; }));
        CHECK_NO_MISMATCHES("dshift",
                            compare_within(d_dshift, lc.dshift, [&](std::size_t j) { return bounds.shift[j]; }));
    }
}

TEST_CASE("grid LayerNorm's CUDA steps on simulated threads follow the host's within 1e-5", "[simulated][layernorm]") {
    // The steps of LayerNorm on an Optimus 2D grid, each from the same inputs
    // on both sides, with the CUDA test's shapes and tolerance (1e-5 relative
    // to max(|host|, 1)); one thread a row or an element, no barriers.
    const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1}, {1, 7}, {7, 1}, {33, 48}, {1 << 16, 3}};
    std::mt19937 rng(2616);
    for (const auto& [rows, C] : shapes) {
        INFO(rows << " x " << C);
        const auto n = static_cast<std::size_t>(rows * C), r = static_cast<std::size_t>(rows);
        const float inverse_C = 1.0f / static_cast<float>(2 * C);  // as if the grid row held 2 ranks
        std::uniform_real_distribution<float> wide(-2.0f, 2.0f), unit(-1.0f, 1.0f), near_one(0.5f, 1.5f),
            small(-0.5f, 0.5f);
        const auto draw = [&](std::size_t count, std::uniform_real_distribution<float>& d) {
            std::vector<float> v(count);
            for (float& e : v) e = d(rng);
            return v;
        };
        const std::vector<float> x = draw(n, wide), dy = draw(n, unit);
        const std::vector<float> gain = draw(static_cast<std::size_t>(C), near_one);
        const std::vector<float> shift = draw(static_cast<std::size_t>(C), small);
        const Grid per_row{dev::blocks_for(rows), 1}, per_element{dev::blocks_for(rows * C), 1};

        std::vector<float> sums(r), d_sums = nans(rows);
        host::layernorm_grid_row_sums(x.data(), sums.data(), rows, C);
        loom_sim::launch_each(per_row, block,
                              [&] { dev::detail::grid_row_sums_kernel<float>(x.data(), d_sums.data(), rows, C); });
        CHECK_NO_MISMATCHES("row sums", compare_relative(d_sums, sums, 1e-5));

        std::vector<float> mean = sums, squares(r), d_mean = sums, d_squares = nans(rows);
        host::layernorm_grid_centered_squares(x.data(), mean.data(), squares.data(), rows, C, inverse_C);
        loom_sim::launch_each(per_row, block, [&] {
            dev::detail::grid_centered_squares_kernel<float>(x.data(), d_mean.data(), d_squares.data(), rows, C,
                                                             inverse_C);
        });
        CHECK_NO_MISMATCHES("mean", compare_relative(d_mean, mean, 1e-5));
        CHECK_NO_MISMATCHES("squares", compare_relative(d_squares, squares, 1e-5));

        std::vector<float> rstd = squares, y(n), d_rstd = squares, d_y = nans(rows * C);
        host::layernorm_grid_normalize(x.data(), gain.data(), shift.data(), mean.data(), rstd.data(), y.data(), rows,
                                       C, inverse_C, 1e-5f);
        loom_sim::launch_each(per_row, block,
                              [&] { dev::detail::grid_rstd_kernel<float>(d_rstd.data(), rows, inverse_C, 1e-5f); });
        loom_sim::launch_each(per_element, block, [&] {
            dev::detail::grid_normalize_kernel<float>(x.data(), gain.data(), shift.data(), mean.data(), d_rstd.data(),
                                                      d_y.data(), rows, C);
        });
        CHECK_NO_MISMATCHES("rstd", compare_relative(d_rstd, rstd, 1e-5));
        CHECK_NO_MISMATCHES("y", compare_relative(d_y, y, 1e-5));

        std::vector<float> grad_sums(2 * r), d_grad_sums = nans(2 * rows);
        host::layernorm_grid_backward_sums(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(), grad_sums.data(),
                                           rows, C);
        loom_sim::launch_each(per_row, block, [&] {
            dev::detail::grid_backward_sums_kernel<float>(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(),
                                                          d_grad_sums.data(), rows, C);
        });
        CHECK_NO_MISMATCHES("backward sums", compare_relative(d_grad_sums, grad_sums, 1e-5));

        std::vector<float> dx(n), d_dx = nans(rows * C);
        host::layernorm_grid_backward_apply(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(),
                                            grad_sums.data(), dx.data(), rows, C, inverse_C);
        loom_sim::launch_each(per_element, block, [&] {
            dev::detail::grid_backward_apply_kernel<float>(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(),
                                                           grad_sums.data(), d_dx.data(), rows, C, inverse_C);
        });
        CHECK_NO_MISMATCHES("dx", compare_relative(d_dx, dx, 1e-5));
    }
}

namespace {

struct Batch {
    std::vector<float> logits;
    std::vector<std::int32_t> targets;
};

// As tests/cuda/cross_entropy_batch.hpp: N(0, 2) logits, random targets, a
// row shifted by +100, a confident row and a row whose target is far below.
Batch batch_of(std::int64_t rows, std::int64_t V, std::mt19937& rng) {
    Batch b{normal_values(static_cast<std::size_t>(rows * V), rng, 0.0f, 2.0f),
            std::vector<std::int32_t>(static_cast<std::size_t>(rows))};
    std::uniform_int_distribution<std::int32_t> klass(0, static_cast<std::int32_t>(V - 1));
    for (std::int32_t& t : b.targets) t = klass(rng);
    if (rows > 1)
        for (std::int64_t j = 0; j < V; ++j) b.logits[V + j] += 100.0f;
    if (rows > 2) b.logits[2 * V + b.targets[2]] += 15.0f;
    if (rows > 3) b.logits[3 * V + b.targets[3]] = -20.0f;
    return b;
}

// What the device's forward leaves: the report, logsumexp and the loss.
struct Forward {
    dev::detail::CrossEntropyReport report;
    std::vector<float> logsumexp;
};

// cross_entropy_forward's launches: the target check (one block), the rows,
// the loss sum (one block).
template <int RowThreads>
Forward forward_on_threads(const Batch& b, std::int64_t rows, std::int64_t V, unsigned cap) {
    Forward f{{-1, NAN}, nans(rows)};
    std::vector<double> row_loss(static_cast<std::size_t>(rows), NAN);
    loom_sim::launch(Grid{}, block, 0, [&] {
        dev::detail::cross_entropy_check_targets_kernel<block>(b.targets.data(), rows, V, &f.report);
    });
    loom_sim::launch(row_grid(rows, RowThreads, cap), block, 0, [&] {
        dev::detail::cross_entropy_logsumexp_kernel<RowThreads>(b.logits.data(), b.targets.data(),
                                                               f.logsumexp.data(), row_loss.data(), &f.report, rows,
                                                               V);
    });
    loom_sim::launch(Grid{}, block, 0, [&] {
        dev::detail::cross_entropy_loss_sum_kernel<block>(row_loss.data(), rows, &f.report);
    });
    return f;
}

template <int RowThreads>
std::vector<float> backward_on_threads(const Batch& b, const std::vector<float>& lse, float scale, std::int64_t rows,
                                       std::int64_t V, std::int64_t start,
                                       const dev::detail::CrossEntropyReport& report, unsigned cap) {
    std::vector<float> dlogits = nans(rows * V);
    loom_sim::launch(row_grid(rows, RowThreads, cap), block, 0, [&] {
        dev::detail::cross_entropy_backward_kernel<RowThreads>(b.logits.data(), b.targets.data(), lse.data(), scale,
                                                               dlogits.data(), &report, rows, V, start);
    });
    return dlogits;
}

// RowThreads as cross_entropy's launch_per_row picks them.
template <class Body>
void per_row(std::int64_t V, Body body) {
    if (V <= dev::warp_row_limit)
        body.template operator()<32>();
    else
        body.template operator()<block>();
}

}  // namespace

TEST_CASE("cross-entropy's CUDA kernels on simulated threads match the host cross-entropy",
          "[simulated][cross_entropy]") {
    constexpr double rtol = 1e-5, target_atol = 1e-6;
    std::mt19937 rng(2612);
    // V around the four-loads-ahead loop's edges (4 x 32 and 4 x 256 values a
    // pass), GPT-2's vocabulary, and rows past a capped grid.
    const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1},    {1, 2},    {5, 127},  {5, 128},   {4, 129},
                                                            {9, 257},  {3, 1024}, {2, 1025}, {2, 2048},  {3, 2049},
                                                            {2, 3000}, {2, 50257}};
    for (const auto& [rows, V] : shapes) {
        const unsigned cap = rows > 4 ? 1 : 4096;
        INFO("rows = " << rows << ", V = " << V << ", grid cap " << cap);
        const Batch b = batch_of(rows, V, rng);
        const float dloss = 0.7f;
        std::vector<float> lse(static_cast<std::size_t>(rows)), dlogits(static_cast<std::size_t>(rows * V));
        const float loss = host::cross_entropy_forward(b.logits.data(), b.targets.data(), lse.data(), rows, V);
        host::cross_entropy_backward(b.logits.data(), b.targets.data(), lse.data(), dloss, dlogits.data(), rows, V);

        per_row(V, [&]<int RowThreads>() {
            const Forward f = forward_on_threads<RowThreads>(b, rows, V, cap);
            CHECK(f.report.first_bad_row == rows);
            const auto device_loss = static_cast<float>(f.report.loss_sum / static_cast<double>(rows));
            CHECK(std::fabs(device_loss - loss) <= rtol * std::max(1.0f, std::fabs(loss)));
            CHECK_NO_MISMATCHES("logsumexp", compare_relative(f.logsumexp, lse, rtol));
            const float scale = dloss / static_cast<float>(rows);
            const std::vector<float> d = backward_on_threads<RowThreads>(b, lse, scale, rows, V, 0, f.report, cap);
            CHECK_NO_MISMATCHES("dlogits", compare_within(d, dlogits, [&](std::size_t i) {
                                    return rtol * std::fabs(static_cast<double>(dlogits[i])) +
                                           target_atol * std::fabs(static_cast<double>(scale));
                                }));
        });
    }
}

TEST_CASE("cross-entropy's CUDA kernels on simulated threads find the first bad target and then write nothing",
          "[simulated][cross_entropy]") {
    std::mt19937 rng(2613);
    for (const std::int64_t V : {std::int64_t{50}, std::int64_t{2000}}) {
        INFO("V = " << V);
        constexpr std::int64_t rows = 600;  // past one block's 256 threads: the check's loop and its min
        Batch b = batch_of(rows, V, rng);
        b.targets[517] = static_cast<std::int32_t>(V);
        b.targets[300] = -1;
        per_row(V, [&]<int RowThreads>() {
            const Forward f = forward_on_threads<RowThreads>(b, rows, V, 4096);
            CHECK(f.report.first_bad_row == 300);
            CHECK(std::all_of(f.logsumexp.begin(), f.logsumexp.end(), [](float v) { return std::isnan(v); }));
            const std::vector<float> d =
                backward_on_threads<RowThreads>(b, nans(rows), 1.0f, rows, V, 0, f.report, 4096);
            CHECK(std::all_of(d.begin(), d.end(), [](float v) { return std::isnan(v); }));
        });
    }
}

TEST_CASE("the vocabulary-slice CUDA kernels on simulated threads match the host's slices",
          "[simulated][cross_entropy]") {
    constexpr double rtol = 1e-5, target_atol = 1e-6;
    std::mt19937 rng(2614);
    // A vocabulary of `classes` cut in two slices at `cut`; the targets on
    // either side, on the edges too.
    const std::pair<std::int64_t, std::int64_t> vocabularies[] = {{300, 129}, {2500, 1100}};
    for (const auto& [classes, cut] : vocabularies) {
        constexpr std::int64_t rows = 6;
        const Batch whole = batch_of(rows, classes, rng);
        Batch b = whole;
        b.targets[4] = static_cast<std::int32_t>(cut - 1);
        b.targets[5] = static_cast<std::int32_t>(cut);
        std::vector<float> lse(rows);
        (void)host::cross_entropy_forward(b.logits.data(), b.targets.data(), lse.data(), rows, classes);
        const dev::detail::CrossEntropyReport fine{rows, 0.0};
        for (const auto& [start, V] : {std::pair{std::int64_t{0}, cut}, std::pair{cut, classes - cut}}) {
            INFO("classes = " << classes << ", slice [" << start << ", " << start + V << ")");
            Batch slice{std::vector<float>(static_cast<std::size_t>(rows * V)), b.targets};
            for (std::int64_t r = 0; r < rows; ++r)
                std::copy_n(b.logits.begin() + r * classes + start, V, slice.logits.begin() + r * V);
            std::vector<float> row_max(rows), sums(2 * rows), dlogits(static_cast<std::size_t>(rows * V));
            host::cross_entropy_slice_max(slice.logits.data(), slice.targets.data(), row_max.data(), rows, V, classes);
            host::cross_entropy_slice_sums(slice.logits.data(), slice.targets.data(), row_max.data(), sums.data(), rows,
                                           V, start);
            host::cross_entropy_slice_backward(slice.logits.data(), slice.targets.data(), lse.data(), 0.7f,
                                               dlogits.data(), rows, V, start, classes);
            per_row(V, [&]<int RowThreads>() {
                std::vector<float> d_max = nans(rows), d_sums = nans(2 * rows);
                loom_sim::launch(row_grid(rows, RowThreads, 4096), block, 0, [&] {
                    dev::detail::cross_entropy_slice_max_kernel<RowThreads>(slice.logits.data(), d_max.data(), &fine,
                                                                            rows, V);
                });
                // The sums from the host's max, so both sides sum the same terms.
                loom_sim::launch(row_grid(rows, RowThreads, 4096), block, 0, [&] {
                    dev::detail::cross_entropy_slice_sums_kernel<RowThreads>(
                        slice.logits.data(), slice.targets.data(), row_max.data(), d_sums.data(), rows, V, start);
                });
                CHECK_NO_MISMATCHES("row max", loom_test::compare_floats(d_max, row_max, false));
                CHECK_NO_MISMATCHES("sums", compare_relative(d_sums, sums, rtol));
                const float scale = 0.7f / static_cast<float>(rows);
                const std::vector<float> d =
                    backward_on_threads<RowThreads>(slice, lse, scale, rows, V, start, fine, 4096);
                CHECK_NO_MISMATCHES("dlogits", compare_within(d, dlogits, [&](std::size_t i) {
                                        return rtol * std::fabs(static_cast<double>(dlogits[i])) +
                                               target_atol * std::fabs(static_cast<double>(scale));
                                    }));
            });
        }
    }
}

TEST_CASE("the bf16 rounding of GEMM operands on simulated threads is to_bf16 of each element and writes no other",
          "[simulated][gemm]") {
    std::mt19937 rng(2615);
    // {rows, cols, ld, out_ld, offset of x in floats}: the flat pass; four
    // neighbours a thread (quads) with padded rows; GPT-2's head gradient
    // (ld = 50257: four strided columns a thread); x misaligned; a grid
    // capped at 4096 blocks down the rows.
    struct Case {
        std::int64_t rows, cols, ld, out_ld, offset;
    };
    const Case cases[] = {{3, 8, 8, 8, 0},        {5, 1027, 1027, 1027, 0}, {7, 30, 32, 32, 0},
                          {4, 1029, 1032, 1032, 0}, {3, 50257, 50257, 50264, 0}, {6, 33, 36, 40, 1},
                          {5000, 3, 3, 8, 0},     {2, 1, 1, 1, 0}};
    constexpr std::uint16_t sentinel = 0xabcd;
    for (const Case& c : cases) {
        INFO("rows = " << c.rows << ", cols = " << c.cols << ", ld = " << c.ld << ", out_ld = " << c.out_ld
                       << ", x offset " << c.offset);
        std::vector<float> storage = normal_values(static_cast<std::size_t>(c.offset + c.rows * c.ld), rng);
        storage[static_cast<std::size_t>(c.offset)] = NAN;
        if (c.rows * c.cols > 2) storage[static_cast<std::size_t>(c.offset + 1)] = INFINITY;
        const float* x = storage.data() + c.offset;
        std::vector<loom::bf16> out(static_cast<std::size_t>(c.rows * c.out_ld + 8), loom::bf16::from_bits(sentinel));
        const dev::detail::RoundingLaunch shape =
            dev::detail::rounding_launch(x, c.ld, c.rows, c.cols, out.data(), c.out_ld);
        CHECK(shape.flat == (c.ld == c.cols && c.out_ld == c.cols && c.offset == 0 && c.cols % 4 == 0));
        CHECK(shape.grid_x * shape.grid_y <= 4096);
        if (shape.flat)
            loom_sim::launch_each(Grid{shape.grid_x, 1}, block, [&] {
                dev::detail::round_flat_to_bf16_kernel<float>(x, c.rows * c.cols, out.data());
            });
        else
            loom_sim::launch_each(Grid{shape.grid_x, shape.grid_y}, block, [&] {
                dev::detail::round_rows_to_bf16_kernel<float>(x, c.ld, c.rows, c.cols, out.data(), c.out_ld,
                                                              shape.quads);
            });
        loom_test::Mismatches bad;
        for (std::int64_t r = 0; r < c.rows; ++r)
            for (std::int64_t j = 0; j < c.out_ld; ++j) {
                const std::uint16_t want = j < c.cols ? loom::to_bf16(x[r * c.ld + j]).bits : sentinel;
                if (out[static_cast<std::size_t>(r * c.out_ld + j)].bits != want)
                    bad.add("row " + std::to_string(r) + " column " + std::to_string(j));
            }
        for (std::size_t i = static_cast<std::size_t>(c.rows * c.out_ld); i < out.size(); ++i)
            if (out[i].bits != sentinel) bad.add("past the end: " + std::to_string(i));
        CHECK_NO_MISMATCHES("rounded", bad);
    }
}
