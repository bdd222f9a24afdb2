// SUMMA on a q x q grid of ranks: the matrix products of Optimus 2D tensor
// parallelism (Xu et al., arXiv 2104.05343; Colossal-AI's parallel_2d). Every
// matrix is cut into q x q blocks and rank (i, j) holds block (i, j) of each,
// so both weights and activations take 1/q^2 per rank. The three products a
// Linear needs, forward and backward:
//
//   C = A B     for l: A(i,l) broadcast along row i, B(l,j) along column j,
//                      C(i,j) += A(i,l) B(l,j)
//   C = A B^T   for j': B(j',l) broadcast along column l; each rank forms
//                      A(i,l) B(j',l)^T; a reduce-scatter along row i gives
//                      rank (i,j') the sum over l
//   C = A^T B   for i': A(l,i') broadcast along row l; each rank forms
//                      A(l,i')^T B(l,j); a reduce-scatter along column j
//                      gives rank (i',j) the sum over l
//
// Blocks are row-major f32; A(i,j) is [m, k] for A of [q m, q k], and so on.
// This header holds the grid and the products; the 2D layers build on them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/gemm.hpp"

namespace loom::tp {

// A q x q grid over the q^2 ranks of a tp communicator: rank r sits at row
// r / q, column r % q; `row` holds the ranks of its row (ordered by column),
// `column` those of its column (ordered by row). Collective to construct.
template <comm::Communicator C>
struct Grid2D {
    int q = 1, i = 0, j = 0;
    C row, column;

    explicit Grid2D(C& tp) : q(side_of(tp.size())), i(tp.rank() / q), j(tp.rank() % q),
                             row(tp.split(i, j)), column(tp.split(j, i)) {}

    // q for q^2 ranks; one line naming the size and the nearest squares otherwise.
    [[nodiscard]] static int side_of(int ranks) {
        int side = 1;
        while ((side + 1) * (side + 1) <= ranks) ++side;
        LOOM_CHECK(side * side == ranks, "Optimus 2D: a tp axis of ", ranks, " ranks is not a square grid; use ",
                   side * side, " or ", (side + 1) * (side + 1), " ranks (q x q)");
        return side;
    }
};

namespace detail {

inline void check_block(const Tensor& t, std::int64_t rows, std::int64_t cols, const char* what) {
    LOOM_CHECK(t.dtype() == DType::f32 && t.numel() == rows * cols, "SUMMA: block ", what, " is ", t, "; expected ",
               rows, " x ", cols, " f32");
}

}  // namespace detail

// c (m x n) = sum over l of a(i,l) (m x k) b(l,j) (k x n); c is overwritten.
template <comm::Communicator C>
void summa_ab(Grid2D<C>& grid, const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t m, std::int64_t k,
              std::int64_t n) {
    detail::check_block(a, m, k, "A");
    detail::check_block(b, k, n, "B");
    detail::check_block(c, m, n, "C");
    Buffer<Host> a_l(DType::f32, Shape{m * k}), b_l(DType::f32, Shape{k * n});
    std::fill_n(c.data<float>(), m * n, 0.0f);
    for (int l = 0; l < grid.q; ++l) {
        const Tensor at = grid.j == l ? a : Tensor::of(a_l.data<float>(), {m * k});
        const Tensor bt = grid.i == l ? b : Tensor::of(b_l.data<float>(), {k * n});
        grid.row.broadcast(at, l);
        grid.column.broadcast(bt, l);
        using kernels::host::Trans;
        kernels::host::gemm(Trans::no, Trans::no, m, n, k, 1.0f, at.data<float>(), k, bt.data<float>(), n, 1.0f,
                            c.data<float>(), n);
    }
}

// c (m x n) = sum over l of a(i,l) (m x k) b(j,l)^T (b blocks n x k).
template <comm::Communicator C>
void summa_abt(Grid2D<C>& grid, const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t m, std::int64_t k,
               std::int64_t n) {
    detail::check_block(a, m, k, "A");
    detail::check_block(b, n, k, "B");
    detail::check_block(c, m, n, "C");
    Buffer<Host> b_j(DType::f32, Shape{n * k}), partial(DType::f32, Shape{grid.q * m * n});
    for (int target = 0; target < grid.q; ++target) {
        const Tensor bt = grid.i == target ? b : Tensor::of(b_j.data<float>(), {n * k});
        grid.column.broadcast(bt, target);
        using kernels::host::Trans;
        kernels::host::gemm(Trans::no, Trans::yes, m, n, k, 1.0f, a.data<float>(), k, bt.data<float>(), k, 0.0f,
                            partial.data<float>() + target * m * n, n);
    }
    grid.row.reduce_scatter(Tensor::of(partial.data<float>(), {grid.q * m * n}), c, comm::ReduceOp::sum);
}

// c (m x n) = sum over l of a(l,i)^T b(l,j) (a blocks k x m, b blocks k x n).
template <comm::Communicator C>
void summa_atb(Grid2D<C>& grid, const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t m, std::int64_t k,
               std::int64_t n) {
    detail::check_block(a, k, m, "A");
    detail::check_block(b, k, n, "B");
    detail::check_block(c, m, n, "C");
    Buffer<Host> a_i(DType::f32, Shape{k * m}), partial(DType::f32, Shape{grid.q * m * n});
    for (int target = 0; target < grid.q; ++target) {
        const Tensor at = grid.j == target ? a : Tensor::of(a_i.data<float>(), {k * m});
        grid.row.broadcast(at, target);
        using kernels::host::Trans;
        kernels::host::gemm(Trans::yes, Trans::no, m, n, k, 1.0f, at.data<float>(), m, b.data<float>(), n, 0.0f,
                            partial.data<float>() + target * m * n, n);
    }
    grid.column.reduce_scatter(Tensor::of(partial.data<float>(), {grid.q * m * n}), c, comm::ReduceOp::sum);
}

}  // namespace loom::tp
