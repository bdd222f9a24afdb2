// The q x q grid of Optimus 2D tensor parallelism: GridPosition, a tp
// rank's row and column, and Grid2D, a tp communicator split into row and
// column communicators with the type-erased nn::TensorGrid view that layers
// and the SUMMA products (nn/summa.hpp) use.
#pragma once

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/nn/summa.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::tp {

// Rank (i, j) of a q x q grid: tp rank r sits at row r / q, column r % q.
struct GridPosition {
    int i = 0, j = 0, q = 1;

    [[nodiscard]] static GridPosition of(int rank, int ranks) {
        int q = 1;
        while ((q + 1) * (q + 1) <= ranks) ++q;
        LOOM_CHECK(q * q == ranks, "Optimus 2D: a tp axis of ", ranks, " ranks is not a square grid; use ", q * q,
                   " or ", (q + 1) * (q + 1), " ranks (q x q)");
        LOOM_CHECK(rank >= 0 && rank < ranks, "Optimus 2D: rank ", rank, " is not in the tp axis's ranks [0, ", ranks,
                   ")");
        return {rank / q, rank % q, q};
    }
};

// Rank r of the tp axis sits at row r / q, column r % q; `row` holds the
// ranks of its row (ordered by column), `column` those of its column
// (ordered by row). Collective to construct; not movable (view() points
// into it).
template <comm::Communicator C>
struct Grid2D {
    int q = 1, i = 0, j = 0;
    C row, column;

    explicit Grid2D(C& tp)
        : q(side_of(tp.size())), i(tp.rank() / q), j(tp.rank() % q), row(tp.split(i, j)), column(tp.split(j, i)),
          row_group_(row), column_group_(column) {}
    Grid2D(const Grid2D&) = delete;
    Grid2D& operator=(const Grid2D&) = delete;

    // q for q^2 ranks; one line naming the size and the nearest squares otherwise.
    [[nodiscard]] static int side_of(int ranks) { return GridPosition::of(0, ranks).q; }

    [[nodiscard]] nn::TensorGrid view() const { return {q, i, j, &row_group_, &column_group_}; }

private:
    nn::TensorGroupOf<C> row_group_, column_group_;
};

}  // namespace loom::tp
