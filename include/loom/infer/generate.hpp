// Generation with a KV cache: each request's prompt is prefilled once (all
// prompts packed in one forward, no padding), then every step decodes one
// token for each request still running, reading its cached keys and values.
// A request ends at one of its stop tokens (which is kept as its last token)
// or after max_new_tokens; it leaves the batch at once, so later steps do no
// work for it. Each request samples with its own Sampling (and seed): its
// tokens are the same whatever it is batched with.
//
// Not yet here (issue 39): continuous batching (a finished request's slot
// refilled by a waiting one), the paged cache, parallel serving.
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

// Runs the requests to completion on `engine`, in slots 0..n-1 of its cache
// (which must be free; they are free again afterwards, even on an error).
[[nodiscard]] inline std::vector<Completion> generate(CachedGpt& engine, std::span<const Request> requests) {
    KvCache& cache = engine.cache();
    const auto n = static_cast<std::int64_t>(requests.size());
    LOOM_CHECK(n >= 1, "generate: no requests");
    LOOM_CHECK(n <= cache.slots(), "generate: ", n, " requests but the cache has ", cache.slots(),
               " slots; build it with one slot per request");
    for (std::size_t i = 0; i < requests.size(); ++i) {
        check_request(requests[i], i, cache.capacity());
        LOOM_CHECK(cache.length(static_cast<std::int64_t>(i)) == 0, "generate: slot ", i, " of the cache holds ",
                   cache.length(static_cast<std::int64_t>(i)), " positions; release it first");
    }
    struct Release {  // the slots are free again however generate ends
        KvCache& cache;
        std::int64_t n;
        ~Release() {
            for (std::int64_t s = 0; s < n; ++s) cache.release(s);
        }
    } release{cache, n};

    std::vector<Completion> done(requests.size());
    Sampler sampler;
    std::vector<std::int64_t> running;  // slots still generating, in request order
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

    std::vector<Segment> prompts;
    for (std::size_t i = 0; i < requests.size(); ++i)
        prompts.push_back({static_cast<std::int64_t>(i), requests[i].prompt});
    const auto V = static_cast<std::size_t>(engine.config().vocab);
    std::span<const float> logits = engine.forward(prompts);
    for (std::size_t i = 0; i < requests.size(); ++i)
        if (next(i, logits.subspan(i * V, V))) running.push_back(static_cast<std::int64_t>(i));

    std::vector<std::int32_t> fed;
    std::vector<std::int64_t> still;
    while (!running.empty()) {
        fed.clear();
        for (std::int64_t s : running) fed.push_back(done[static_cast<std::size_t>(s)].tokens.back());
        logits = engine.decode(running, fed);
        still.clear();
        for (std::size_t j = 0; j < running.size(); ++j)
            if (next(static_cast<std::size_t>(running[j]), logits.subspan(j * V, V))) still.push_back(running[j]);
        running.swap(still);
    }
    return done;
}

// The same on a cache of its own, sized to these requests (one slot each,
// as many positions as the longest needs): the one-call form.
[[nodiscard]] inline std::vector<Completion> generate(gpt::Model& model, const gpt::Config& config,
                                                      std::span<const Request> requests) {
    LOOM_CHECK(!requests.empty(), "generate: no requests");
    std::int64_t capacity = 1;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        check_request(requests[i], i, config.seq);
        capacity = std::max(capacity, positions_needed(requests[i]));
    }
    KvCache cache(config.layers, config.width, static_cast<std::int64_t>(requests.size()), capacity);
    CachedGpt engine(model, config, cache);
    return generate(engine, requests);
}

}  // namespace loom::infer
