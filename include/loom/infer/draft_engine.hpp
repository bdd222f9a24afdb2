// What speculative decoding (infer/speculative_batcher.hpp) needs of a draft:
// its shape, its own KvCache, and a forward over chain segments that appends
// to that cache and returns each segment's last logits. A plain GPT draft is
// a CachedGpt (PlainDraft wraps one); GliDe's draft (infer/cached_glide.hpp)
// also reads the target's cache, which it names in reads(), so the batcher
// can check that it is the cache of the target it verifies with.
#pragma once

#include <span>

#include "loom/gpt/model.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/kv_cache.hpp"

namespace loom::infer {

class DraftEngine {
public:
    DraftEngine() = default;
    DraftEngine(const DraftEngine&) = delete;
    DraftEngine& operator=(const DraftEngine&) = delete;
    virtual ~DraftEngine() = default;

    // The draft's shape (its vocabulary must be the target's).
    [[nodiscard]] virtual const gpt::Config& config() const = 0;
    // The draft's own keys and values, one slot per request (the slot it has in the target's cache).
    [[nodiscard]] virtual KvCache& cache() = 0;
    // Another model's cache this draft reads (GliDe: the target's), or null.
    [[nodiscard]] virtual const KvCache* reads() const { return nullptr; }
    // Runs chain segments (CachedGpt::forward's rules), appends their keys
    // and values to cache(), and returns the logits of each segment's last
    // token: [segments, vocab], valid until the next call.
    virtual std::span<const float> forward(std::span<const Segment> segments) = 0;
};

// A plain GPT as the draft: its CachedGpt, referenced.
class PlainDraft final : public DraftEngine {
public:
    explicit PlainDraft(CachedGpt& engine) : engine_(engine) {}
    [[nodiscard]] const gpt::Config& config() const override { return engine_.config(); }
    [[nodiscard]] KvCache& cache() override { return engine_.cache(); }
    std::span<const float> forward(std::span<const Segment> segments) override { return engine_.forward(segments); }

private:
    CachedGpt& engine_;
};

}  // namespace loom::infer
