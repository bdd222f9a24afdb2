// What speculative decoding (infer/speculative_batcher.hpp) needs of a draft:
// its vocabulary, its own KvCache, and a forward over chain segments that
// appends to that cache and returns each segment's last logits. A plain draft
// is any Engine (PlainDraft wraps one): loom's GPT (CachedGpt) or a user's
// model (CachedModel, infer/cached_model.hpp); GliDe's draft (infer/cached_glide.hpp)
// also reads the target's cache, which it names in reads(), so the batcher
// can check that it is the cache of the target it verifies with.
#pragma once

#include <cstdint>
#include <span>

#include "loom/infer/engine.hpp"
#include "loom/infer/kv_cache.hpp"

namespace loom::infer {

class DraftEngine {
public:
    DraftEngine() = default;
    DraftEngine(const DraftEngine&) = delete;
    DraftEngine& operator=(const DraftEngine&) = delete;
    virtual ~DraftEngine() = default;

    // The draft's vocabulary (it must be the target's).
    [[nodiscard]] virtual std::int64_t vocab() const = 0;
    // The draft's own keys and values, one slot per request (the slot it has in the target's cache).
    [[nodiscard]] virtual KvCache& cache() = 0;
    // Another model's cache this draft reads (GliDe: the target's), or null.
    [[nodiscard]] virtual const KvCache* reads() const { return nullptr; }
    // Runs chain segments (CachedGpt::forward's rules), appends their keys
    // and values to cache(), and returns the logits of each segment's last
    // token: [segments, vocab], valid until the next call.
    virtual std::span<const float> forward(std::span<const Segment> segments) = 0;
};

// A plain model as the draft: its engine (a CachedGpt, a CachedModel of a
// user's model, ...), referenced.
class PlainDraft final : public DraftEngine {
public:
    explicit PlainDraft(Engine& engine) : engine_(engine) {}
    [[nodiscard]] std::int64_t vocab() const override { return engine_.vocab(); }
    [[nodiscard]] KvCache& cache() override { return engine_.cache(); }
    std::span<const float> forward(std::span<const Segment> segments) override { return engine_.forward(segments); }

private:
    Engine& engine_;
};

}  // namespace loom::infer
