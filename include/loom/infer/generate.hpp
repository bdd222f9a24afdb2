// Generation with a KV cache: each request's prompt is prefilled once, then
// every step decodes one token for each request still running, reading its
// cached keys and values; prompts and decode tokens of different requests
// share one packed forward with no padding. A request ends at one of its stop
// tokens (kept as its last token) or after max_new_tokens; it leaves the
// batch at once and a waiting request takes its slot at the next step
// (continuous batching). Each request samples with its own Sampling (and
// seed): its tokens do not depend on what it is batched with.
//
// The stepping itself is infer/batcher.hpp's Batcher, which a server feeds
// while requests run. Not yet here (issue 39): preemption (swapping a
// sequence's blocks out when the pool runs short), parallel serving.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/sampler.hpp"

namespace loom::infer {

struct Completion {
    std::vector<std::int32_t> tokens;  // the new tokens only
    Finish finish = Finish::length;
};

// Runs the requests to completion on `engine`, continuously batched: as
// many run at once as the cache has slots and blocks for, the rest wait in
// order, and a slot a request leaves is refilled at the next step (the newcomer's prompt
// is prefilled in the same forward as the others' decode tokens). The cache's
// slots must be free; they are free again afterwards, even on an error.
[[nodiscard]] inline std::vector<Completion> generate(Engine& engine, std::span<const Request> requests) {
    KvCache& cache = engine.cache();
    LOOM_CHECK(!requests.empty(), "generate: no requests");
    for (std::size_t i = 0; i < requests.size(); ++i) {  // every request checked before any runs
        check_request(requests[i], i, cache.capacity());
        const std::int64_t blocks = cache.blocks_for(positions_needed(requests[i]));
        LOOM_CHECK(blocks <= cache.blocks(), "generate: request ", i, " needs ", blocks,
                   " blocks of ", cache.block_size(), " positions but the cache has ", cache.blocks(),
                   "; build it with more blocks");
    }
    for (std::int64_t s = 0; s < cache.slots(); ++s)
        LOOM_CHECK(cache.length(s) == 0, "generate: slot ", s, " of the cache holds ", cache.length(s),
                   " positions; release it first");
    Batcher batcher(engine);  // frees the slots however generate ends
    for (const Request& r : requests) (void)batcher.submit(r);  // ids 0, 1, ...: the requests' indices
    std::vector<Completion> done(requests.size());
    while (!batcher.idle()) {
        for (const Batcher::Event& e : batcher.step()) {
            Completion& c = done[static_cast<std::size_t>(e.id)];
            c.tokens.push_back(e.token);
            if (e.finish) c.finish = *e.finish;
        }
    }
    return done;
}

// The cache the one-call forms build: `max_batch` slots (0: one per
// request), as many positions as the longest request needs; each request
// checked against the model's `seq` positions.
struct CacheShape {
    std::int64_t slots = 1, capacity = 1;
};
[[nodiscard]] inline CacheShape cache_shape_for(const gpt::Config& config, std::span<const Request> requests,
                                                std::int64_t max_batch) {
    LOOM_CHECK(!requests.empty(), "generate: no requests");
    LOOM_CHECK(max_batch >= 0, "generate: max_batch = ", max_batch, " must be >= 0 (0: every request at once)");
    CacheShape shape;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        check_request(requests[i], i, config.seq);
        shape.capacity = std::max(shape.capacity, positions_needed(requests[i]));
    }
    const auto n = static_cast<std::int64_t>(requests.size());
    shape.slots = max_batch == 0 ? n : std::min(max_batch, n);
    return shape;
}

// The same on a cache of its own (cache_shape_for). The one-call form.
[[nodiscard]] inline std::vector<Completion> generate(gpt::Model& model, const gpt::Config& config,
                                                      std::span<const Request> requests, std::int64_t max_batch = 0) {
    const CacheShape shape = cache_shape_for(config, requests, max_batch);
    KvCache cache(config.layers, config.width, shape.slots, shape.capacity);
    CachedGpt engine(model, config, cache);
    return generate(engine, requests);
}

}  // namespace loom::infer
