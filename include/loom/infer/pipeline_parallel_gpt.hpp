// Pipeline-parallel serving of loom's GPT with EnergonAI's non-blocking
// pipeline: `pp` ranks each hold a contiguous run of blocks
// (infer/pipeline_stage.hpp) and a KV cache of those blocks only, and the
// running requests are split into groups (pp + 1 of them by default) that move
// through the stages one after another, so while stage 1 runs group A's
// step, stage 0 runs group B's. No stage waits for a whole batch to drain:
// stage 0 waits only for the group whose tokens it needs next.
//
// Stage 0 admits requests into groups (continuous batching, as
// infer/batcher.hpp: a slot freed by a finished request is refilled at that
// group's next step), embeds the group's new tokens, runs its blocks and
// sends them on; generate_pipelined's stage 0 is a PipelinedBatcher
// (infer/pipelined_batcher.hpp) given every request at once. The later
// stages run their blocks, the last samples and sends the tokens back to
// stage 0, which decides who finished before the group's next step (the
// messages: infer/pipeline_messages.hpp).
//
// Every rank is given the same requests; the completions are broadcast from
// stage 0 at the end, so every rank returns them. Each stage may also be a
// tp group (the last generate_pipelined below): tp x pp.
//
//   loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {   // or an Mpi rank
//       loom::comm::AnyComm pp = loom::comm::AnyComm::view(comm);
//       const auto where = loom::infer::pipeline_stage(config, pp.rank(), pp.size());
//       auto stage = loom::infer::make_stage_model(config, where);
//       loom::nn::ParamArena arena(stage);
//       loom::infer::load_stage_values(stage, config, where, whole);   // a checkpoint's values
//       auto done = loom::infer::generate_pipelined(stage, config, pp, requests);   // the same on every rank
//   });
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/error.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pipeline_messages.hpp"
#include "loom/infer/pipeline_stage.hpp"
#include "loom/infer/pipelined_batcher.hpp"

