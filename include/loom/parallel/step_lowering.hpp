// The built-in policies lowered into one rank's step program: Pipeline<S>'s
// schedule for the rank's stage, or plain data parallelism's micro-batch
// loop, each with ZeroShard<S>'s gathers, releases and reduce-scatters; and
// how ZeroShard groups the parameters for them. exec::rank_program calls this
// for the executor and the planner alike, so neither reads a policy's fields.
// Recompute<...> and the custom policies lower themselves into the result
// afterwards (parallel/recomputation.hpp, exec/adopted_policies.hpp).
#pragma once

#include "loom/core/error.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/schedule/data_parallel.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/pipeline_step.hpp"
#include "loom/schedule/program.hpp"

namespace loom::parallel {

// Whether the plan pipelines, checked against a pp axis of `pp_ranks` ranks.
[[nodiscard]] inline bool check_pipeline_axis(const StrategySpec& plan, int pp_ranks) {
    LOOM_CHECK(plan.pipelined || pp_ranks == 1, "Executor: a pipeline axis of ", pp_ranks,
               " ranks for a strategy without Pipeline<...>; add Pipeline<Schedule> or use a pp axis of 1");
    return plan.pipelined;
}

// ZeRO-3 gathers per unit; a pipeline at ZeRO 2/3 (ZeroPP) per chunk, once a
// step; otherwise gradients travel in buckets.
[[nodiscard]] inline Grouping grouping_of(const StrategySpec& spec) {
    if (spec.zero_stage >= 2 && spec.pipelined) return Grouping::per_segment;
    return spec.zero_stage == 3 ? Grouping::per_unit : Grouping::buckets;
}

// The step program of pipeline rank `pp_rank` (with `pipe` and `stages`),
// or of a data-parallel rank running `units` units in `micro_batches`.
[[nodiscard]] inline schedule::StepProgram lower_step_program(const StrategySpec& spec,
                                                              const schedule::PipelineProgram& pipe, int pp_rank,
                                                              const schedule::StageBounds& stages,
                                                              const ShardLayout& layout, int units, int micro_batches) {
    return spec.pipelined ? schedule::pipeline_step_program(pipe, pp_rank, stages, layout, spec.zero_stage)
                          : schedule::data_parallel_program(layout, units, spec.zero_stage, micro_batches);
}

}  // namespace loom::parallel
