// One pipeline rank's whole step program: its schedule (pipeline.hpp, which
// speaks of chunks) lowered to the model's units, with the data-parallel and
// ZeRO instructions of the units it holds. This is what the executor runs for
// Strategy<..., Pipeline<S>, ...>; with one stage and one chunk it is the
// plain data-parallel step of that schedule's order.
//
//   - forward of chunk v runs its units first to last, a backward (or B, or
//     W) last to first; sends, recvs and their waits are kept as they are;
//   - ZeRO 0/1: gradients accumulate in the arena; after the last
//     micro-batch's weight gradients of a bucket, its reduction starts
//     (all-reduce, or reduce-scatter into the owner's block) and runs while
//     the schedule goes on;
//   - ZeRO 2/3 (ZeroPP): the layout has one group per chunk. Its gradients
//     live in a slot from the chunk's first weight gradient of the step to
//     the last, then are reduce-scattered once; at stage 3 its parameters are
//     gathered once, before the chunk first computes (the next chunk's gather
//     is issued while this one runs), and released after it last computes.
//     So a chunk is gathered and reduced once per step, not per micro-batch.
//   - before the optimizer, every reduction is waited; stages 1 and 2 then
//     all-gather the updated blocks; the step ends with the loss reduction.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/program.hpp"

namespace loom::schedule {

// Where the units go: virtual stage v holds units [bounds[v], bounds[v+1]).
struct StageBounds {
    std::vector<int> bounds;

    // From units per virtual stage, e.g. {3, 3, 2}.
    [[nodiscard]] static StageBounds of_sizes(const std::vector<int>& sizes) {
        StageBounds s{{0}};
        for (int n : sizes) s.bounds.push_back(s.bounds.back() + n);
        return s;
    }
    [[nodiscard]] int stages() const noexcept { return static_cast<int>(bounds.size()) - 1; }
    [[nodiscard]] int first(int v) const { return bounds.at(static_cast<std::size_t>(v)); }
    [[nodiscard]] int end(int v) const { return bounds.at(static_cast<std::size_t>(v) + 1); }
    [[nodiscard]] int units() const noexcept { return bounds.empty() ? 0 : bounds.back(); }

    // unit -> the virtual stage holding it, if on `rank`; -1 otherwise.
    [[nodiscard]] std::vector<int> chunk_of_unit(const std::vector<int>& rank_of_chunk, int rank) const {
        std::vector<int> chunk(static_cast<std::size_t>(units()), -1);
        for (int v = 0; v < stages(); ++v)
            if (rank_of_chunk.at(static_cast<std::size_t>(v)) == rank)
                for (int u = first(v); u < end(v); ++u) chunk[static_cast<std::size_t>(u)] = v;
        return chunk;
    }
};

namespace detail {

class PipelineStepGenerator {
public:
    PipelineStepGenerator(const PipelineProgram& pipe, int rank, const StageBounds& stages,
                          const parallel::ShardLayout& layout, int zero_stage)
        : source_(pipe.ranks.at(static_cast<std::size_t>(rank))), stages_(stages), layout_(layout),
          zero_(zero_stage) {}

    StepProgram run() {
        plan_chunks();
        out_.generator = source_.generator + ", ZeRO stage " + std::to_string(zero_) + " over " +
                         std::to_string(layout_.ranks()) + " data-parallel rank" + (layout_.ranks() == 1 ? "" : "s");
        out_.micro_batches = source_.micro_batches;
        out_.pipelined = true;
        out_.grad_slots = zero_ >= 2 ? static_cast<int>(order_.size()) : 0;
        out_.param_slots = zero_ == 3 ? static_cast<int>(order_.size()) : 0;
        remap_.assign(source_.code.size(), -1);
        for (std::size_t i = 0; i < source_.code.size(); ++i) lower(static_cast<int>(i), source_.code[i]);
        out_.emit({.op = Op::reduce_loss});
        return std::move(out_);
    }

private:
    struct Chunk {
        int group = -1;  // ZeRO 2/3: the chunk's one group (-1: no parameters)
        int slot = -1;   // its parameter and gradient slot
        int first_compute = -1, last_compute = -1, first_grad = -1, last_grad = -1;
        int gather = -1;  // the pending gather, if issued and not yet waited
    };

    static bool writes_grads(Op op) { return op == Op::backward || op == Op::backward_weight; }

    // Which chunks this rank runs, in order of first use, and where each
    // first and last computes and writes gradients.
    void plan_chunks() {
        chunks_.assign(static_cast<std::size_t>(stages_.stages()), Chunk{});
        for (int i = 0; i < static_cast<int>(source_.code.size()); ++i) {
            const Instruction& in = source_.code[static_cast<std::size_t>(i)];
            if (!is_compute(in.op) || in.chunk < 0) continue;
            Chunk& c = chunks_.at(static_cast<std::size_t>(in.chunk));
            if (c.first_compute < 0) {
                c.first_compute = i;
                c.slot = static_cast<int>(order_.size());
                order_.push_back(in.chunk);
            }
            c.last_compute = i;
            if (writes_grads(in.op)) {
                if (c.first_grad < 0) c.first_grad = i;
                c.last_grad = i;
            }
        }
        if (zero_ >= 2)
            for (int v : order_) {
                Chunk& c = chunks_[static_cast<std::size_t>(v)];
                for (int u = stages_.first(v); u < stages_.end(v) && c.group < 0; ++u) c.group = layout_.group_of_unit(u);
                if (c.group >= 0) gather_order_.push_back(v);
            }
    }

