// What pipeline-parallel serving's tests share on every transport (rank
// threads in tests/infer, processes in tests/mpi): a small scaled GPT of 4
// layers (pp 1, 2 and 4), a rank's stage of it, and its completions of a
// list of requests. Test code only.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/pipeline_parallel_gpt.hpp"
#include "loom/infer/pipeline_stage.hpp"
#include "loom/infer/tensor_parallel_shard.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/scaled_gpt.hpp"

namespace loom_test {

// The vocabulary of tensor_parallel_serving_suite.hpp's mixed_batch (42), 4 layers for pp 2 and 4.
struct PipelineGpt : loom_test::ScaledGpt {
    explicit PipelineGpt(std::uint64_t seed)
        : ScaledGpt({.layers = 4, .width = 32, .heads = 4, .seq = 32, .vocab = 42}, seed, 8.0f) {}
};

// One pipeline rank's model: its stage of `whole`, bound, with its values.
struct RankStage {
    loom::infer::PipelineStage where;
    loom::gpt::Model model;
    loom::nn::ParamArena arena;

    RankStage(const loom_test::ScaledGpt& whole, int rank, int degree)
        : where(loom::infer::pipeline_stage(whole.config, rank, degree)),
          model(loom::infer::make_stage_model(whole.config, where)), arena(model) {
        loom::infer::load_stage_values(model, whole.config, where, whole.arena.values());
    }
};

// One rank's model at pp x tp: its tp shard of its stage of `whole`, bound, with its values.
struct RankStageShard {
    loom::infer::PipelineStage where;
    loom::gpt::Model model;
    loom::nn::ParamArena arena;

    RankStageShard(const loom_test::ScaledGpt& whole, int stage, int stages, int rank, int degree)
        : where(loom::infer::pipeline_stage(whole.config, stage, stages)), model(cut(whole.config, where, rank, degree)),
          arena(model) {
        loom::infer::load_stage_values(model, whole.config, where, whole.arena.values());
    }
    static loom::gpt::Model cut(const loom::gpt::Config& config, const loom::infer::PipelineStage& where, int rank,
                                int degree) {
        auto model = loom::infer::make_stage_model(config, where);
        loom::infer::shard_for_serving(model, rank, degree);
        return model;
    }
};

// This rank's completions of `requests` at pp = pp.size() x tp = tp.size().
inline std::vector<loom::infer::Completion> serve_pipelined_tp_on(loom::comm::AnyComm& pp, loom::comm::AnyComm& tp,
                                                                  const loom_test::ScaledGpt& whole,
                                                                  const std::vector<loom::infer::Request>& requests,
                                                                  std::int64_t max_batch) {
    RankStageShard stage(whole, pp.rank(), pp.size(), tp.rank(), tp.size());
    return loom::infer::generate_pipelined(stage.model, whole.config, pp, tp, requests, max_batch);
}

// This rank's completions of `requests` at pp = pp.size(), on its stage of `whole`.
inline std::vector<loom::infer::Completion> serve_pipelined_on(loom::comm::AnyComm& pp,
                                                               const loom_test::ScaledGpt& whole,
                                                               const std::vector<loom::infer::Request>& requests,
                                                               std::int64_t max_batch,
                                                               const loom::infer::PipelineOptions& options = {}) {
    RankStage stage(whole, pp.rank(), pp.size());
    return loom::infer::generate_pipelined(stage.model, whole.config, pp, requests, max_batch, options);
}

}  // namespace loom_test
