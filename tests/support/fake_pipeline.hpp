// The fixture of the pipeline step-program tests (tests/parallel/
// test_pipeline_step.cpp, test_pipeline_step_verifier.cpp and
// test_shard_layout_segments.cpp): ten fake units (names and sizes only: the
// layout and the program generators read nothing else), one of them without
// parameters,
//   numel  520 130 0 260 70 400 90 33 180 64   (1747 in all),
// the layout the executor builds for a pipeline rank, and one rank's lowering
// of a schedule with everything it was made from. Test code only, all inline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "loom/parallel/pipeline.hpp"
#include "loom/exec/executor.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/schedule/pipeline.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/pipeline_step.hpp"
#include "loom/schedule/program.hpp"
#include "loom/schedule/verify.hpp"
#include "support/message_of.hpp"

namespace loom_test::fake_pipeline {

using loom::ScheduleKind;
using loom::parallel::Grouping;
using loom::parallel::ShardLayout;
using loom::schedule::PipelineProgram;
using loom::schedule::StageBounds;
using loom::schedule::StepProgram;

inline const std::vector<std::int64_t> fake_numels{520, 130, 0, 260, 70, 400, 90, 33, 180, 64};
inline constexpr int fake_count = 10;
inline constexpr std::int64_t fake_total = 1747;
// 400 bytes = 100 floats: without segments, buckets {u0} {u1} {u3-u4} {u5} {u6-u7} {u8-u9} (u2 has none).
inline constexpr std::int64_t small_bucket = 400;

inline const std::vector<loom::nn::Unit>& fake_units() {
    static const std::vector<loom::nn::Unit> units = [] {
        std::vector<loom::nn::Unit> out;
        for (std::size_t k = 0; k < fake_numels.size(); ++k) {
            loom::nn::Unit u;
            std::ostringstream name;
            name << "u" << k << " Fake";
            u.name = name.str();
            u.numel = fake_numels[k];
            out.push_back(std::move(u));
        }
        return out;
    }();
    return units;
}

inline std::int64_t dense_start(int u) {
    std::int64_t at = 0;
    for (int k = 0; k < u; ++k) at += fake_numels[static_cast<std::size_t>(k)];
    return at;
}

inline int chunks_of(ScheduleKind kind) {
    return kind == ScheduleKind::interleaved || kind == ScheduleKind::zero_bubble_v ? 2 : 1;
}

inline constexpr ScheduleKind all_schedules[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b,
                                                 ScheduleKind::interleaved, ScheduleKind::zero_bubble_h1,
                                                 ScheduleKind::zero_bubble_v};

// The layout the executor builds for a pipeline rank: this rank's chunks as
// segments; one group per chunk at ZeRO 2/3, buckets otherwise.
inline ShardLayout pipeline_layout(const std::vector<int>& chunk_of_unit, int dp, int zero_stage,
                                   std::int64_t bucket = small_bucket) {
    return ShardLayout(fake_units(), dp, zero_stage >= 2 ? Grouping::per_segment : Grouping::buckets, bucket,
                       chunk_of_unit);
}

// One rank's lowering of a schedule, everything it was made from kept.
struct Lowered {
    PipelineProgram pipe;
    StageBounds bounds;
    int rank;
    int zero_stage;
    std::vector<int> chunk_of_unit;
    ShardLayout layout;
    StepProgram program;

    Lowered(PipelineProgram pipe_, StageBounds bounds_, int rank_, int dp, int zero)
        : pipe(std::move(pipe_)),
          bounds(std::move(bounds_)),
          rank(rank_),
          zero_stage(zero),
          chunk_of_unit(bounds.chunk_of_unit(pipe.rank_of_chunk, rank)),
          layout(pipeline_layout(chunk_of_unit, dp, zero)),
          program(loom::schedule::pipeline_step_program(pipe, rank, bounds, layout, zero)) {}
};

// The executor's default split: equal costs, balanced by schedule::balance.
inline StageBounds balanced(int virtual_stages) {
    return loom::exec::stage_bounds(fake_count, virtual_stages, loom::exec::ExecutorOptions{});
}

inline Lowered lower(ScheduleKind kind, int p, int m, int rank, int dp, int zero) {
    auto pipe = loom::schedule::pipeline_program(kind, p, m, chunks_of(kind));
    auto bounds = balanced(pipe.virtual_stages());
    return Lowered(std::move(pipe), std::move(bounds), rank, dp, zero);
}

// The verifier's message for `program`, or "(no error)".
inline std::string verify_message(const StepProgram& program, const ShardLayout& layout,
                                  const std::vector<int>& chunk_of) {
    return message_of([&] { loom::schedule::verify(program, layout, chunk_of); });
}
inline std::string verify_message(const Lowered& l, const StepProgram& program) {
    return verify_message(program, l.layout, l.chunk_of_unit);
}

}  // namespace loom_test::fake_pipeline
