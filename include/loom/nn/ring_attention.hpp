// Ring attention (Liu et al., arXiv 2310.01889) over the sp axis: each rank
// holds some positions of every sequence (nn/sequence_layout.hpp) and keeps
// its queries; the keys and values travel around the ring. At each of the N
// steps a rank attends with its queries to the K/V block it holds, while the
// next block is already on its way, and folds the partial result into its
// running output with the log-sum-exp merge (kernels/host/attention_blocks.hpp),
// in f32. The backward sends the blocks around again, each with the gradient
// of its keys and values, which every rank adds to before passing it on; after
// N steps a block's gradient arrives back at its owner, complete.
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
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/sequence_layout.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

// What the forward keeps for the backward, packed run by run: for run u,
// [B, c, C] blocks of queries, outputs and [B, H, c] log-sum-exps, and the
// rank's own keys and values [B, c, 2C] (k in the first C columns).
struct RingSaved {
    Tensor q, kv, out, lse;
};

namespace ring_detail {

// How query chunk `qc` sees key chunk `kc`; nullopt-like `skip` when it sees none.
enum class Pair : std::uint8_t { full, diagonal, skip };

[[nodiscard]] inline Pair pair_of(int qc, int kc, bool causal) {
    if (!causal || kc < qc) return Pair::full;
    return kc == qc ? Pair::diagonal : Pair::skip;
}

// Rows [run.local, run.local + c) of every sequence of `from` ([B, T, width],
// `offset` columns in, `cols` wide) to the run's packed block of `to`
// ([B, c, cols]), or back (unpack).
inline void pack_run(const float* from, std::int64_t B, std::int64_t T, std::int64_t width, std::int64_t offset,
                     std::int64_t cols, const SequenceRun& run, float* to) {
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < run.length; ++t)
            std::copy_n(from + (b * T + run.local + t) * width + offset, cols, to + (b * run.length + t) * cols);
}
inline void unpack_run(const float* from, std::int64_t B, std::int64_t T, std::int64_t width, std::int64_t offset,
                       std::int64_t cols, const SequenceRun& run, float* to) {
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < run.length; ++t)
            std::copy_n(from + (b * run.length + t) * cols, cols, to + (b * T + run.local + t) * width + offset);
}

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

inline constexpr int kv_tag = 0x5a01, dkv_tag = 0x5a02;

