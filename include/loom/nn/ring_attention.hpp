// Ring attention (Liu et al., arXiv 2310.01889) over the sp axis: each rank
// holds some positions of every sequence (nn/sequence_layout.hpp) and keeps
// its queries; the keys and values travel around the ring. At each of the N
// steps a rank attends with its queries to the K/V block it holds, while the
// next block is already on its way, and folds the partial result into its
// running output with the log-sum-exp merge (kernels/host/attention_blocks.hpp),
// in f32. The blocks' products follow the Context's MatmulPrecision: at bf16
// they read bf16 operands (kernels/host/attention_blocks_bf16.hpp), as the
// serial run's whole-sequence attention does. The backward sends the blocks
// around again, each with the gradient of its keys and values, which every
// rank adds to before passing it on; after N steps a block's gradient arrives
// back at its owner, complete.
//
// Everything runs where the layer's tensors live: blocks are copied by rows
// (copy_rows), attended by the block kernels of kernels/attention_block_ops.hpp,
// and passed on as device memory when the ring's communicator moves it.
//
// Work happens chunk by chunk: a rank's tokens are runs of consecutive
// positions (chunks), and a (query chunk, key chunk) pair is either whole
// (keys before the queries, or no mask), the causal diagonal (the same
// chunk), or skipped (keys after the queries). In the zigzag layout every rank
// does the same number of each kind.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <utility>

#include "loom/comm/communicator.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/attention_block_ops.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/sequence_layout.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

// What the forward keeps for the backward besides the layer's own q, k, v
// and output: each query row's log-sum-exp over all keys, [B, runs, H, c].
// Everything else ring attention needs (the K/V blocks in flight and their
// gradients, one pair's partial result) is scratch of the call, not held
// until the micro-batch ends, so a rank's activations are its tokens' share.
struct RingSaved {
    Tensor lse;
    // The forward's matrix-product precision (its Context's), which the
    // backward repeats.
    kernels::MatmulPrecision precision = kernels::MatmulPrecision::f32;
};

namespace ring_detail {

// How query chunk `qc` sees key chunk `kc`; nullopt-like `skip` when it sees none.
enum class Pair : std::uint8_t { full, diagonal, skip };

[[nodiscard]] inline Pair pair_of(int qc, int kc, bool causal) {
    if (!causal || kc < qc) return Pair::full;
    return kc == qc ? Pair::diagonal : Pair::skip;
}

// `rows` rows of `cols` floats from `from` (rows `from_stride` apart) to
// `to` (rows `to_stride` apart), both on `where`.
inline void copy_float_rows(float* to, std::int64_t to_stride, const float* from, std::int64_t from_stride,
                            std::int64_t cols, std::int64_t rows, Device where) {
    constexpr auto f = sizeof(float);
    copy_rows(to, static_cast<std::size_t>(to_stride) * f, where, from, static_cast<std::size_t>(from_stride) * f,
              where, static_cast<std::size_t>(cols) * f, static_cast<std::size_t>(rows));
}

// Columns [offset, offset + cols) of every sequence's rows of `run` in
// `from` ([B, T, width]) to the run's packed block of `to` ([B, c, cols]),
// or back (unpack).
inline void pack_run(const float* from, std::int64_t B, std::int64_t T, std::int64_t width, std::int64_t offset,
                     std::int64_t cols, const SequenceRun& run, float* to, Device where) {
    for (std::int64_t b = 0; b < B; ++b)
        copy_float_rows(to + b * run.length * cols, cols, from + (b * T + run.local) * width + offset, width, cols,
                        run.length, where);
}
inline void unpack_run(const float* from, std::int64_t B, std::int64_t T, std::int64_t width, std::int64_t offset,
                       std::int64_t cols, const SequenceRun& run, float* to, Device where) {
    for (std::int64_t b = 0; b < B; ++b)
        copy_float_rows(to + (b * T + run.local) * width + offset, width, from + b * run.length * cols, cols, cols,
                        run.length, where);
}

// Scratch of one call on `where`: freed when it returns.
[[nodiscard]] inline DeviceBuffer scratch(std::int64_t floats, Device where) {
    return DeviceBuffer(DType::f32, Shape{floats}, where);
}
[[nodiscard]] inline Tensor whole(const DeviceBuffer& b) { return b.tensor(); }

// Sends `mine` to the next rank and receives the previous rank's into
// `theirs`; the caller waits on both, in order: the receive first, since a
// transport may complete a send only when its receiver takes it (rank
// threads copy on the receiving side), and every rank waits on its own.
[[nodiscard]] inline std::array<comm::Request, 2> pass_on(const TensorGroup& group, const Tensor& mine,
                                                          const Tensor& theirs, int tag) {
    const int n = group.size(), r = group.rank();
    comm::Request receive = group.recv_async(theirs, (r + n - 1) % n, tag);
    return {std::move(receive), group.send_async(mine, (r + 1) % n, tag)};
}

// Fixed tags are enough: every call completes its exchanges before it
// returns, and all ranks of a ring call in the same order (the same layers,
// the same schedule), so messages of one (peer, tag) match in order.
inline constexpr int kv_tag = 0x5a01, dkv_tag = 0x5a02;

// The ring and the layout must describe the same ranks.
inline void check_ring(const TensorGroup& group, const SequenceLayout& layout) {
    LOOM_CHECK(group.size() == layout.ranks && group.rank() == layout.rank, "ring attention: a group of ",
               group.size(), " ranks (this one ", group.rank(), ") for a layout of ", layout.ranks, " (this one ",
               layout.rank, "); pass the ring the layout describes");
}

// f(x, y, mask) for every pair of this rank's query run x and the held key
// run y (of chunks `theirs`) that sees anything.
template <class F>
void for_each_pair(const std::array<SequenceRun, 2>& mine, const std::array<int, 2>& theirs, int runs, bool causal,
                   F f) {
    for (int x = 0; x < runs; ++x)
        for (int y = 0; y < runs; ++y) {
            const Pair pair = pair_of(mine[x].chunk, theirs[y], causal);
            if (pair == Pair::skip) continue;
            f(x, y, pair == Pair::diagonal ? kernels::BlockMask::causal : kernels::BlockMask::full);
        }
}

}  // namespace ring_detail

