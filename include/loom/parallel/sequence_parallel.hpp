// SequenceParallel<Attention>: every sequence split over the sp axis, for
// sequences no single rank can hold. Each rank keeps some positions of every
// sequence (nn/sequence_layout.hpp: zigzag by default, so causal attention
// costs every rank the same) and runs everything outside attention on those
// tokens alone; attention reaches across the axis:
//
//   RingAttention  K/V blocks passed around the ring, each rank attending
//                  with its own queries to the resident block while the next
//                  is in flight, partial results merged by log-sum-exp
//                  (nn/ring_attention.hpp);
//   Ulysses        an all-to-all from sequence-sharded to head-sharded, whole
//                  sequences of heads/sp heads attended locally, and back;
//   UlyssesRing<K> the hybrid (USP): Ulysses within groups of K consecutive
//                  sp ranks, ring attention across the sp/K groups.
//
// The sp ranks' gradients are partial sums over their tokens, so they are
// reduced with the data-parallel ones: the executor's gradient axis is
// dp x sp, and ZeRO shards over it.
//
//   loom::Strategy<loom::DataParallel<>, loom::SequenceParallel<loom::RingAttention>>
#pragma once

#include <ostream>

#include "loom/nn/sequence_layout.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/strategy_rules.hpp"

namespace loom {

struct RingAttention {
    static constexpr nn::SequenceAttention attention = nn::SequenceAttention::ring;
    static constexpr int ulysses = 1;
    static void describe(std::ostream& out) { out << "RingAttention"; }
};

struct Ulysses {
    static constexpr nn::SequenceAttention attention = nn::SequenceAttention::ulysses;
    static constexpr int ulysses = 0;  // every sp rank
    static void describe(std::ostream& out) { out << "Ulysses"; }
};

template <int K>
struct UlyssesRing {
    static_assert(K >= 2, LOOM_RULE_ULYSSES_GROUP);
    static constexpr nn::SequenceAttention attention = nn::SequenceAttention::hybrid;
    static constexpr int ulysses = K;
    static void describe(std::ostream& out) { out << "UlyssesRing<" << K << ">"; }
};

// Layouts: Zigzag (rank r holds chunks r and 2N-1-r of 2N; the default) or
// Contiguous (rank r holds chunk r of N).
struct Zigzag {
    static constexpr bool zigzag = true;
};
struct Contiguous {
    static constexpr bool zigzag = false;
};

template <class Attention = RingAttention, class Layout = Zigzag>
struct SequenceParallel {
    static constexpr PolicyKind kind = PolicyKind::sequence_parallel;
    static constexpr nn::SequenceAttention attention = Attention::attention;
    static constexpr bool zigzag = Layout::zigzag;
    static constexpr int ulysses = Attention::ulysses;

    static void describe(std::ostream& out) {
        out << "SequenceParallel<";
        Attention::describe(out);
        out << (zigzag ? "" : ", Contiguous") << ">";
    }
};

}  // namespace loom
