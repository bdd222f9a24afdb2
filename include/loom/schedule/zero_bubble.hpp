// The zero-bubble schedules (Qi et al., arXiv 2401.10241): backward split into
// backward_input (B, on the critical path: the previous stage waits for it)
// and backward_weight (W, needed only by the optimizer), so W can be moved
// into the places where 1F1B idles. An activation is alive from its F until
// its W (W still reads it).
//
// ZB-H1 (one stage per rank): 1F1B's warm-up of min(p-r-1, m) forwards; in
// the steady phase each F B pair is followed by a W, except that rank r holds
// back its first r Ws (the later the stage, the sooner its B must reach the
// rank before it, so it does not stop for W); in the drain each B is followed
// by the oldest pending W, and the held-back Ws finish the step, filling the
// time rank r would otherwise wait for the ranks before it. Holding back r
// Ws on a rank with p-r-1 warm-up forwards keeps every rank at exactly
// min(p, m) live activations: 1F1B's bound. With F = B = W = 1, free p2p
// and m >= p a step takes 3m + p - 1 (1F1B: 3m + 3(p-1)), the paper's
// (p-1)(F+B-W) bubble; with fewer micro-batches than stages the held-back Ws
// cannot fill the warm-up and it takes longer (p = 8, m = 4: 23, not 19).
//
// ZB-V (two chunks per rank in a V: rank s holds virtual stages s and
// 2p-1-s, so the turn at the bottom stays on rank p-1): the paper's
// handcrafted order, as PyTorch's ScheduleZBVZeroBubble writes it for rank r:
// 2(p-r)-1 forwards of the first chunk; r pairs (second chunk, first chunk);
// p-r triples F B W of the second chunk; then the steady F0 B0 W0 F1 B1 W1
// until every forward ran; then r pairs B0 B1 with the Ws held back, p-r
// pairs B0 W0, and the held-back Ws. Rank 0 starts with 2p-1 forwards of its
// first chunk, so with fewer micro-batches the order is written for 2p-1 and
// the missing micro-batches' work is dropped (as PyTorch does): every
// dependency joins work of one micro-batch, so what is left keeps the full
// schedule's deadlock-free order. Each rank peaks at 2 min(p, m) chunk
// activations, each half a 1F1B stage: 1F1B's memory.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/schedule/pipeline_actions.hpp"
#include "loom/schedule/pipeline_program.hpp"

namespace loom::schedule {

[[nodiscard]] constexpr detail::ComputeOrder zero_bubble_h1_order(int p, int m) {
    detail::ComputeOrder order;
    for (int r = 0; r < p; ++r) {
        std::vector<detail::PipeAction> a;
        const int warmup = std::min(p - r - 1, m);
        const int held_back = r;
        int next_w = 0;
        const auto w = [&] { a.push_back({Op::backward_weight, r, next_w++}); };
        for (int k = 0; k < warmup; ++k) a.push_back({Op::forward, r, k});
        for (int i = 0; i < m - warmup; ++i) {
            a.push_back({Op::forward, r, warmup + i});
            a.push_back({Op::backward_input, r, i});
            if (i >= held_back) w();
        }
        for (int k = m - warmup; k < m; ++k) {
            a.push_back({Op::backward_input, r, k});
            w();  // k >= next_w always: at most one W per B so far
        }
        while (next_w < m) w();
        order.push_back(std::move(a));
    }
    return order;
}

[[nodiscard]] inline PipelineProgram zero_bubble_h1(int stages, int micro_batches) {
    const int p = stages, m = micro_batches;
    detail::check_shape("ZB-H1", p, m);
    return detail::lower({.schedule = "ZB-H1", .stages = p, .micro_batches = m, .chunks = 1, .split_backward = true,
                          .activation_bound = std::min(p, m), .rank_of_chunk = detail::looped_ranks(p, 1),
                          .actions = zero_bubble_h1_order(p, m)});
}

// Rank s holds virtual stages s and 2p-1-s.
[[nodiscard]] inline std::vector<int> v_shape_ranks(int stages) {
    std::vector<int> rank_of(static_cast<std::size_t>(2 * stages));
    for (int v = 0; v < 2 * stages; ++v) rank_of[static_cast<std::size_t>(v)] = v < stages ? v : 2 * stages - 1 - v;
    return rank_of;
}

[[nodiscard]] constexpr detail::ComputeOrder zero_bubble_v_order(int p, int micro_batches) {
    const int m = std::max(micro_batches, 2 * p - 1);  // m: the micro-batches the order is written for
    detail::ComputeOrder order;
    for (int r = 0; r < p; ++r) {
        std::vector<detail::PipeAction> a;
        const int down = r, up = 2 * p - 1 - r;  // the chunk on the way down, and on the way back up
        int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
        const auto f_down = [&] { a.push_back({Op::forward, down, f0++}); };
        const auto f_up = [&] { a.push_back({Op::forward, up, f1++}); };
        const auto bw_down = [&] {
            a.push_back({Op::backward_input, down, b0});
            a.push_back({Op::backward_weight, down, b0++});
        };
        const auto bw_up = [&] {
            a.push_back({Op::backward_input, up, b1});
            a.push_back({Op::backward_weight, up, b1++});
        };
        for (int k = 0; k < 2 * (p - r) - 1; ++k) f_down();
        for (int k = 0; k < r; ++k) {
            f_up();
            f_down();
        }
        for (int k = 0; k < p - r; ++k) {
            f_up();
            bw_up();
        }
        while (f1 < f0 || f0 < m) {
            if (f0 < m) f_down();
            bw_down();
            f_up();
            bw_up();
        }
        // Drain: r pairs of B with their Ws held back, then B W of the down chunk.
        int w0 = b0, w1 = b1;
        for (int k = 0; k < r; ++k) {
            a.push_back({Op::backward_input, down, b0++});
            a.push_back({Op::backward_input, up, b1++});
        }
        for (int k = 0; k < p - r; ++k) {
            a.push_back({Op::backward_input, down, b0++});
            a.push_back({Op::backward_weight, down, w0++});
        }
        while (w1 < b1) a.push_back({Op::backward_weight, up, w1++});
        while (w0 < b0) a.push_back({Op::backward_weight, down, w0++});
        LOOM_CHECK(f0 == m && f1 == m && b0 == m && b1 == m, "ZB-V: rank ", r, " scheduled ", f0, "/", f1,
                   " forwards and ", b0, "/", b1, " backwards of ", m, " micro-batches");
        std::erase_if(a, [&](const detail::PipeAction& x) { return x.micro_batch >= micro_batches; });
        order.push_back(std::move(a));
    }
    return order;
}

[[nodiscard]] inline PipelineProgram zero_bubble_v(int stages, int micro_batches) {
    detail::check_shape("ZB-V", stages, micro_batches);
    const int p = stages;
    return detail::lower({.schedule = "ZB-V", .stages = p, .micro_batches = micro_batches, .chunks = 2,
                          .split_backward = true, .activation_bound = 2 * std::min(p, micro_batches),
                          .rank_of_chunk = v_shape_ranks(p), .actions = zero_bubble_v_order(p, micro_batches)});
}

}  // namespace loom::schedule