// The geometry of one call: B sequences of T local tokens, H heads of D.
struct RingShape {
    std::int64_t B = 0, T = 0, H = 0, D = 0;
    [[nodiscard]] std::int64_t C() const { return H * D; }
};

// out ([B, T, C]) = attention of this rank's queries in qkv ([B, T, 3C]) to
// every rank's keys and values. Fills `saved` for ring_attention_backward.
// Kernels run sequence by sequence, so q and out are read and written where
// they are (rows of a run are consecutive), not copied.
inline void ring_attention_forward(Context& ctx, const TensorGroup& group, const SequenceLayout& layout, bool causal,
                                   const Tensor& qkv, const RingShape& s, const Tensor& out, RingSaved& saved) {
    using namespace ring_detail;
    const std::int64_t C = s.C(), T_whole = s.T * layout.ranks, c = layout.chunk_length(T_whole);
    const int runs = layout.runs_per_rank(), n = layout.ranks;
    check_ring(group, layout);
    LOOM_CHECK(s.T == c * runs, "ring attention: ", s.T, " local tokens per sequence; the layout holds ", c * runs);
    const std::int64_t block_kv = s.B * c * 2 * C, lse_per_run = s.H * c;
    const auto my_runs = layout.runs(T_whole);
    const Device where = qkv.device();
    saved.lse = ctx.alloc(Shape{s.B * runs * lse_per_run});
    saved.precision = ctx.matmul_precision();
    fill_floats(saved.lse, -std::numeric_limits<float>::infinity());
    fill_zero_bytes(out.raw(), where, out.nbytes());
    DeviceBuffer held = scratch(runs * block_kv, where), next = scratch(runs * block_kv, where);
    const DeviceBuffer part_out = scratch(c * C, where), part_lse = scratch(lse_per_run, where);
    for (int u = 0; u < runs; ++u)
        pack_run(qkv.data<float>(), s.B, s.T, 3 * C, C, 2 * C, my_runs[u], held.data<float>() + u * block_kv, where);
    for (int step = 0; step < n; ++step) {
        const int src = (layout.rank - step + n) % n;
        std::array<comm::Request, 2> in_flight{};
        if (step + 1 < n) in_flight = pass_on(group, whole(held), whole(next), kv_tag);
        for_each_pair(my_runs, layout.chunks_of(src), runs, causal, [&](int x, int y, kernels::BlockMask mask) {
            for (std::int64_t b = 0; b < s.B; ++b) {
                const float* q = qkv.data<float>() + (b * s.T + my_runs[x].local) * 3 * C;
                const float* kv = held.data<float>() + y * block_kv + b * c * 2 * C;
                kernels::attention_block_forward(where, q, 3 * C, kv, kv + C, 2 * C, part_out.data<float>(),
                                                 part_lse.data<float>(), 1, c, c, s.H, s.D, mask, saved.precision);
                kernels::attention_merge(where, out.data<float>() + (b * s.T + my_runs[x].local) * C,
                                         saved.lse.data<float>() + (b * runs + x) * lse_per_run,
                                         part_out.data<float>(), part_lse.data<float>(), 1, c, s.H, s.D);
            }
        });
        for (auto& r : in_flight) r.wait();
        std::swap(held, next);
    }
}

