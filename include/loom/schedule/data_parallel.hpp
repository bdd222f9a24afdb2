// The step program of data parallelism and ZeRO (stages 0-3) for one rank.
//
// Stage 0 and 1: forward and backward every micro-batch with gradients
// accumulating in the arena; in the last micro-batch, each group's reduction
// starts as soon as backward has passed its first unit (all-reduce at stage 0,
// reduce-scatter into the rank's own block at stage 1) and runs while backward
// goes on. Stage 1 then updates its blocks and all-gathers the parameters.
// Stage 2: gradients have no arena; a group's backward writes into one of two
// gradient slots, which is reduce-scattered into the rank's gradient shard
// every micro-batch (a slot is reused once the reduction of the group before
// last has finished). Stage 3: as stage 2, and parameters too live only as
// shards: a group is gathered into one of two parameter slots before its
// forward and again before its backward, the next group's gather issued
// before the current one computes, and released after.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/schedule/program.hpp"

namespace loom::schedule {

namespace detail {

// Two working buffers, each free or held by a group whose pending async
// instruction must be waited before the buffer is reused.
struct SlotPair {
    std::array<int, 2> group{-1, -1};
    std::array<int, 2> pending{-1, -1};  // the instruction to wait for, or -1
    int next = 0;
};

class DataParallelGenerator {
public:
    DataParallelGenerator(const parallel::ShardLayout& layout, int units, int stage, int micro_batches)
        : layout_(layout), units_(units), stage_(stage), micro_batches_(micro_batches) {}

    StepProgram run() {
        program_.generator = "data parallel over " + std::to_string(layout_.ranks()) + " ranks, ZeRO stage " +
                             std::to_string(stage_) + ", " + std::to_string(micro_batches_) + " micro-batch" +
                             (micro_batches_ == 1 ? "" : "es");
        program_.micro_batches = micro_batches_;
        program_.grad_slots = stage_ >= 2 ? 2 : 0;
        program_.param_slots = stage_ == 3 ? 2 : 0;
        program_.emit({.op = Op::zero_grads});
        for (int mb = 0; mb < micro_batches_; ++mb) {
            forward(mb);
            backward(mb);
        }
        for (int index : outstanding_reductions_) program_.emit({.op = Op::wait, .target = index});
        outstanding_reductions_.clear();
        program_.emit({.op = Op::optimizer_step});
        if (stage_ == 1 || stage_ == 2) {
            // The updated blocks go back to every rank.
            std::vector<int> gathers;
            for (int g = 0; g < static_cast<int>(layout_.groups().size()); ++g)
                gathers.push_back(program_.emit({.op = Op::gather_params, .group = g}));
            for (int index : gathers) program_.emit({.op = Op::wait, .target = index});
        }
        program_.emit({.op = Op::reduce_loss});
        return std::move(program_);
    }

private:
    [[nodiscard]] int group_of(int unit) const { return layout_.group_of_unit(unit); }
    [[nodiscard]] bool first_unit_of_group(int unit) const {
        const int g = group_of(unit);
        return g >= 0 && layout_.group(g).first_unit == unit;
    }
    [[nodiscard]] bool last_unit_of_group(int unit) const {
        const int g = group_of(unit);
        return g >= 0 && layout_.group(g).last_unit == unit;
    }
    // The next group in the direction of travel, or -1.
    [[nodiscard]] int neighbour_group(int g, int direction) const {
        const int n = g + direction;
        return n >= 0 && n < static_cast<int>(layout_.groups().size()) ? n : -1;
    }

    // ZeRO-3: make sure group g's parameters are (being) gathered into a slot.
    void gather(int g) {
        for (int s = 0; s < 2; ++s)
            if (params_.group[s] == g) return;  // still held from before
        int s = params_.next;
        if (params_.group[s] != -1) s = 1 - s;
        LOOM_CHECK(params_.group[s] == -1, "data-parallel schedule: no free parameter slot for group ", g);
        params_.group[s] = g;
        params_.pending[s] = program_.emit({.op = Op::gather_params, .group = g, .slot = s});
        params_.next = 1 - s;
    }
    void wait_gathered(int g) {
        for (int s = 0; s < 2; ++s) {
            if (params_.group[s] != g) continue;
            if (params_.pending[s] >= 0) program_.emit({.op = Op::wait, .target = params_.pending[s]});
            params_.pending[s] = -1;
            return;
        }
        LOOM_FAIL("data-parallel schedule: group ", g, " was never gathered");
    }
    void release(int g) {
        for (int s = 0; s < 2; ++s) {
            if (params_.group[s] != g) continue;
            program_.emit({.op = Op::release_params, .group = g, .slot = s});
            params_.group[s] = -1;
            return;
        }
    }

