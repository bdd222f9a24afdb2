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
#include "loom/parallel/step_lowering.hpp"
#include "loom/schedule/pipeline.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/pipeline_step.hpp"
#include "loom/schedule/program.hpp"
#include "loom/schedule/verify.hpp"
#include "loom/schedule/verify_pipeline.hpp"

namespace loom::exec {

struct RankProgram {
    schedule::PipelineProgram pipe;    // empty unless pipelined
    schedule::StageBounds stages;      // units of each virtual stage
    std::vector<int> chunk_of_unit;    // -1: a unit held by another stage
    parallel::ShardLayout layout;      // this rank's parameters over the dp axis
    schedule::StepProgram program;     // what the executor interprets every step
};

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
    parallel::ShardLayout layout(units, dp_size, parallel::grouping_of(plan), plan.bucket_bytes,
                                 pipelined ? chunk_of_unit : std::vector<int>{});
    schedule::StepProgram program =
        parallel::lower_step_program(plan, pipe, pp_rank, stages, layout, count, options.micro_batches);
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