// dqkv ([B, T, 3C], written) from dout ([B, T, C]), the forward's q, k, v
// (qkv) and output (out), and what it saved.
inline void ring_attention_backward(const TensorGroup& group, const SequenceLayout& layout, bool causal,
                                    const Tensor& qkv, const Tensor& out, const RingSaved& saved, const Tensor& dout,
                                    const RingShape& s, const Tensor& dqkv) {
    using namespace ring_detail;
    const std::int64_t C = s.C(), T_whole = s.T * layout.ranks, c = layout.chunk_length(T_whole);
    const int runs = layout.runs_per_rank(), n = layout.ranks;
    check_ring(group, layout);
    LOOM_CHECK(s.T == c * runs && dout.numel() == s.B * s.T * C && dqkv.numel() == s.B * s.T * 3 * C,
               "ring attention backward: dout ", dout.shape(), " and dqkv ", dqkv.shape(), " for ", s.B,
               " sequences of ", s.T, " local tokens and width ", C);
    const std::int64_t block_kv = s.B * c * 2 * C, lse_per_run = s.H * c;
    const auto my_runs = layout.runs(T_whole);
    const Device where = qkv.device();
    fill_zero_bytes(dqkv.raw(), where, dqkv.nbytes());  // dq accumulates in place
    DeviceBuffer held = scratch(runs * block_kv, where), next = scratch(runs * block_kv, where);
    DeviceBuffer dheld = scratch(runs * block_kv, where), dnext = scratch(runs * block_kv, where);
    for (int u = 0; u < runs; ++u)
        pack_run(qkv.data<float>(), s.B, s.T, 3 * C, C, 2 * C, my_runs[u], held.data<float>() + u * block_kv, where);
    fill_zero_bytes(dheld.raw(), where, dheld.nbytes());
    for (int step = 0; step < n; ++step) {
        const int src = (layout.rank - step + n) % n;
        std::array<comm::Request, 2> kv_in_flight{};
        if (step + 1 < n) kv_in_flight = pass_on(group, whole(held), whole(next), kv_tag);
        for_each_pair(my_runs, layout.chunks_of(src), runs, causal, [&](int x, int y, kernels::BlockMask mask) {
            for (std::int64_t b = 0; b < s.B; ++b) {
                const std::int64_t row = b * s.T + my_runs[x].local;
                const float* kv = held.data<float>() + y * block_kv + b * c * 2 * C;
                float* dkv = dheld.data<float>() + y * block_kv + b * c * 2 * C;
                kernels::attention_block_backward(
                    where, qkv.data<float>() + row * 3 * C, 3 * C, kv, kv + C, 2 * C, out.data<float>() + row * C,
                    dout.data<float>() + row * C, saved.lse.data<float>() + (b * runs + x) * lse_per_run,
                    dqkv.data<float>() + row * 3 * C, dkv, dkv + C, 1, c, c, s.H, s.D, mask, saved.precision);
            }
        });
        // The gradient of the block just used goes on with it; after the last
        // step the one that arrives is this rank's own, complete.
        auto dkv_in_flight = pass_on(group, whole(dheld), whole(dnext), dkv_tag);
        for (auto& r : kv_in_flight) r.wait();
        for (auto& r : dkv_in_flight) r.wait();
        std::swap(held, next);
        std::swap(dheld, dnext);
    }
    for (int u = 0; u < runs; ++u)
        unpack_run(dheld.data<float>() + u * block_kv, s.B, s.T, 3 * C, C, 2 * C, my_runs[u], dqkv.data<float>(),
                   where);
}

}  // namespace loom::nn
