// The pipeline schedule generators: pure functions of (stages p, micro-batches
// m, chunks) returning one step program per rank (pipeline_program.hpp).
// Each writes every rank's compute order; pipeline_actions.hpp adds the
// sends, recvs and waits. Micro-batches run in increasing order within every
// virtual stage, and every rank's order respects F(v,k) <- F(v-1,k) and
// B(v,k) <- B(v+1,k), so with asynchronous sends no set of programs here can
// deadlock (argued per schedule below, checked by running all ranks in the
// tests). activation_bound counts micro-batch-chunk activations alive on a
// rank, from a forward to its combined backward (or its W when split).
//
//   GPipe          all F, then all B                         bound m
//   1F1B           min(p-r-1, m) F, then F B pairs, drain    bound min(p, m)   (rank r: min(p-r, m))
//   Interleaved<v> Megatron's interleaved 1F1B, m % p == 0   bound min(vp + p - 1, vm); vm when m == p
//   ZB-H1          1F1B with B/W split, W deferred           bound min(p, m)   (zero_bubble.hpp)
//   ZB-V           V-shaped 2 chunks, B/W split              bound 2 min(p, m) (zero_bubble.hpp)
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/pipeline.hpp"
#include "loom/schedule/pipeline_actions.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/zero_bubble.hpp"

