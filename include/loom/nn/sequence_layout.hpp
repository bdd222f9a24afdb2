// SequenceLayout: which positions of each sequence an sp rank holds, when
// sequence parallelism splits every sequence of T tokens over the sp axis.
//
//   contiguous: N chunks of T/N; rank r holds chunk r.
//   zigzag:     2N chunks of T/(2N); rank r holds chunks r and 2N-1-r, in that
//               order. Under a causal mask chunk k attends to k+1 chunks'
//               worth of keys, so pairing an early chunk with a late one gives
//               every rank the same work (ring attention's load balance).
//
// A rank's tokens are the concatenation of its chunks, each a run of
// consecutive positions: layers that care about positions (the embedding's
// position table, attention's causal mask) work run by run.
#pragma once

#include <array>
#include <cstdint>
#include <ostream>

#include "loom/core/error.hpp"
#include "loom/nn/tensor_group.hpp"

namespace loom::nn {

// A run of a rank's tokens that are consecutive in the sequence.
struct SequenceRun {
    std::int64_t local = 0;     // first local index
    std::int64_t position = 0;  // its position in the sequence
    std::int64_t length = 0;
    int chunk = 0;              // which chunk of the sequence it is
};

struct SequenceLayout {
    int ranks = 1, rank = 0;
    bool zigzag = true;

    [[nodiscard]] int chunks() const noexcept { return zigzag ? 2 * ranks : ranks; }
    [[nodiscard]] int runs_per_rank() const noexcept { return zigzag ? 2 : 1; }
    // The chunks rank r holds, in its local order (the second is unused when contiguous).
    [[nodiscard]] std::array<int, 2> chunks_of(int r) const noexcept {
        return zigzag ? std::array<int, 2>{r, 2 * ranks - 1 - r} : std::array<int, 2>{r, -1};
    }

    // One line naming T, the chunks and the lengths that would split.
    void check(std::int64_t T) const {
        LOOM_CHECK(T % chunks() == 0, "sequence parallelism: a sequence of ", T, " tokens does not split into the ",
                   chunks(), " chunks of ", zigzag ? "the zigzag layout over " : "", ranks, " sp ranks",
                   zigzag ? " (2 x sp)" : "", "; use a sequence length that is a multiple of ", chunks());
    }
    [[nodiscard]] std::int64_t chunk_length(std::int64_t T) const {
        check(T);
        return T / chunks();
    }
    [[nodiscard]] std::int64_t local_tokens(std::int64_t T) const { return chunk_length(T) * runs_per_rank(); }

    // Rank r's runs for sequences of T tokens.
    [[nodiscard]] std::array<SequenceRun, 2> runs(std::int64_t T, int r) const {
        const std::int64_t c = chunk_length(T);
        const auto held = chunks_of(r);
        return {SequenceRun{0, held[0] * c, c, held[0]},
                zigzag ? SequenceRun{c, held[1] * c, c, held[1]} : SequenceRun{c, 0, 0, -1}};
    }
    [[nodiscard]] std::array<SequenceRun, 2> runs(std::int64_t T) const { return runs(T, rank); }

    // The position of local token t (of a sequence of T).
    [[nodiscard]] std::int64_t position(std::int64_t t, std::int64_t T) const {
        for (const SequenceRun& run : runs(T))
            if (t >= run.local && t < run.local + run.length) return run.position + t - run.local;
        LOOM_FAIL("sequence parallelism: local token ", t, " is outside this rank's ", local_tokens(T), " tokens");
    }

    friend std::ostream& operator<<(std::ostream& out, const SequenceLayout& l) {
        return out << (l.zigzag ? "zigzag" : "contiguous") << " over " << l.ranks << " sp ranks";
    }
};

// How attention reaches across the sp axis.
enum class SequenceAttention : std::uint8_t { ring, ulysses };

// What a Context tells its layers about sequence parallelism: the sp group
// (null: each rank holds whole sequences), the layout and the attention.
struct SequenceParallelism {
    const TensorGroup* group = nullptr;
    bool zigzag = true;
    SequenceAttention attention = SequenceAttention::ring;

    [[nodiscard]] bool active() const noexcept { return group != nullptr && group->size() > 1; }
    [[nodiscard]] SequenceLayout layout() const {
        return group == nullptr ? SequenceLayout{1, 0, false} : SequenceLayout{group->size(), group->rank(), zigzag};
    }
};

}  // namespace loom::nn