    void gather(int v) {
        Chunk& c = chunks_[static_cast<std::size_t>(v)];
        if (c.group >= 0) c.gather = out_.emit({.op = Op::gather_params, .group = c.group, .slot = c.slot});
    }

    void lower(int i, const Instruction& in) {
        switch (in.op) {
            case Op::zero_grads:
                out_.emit(in);
                if (zero_ == 3 && !gather_order_.empty()) gather(gather_order_.front());
                return;
            case Op::send: remap_[static_cast<std::size_t>(i)] = out_.emit(in); return;
            case Op::recv: out_.emit(in); return;
            case Op::wait: out_.emit({.op = Op::wait, .target = remap_.at(static_cast<std::size_t>(in.target))}); return;
            case Op::optimizer_step: {
                for (int r : reductions_) out_.emit({.op = Op::wait, .target = r});
                out_.emit(in);
                if (zero_ == 1 || zero_ == 2) {
                    std::vector<int> gathers;
                    for (int g = 0; g < static_cast<int>(layout_.groups().size()); ++g)
                        gathers.push_back(out_.emit({.op = Op::gather_params, .group = g}));
                    for (int index : gathers) out_.emit({.op = Op::wait, .target = index});
                }
                return;
            }
            case Op::forward:
            case Op::backward:
            case Op::backward_input:
            case Op::backward_weight: compute(i, in); return;
            default:
                LOOM_FAIL("pipeline step: the schedule's program has ", in, " at #", i,
                          "; a schedule emits only compute, p2p, waits and the optimizer");
        }
    }

    void compute(int i, const Instruction& in) {
        const int v = in.chunk;
        LOOM_CHECK(v >= 0 && v < stages_.stages(), "pipeline step: ", in, " names virtual stage ", v, " of ",
                   stages_.stages());
        Chunk& c = chunks_[static_cast<std::size_t>(v)];
        if (zero_ == 3 && i == c.first_compute && c.group >= 0) {
            out_.emit({.op = Op::wait, .target = c.gather});
            c.gather = -1;
            // Prefetch: the next chunk's gather runs while this one computes.
            const auto at = std::find(gather_order_.begin(), gather_order_.end(), v);
            if (at + 1 != gather_order_.end()) gather(*(at + 1));
        }
        if (zero_ >= 2 && i == c.first_grad && c.group >= 0)
            out_.emit({.op = Op::bind_grads, .micro_batch = in.micro_batch, .group = c.group, .slot = c.slot});
        const bool last_grads = writes_grads(in.op) && i == c.last_grad;
        const auto unit_op = [&](int u) {
            out_.emit({.op = in.op, .unit = u, .micro_batch = in.micro_batch, .chunk = v});
            // ZeRO 0/1: a bucket's reduction starts once its first unit has
            // added the last micro-batch's weight gradients.
            const int g = layout_.group_of_unit(u);
            if (zero_ < 2 && last_grads && g >= 0 && layout_.group(g).first_unit == u)
                reductions_.push_back(out_.emit({.op = Op::reduce_grads, .micro_batch = in.micro_batch, .group = g,
                                                 .reduction = zero_ == 0 ? Reduction::all_reduce
                                                                         : Reduction::reduce_scatter}));
        };
        if (in.op == Op::forward)
            for (int u = stages_.first(v); u < stages_.end(v); ++u) unit_op(u);
        else
            for (int u = stages_.end(v) - 1; u >= stages_.first(v); --u) unit_op(u);
        if (zero_ >= 2 && last_grads && c.group >= 0)
            reductions_.push_back(out_.emit({.op = Op::reduce_grads, .micro_batch = in.micro_batch, .group = c.group,
                                             .slot = c.slot, .reduction = Reduction::reduce_scatter}));
        if (zero_ == 3 && i == c.last_compute && c.group >= 0)
            out_.emit({.op = Op::release_params, .group = c.group, .slot = c.slot});
    }

    const StepProgram& source_;
    const StageBounds& stages_;
    const parallel::ShardLayout& layout_;
    int zero_;
    StepProgram out_;
    std::vector<Chunk> chunks_;
    std::vector<int> order_;         // this rank's chunks by first use
    std::vector<int> gather_order_;  // those with parameters: the chain of ZeRO-3 gathers
    std::vector<int> remap_;         // schedule index -> index here (sends)
    std::vector<int> reductions_;    // waited before the optimizer
};

}  // namespace detail

// Rank `rank`'s step program for schedule `pipe`, the units split by
// `stages` (one entry per virtual stage), its units' parameters laid out by
// `layout` (built with this rank's chunks as segments; per_segment at ZeRO
// 2/3), at ZeRO stage `zero_stage`.
[[nodiscard]] inline StepProgram pipeline_step_program(const PipelineProgram& pipe, int rank,
                                                       const StageBounds& stages, const parallel::ShardLayout& layout,
                                                       int zero_stage) {
    LOOM_CHECK(rank >= 0 && rank < pipe.stages, "pipeline_step_program: rank ", rank, " of a ", pipe.stages,
               "-stage pipeline");
    LOOM_CHECK(stages.stages() == pipe.virtual_stages(), "pipeline_step_program: ", stages.stages(),
               " unit ranges for ", pipe.virtual_stages(), " virtual stages");
    LOOM_CHECK(zero_stage >= 0 && zero_stage <= 3, "pipeline_step_program: ZeRO stage ", zero_stage,
               " is not 0, 1, 2 or 3");
    return detail::PipelineStepGenerator(pipe, rank, stages, layout, zero_stage).run();
}

}  // namespace loom::schedule
