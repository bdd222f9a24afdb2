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
//
// The hybrid (USP, arXiv 2405.07719): sp = u x R ranks, Ulysses groups of u
// consecutive ranks and R ring positions. The chunks are the ring's (2R in
// zigzag), and ring position g holds chunks g and 2R-1-g as above; within its
// Ulysses group each of the u members holds piece m of each of those chunks.
// Plain ring attention is u = 1; plain Ulysses is R = 1.
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
    int ulysses = 1;  // u: the Ulysses group size (1: plain ring; ranks: plain Ulysses)

    [[nodiscard]] int ring_ranks() const noexcept { return ranks / ulysses; }
    // The ring of Ulysses groups: rank r's group is its position on the ring.
    [[nodiscard]] SequenceLayout ring() const noexcept { return {ring_ranks(), rank / ulysses, zigzag, 1}; }
    [[nodiscard]] int chunks() const noexcept { return zigzag ? 2 * ring_ranks() : ring_ranks(); }
    [[nodiscard]] int runs_per_rank() const noexcept { return zigzag ? 2 : 1; }
    // The chunks ring position g holds, in its local order (the second is unused when contiguous).
    [[nodiscard]] std::array<int, 2> chunks_of(int g) const noexcept {
        return zigzag ? std::array<int, 2>{g, 2 * ring_ranks() - 1 - g} : std::array<int, 2>{g, -1};
    }

    // One line naming T, the chunks and the lengths that would split.
    void check(std::int64_t T) const {
        LOOM_CHECK(ulysses >= 1 && ranks % ulysses == 0, "sequence parallelism: a Ulysses degree of ", ulysses,
                   " does not divide the ", ranks, " sp ranks; use a divisor of ", ranks);
        const std::int64_t pieces = static_cast<std::int64_t>(chunks()) * ulysses;
        if (T % pieces == 0) return;
        if (ulysses == 1)
            LOOM_FAIL("sequence parallelism: a sequence of ", T, " tokens does not split into the ", chunks(),
                      " chunks of ", zigzag ? "the zigzag layout over " : "", ranks, " sp ranks",
                      zigzag ? " (2 x sp)" : "", "; use a sequence length that is a multiple of ", chunks());
        LOOM_FAIL("sequence parallelism: a sequence of ", T, " tokens does not split into ", chunks(),
                  " ring chunks of ", ulysses, " Ulysses pieces each; use a sequence length that is a multiple of ",
                  pieces);
    }
    [[nodiscard]] std::int64_t chunk_length(std::int64_t T) const {
        check(T);
        return T / chunks();
    }
    // The tokens of one chunk a rank holds: the whole chunk, or its Ulysses piece.
    [[nodiscard]] std::int64_t piece_length(std::int64_t T) const { return chunk_length(T) / ulysses; }
    [[nodiscard]] std::int64_t local_tokens(std::int64_t T) const { return piece_length(T) * runs_per_rank(); }

    // Rank r's runs for sequences of T tokens.
    [[nodiscard]] std::array<SequenceRun, 2> runs(std::int64_t T, int r) const {
        const std::int64_t c = chunk_length(T), piece = piece_length(T), m = r % ulysses;
        const auto held = chunks_of(r / ulysses);
        return {SequenceRun{0, held[0] * c + m * piece, piece, held[0]},
                zigzag ? SequenceRun{piece, held[1] * c + m * piece, piece, held[1]} : SequenceRun{piece, 0, 0, -1}};
    }
    [[nodiscard]] std::array<SequenceRun, 2> runs(std::int64_t T) const { return runs(T, rank); }

    // The position of local token t (of a sequence of T).
    [[nodiscard]] std::int64_t position(std::int64_t t, std::int64_t T) const {
        for (const SequenceRun& run : runs(T))
            if (t >= run.local && t < run.local + run.length) return run.position + t - run.local;
        LOOM_FAIL("sequence parallelism: local token ", t, " is outside this rank's ", local_tokens(T), " tokens");
    }

    friend std::ostream& operator<<(std::ostream& out, const SequenceLayout& l) {
        out << (l.zigzag ? "zigzag" : "contiguous") << " over " << l.ranks << " sp ranks";
        if (l.ulysses > 1) out << " (Ulysses groups of " << l.ulysses << ")";
        return out;
    }
};

// How attention reaches across the sp axis.
enum class SequenceAttention : std::uint8_t { ring, ulysses, hybrid };

// What a Context tells its layers about sequence parallelism: the sp group
// (null: each rank holds whole sequences), the layout and the attention.
struct SequenceParallelism {
    const TensorGroup* group = nullptr;
    bool zigzag = true;
    SequenceAttention attention = SequenceAttention::ring;
    int ulysses = 1;                            // the hybrid's Ulysses degree
    const TensorGroup* ulysses_group = nullptr;  // the hybrid's groups (consecutive sp ranks)
    const TensorGroup* ring_group = nullptr;     // and rings (strided)

    [[nodiscard]] bool active() const noexcept { return group != nullptr && group->size() > 1; }
    // Ulysses groups of: 1 (ring), every rank (Ulysses), or the hybrid's degree.
    [[nodiscard]] int ulysses_degree() const noexcept {
        if (group == nullptr) return 1;
        return attention == SequenceAttention::ring ? 1 : attention == SequenceAttention::ulysses ? group->size() : ulysses;
    }
    [[nodiscard]] SequenceLayout layout() const {
        return group == nullptr ? SequenceLayout{1, 0, false, 1}
                                : SequenceLayout{group->size(), group->rank(), zigzag, ulysses_degree()};
    }
};

}  // namespace loom::nn
