// SUMMA on q x q grids of rank threads (q = 2 and 3): each of the three
// products Optimus 2D needs (A B, A B^T, A^T B), computed from blocks, equals
// the whole product; a tp axis that is not a square is refused in one line.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/core/rng.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/parallel/grid2d.hpp>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Tensor;
using loom::comm::ThreadComm;
using loom::kernels::host::Trans;

namespace {

// Block (bi, bj) of a row-major [rows, cols] matrix cut q x q.
std::vector<float> block_of(const std::vector<float>& whole, std::int64_t rows, std::int64_t cols, int q, int bi, int bj) {
    const std::int64_t r = rows / q, c = cols / q;
    std::vector<float> out(static_cast<std::size_t>(r * c));
    for (std::int64_t x = 0; x < r; ++x)
        for (std::int64_t y = 0; y < c; ++y)
            out[static_cast<std::size_t>(x * c + y)] = whole[static_cast<std::size_t>((bi * r + x) * cols + bj * c + y)];
    return out;
}

std::vector<float> random(std::int64_t n, std::uint64_t stream) {
    std::vector<float> v(static_cast<std::size_t>(n));
    loom::RngStream{9, stream}.fill_normal(v, 0);
    return v;
}

enum class Product { ab, abt, atb };

// Runs one product on q x q rank threads; returns each rank's largest error
// against the whole product's block (checked on the main thread).
std::vector<double> run(Product product, int q, std::int64_t m, std::int64_t k, std::int64_t n) {
    // Whole shapes: C [q m, q n]; A and B as the product needs them.
    const std::int64_t M = q * m, K = q * k, N = q * n;
    const auto a = random(M * K, 1), b = random(K * N, 2);
    std::vector<float> c(static_cast<std::size_t>(M * N));
    switch (product) {
        case Product::ab:  // A [M, K], B [K, N]
            loom::kernels::host::gemm(Trans::no, Trans::no, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
            break;
        case Product::abt:  // A [M, K], B [N, K]
            loom::kernels::host::gemm(Trans::no, Trans::yes, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c.data(), N);
            break;
        case Product::atb:  // A [K, M], B [K, N]
            loom::kernels::host::gemm(Trans::yes, Trans::no, M, N, K, 1.0f, a.data(), M, b.data(), N, 0.0f, c.data(), N);
            break;
    }
    std::vector<double> worst(static_cast<std::size_t>(q * q), 0.0);
    loom::comm::ThreadWorld(q * q).run([&](ThreadComm& tp) {
        loom::tp::Grid2D<ThreadComm> grid(tp);
        const int i = grid.i, j = grid.j;
        std::vector<float> mine(static_cast<std::size_t>(m * n));
        const Tensor out = Tensor::of(mine.data(), {m * n});
        if (product == Product::ab) {
            auto ab = block_of(a, M, K, q, i, j), bb = block_of(b, K, N, q, i, j);
            loom::nn::summa_ab(grid.view(), Tensor::of(ab.data(), {m * k}), Tensor::of(bb.data(), {k * n}), out, m, k, n);
        } else if (product == Product::abt) {
            auto ab = block_of(a, M, K, q, i, j), bb = block_of(b, N, K, q, i, j);
            loom::nn::summa_abt(grid.view(), Tensor::of(ab.data(), {m * k}), Tensor::of(bb.data(), {n * k}), out, m, k, n);
        } else {
            auto ab = block_of(a, K, M, q, i, j), bb = block_of(b, K, N, q, i, j);
            loom::nn::summa_atb(grid.view(), Tensor::of(ab.data(), {k * m}), Tensor::of(bb.data(), {k * n}), out, m, k, n);
        }
        const auto want = block_of(c, M, N, q, i, j);
        double& w = worst[static_cast<std::size_t>(tp.rank())];
        for (std::size_t x = 0; x < want.size(); ++x)
            w = std::max(w, static_cast<double>(std::abs(mine[x] - want[x])) / (1.0 + std::abs(want[x])));
    });
    return worst;
}

}  // namespace

TEST_CASE("SUMMA's three products on a q x q grid equal the whole products", "[parallel][tp2d]") {
    for (int q : {2, 3})
        for (Product p : {Product::ab, Product::abt, Product::atb}) {
            const auto worst = run(p, q, 3, 4, 5);  // unequal block sides catch a transposed block
            for (std::size_t r = 0; r < worst.size(); ++r) {
                INFO("q " << q << ", product " << static_cast<int>(p) << ", rank " << r);
                CHECK(worst[r] <= 1e-5);
            }
        }
}

TEST_CASE("a tp axis that is not a square is refused in one line", "[parallel][tp2d]") {
    CHECK(loom_test::message_of([] { (void)loom::tp::Grid2D<ThreadComm>::side_of(6); }) ==
          "Optimus 2D: a tp axis of 6 ranks is not a square grid; use 4 or 9 ranks (q x q)");
    CHECK(loom::tp::Grid2D<ThreadComm>::side_of(9) == 3);
    CHECK(loom::tp::Grid2D<ThreadComm>::side_of(1) == 1);
}

}  // namespace LOOM_TEST_FILE
