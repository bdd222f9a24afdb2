// What Kraken serving's tests share on every transport (rank threads in
// tests/infer, processes in tests/mpi): a small scaled Kraken, and a rank's
// completions of a batch on its shard, through the Batcher every engine
// shares, or on its pipeline stage, through the non-blocking pipeline. The
// requests are tensor-parallel serving's (mixed lengths, greedy or seeded, a
// stop token). Test code only.
#pragma once

#include <cstdint>
#include <vector>

#include "infer/tensor_parallel_serving_suite.hpp"
#include "loom/comm/any_comm.hpp"
#include "loom/gpt/kraken.hpp"
#include "loom/infer/cached_kraken.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/pipeline_parallel_gpt.hpp"
#include "loom/infer/pipeline_stage.hpp"
#include "loom/nn/param_arena.hpp"

namespace loom_test {

// A small random Kraken of N = `degree` sub-layers per layer, its values scaled
// by 8 so greedy choices are clear-cut (as support/scaled_gpt.hpp does for
// the GPT); vocabulary 42, as mixed_batch's prompts need.
struct TinyKraken {
    loom::gpt::KrakenConfig config;
    loom::gpt::KrakenModel model;
    loom::nn::ParamArena arena;

    explicit TinyKraken(std::int64_t degree, std::int64_t layers = 3)
        : config{.layers = layers, .width = 32, .heads = 4, .seq = 40, .vocab = 42, .degree = degree},
          model(loom::gpt::make_kraken(config)), arena(model) {
        arena.initialize(model, 21);
        for (float& v : arena.values()) v *= 8.0f;
    }
};

// The whole model on this rank: `requests` continuously batched on `slots` slots.
inline std::vector<loom::infer::Completion> serve_kraken_whole(TinyKraken& whole, const std::vector<Request>& requests,
                                                               std::int64_t slots) {
    auto cache = loom::infer::kraken_cache(whole.config, 1, slots, whole.config.seq, 4);
    loom::infer::CachedKraken engine(whole.model, whole.config, cache);
    return loom::infer::generate(engine, requests);
}

// This rank's completions on its shard of `whole`, at tp = tp.size().
inline std::vector<loom::infer::Completion> serve_kraken_on(loom::comm::AnyComm& tp, const TinyKraken& whole,
                                                            const std::vector<Request>& requests, std::int64_t slots,
                                                            bool overlap = true) {
    auto shard = loom::infer::kraken_serving_shard(whole.config, tp.rank(), tp.size());
    loom::nn::ParamArena arena(shard);
    loom::infer::load_kraken_shard(shard, whole.config, tp.rank(), whole.arena.values());
    auto cache = loom::infer::kraken_cache(whole.config, tp.size(), slots, whole.config.seq, 4);
    loom::infer::CachedKraken engine(shard, whole.config, cache, tp, overlap);
    return loom::infer::generate(engine, requests);
}

// This rank's completions on its pipeline stage of `whole` at pp = pp.size(), through the
// non-blocking pipeline; with `tp`, its shard of the stage at tp = tp->size() (tp x pp).
inline std::vector<loom::infer::Completion> serve_kraken_pipelined_on(loom::comm::AnyComm& pp, loom::comm::AnyComm* tp,
                                                                      const TinyKraken& whole,
                                                                      const std::vector<Request>& requests,
                                                                      std::int64_t slots) {
    const int rank = tp == nullptr ? 0 : tp->rank(), degree = tp == nullptr ? 1 : tp->size();
    const loom::infer::PipelineStage where = loom::infer::pipeline_stage(whole.config.gpt(), pp.rank(), pp.size());
    auto stage = loom::infer::kraken_stage_model(whole.config, where, rank, degree);
    loom::nn::ParamArena arena(stage);
    loom::infer::load_kraken_shard(stage, whole.config, rank, whole.arena.values(), where);
    auto cache = loom::infer::kraken_cache(whole.config, where, degree, slots, whole.config.seq, 4);
    if (tp != nullptr) {
        loom::infer::CachedKraken engine(stage, whole.config, cache, *tp, where);
        return loom::infer::generate_pipelined(engine, pp, requests);
    }
    loom::infer::CachedKraken engine(stage, whole.config, cache, where);
    return loom::infer::generate_pipelined(engine, pp, requests);
}

}  // namespace loom_test
