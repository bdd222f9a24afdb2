// Generation with a KV cache: each request's prompt is prefilled once, then
// every step decodes one token for each request still running, reading its
// cached keys and values; prompts and decode tokens of different requests
// share one packed forward with no padding. A request ends at one of its stop
// tokens (kept as its last token) or after max_new_tokens; it leaves the
// batch at once and a waiting request takes its slot at the next step
// (continuous batching). Each request samples with its own Sampling (and
// seed): its tokens do not depend on what it is batched with.
//
// Not yet here (issue 39): preemption (swapping a sequence's blocks out when
// the pool runs short), parallel serving, a server.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/sampler.hpp"

namespace loom::infer {

struct Request {
    std::vector<std::int32_t> prompt;
    std::int64_t max_new_tokens = 16;       // the length limit: at most this many new tokens
    std::vector<std::int32_t> stop_tokens;  // generating any of these ends the request
    Sampling sampling{};
};

enum class Finish : std::uint8_t {
    length,  // max_new_tokens were generated
    stop,    // a stop token was generated (it is the last token)
};

struct Completion {
    std::vector<std::int32_t> tokens;  // the new tokens only
    Finish finish = Finish::length;
};

// Positions a request occupies in the cache: the prompt and every new token
// but the last (which is returned, never fed back).
[[nodiscard]] inline std::int64_t positions_needed(const Request& request) {
    return static_cast<std::int64_t>(request.prompt.size()) + request.max_new_tokens - 1;
}

inline void check_request(const Request& request, std::size_t index, std::int64_t capacity) {
    const auto prompt = static_cast<std::int64_t>(request.prompt.size());
    LOOM_CHECK(prompt >= 1, "generate: request ", index, " has an empty prompt; give at least one token");
    LOOM_CHECK(prompt <= capacity, "generate: request ", index, "'s prompt of ", prompt,
               " tokens is longer than the cache's ", capacity, " positions per sequence");
    LOOM_CHECK(request.max_new_tokens >= 1, "generate: request ", index, " asks for max_new_tokens = ",
               request.max_new_tokens, "; ask for at least 1");
    LOOM_CHECK(positions_needed(request) <= capacity, "generate: request ", index, " needs ",
               positions_needed(request), " cached positions (a prompt of ", prompt, " and ", request.max_new_tokens,
               " new tokens, the last never cached) but the cache holds ", capacity, " per sequence");
    request.sampling.validate();
}

// Runs the requests to completion on `engine`, continuously batched: as
// many run at once as the cache has slots and blocks for, the rest wait in
// order, and a slot a request leaves is refilled at the next step (the newcomer's prompt
// is prefilled in the same forward as the others' decode tokens). The cache's
// slots must be free; they are free again afterwards, even on an error.
[[nodiscard]] inline std::vector<Completion> generate(CachedGpt& engine, std::span<const Request> requests) {
    KvCache& cache = engine.cache();
    LOOM_CHECK(!requests.empty(), "generate: no requests");
    std::vector<std::int64_t> blocks_needed;  // each request's whole need, held back for it while it runs
    for (std::size_t i = 0; i < requests.size(); ++i) {
        check_request(requests[i], i, cache.capacity());
        blocks_needed.push_back(cache.blocks_for(positions_needed(requests[i])));
        LOOM_CHECK(blocks_needed.back() <= cache.blocks(), "generate: request ", i, " needs ", blocks_needed.back(),
                   " blocks of ", cache.block_size(), " positions but the cache has ", cache.blocks(),
                   "; build it with more blocks");
    }
    for (std::int64_t s = 0; s < cache.slots(); ++s)
        LOOM_CHECK(cache.length(s) == 0, "generate: slot ", s, " of the cache holds ", cache.length(s),
                   " positions; release it first");
    struct Release {  // the slots are free again however generate ends
        KvCache& cache;
        ~Release() {
            for (std::int64_t s = 0; s < cache.slots(); ++s) cache.release(s);
        }
    } release{cache};

    std::vector<Completion> done(requests.size());
    Sampler sampler;
    // Takes request i's next token from its logits; true while it goes on.
    const auto next = [&](std::size_t i, std::span<const float> logits) {
        const Request& r = requests[i];
        Completion& c = done[i];
        const std::int32_t token = sampler.pick(logits, r.sampling, c.tokens.size());
        c.tokens.push_back(token);
        if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), token) != r.stop_tokens.end()) {
            c.finish = Finish::stop;
            return false;
        }
        c.finish = Finish::length;
        return static_cast<std::int64_t>(c.tokens.size()) < r.max_new_tokens;
    };

    struct Running {
        std::int64_t slot;
        std::size_t request;
    };
    std::vector<Running> running, still;
    std::vector<std::int64_t> free_slots;  // popped from the back: slot 0 first
    for (std::int64_t s = cache.slots() - 1; s >= 0; --s) free_slots.push_back(s);
    std::size_t waiting = 0;   // requests [waiting, n) have not started
    std::int64_t promised = 0;  // blocks the running requests may still take, with those they hold
    std::vector<Segment> segments;
    const auto V = static_cast<std::size_t>(engine.config().vocab);
    while (!running.empty() || waiting < requests.size()) {
        segments.clear();
        for (const Running& r : running) segments.push_back({r.slot, std::span(&done[r.request].tokens.back(), 1)});
        // A request starts when a slot is free and the blocks it will need at
        // its longest are not promised to the running ones: no request can run
        // out of blocks halfway.
        while (waiting < requests.size() && !free_slots.empty() &&
               promised + blocks_needed[waiting] <= cache.blocks()) {
            promised += blocks_needed[waiting];
            running.push_back({free_slots.back(), waiting});
            free_slots.pop_back();
            segments.push_back({running.back().slot, requests[waiting].prompt});
            ++waiting;
        }
        const std::span<const float> logits = engine.forward(segments);
        still.clear();
        for (std::size_t j = 0; j < running.size(); ++j) {
            if (next(running[j].request, logits.subspan(j * V, V))) {
                still.push_back(running[j]);
            } else {
                cache.release(running[j].slot);
                promised -= blocks_needed[running[j].request];
                free_slots.push_back(running[j].slot);
            }
        }
        running.swap(still);
    }
    return done;
}

// The same on a cache of its own: `max_batch` slots (0: one per request),
// as many positions as the longest request needs. The one-call form.
[[nodiscard]] inline std::vector<Completion> generate(gpt::Model& model, const gpt::Config& config,
                                                      std::span<const Request> requests, std::int64_t max_batch = 0) {
    LOOM_CHECK(!requests.empty(), "generate: no requests");
    LOOM_CHECK(max_batch >= 0, "generate: max_batch = ", max_batch, " must be >= 0 (0: every request at once)");
    std::int64_t capacity = 1;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        check_request(requests[i], i, config.seq);
        capacity = std::max(capacity, positions_needed(requests[i]));
    }
    const auto n = static_cast<std::int64_t>(requests.size());
    KvCache cache(config.layers, config.width, max_batch == 0 ? n : std::min(max_batch, n), capacity);
    CachedGpt engine(model, config, cache);
    return generate(engine, requests);
}

}  // namespace loom::infer
