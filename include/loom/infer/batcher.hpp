// Continuous batching one step at a time: requests are submitted whenever
// they arrive, each step() runs one packed forward (the running requests'
// decode tokens and the prompts of those that start now) and reports, per
// running request, the token it produced and whether it finished. A request
// that finishes (or is cancelled) leaves its slot at once, and the oldest
// waiting request takes it at the next step. generate() (infer/generate.hpp)
// is a loop over this; a server (examples/serve_gpt.cpp) feeds it from
// HTTP connections between steps.
//
// Single-threaded by design: a caller that takes requests from other threads
// queues them and calls submit/cancel/step from one thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/infer/engine.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/request_queue.hpp"
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

// Positions a request occupies in the cache: the prompt and every new token
// but the last (which is returned, never fed back).
[[nodiscard]] inline std::int64_t positions_needed(const Request& request) {
    return static_cast<std::int64_t>(request.prompt.size()) + request.max_new_tokens - 1;
}

// Refuses a request a cache of `capacity` positions per sequence cannot run;
// `who` starts each message ("generate: request 3").
inline void check_request(const Request& request, std::string_view who, std::int64_t capacity) {
    const auto prompt = static_cast<std::int64_t>(request.prompt.size());
    LOOM_CHECK(prompt >= 1, who, " has an empty prompt; give at least one token");
    LOOM_CHECK(prompt <= capacity, who, "'s prompt of ", prompt, " tokens is longer than the cache's ", capacity,
               " positions per sequence");
    LOOM_CHECK(request.max_new_tokens >= 1, who, " asks for max_new_tokens = ", request.max_new_tokens,
               "; ask for at least 1");
    LOOM_CHECK(positions_needed(request) <= capacity, who, " needs ", positions_needed(request),
               " cached positions (a prompt of ", prompt, " and ", request.max_new_tokens,
               " new tokens, the last never cached) but the cache holds ", capacity, " per sequence");
    request.sampling.validate();
}

inline void check_request(const Request& request, std::size_t index, std::int64_t capacity) {
    check_request(request, "generate: request " + std::to_string(index), capacity);
}

class Batcher {
public:
    // What one request did in one step.
    struct Event {
        std::uint64_t id = 0;               // submit's id
        std::int32_t token = 0;             // its new token
        std::optional<Finish> finish;       // set on its last token
    };

    // Runs on `engine`'s cache, whose slots must be free; they are free again
    // when the Batcher is destroyed.
    explicit Batcher(Engine& engine) : engine_(engine), cache_(engine.cache()) {
        for (std::int64_t s = 0; s < cache_.slots(); ++s)
            LOOM_CHECK(cache_.length(s) == 0, "Batcher: slot ", s, " of the cache holds ", cache_.length(s),
                       " positions; release it first");
        for (std::int64_t s = cache_.slots() - 1; s >= 0; --s) free_slots_.push_back(s);
    }
    Batcher(const Batcher&) = delete;
    Batcher& operator=(const Batcher&) = delete;
    ~Batcher() {
        for (std::int64_t s = 0; s < cache_.slots(); ++s) cache_.release(s);
    }

    // Queues a request (it starts at a step when a slot and its blocks are
    // free, after those submitted before it); returns its id, 0, 1, 2, ...
    // in submission order. A request the cache can never run is refused here.
    std::uint64_t submit(Request request) {
        const std::uint64_t id = next_id_;
        const std::string who = "Batcher: request " + std::to_string(id);
        check_request(request, who, cache_.capacity());
        const std::int64_t blocks = cache_.blocks_for(positions_needed(request));
        LOOM_CHECK(blocks <= cache_.blocks(), who, " needs ", blocks, " blocks of ", cache_.block_size(),
                   " positions but the cache has ", cache_.blocks(), "; build it with more blocks");
        ++next_id_;
        queue_.waiting.push_back({id, std::move(request), blocks, -1, {}});
        return id;
    }

    // Drops a waiting or running request (a running one frees its slot at
    // once); false if `id` is neither (finished, cancelled or never given).
    bool cancel(std::uint64_t id) {
        return queue_.cancel(id, [this](const Entry& e) { leave(e); });
    }

    [[nodiscard]] bool idle() const noexcept { return queue_.idle(); }
    [[nodiscard]] std::size_t running() const noexcept { return queue_.running.size(); }
    [[nodiscard]] std::size_t waiting() const noexcept { return queue_.waiting.size(); }

    // One packed forward: a token for every running request and for every
    // waiting one that starts now (in that order). Finished requests leave.
    // Valid until the next call; empty when idle.
    std::span<const Event> step() {
        events_.clear();
        segments_.clear();
        for (const Entry& r : queue_.running) segments_.push_back({r.slot, std::span(&r.tokens.back(), 1)});
        // A request starts when a slot is free and the blocks it will need at
        // its longest are not promised to the running ones: no request can run
        // out of blocks halfway.
        while (!queue_.waiting.empty() && !free_slots_.empty() && promised_ + queue_.waiting.front().blocks <= cache_.blocks()) {
            Entry& e = queue_.running.emplace_back(std::move(queue_.waiting.front()));
            queue_.waiting.pop_front();
            promised_ += e.blocks;
            e.slot = free_slots_.back();
            free_slots_.pop_back();
            segments_.push_back({e.slot, e.request.prompt});
        }
        if (queue_.running.empty()) return {};
        const std::span<const float> logits = engine_.forward(segments_);
        const auto V = static_cast<std::size_t>(engine_.vocab());
        still_.clear();
        for (std::size_t j = 0; j < queue_.running.size(); ++j) {
            Entry& e = queue_.running[j];
            const Request& r = e.request;
            const std::int32_t token = sampler_.pick(logits.subspan(j * V, V), r.sampling, e.tokens.size());
            e.tokens.push_back(token);
            Event& event = events_.emplace_back(Event{e.id, token, std::nullopt});
            if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), token) != r.stop_tokens.end())
                event.finish = Finish::stop;
            else if (static_cast<std::int64_t>(e.tokens.size()) >= r.max_new_tokens)
                event.finish = Finish::length;
            if (event.finish) leave(e);
            else still_.push_back(std::move(e));
        }
        queue_.running.swap(still_);
        return events_;
    }

private:
    struct Entry {
        std::uint64_t id;
        Request request;
        std::int64_t blocks;                // its whole need, held back for it while it runs
        std::int64_t slot;                  // -1 while waiting
        std::vector<std::int32_t> tokens;   // the new ones so far
    };

    void leave(const Entry& e) {
        cache_.release(e.slot);
        promised_ -= e.blocks;
        free_slots_.push_back(e.slot);
    }

    Engine& engine_;
    KvCache& cache_;
    Sampler sampler_;
    std::uint64_t next_id_ = 0;
    RequestQueue<Entry> queue_;
    std::vector<Entry> still_;  // step()'s: the running requests that go on
    std::vector<std::int64_t> free_slots_;  // popped from the back: slot 0 first
    std::int64_t promised_ = 0;             // blocks the running requests may still take, with those they hold
    std::vector<Segment> segments_;
    std::vector<Event> events_;
};

}  // namespace loom::infer
