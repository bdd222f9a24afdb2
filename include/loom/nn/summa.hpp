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
// [q m, q k], and so on. Blocks may live on the host or a device (all on one):
// the GEMMs go through kernels/ops.hpp and the buffers are DeviceBuffers
// there. Layers reach the grid through their Context; the
// executor builds it from its tp communicator (parallel/grid2d.hpp).
#pragma once

#include <array>
#include <cstdint>

#include "loom/comm/communicator.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"
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

// Two slots of `elements` floats each on `where`: the block in use and the next one.
class DoubleBuffer {
public:
    DoubleBuffer(std::int64_t elements, Device where)
        : elements_(elements), storage_(DType::f32, Shape{2 * elements}, where) {}
    [[nodiscard]] Tensor slot(int l) const { return storage_.tensor().slice(0, (l % 2) * elements_, (l % 2 + 1) * elements_); }

private:
    std::int64_t elements_;
    DeviceBuffer storage_;
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
                     std::int64_t k, std::int64_t n,
                     kernels::MatmulPrecision precision = kernels::MatmulPrecision::f32) {
    detail::check_block(a, m, k, "A");
    detail::check_block(b, k, n, "B");
    detail::check_block(c, m, n, "C");
    const detail::DoubleBuffer a_in(m * k, a.device()), b_in(k * n, a.device());
    const auto a_at = [&](int l) { return grid.j == l ? a : a_in.slot(l); };
    const auto b_at = [&](int l) { return grid.i == l ? b : b_in.slot(l); };
    const auto post = [&](int l) {
        return std::array<comm::Request, 2>{grid.row->broadcast_async(a_at(l), l),
                                            grid.column->broadcast_async(b_at(l), l)};
    };
    fill_zero_bytes(c.raw(), c.device(), c.nbytes());
    detail::pipelined_broadcasts(grid.q, post, [&](int l) {
        kernels::gemm(precision, kernels::Trans::no, kernels::Trans::no, m, n, k, 1.0f, a_at(l), k, b_at(l), n, 1.0f, c, n);
    });
}

namespace detail {

// The transposed products' common shape: for each target coordinate t, the
// owner of t along `along` broadcasts its block (`own`, of `elements`), and
// `multiply(block, partial_t)` (Tensors) writes this rank's contribution to output
// block t (m x n); `reduce` then sums every rank's partials, and rank t of
// it keeps block t in c. The next broadcast is in flight during each GEMM.
template <class Multiply>
void broadcast_multiply_reduce(const TensorGrid& grid, const TensorGroup& along, int mine, const Tensor& own,
                               std::int64_t elements, const TensorGroup& reduce, std::int64_t m, std::int64_t n,
                               const Tensor& c, Multiply multiply) {
    const DoubleBuffer incoming(elements, own.device());
    const DeviceBuffer partial(DType::f32, Shape{grid.q * m * n}, own.device());
    const auto block_of = [&](int target) { return mine == target ? own : incoming.slot(target); };
    pipelined_broadcasts(
        grid.q,
        [&](int target) { return std::array<comm::Request, 1>{along.broadcast_async(block_of(target), target)}; },
        [&](int target) {
            multiply(block_of(target), partial.tensor().slice(0, target * m * n, (target + 1) * m * n));
        });
    reduce.reduce_scatter_sum(partial.tensor(), c);
}

}  // namespace detail

// c (m x n) = sum over l of a(i,l) (m x k) b(j,l)^T (b blocks n x k).
inline void summa_abt(const TensorGrid& grid, const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t m,
                      std::int64_t k, std::int64_t n,
                      kernels::MatmulPrecision precision = kernels::MatmulPrecision::f32) {
    detail::check_block(a, m, k, "A");
    detail::check_block(b, n, k, "B");
    detail::check_block(c, m, n, "C");
    detail::broadcast_multiply_reduce(grid, *grid.column, grid.i, b, n * k, *grid.row, m, n, c,
                                      [&](const Tensor& b_block, const Tensor& out) {
                                          kernels::gemm(precision, kernels::Trans::no, kernels::Trans::yes, m, n, k, 1.0f, a, k,
                                                        b_block, k, 0.0f, out, n);
                                      });
}

// c (m x n) = sum over l of a(l,i)^T b(l,j) (a blocks k x m, b blocks k x n).
inline void summa_atb(const TensorGrid& grid, const Tensor& a, const Tensor& b, const Tensor& c, std::int64_t m,
                      std::int64_t k, std::int64_t n,
                      kernels::MatmulPrecision precision = kernels::MatmulPrecision::f32) {
    detail::check_block(a, k, m, "A");
    detail::check_block(b, k, n, "B");
    detail::check_block(c, m, n, "C");
    detail::broadcast_multiply_reduce(grid, *grid.row, grid.j, a, k * m, *grid.column, m, n, c,
                                      [&](const Tensor& a_block, const Tensor& out) {
                                          kernels::gemm(precision, kernels::Trans::yes, kernels::Trans::no, m, n, k, 1.0f,
                                                        a_block, m, b, n, 0.0f, out, n);
                                      });
}

}  // namespace loom::nn