// f(x, y, mask) for every pair of this rank's query run x and the held key
// run y (of chunks `theirs`) that sees anything.
template <class F>
void for_each_pair(const std::array<SequenceRun, 2>& mine, const std::array<int, 2>& theirs, int runs, bool causal,
                   F f) {
    for (int x = 0; x < runs; ++x)
        for (int y = 0; y < runs; ++y) {
            const Pair pair = pair_of(mine[x].chunk, theirs[y], causal);
            if (pair == Pair::skip) continue;
            f(x, y, pair == Pair::diagonal ? kernels::host::BlockMask::causal : kernels::host::BlockMask::full);
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
inline void ring_attention_forward(Context& ctx, const TensorGroup& group, const SequenceLayout& layout, bool causal,
                                   const Tensor& qkv, const RingShape& s, const Tensor& out, RingSaved& saved) {
    using namespace ring_detail;
    const std::int64_t C = s.C(), T_whole = s.T * layout.ranks, c = layout.chunk_length(T_whole);
    const int runs = layout.runs_per_rank(), n = layout.ranks;
    LOOM_CHECK(s.T == c * runs, "ring attention: ", s.T, " local tokens per sequence; the layout holds ", c * runs);
    const std::int64_t block_q = s.B * c * C, block_kv = s.B * c * 2 * C, block_lse = s.B * s.H * c;
    saved.q = ctx.alloc(Shape{runs * block_q});
    saved.kv = ctx.alloc(Shape{runs * block_kv});
    saved.out = ctx.alloc(Shape{runs * block_q});
    saved.lse = ctx.alloc(Shape{runs * block_lse});
    const auto my_runs = layout.runs(T_whole);
    for (int u = 0; u < runs; ++u) {
        pack_run(qkv.data<float>(), s.B, s.T, 3 * C, 0, C, my_runs[u], saved.q.data<float>() + u * block_q);
        pack_run(qkv.data<float>(), s.B, s.T, 3 * C, C, 2 * C, my_runs[u], saved.kv.data<float>() + u * block_kv);
    }
    std::fill_n(saved.lse.data<float>(), runs * block_lse, -std::numeric_limits<float>::infinity());
    std::fill_n(saved.out.data<float>(), runs * block_q, 0.0f);
    Tensor held = ctx.alloc(Shape{runs * block_kv}), next = ctx.alloc(Shape{runs * block_kv});
    std::copy_n(saved.kv.data<float>(), runs * block_kv, held.data<float>());
    Tensor part_out = ctx.alloc(Shape{block_q}), part_lse = ctx.alloc(Shape{block_lse});
    for (int step = 0; step < n; ++step) {
        const int src = (layout.rank - step + n) % n;
        std::array<comm::Request, 2> in_flight{};
        if (step + 1 < n) in_flight = pass_on(group, held, next, kv_tag);
        for_each_pair(my_runs, layout.chunks_of(src), runs, causal, [&](int x, int y, kernels::host::BlockMask mask) {
            const float* kv = held.data<float>() + y * block_kv;
            kernels::host::attention_block_forward(saved.q.data<float>() + x * block_q, C, kv, kv + C, 2 * C,
                                                   part_out.data<float>(), part_lse.data<float>(), s.B, c, c, s.H, s.D,
                                                   mask);
            kernels::host::attention_merge(saved.out.data<float>() + x * block_q,
                                           saved.lse.data<float>() + x * block_lse, part_out.data<float>(),
                                           part_lse.data<float>(), s.B, c, s.H, s.D);
        });
        for (auto& r : in_flight) r.wait();
        std::swap(held, next);
    }
    for (int u = 0; u < runs; ++u)
        unpack_run(saved.out.data<float>() + u * block_q, s.B, s.T, C, 0, C, my_runs[u], out.data<float>());
}

// dqkv ([B, T, 3C], written) from dout ([B, T, C]) and what the forward saved.
inline void ring_attention_backward(Context& ctx, const TensorGroup& group, const SequenceLayout& layout,
                                    bool causal, const RingSaved& saved, const Tensor& dout, const RingShape& s,
                                    const Tensor& dqkv) {
    using namespace ring_detail;
    const std::int64_t C = s.C(), T_whole = s.T * layout.ranks, c = layout.chunk_length(T_whole);
    const int runs = layout.runs_per_rank(), n = layout.ranks;
    const std::int64_t block_q = s.B * c * C, block_kv = s.B * c * 2 * C, block_lse = s.B * s.H * c;
    const auto my_runs = layout.runs(T_whole);
    Tensor dout_runs = ctx.alloc(Shape{runs * block_q}), dq = ctx.alloc(Shape{runs * block_q});
    for (int u = 0; u < runs; ++u)
        pack_run(dout.data<float>(), s.B, s.T, C, 0, C, my_runs[u], dout_runs.data<float>() + u * block_q);
    std::fill_n(dq.data<float>(), runs * block_q, 0.0f);
    Tensor held = ctx.alloc(Shape{runs * block_kv}), next = ctx.alloc(Shape{runs * block_kv});
    Tensor dheld = ctx.alloc(Shape{runs * block_kv}), dnext = ctx.alloc(Shape{runs * block_kv});
    std::copy_n(saved.kv.data<float>(), runs * block_kv, held.data<float>());
    std::fill_n(dheld.data<float>(), runs * block_kv, 0.0f);
    for (int step = 0; step < n; ++step) {
        const int src = (layout.rank - step + n) % n;
        std::array<comm::Request, 2> kv_in_flight{};
        if (step + 1 < n) kv_in_flight = pass_on(group, held, next, kv_tag);
        for_each_pair(my_runs, layout.chunks_of(src), runs, causal, [&](int x, int y, kernels::host::BlockMask mask) {
            const float* kv = held.data<float>() + y * block_kv;
            float* dkv = dheld.data<float>() + y * block_kv;
            kernels::host::attention_block_backward(
                saved.q.data<float>() + x * block_q, C, kv, kv + C, 2 * C, saved.out.data<float>() + x * block_q,
                dout_runs.data<float>() + x * block_q, saved.lse.data<float>() + x * block_lse,
                dq.data<float>() + x * block_q, dkv, dkv + C, s.B, c, c, s.H, s.D, mask);
        });
        // The gradient of the block just used goes on with it; after the last
        // step the one that arrives is this rank's own, complete.
        auto dkv_in_flight = pass_on(group, dheld, dnext, dkv_tag);
        for (auto& r : kv_in_flight) r.wait();
        for (auto& r : dkv_in_flight) r.wait();
        std::swap(held, next);
        std::swap(dheld, dnext);
    }
    for (int u = 0; u < runs; ++u) {
        unpack_run(dq.data<float>() + u * block_q, s.B, s.T, 3 * C, 0, C, my_runs[u], dqkv.data<float>());
        unpack_run(dheld.data<float>() + u * block_kv, s.B, s.T, 3 * C, C, 2 * C, my_runs[u], dqkv.data<float>());
    }
}

}  // namespace loom::nn
