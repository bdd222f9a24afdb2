// RankProgram: everything one rank's step is generated from and the step
// program itself: the pipeline schedule, the units of each virtual stage,
// the units this rank holds, its ShardLayout and its verified StepProgram.
// The Executor runs it; the planner (plan/cost_model.hpp) builds the same
// thing from a model description's parameter counts and simulates it, so
// the cost model and the executor can never disagree about the schedule.
#pragma once

#include <vector>

#include "loom/core/error.hpp"
#include "loom/exec/execution_plan.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/schedule/pipeline.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/pipeline_step.hpp"
#include "loom/schedule/data_parallel.hpp"
#include "loom/schedule/program.hpp"
#include "loom/schedule/verify.hpp"
#include "loom/schedule/verify_pipeline.hpp"

namespace loom::exec {

// ZeRO-3 gathers per unit; a pipeline at ZeRO 2/3 (ZeroPP) per chunk, once a step.
[[nodiscard]] inline parallel::Grouping grouping_of(const ExecutionPlan& plan) {
    if (plan.zero_stage >= 2 && plan.pipelined) return parallel::Grouping::per_segment;
    return plan.zero_stage == 3 ? parallel::Grouping::per_unit : parallel::Grouping::buckets;
}

struct RankProgram {
    schedule::PipelineProgram pipe;    // empty unless pipelined
    schedule::StageBounds stages;      // units of each virtual stage
    std::vector<int> chunk_of_unit;    // -1: a unit held by another stage
    parallel::ShardLayout layout;      // this rank's parameters over the dp axis
    schedule::StepProgram program;     // what the executor interprets every step
};

// Whether the plan pipelines, checked against a pp axis of `pp_ranks` ranks.
[[nodiscard]] inline bool check_pipeline_axis(const ExecutionPlan& plan, int pp_ranks) {
    LOOM_CHECK(plan.pipelined || pp_ranks == 1, "Executor: a pipeline axis of ", pp_ranks,
               " ranks for a strategy without Pipeline<...>; add Pipeline<Schedule> or use a pp axis of 1");
    return plan.pipelined;
}

inline void verify(const RankProgram& rank);

// Pipeline rank `pp_rank` of `pp_size` (1 and 0 without a pipeline), its
// parameters sharded over `dp_size` ranks. Only the units' parameter counts
// are read. Verified before it is returned.
[[nodiscard]] inline RankProgram rank_program(const std::vector<nn::Unit>& units, int dp_size, int pp_size, int pp_rank,
                                              const ExecutionPlan& plan, const ExecutorOptions& options) {
    const bool pipelined = plan.pipelined;
    const int count = static_cast<int>(units.size());
    schedule::PipelineProgram pipe =
        pipelined ? schedule::pipeline_program(plan.schedule, pp_size, options.micro_batches, plan.chunks)
                  : schedule::PipelineProgram{};
    schedule::StageBounds stages = pipelined ? exec::stage_bounds(count, pipe.virtual_stages(), options)
                                             : schedule::StageBounds{{0, count}};
    std::vector<int> chunk_of_unit = stages.chunk_of_unit(pipelined ? pipe.rank_of_chunk : std::vector<int>{0}, pp_rank);
    parallel::ShardLayout layout(units, dp_size, grouping_of(plan), plan.bucket_bytes,
                                 pipelined ? chunk_of_unit : std::vector<int>{});
    schedule::StepProgram program =
        pipelined ? schedule::pipeline_step_program(pipe, pp_rank, stages, layout, plan.zero_stage)
                  : schedule::data_parallel_program(layout, count, plan.zero_stage, options.micro_batches);
    RankProgram rank{std::move(pipe), std::move(stages), std::move(chunk_of_unit), std::move(layout),
                     std::move(program)};
    if (pipelined) schedule::verify_pipeline(rank.pipe);
    verify(rank);
    return rank;
}

// Checks the step program against the rank's layout and units: when it is
// generated, and again after a policy lowered itself into it.
inline void verify(const RankProgram& rank) {
    if (rank.program.pipelined) schedule::verify(rank.program, rank.layout, rank.chunk_of_unit);
    else schedule::verify(rank.program, rank.layout, static_cast<int>(rank.chunk_of_unit.size()));
}

}  // namespace loom::exec