namespace loom::infer {

namespace detail {

// Stage 0's completions to every rank: [finish, length] per request, then the tokens.
inline std::vector<Completion> broadcast_completions(comm::AnyComm& pp, std::vector<Completion> done,
                                                     std::size_t requests) {
    std::vector<std::int32_t> packed;
    if (pp.rank() == 0)
        for (const Completion& c : done) packed.insert(packed.end(), {static_cast<std::int32_t>(c.finish),
                                                                      static_cast<std::int32_t>(c.tokens.size())});
    if (pp.rank() == 0)
        for (const Completion& c : done) packed.insert(packed.end(), c.tokens.begin(), c.tokens.end());
    std::int32_t size = static_cast<std::int32_t>(packed.size());
    pp.broadcast(Tensor::of(&size, Shape{1}), 0);
    packed.resize(static_cast<std::size_t>(size));
    pp.broadcast(Tensor::of(packed.data(), Shape{size}), 0);
    if (pp.rank() == 0) return done;
    done.assign(requests, {});
    const std::int32_t* token = packed.data() + 2 * requests;
    for (std::size_t i = 0; i < requests; ++i) {
        done[i].finish = static_cast<Finish>(packed[2 * i]);
        done[i].tokens.assign(token, token + packed[2 * i + 1]);
        token += packed[2 * i + 1];
    }
    return done;
}

}  // namespace detail

// Runs the requests to completion on a pipeline: `engine` is this rank's
// stage (CachedGpt given pipeline_stage(config, pp.rank(), pp.size())),
// every rank calls it with the same requests and gets the same completions,
// which equal generate()'s on the whole model token for token. The cache's
// slots must be free; they are free again afterwards.
[[nodiscard]] inline std::vector<Completion> generate_pipelined(StageEngine& engine, comm::AnyComm& pp,
                                                                std::span<const Request> requests,
                                                                const PipelineOptions& options = {}) {
    const PipelineStage& where = engine.stage();
    LOOM_CHECK(where.stage == pp.rank() && where.stages == pp.size(), "generate_pipelined: the engine is stage ",
               where.stage, " of ", where.stages, " but this is rank ", pp.rank(), " of a pipeline of ", pp.size(),
               "; build rank r's engine for pipeline_stage(config, r, ", pp.size(), ")");
    const int groups = groups_in_flight(options, pp.size());
    LOOM_CHECK(groups >= 1, "generate_pipelined: groups = ", options.groups,
               " is not valid; give at least 1 group in flight (0: one more than the stages, ", pp.size() + 1, ")");
    LOOM_CHECK(options.prefill_tokens >= 0, "generate_pipelined: prefill_tokens = ", options.prefill_tokens,
               " is not valid; give the most prompt tokens a step admits, or 0 for no limit");
    if (pp.size() == 1) return generate(engine, requests);
    KvCache& cache = engine.cache();
    LOOM_CHECK(!requests.empty(), "generate_pipelined: no requests");
    for (std::size_t i = 0; i < requests.size(); ++i) {  // every rank checks every request before any runs
        check_request(requests[i], i, cache.capacity());
        const std::int64_t blocks = cache.blocks_for(positions_needed(requests[i]));
        LOOM_CHECK(blocks <= cache.blocks(), "generate_pipelined: request ", i, " needs ", blocks, " blocks of ",
                   cache.block_size(), " positions but the cache has ", cache.blocks(), "; build it with more blocks");
    }
    for (std::int64_t s = 0; s < cache.slots(); ++s)
        LOOM_CHECK(cache.length(s) == 0, "generate_pipelined: slot ", s, " of the cache holds ", cache.length(s),
                   " positions; release it first");
    struct ReleaseAll {  // however the run ends
        KvCache& cache;
        ~ReleaseAll() {
            for (std::int64_t s = 0; s < cache.slots(); ++s) cache.release(s);
        }
    } release_all{cache};
    std::vector<Completion> done;
    if (pp.rank() == 0) {
        // Stage 0 is a PipelinedBatcher given every request at once: ids are the requests' indices.
        done.resize(requests.size());
        PipelinedBatcher batcher(engine, pp,
                                 {.groups = groups, .trace = options.trace, .prefill_tokens = options.prefill_tokens});
        for (const Request& request : requests) (void)batcher.submit(request);
        while (!batcher.idle()) {
            const std::span<const PipelinedBatcher::Event> events = batcher.step();
            LOOM_CHECK(!events.empty(), "generate_pipelined: a step reported no tokens while requests remain; this is a bug");
            for (const PipelinedBatcher::Event& e : events) {
                Completion& c = done[static_cast<std::size_t>(e.id)];
                c.tokens.push_back(e.token);
                if (e.finish) c.finish = *e.finish;
            }
        }
        batcher.close();  // the later stages return; a failure here is thrown, not swallowed by the destructor
    } else {
        detail::run_later_stage(engine, pp, options.trace);
    }
    return detail::broadcast_completions(pp, std::move(done), requests.size());
}

// The one-call form: `stage_model` is this rank's (make_stage_model, bound,
// load_stage_values), with a cache of its own shaped as generate()'s
// (cache_shape_for: max_batch slots, 0 for one per request).
[[nodiscard]] inline std::vector<Completion> generate_pipelined(gpt::Model& stage_model, const gpt::Config& config,
                                                                comm::AnyComm& pp, std::span<const Request> requests,
                                                                std::int64_t max_batch = 0,
                                                                const PipelineOptions& options = {}) {
    const PipelineStage where = pipeline_stage(config, pp.rank(), pp.size());
    const CacheShape shape = cache_shape_for(config, requests, max_batch);
    KvCache cache = pipeline_cache(config, where, shape.slots, shape.capacity);
    CachedGpt engine(stage_model, config, cache, where);
    return generate_pipelined(engine, pp, requests, options);
}

// The one-call form on a pipeline of tp groups: every stage is cut over
// `tp` (Megatron's cut, as tensor-parallel serving's), `pp` joins the ranks
// of one tp position across the stages. `stage_shard` is this rank's tp
// shard of its stage (make_stage_model, shard_for_serving, bound,
// load_stage_values). Each tp position runs its own pipeline; the scheduling
// is a function of the requests and the tokens, which every tp rank of the
// last stage gets as the same bits, so the pipelines stay in step and the
// stage's sums pair up.
[[nodiscard]] inline std::vector<Completion> generate_pipelined(gpt::Model& stage_shard, const gpt::Config& config,
                                                                comm::AnyComm& pp, comm::AnyComm& tp,
                                                                std::span<const Request> requests,
                                                                std::int64_t max_batch = 0,
                                                                const PipelineOptions& options = {}) {
    LOOM_CHECK(config.heads % tp.size() == 0, "generate_pipelined: a tp group of ", tp.size(),
               " ranks does not divide the ", config.heads, " heads; use a degree that divides ", config.heads);
    const PipelineStage where = pipeline_stage(config, pp.rank(), pp.size());
    const CacheShape shape = cache_shape_for(config, requests, max_batch);
    KvCache cache(where.count, config.width / tp.size(), shape.slots, shape.capacity);
    CachedGpt engine(stage_shard, config, cache, tp, where);
    return generate_pipelined(engine, pp, requests, options);
}

}  // namespace loom::infer