    void forward(int mb) {
        int last_param_unit = -1;
        for (int u = 0; u < units_; ++u)
            if (group_of(u) >= 0) last_param_unit = u;
        for (int u = 0; u < units_; ++u) {
            const int g = group_of(u);
            if (stage_ == 3 && g >= 0) {
                gather(g);
                wait_gathered(g);
                if (const int next = neighbour_group(g, +1); next >= 0) gather(next);  // prefetch
            }
            program_.emit({.op = Op::forward, .unit = u, .micro_batch = mb});
            // The last group stays gathered: backward starts with it.
            if (stage_ == 3 && g >= 0 && u != last_param_unit) release(g);
        }
    }

    void backward(int mb) {
        const bool last_micro_batch = mb == micro_batches_ - 1;
        for (int u = units_ - 1; u >= 0; --u) {
            const int g = group_of(u);
            if (stage_ == 3 && g >= 0) {
                gather(g);
                wait_gathered(g);
                if (const int previous = neighbour_group(g, -1); previous >= 0) gather(previous);  // prefetch
            }
            if (stage_ >= 2 && last_unit_of_group(u)) bind_grad_slot(g, mb);
            program_.emit({.op = Op::backward, .unit = u, .micro_batch = mb});
            if (first_unit_of_group(u)) {
                if (stage_ >= 2) {
                    const int s = grads_.group[0] == g ? 0 : 1;
                    grads_.pending[s] = program_.emit({.op = Op::reduce_grads, .micro_batch = mb, .group = g, .slot = s,
                                                       .reduction = Reduction::reduce_scatter});
                } else if (last_micro_batch) {
                    outstanding_reductions_.push_back(program_.emit(
                        {.op = Op::reduce_grads, .micro_batch = mb, .group = g,
                         .reduction = stage_ == 0 ? Reduction::all_reduce : Reduction::reduce_scatter}));
                }
            }
            if (stage_ == 3 && g >= 0 && first_unit_of_group(u)) release(g);
        }
        if (stage_ >= 2) {
            // The next micro-batch's backward rebinds the slots; the last one's
            // reductions are waited before the optimizer.
            for (int s = 0; s < 2; ++s)
                if (grads_.pending[s] >= 0) {
                    if (last_micro_batch) outstanding_reductions_.push_back(grads_.pending[s]);
                    else program_.emit({.op = Op::wait, .target = grads_.pending[s]});
                    grads_.pending[s] = -1;
                    grads_.group[s] = -1;
                }
        }
    }

    void bind_grad_slot(int g, int mb) {
        const int s = grads_.next;
        if (grads_.pending[s] >= 0) program_.emit({.op = Op::wait, .target = grads_.pending[s]});
        grads_.pending[s] = -1;
        grads_.group[s] = g;
        grads_.next = 1 - s;
        program_.emit({.op = Op::bind_grads, .micro_batch = mb, .group = g, .slot = s});
    }

    const parallel::ShardLayout& layout_;
    int units_, stage_, micro_batches_;
    StepProgram program_;
    SlotPair params_, grads_;
    std::vector<int> outstanding_reductions_;
};

}  // namespace detail

// The program for `units` units grouped by `layout`, at ZeRO `stage` (0 for
// plain data parallelism), with `micro_batches` micro-batches per step.
[[nodiscard]] inline StepProgram data_parallel_program(const parallel::ShardLayout& layout, int units, int stage,
                                                       int micro_batches) {
    LOOM_CHECK(stage >= 0 && stage <= 3, "data_parallel_program: ZeRO stage ", stage, " is not 0, 1, 2 or 3");
    LOOM_CHECK(micro_batches >= 1, "data_parallel_program: ", micro_batches, " micro-batches; there must be at least 1");
    LOOM_CHECK(units >= 1, "data_parallel_program: a model with ", units, " units has nothing to run");
    return detail::DataParallelGenerator(layout, units, stage, micro_batches).run();
}

}  // namespace loom::schedule
