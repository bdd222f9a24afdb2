// What continuous batching (infer/batcher.hpp, infer/generate.hpp) needs of a
// model: a KV cache and a forward over packed segments that appends to it and
// returns logits. loom's GPT (infer/cached_gpt.hpp) and any model composed
// from loom's layers (infer/cached_model.hpp) are engines; the Batcher steps
// either through this one interface, one virtual call per step.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/tree_attention.hpp"

namespace loom::infer {

// New tokens of one sequence slot, at positions cache.length(slot) onwards.
// With `parents` (one per token) they are a tree's nodes instead: node j's
// parent is node parents[j] < j, or -1 for the last cached position; it sits
// at position cache.length(slot) + its depth and sees only the cached prefix,
// its ancestors and itself. Its K/V row is still cached at length + j.
struct Segment {
    std::int64_t slot = 0;
    std::span<const std::int32_t> tokens;
    std::span<const std::int32_t> parents = {};  // empty: a chain, token j after token j - 1
};

// The arithmetic an engine has done since it was built (or reset_work()),
// counted where it is issued: what the padding-removal check of issue 39
// compares with the packed tokens' own work. A multiply-add is 2 FLOPs.
struct WorkCount {
    std::int64_t linear_rows = 0;      // rows through the Linears of every block (each row once per layer)
    std::int64_t linear_flops = 0;     // 2 x rows x in x out over every Linear and the head
    std::int64_t attention_pairs = 0;  // (query, key) pairs per head that attention used, masked ones left out
    std::int64_t attention_flops = 0;  // 4 x head dim per pair and head: q.k and the weighted sum of v
};

// Which positions' logits forward() forms.
enum class Logits : std::uint8_t {
    last,   // each segment's last position: [segments, vocab]
    every,  // every position of every segment, packed in segment order: [tokens, vocab]
};

// Refuses segments a forward cannot run, before any slot grows: `who` (the
// engine's name) starts each message. `seen` and `depths` are scratch.
inline void check_segments(std::string_view who, const KvCache& cache, std::span<const Segment> segments,
                           std::int64_t vocab, std::vector<bool>& seen, std::vector<std::int64_t>& depths) {
    LOOM_CHECK(!segments.empty(), who, ": forward of no segments; pass at least one");
    seen.assign(static_cast<std::size_t>(cache.slots()), false);
    std::int64_t more_blocks = 0;  // checked for all segments first, so no slot grows unless all do
    for (const Segment& s : segments) {
        LOOM_CHECK(s.slot >= 0 && s.slot < cache.slots(), who, ": slot ", s.slot, " is not in [0, ", cache.slots(),
                   ")");
        LOOM_CHECK(!seen[static_cast<std::size_t>(s.slot)], who, ": slot ", s.slot,
                   " appears twice in one forward; give each sequence one segment");
        seen[static_cast<std::size_t>(s.slot)] = true;
        LOOM_CHECK(!s.tokens.empty(), who, ": an empty segment for slot ", s.slot,
                   "; every segment needs at least one token");
        const std::int64_t held = cache.length(s.slot), count = static_cast<std::int64_t>(s.tokens.size());
        LOOM_CHECK(s.parents.empty() || s.parents.size() == s.tokens.size(), who, ": the tree of slot ", s.slot,
                   " has ", s.tokens.size(), " tokens but ", s.parents.size(),
                   " parents; give one parent per token (or none for a chain)");
        if (!s.parents.empty()) tree_depths(s.parents, depths);
        LOOM_CHECK(count <= cache.capacity() - held, who, ": slot ", s.slot, " holds ", held, " positions and ", count,
                   " more would exceed the cache's capacity of ", cache.capacity(),
                   "; shorten the prompt or the generation");
        const auto holding = static_cast<std::int64_t>(cache.block_table(s.slot).size());
        more_blocks += cache.blocks_for(held + count) - holding;
        for (std::size_t t = 0; t < s.tokens.size(); ++t)
            LOOM_CHECK(s.tokens[t] >= 0 && s.tokens[t] < vocab, who, ": token id ", s.tokens[t], " at position ",
                       held + static_cast<std::int64_t>(t), " of slot ", s.slot, " is outside the vocabulary [0, ",
                       vocab, ")");
    }
    LOOM_CHECK(more_blocks <= cache.free_blocks(), who, ": this forward needs ", more_blocks, " more blocks of ",
               cache.block_size(), " positions but ", cache.free_blocks(), " of the ", cache.blocks(),
               " are free; release a sequence or build the cache with more blocks");
}

class Engine {
public:
    Engine() = default;
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;
    virtual ~Engine() = default;

    // The keys and values this engine appends to, one slot per sequence.
    [[nodiscard]] virtual KvCache& cache() = 0;
    // The logits' width: the model's vocabulary.
    [[nodiscard]] virtual std::int64_t vocab() const = 0;
    // Runs the segments (each slot at most once, at least one token each),
    // appends their keys and values to the cache, and returns the logits:
    // [segments, vocab] for Logits::last, [total tokens, vocab] for
    // Logits::every, row-major, valid until the next call.
    virtual std::span<const float> forward(std::span<const Segment> segments, Logits which) = 0;
    std::span<const float> forward(std::span<const Segment> segments) { return forward(segments, Logits::last); }
};

}  // namespace loom::infer
