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
// The broadcasts are double-buffered: step l + 1's blocks are in flight while
// step l's GEMM runs. Blocks are row-major f32; A(i,j) is [m, k] for A of
// [q m, q k], and so on. Layers reach the grid through their Context; the
// executor builds it from its tp communicator (parallel/grid2d.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "loom/comm/communicator.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

// Rank (i, j) of a q x q grid and the two groups it talks to.
struct TensorGrid {
    int q = 1, i = 0, j = 0;
    const TensorGroup* row = nullptr;     // ranks (i, 0..q-1), group rank = column
    const TensorGroup* column = nullptr;  // ranks (0..q-1, j), group rank = row
};

// The grid of `ctx`, for a layer (`layer` names it) cut in 2D.
[[nodiscard]] inline const TensorGrid& grid_of(const Context& ctx, const char* layer) {
    const TensorGrid* g = ctx.tensor_grid();
    LOOM_CHECK(g != nullptr, layer, ": cut for an Optimus 2D grid but the context has no grid; run it through an "
                                    "executor whose strategy has Optimus2D");
    return *g;
}

namespace detail {

inline void check_block(const Tensor& t, std::int64_t rows, std::int64_t cols, const char* what) {
    LOOM_CHECK(t.dtype() == DType::f32 && t.numel() == rows * cols, "SUMMA: block ", what, " is ", t, "; expected ",
               rows, " x ", cols, " f32");
}

// Two slots of `elements` floats each: the block in use and the next one.
class DoubleBuffer {
public:
    explicit DoubleBuffer(std::int64_t elements) : elements_(elements), storage_(DType::f32, Shape{2 * elements}) {}
    [[nodiscard]] Tensor slot(int l) const {
        return Tensor::of(const_cast<float*>(storage_.data<float>()) + (l % 2) * elements_, {elements_});
    }

private:
    std::int64_t elements_;
    Buffer<Host> storage_;
};

// Runs consume(l) for l = 0 .. q-1, each after the broadcasts post(l) issued
// (an array of Requests) are done, with post(l + 1)'s in flight meanwhile.
template <class Post, class Consume>
void pipelined_broadcasts(int q, Post post, Consume consume) {
    auto in_flight = post(0);
    for (int l = 0; l < q; ++l) {
        for (auto& r : in_flight) r.wait();
        if (l + 1 < q) in_flight = post(l + 1);
        consume(l);
    }
}

}  // namespace detail

// c (m x n) = sum over l of a(i,l) (m x k) b(l,j) (k x n); c is overwritten.
inline void summa_ab(const TensorGrid& grid, const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t m,
                     std::int64_t k, std::int64_t n) {
    detail::check_block(a, m, k, "A");
    detail::check_block(b, k, n, "B");
    detail::check_block(c, m, n, "C");
    const detail::DoubleBuffer a_in(m * k), b_in(k * n);
    const auto a_at = [&](int l) { return grid.j == l ? a : a_in.slot(l); };
    const auto b_at = [&](int l) { return grid.i == l ? b : b_in.slot(l); };
    const auto post = [&](int l) {
        return std::array<comm::Request, 2>{grid.row->broadcast_async(a_at(l), l),
                                            grid.column->broadcast_async(b_at(l), l)};
    };
    std::fill_n(c.data<float>(), m * n, 0.0f);
    detail::pipelined_broadcasts(grid.q, post, [&](int l) {
        using kernels::host::Trans;
        kernels::host::gemm(Trans::no, Trans::no, m, n, k, 1.0f, a_at(l).data<float>(), k, b_at(l).data<float>(), n,
                            1.0f, c.data<float>(), n);
    });
}

namespace detail {

// The transposed products' common shape: for each target coordinate t, the
// owner of t along `along` broadcasts its block (`own`, of `elements`), and
// `multiply(block, partial_t)` writes this rank's contribution to output
// block t (m x n); `reduce` then sums every rank's partials, and rank t of
// it keeps block t in c. The next broadcast is in flight during each GEMM.
template <class Multiply>
void broadcast_multiply_reduce(const TensorGrid& grid, const TensorGroup& along, int mine, const Tensor& own,
                               std::int64_t elements, const TensorGroup& reduce, std::int64_t m, std::int64_t n,
                               const Tensor& c, Multiply multiply) {
    const DoubleBuffer incoming(elements);
    Buffer<Host> partial(DType::f32, Shape{grid.q * m * n});
    const auto block_of = [&](int target) { return mine == target ? own : incoming.slot(target); };
    pipelined_broadcasts(
        grid.q,
        [&](int target) { return std::array<comm::Request, 1>{along.broadcast_async(block_of(target), target)}; },
        [&](int target) {
            const Tensor block = block_of(target);
            multiply(block.data<float>(), partial.data<float>() + target * m * n);
        });
    reduce.reduce_scatter_sum(Tensor::of(partial.data<float>(), {grid.q * m * n}), c);
}

}  // namespace detail

// c (m x n) = sum over l of a(i,l) (m x k) b(j,l)^T (b blocks n x k).
inline void summa_abt(const TensorGrid& grid, const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t m,
                      std::int64_t k, std::int64_t n) {
    detail::check_block(a, m, k, "A");
    detail::check_block(b, n, k, "B");
    detail::check_block(c, m, n, "C");
    detail::broadcast_multiply_reduce(grid, *grid.column, grid.i, b, n * k, *grid.row, m, n, c,
                                      [&](const float* b_block, float* out) {
                                          using kernels::host::Trans;
                                          kernels::host::gemm(Trans::no, Trans::yes, m, n, k, 1.0f, a.data<float>(),
                                                              k, b_block, k, 0.0f, out, n);
                                      });
}

// c (m x n) = sum over l of a(l,i)^T b(l,j) (a blocks k x m, b blocks k x n).
inline void summa_atb(const TensorGrid& grid, const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t m,
                      std::int64_t k, std::int64_t n) {
    detail::check_block(a, k, m, "A");
    detail::check_block(b, k, n, "B");
    detail::check_block(c, m, n, "C");
    detail::broadcast_multiply_reduce(grid, *grid.row, grid.j, a, k * m, *grid.column, m, n, c,
                                      [&](const float* a_block, float* out) {
                                          using kernels::host::Trans;
                                          kernels::host::gemm(Trans::yes, Trans::no, m, n, k, 1.0f, a_block, m,
                                                              b.data<float>(), n, 0.0f, out, n);
                                      });
}

}  // namespace loom::nn
