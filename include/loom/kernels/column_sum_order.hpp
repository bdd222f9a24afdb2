// The order in which a column sum over the rows of a matrix adds its terms
// (the bias gradient: dbias[j] += sum over r of dy[r, j]), shared by the host
// and the CUDA kernels so that both give the same bits.
//
// Why not row after row: that order is one chain of `rows` dependent adds per
// column, so a GPU can run only one thread per column. A GPT-2 bias of 768
// columns over 8192 rows then kept about 800 threads busy on a 132-SM H200 and
// took 0.9 ms a call, a third of a whole training step (measured, see
// docs/performance.md). Instead the rows fall into column_sum_chunks chunks of
// consecutive rows, each chunk's rows are added in order starting from its
// first row, and the chunk sums are added to dbias[j] in chunk order:
//
//   dbias[j] = (((dbias[j] + S_0) + S_1) + ...) + S_(chunks-1),
//   S_c = ((dy[r0, j] + dy[r0 + 1, j]) + ...) over the rows of chunk c.
//
// The chunks depend on `rows` alone, never on a grid or thread count, so the
// result is the same on any GPU and on the host. On the host the cost is the
// same as row after row (one add per element, plus one per chunk).
#pragma once

#include <cstdint>

namespace loom::kernels {

// 32: one warp of chunk sums per column, enough chunks to fill a GPU for the
// widths of a transformer, few enough that adding them in order is cheap.
inline constexpr std::int64_t column_sum_chunks = 32;

// Rows per chunk: ceil(rows / column_sum_chunks), at least 1. The last
// chunks may be short or empty.
[[nodiscard]] constexpr std::int64_t column_sum_chunk_rows(std::int64_t rows) noexcept {
    return rows <= 0 ? 1 : (rows + column_sum_chunks - 1) / column_sum_chunks;
}

}  // namespace loom::kernels
