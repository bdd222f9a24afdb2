// From compute order to rank programs: a pipeline schedule is written as each
// rank's ordered list of compute actions (forward, backward or backward_input
// / backward_weight of a virtual stage and micro-batch); this header derives
// the p2p instructions from them mechanically, so every generator gets the
// same send/recv conventions (pipeline_program.hpp) for free:
//   - before a forward of v whose predecessor v-1 is on another rank: recv
//     its activation; after a forward of v whose successor is elsewhere: send;
//   - before a backward(_input) of v whose successor v+1 is elsewhere: recv
//     its gradient; after it, if v-1 is elsewhere: send the input gradient;
//   - every send is waited at the end of the program, before the optimizer:
//     sends are asynchronous and their buffers then live until the step ends,
//     which costs memory but never blocks a rank mid-schedule.
// A recv sits right before the compute that needs it. With asynchronous
// sends, a program set cannot deadlock as long as the ranks' compute orders
// together respect F(v,k) <- F(v-1,k), B(v,k) <- B(v+1,k): each generator
// argues that for its own order (and the tests run every rank to the end).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/program.hpp"

namespace loom::schedule::detail {

// One compute step of a rank: op is forward, backward, backward_input or
// backward_weight; stage is the virtual stage.
struct PipeAction {
    Op op = Op::forward;
    int stage = 0;
    int micro_batch = 0;

    friend constexpr bool operator==(const PipeAction&, const PipeAction&) = default;
};

// Every rank's compute order: order[r] is rank r's. The *_order functions
// that make one are constexpr, so a schedule of compile-time shape is a
// compile-time table (compute_table in pipeline.hpp).
using ComputeOrder = std::vector<std::vector<PipeAction>>;

// What a generator decided: the schedule's facts and each rank's compute order.
struct PipelinePlan {
    std::string schedule;
    int stages = 1;
    int micro_batches = 1;
    int chunks = 1;
    bool split_backward = false;
    int activation_bound = 0;
    std::vector<int> rank_of_chunk;
    ComputeOrder actions;  // actions[r]: rank r's compute order
};

// Virtual stage c*p + r on rank r: Megatron's interleaving (and plain pipelines, c = 0).
[[nodiscard]] inline std::vector<int> looped_ranks(int stages, int chunks) {
    std::vector<int> rank_of(static_cast<std::size_t>(stages * chunks));
    for (int v = 0; v < stages * chunks; ++v) rank_of[static_cast<std::size_t>(v)] = v % stages;
    return rank_of;
}

// The lowering: compute actions plus the p2p they imply, then the waits and
// the optimizer step. Gradients start at zero_grads, as in data parallelism.
[[nodiscard]] inline PipelineProgram lower(PipelinePlan plan) {
    PipelineProgram out;
    out.schedule = std::move(plan.schedule);
    out.stages = plan.stages;
    out.micro_batches = plan.micro_batches;
    out.chunks = plan.chunks;
    out.split_backward = plan.split_backward;
    out.activation_bound = plan.activation_bound;
    out.rank_of_chunk = std::move(plan.rank_of_chunk);
    const int last = out.virtual_stages() - 1;
    const auto owner = [&](int v) { return out.rank_of_chunk[static_cast<std::size_t>(v)]; };
    for (int r = 0; r < out.stages; ++r) {
        StepProgram program;
        program.generator = out.schedule + ", rank " + std::to_string(r) + " of " + std::to_string(out.stages) +
                            ", " + std::to_string(out.micro_batches) + " micro-batch" +
                            (out.micro_batches == 1 ? "" : "es");
        program.micro_batches = out.micro_batches;
        std::vector<int> sends;
        const auto p2p = [&](Op op, Payload payload, int peer, const PipeAction& a) {
            const int at = program.emit(
                {.op = op, .micro_batch = a.micro_batch, .chunk = a.stage, .peer = peer, .payload = payload});
            if (op == Op::send) sends.push_back(at);
        };
        program.emit({.op = Op::zero_grads});
        for (const PipeAction& a : plan.actions[static_cast<std::size_t>(r)]) {
            LOOM_CHECK(owner(a.stage) == r, out.schedule, ": rank ", r, " was given virtual stage ", a.stage,
                       ", which lives on rank ", owner(a.stage));
            const bool prev_elsewhere = a.stage > 0 && owner(a.stage - 1) != r;
            const bool next_elsewhere = a.stage < last && owner(a.stage + 1) != r;
            const bool gradient_step = a.op == Op::backward || a.op == Op::backward_input;
            if (a.op == Op::forward && prev_elsewhere) p2p(Op::recv, Payload::activation, owner(a.stage - 1), a);
            if (gradient_step && next_elsewhere) p2p(Op::recv, Payload::gradient, owner(a.stage + 1), a);
            program.emit({.op = a.op, .micro_batch = a.micro_batch, .chunk = a.stage});
            if (a.op == Op::forward && next_elsewhere) p2p(Op::send, Payload::activation, owner(a.stage + 1), a);
            if (gradient_step && prev_elsewhere) p2p(Op::send, Payload::gradient, owner(a.stage - 1), a);
        }
        for (int index : sends) program.emit({.op = Op::wait, .target = index});
        program.emit({.op = Op::optimizer_step});
        out.ranks.push_back(std::move(program));
    }
    return out;
}

// The checks every generator shares: "GPipe: 0 stages; a pipeline needs at least 1".
inline void check_shape(const std::string& schedule, int stages, int micro_batches) {
    LOOM_CHECK(stages >= 1, schedule, ": ", stages, " stages; a pipeline needs at least 1");
    LOOM_CHECK(micro_batches >= 1, schedule, ": ", micro_batches, " micro-batches; a step needs at least 1");
}

}  // namespace loom::schedule::detail