namespace loom::schedule {

// Every rank runs all its forwards, then all its backwards, both in
// micro-batch order: rank r's F(k) needs only earlier ranks' F(k), its B(k)
// only later ranks' B(k), which they run without waiting on rank r.
[[nodiscard]] constexpr detail::ComputeOrder gpipe_order(int p, int m) {
    detail::ComputeOrder order;
    for (int r = 0; r < p; ++r) {
        std::vector<detail::PipeAction> a;
        for (int k = 0; k < m; ++k) a.push_back({Op::forward, r, k});
        for (int k = 0; k < m; ++k) a.push_back({Op::backward, r, k});
        order.push_back(std::move(a));
    }
    return order;
}

[[nodiscard]] inline PipelineProgram gpipe(int stages, int micro_batches) {
    const int p = stages, m = micro_batches;
    detail::check_shape("GPipe", p, m);
    return detail::lower({.schedule = "GPipe", .stages = p, .micro_batches = m, .chunks = 1, .activation_bound = m,
                          .rank_of_chunk = detail::looped_ranks(p, 1), .actions = gpipe_order(p, m)});
}

// Megatron's forward_backward_pipelining_without_interleaving: rank r runs
// w = min(p-r-1, m) warm-up forwards, then F(w+i) B(i) pairs, then the last w
// backwards. Its B(i) follows F(w+i) with w+i >= i, and rank r+1 reaches
// B(i) after F(i + w - 1) of its own, which needs only rank r's F(<= w+i):
// every wait is on work the peer does first. Live: w+1 at the pair's peak.
[[nodiscard]] constexpr detail::ComputeOrder one_f_one_b_order(int p, int m) {
    detail::ComputeOrder order;
    for (int r = 0; r < p; ++r) {
        std::vector<detail::PipeAction> a;
        const int warmup = std::min(p - r - 1, m);
        for (int k = 0; k < warmup; ++k) a.push_back({Op::forward, r, k});
        for (int i = 0; i < m - warmup; ++i) {
            a.push_back({Op::forward, r, warmup + i});
            a.push_back({Op::backward, r, i});
        }
        for (int k = m - warmup; k < m; ++k) a.push_back({Op::backward, r, k});
        order.push_back(std::move(a));
    }
    return order;
}

[[nodiscard]] inline PipelineProgram one_f_one_b(int stages, int micro_batches) {
    const int p = stages, m = micro_batches;
    detail::check_shape("1F1B", p, m);
    return detail::lower({.schedule = "1F1B", .stages = p, .micro_batches = m, .chunks = 1,
                          .activation_bound = std::min(p, m), .rank_of_chunk = detail::looped_ranks(p, 1),
                          .actions = one_f_one_b_order(p, m)});
}

// Megatron's warm-up for interleaving: everything when m == p, else
// 2(p-r-1) + (v-1)p forwards (all ranks fill v-1 rounds of chunks, earlier
// ranks two more per rank behind them), at most all v*m.
[[nodiscard]] constexpr int interleaved_warmup(int stages, int micro_batches, int chunks, int rank) {
    const int total = micro_batches * chunks;
    if (micro_batches == stages) return total;
    return std::min(2 * (stages - rank - 1) + (chunks - 1) * stages, total);
}

// Megatron's forward_backward_pipelining_with_interleaving. The k-th compute
// of each kind on rank r visits (chunk, micro-batch) in groups of p
// micro-batches: chunk 0 for micro-batches g*p .. g*p+p-1, then chunk 1 for
// the same ones, ... (forwards), the chunks in reverse for backwards. Warm-up
// interleaved_warmup forwards, then F(k + warm-up) B(k) pairs, then the
// remaining backwards. Needs m % p == 0: a group of p micro-batches goes
// round all ranks exactly once per chunk, which is what makes the order of
// rank p-1's chunk c the order of rank 0's chunk c+1.
// Needs m % p == 0 (checked by interleaved()).
[[nodiscard]] constexpr detail::ComputeOrder interleaved_order(int p, int m, int v) {
    const int total = m * v;
    const auto forward_of = [&](int k, int r) {
        const int in_group = k % (p * v);
        return detail::PipeAction{Op::forward, (in_group / p) * p + r, (k / (p * v)) * p + k % p};
    };
    const auto backward_of = [&](int k, int r) {
        const int in_group = k % (p * v);
        return detail::PipeAction{Op::backward, (v - 1 - in_group / p) * p + r, (k / (p * v)) * p + k % p};
    };
    detail::ComputeOrder order;
    for (int r = 0; r < p; ++r) {
        std::vector<detail::PipeAction> a;
        const int warmup = interleaved_warmup(p, m, v, r);
        for (int k = 0; k < warmup; ++k) a.push_back(forward_of(k, r));
        for (int k = 0; k < total - warmup; ++k) {
            a.push_back(forward_of(k + warmup, r));
            a.push_back(backward_of(k, r));
        }
        for (int k = total - warmup; k < total; ++k) a.push_back(backward_of(k, r));
        order.push_back(std::move(a));
    }
    return order;
}

[[nodiscard]] inline PipelineProgram interleaved(int stages, int micro_batches, int chunks) {
    const int p = stages, m = micro_batches, v = chunks;
    const std::string name = "Interleaved<" + std::to_string(v) + ">";
    detail::check_shape(name, p, m);
    LOOM_CHECK(v >= 2, name, ": ", v, " chunk", v == 1 ? "" : "s",
               " per rank; interleaving needs at least 2 (one chunk per rank is 1F1B)");
    LOOM_CHECK(m % p == 0, name, ": ", m, " micro-batches over ", p,
               " stages; interleaving needs a multiple of the stages (", p, ", ", 2 * p, ", ...)");
    const int total = m * v;
    const int bound = m == p ? total : std::min(interleaved_warmup(p, m, v, 0) + 1, total);
    return detail::lower({.schedule = name, .stages = p, .micro_batches = m, .chunks = v, .activation_bound = bound,
                          .rank_of_chunk = detail::looped_ranks(p, v), .actions = interleaved_order(p, m, v)});
}

// The factory behind --schedule: `chunks` must be the schedule's own (1; 2
// for ZB-V; any >= 2 for interleaved), e.g. pipeline_program(T::kind, p, m, T::chunks).
[[nodiscard]] inline PipelineProgram pipeline_program(ScheduleKind kind, int stages, int micro_batches,
                                                      int chunks = 1) {
    const auto fixed = [&](int want) {
        LOOM_CHECK(chunks == want, name(kind), ": ", chunks, " chunks per rank; ", name(kind), " runs exactly ", want);
    };
    switch (kind) {
        case ScheduleKind::gpipe: fixed(1); return gpipe(stages, micro_batches);
        case ScheduleKind::one_f_one_b: fixed(1); return one_f_one_b(stages, micro_batches);
        case ScheduleKind::interleaved: return interleaved(stages, micro_batches, chunks);
        case ScheduleKind::zero_bubble_h1: fixed(1); return zero_bubble_h1(stages, micro_batches);
        case ScheduleKind::zero_bubble_v: fixed(2); return zero_bubble_v(stages, micro_batches);
    }
    LOOM_FAIL("pipeline_program: unknown schedule kind ", static_cast<int>(kind));
}

// Every rank's compute order of a schedule, unchecked (the generators check
// the shape); usable in constant expressions.
[[nodiscard]] constexpr detail::ComputeOrder compute_order(ScheduleKind kind, int stages, int micro_batches,
                                                           int chunks) {
    switch (kind) {
        case ScheduleKind::gpipe: return gpipe_order(stages, micro_batches);
        case ScheduleKind::one_f_one_b: return one_f_one_b_order(stages, micro_batches);
        case ScheduleKind::interleaved: return interleaved_order(stages, micro_batches, chunks);
        case ScheduleKind::zero_bubble_h1: return zero_bubble_h1_order(stages, micro_batches);
        case ScheduleKind::zero_bubble_v: return zero_bubble_v_order(stages, micro_batches);
    }
    return {};
}

[[nodiscard]] constexpr bool splits_backward(ScheduleKind kind) {
    return kind == ScheduleKind::zero_bubble_h1 || kind == ScheduleKind::zero_bubble_v;
}
[[nodiscard]] constexpr int default_chunks(ScheduleKind kind) {
    return kind == ScheduleKind::interleaved || kind == ScheduleKind::zero_bubble_v ? 2 : 1;
}

// A schedule of compile-time shape as a compile-time table: table[r][i] is
// rank r's i-th compute. Every rank runs each of its chunks' forward and
// backward (or B and W) once per micro-batch, so all rows have one length.
//   static_assert(compute_table<ScheduleKind::one_f_one_b, 4, 8>[3][1].op == Op::backward);
template <ScheduleKind Kind, int P, int M, int Chunks = default_chunks(Kind)>
inline constexpr auto compute_table = [] {
    static_assert(P >= 1 && M >= 1 && Chunks >= 1, "compute_table: stages, micro-batches and chunks must be >= 1");
    static_assert(Kind != ScheduleKind::interleaved || M % P == 0,
                  "compute_table: interleaving needs micro-batches in multiples of the stages");
    constexpr std::size_t per_rank = static_cast<std::size_t>(M * Chunks * (splits_backward(Kind) ? 3 : 2));
    std::array<std::array<detail::PipeAction, per_rank>, static_cast<std::size_t>(P)> table{};
    const detail::ComputeOrder order = compute_order(Kind, P, M, Chunks);
    for (std::size_t r = 0; r < table.size(); ++r)
        for (std::size_t i = 0; i < per_rank; ++i) table[r][i] = order[r][i];
    return table;
}();

}  // namespace loom::schedule
