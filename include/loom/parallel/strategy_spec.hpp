// StrategySpec: one strategy as one value. Strategy<Ps...> yields it at
// compile time (Strategy<...>::spec), parse_strategy reads it from the text it
// prints (parallel/strategy_text.hpp), and the executor runs it: the same
// value whether a user wrote the type, typed a command line, or the planner
// chose it. It compares, hashes and prints; its rules are strategy_rules.hpp's
// sentences, which the policy types check with static_assert and validate()
// throws at run time. Degrees (how many ranks on each axis) are not part of
// it: they come from the mesh.
//
//   constexpr auto spec = loom::Strategy<loom::DataParallel<>, loom::ZeroShard<1>>::spec;
//   std::cout << spec;   // Strategy<DataParallel<bucket 2 MiB>, ZeroShard<1>>
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <sstream>
#include <string>

#include "loom/core/error.hpp"
#include "loom/nn/sequence_layout.hpp"
#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/grad_compress.hpp"
#include "loom/parallel/pipeline.hpp"
#include "loom/parallel/placement.hpp"
#include "loom/parallel/recompute.hpp"
#include "loom/parallel/strategy_rules.hpp"

namespace loom {

// Chunks per rank a schedule runs; 0 for Interleaved<V>, which chooses V.
[[nodiscard]] constexpr int fixed_chunks(ScheduleKind kind) noexcept {
    switch (kind) {
        case ScheduleKind::interleaved: return 0;
        case ScheduleKind::zero_bubble_v: return 2;
        default: return 1;
    }
}

// The fields keep the order (and names) of the executor's former
// ExecutionPlan, so `ExecutionPlan{stage, bucket}` still reads the same.
// Fields a policy does not use keep their defaults (no pipeline: 1F1B with one
// chunk; no sequence parallelism: ring, zigzag, 1), so equal strategies are
// equal values.
struct StrategySpec {
    int zero_stage = 0;                                    // ZeroShard<S>; 0: plain DataParallel
    std::int64_t bucket_bytes = default_bucket_bytes;      // DataParallel<BucketBytes<N>>
    bool pipelined = false;                                // Pipeline<Schedule>
    ScheduleKind schedule = ScheduleKind::one_f_one_b;
    int chunks = 1;                                        // per rank: Interleaved<V>'s V, ZB-V's 2
    bool tensor_parallel = false;                          // TensorParallel or Optimus2D
    bool tensor_grid = false;                              // Optimus2D: the tp axis is a q x q grid
    bool sequence_parallel = false;                        // SequenceParallel<Attention, Layout>
    nn::SequenceAttention sequence_attention = nn::SequenceAttention::ring;
    bool sequence_zigzag = true;
    int sequence_ulysses = 1;                              // UlyssesRing<K>: K; Ulysses: 0 (every sp rank)
    Compression dp_compression{};                          // GradCompress<C> (DpAxis): the gradient exchange
    Compression pp_compression{};                          // GradCompress<Cast, PpAxis>: stage messages
    Compression tp_compression{};                          // GradCompress<Cast, TpAxis>: the f/g all-reduces
    RecomputeSpec recompute{};                             // Recompute<Full | Selective | Budget<Bytes>>

    // What each rank keeps whole and what it keeps only its dp block of.
    [[nodiscard]] constexpr parallel::Placement placement() const { return parallel::zero_placement(zero_stage); }

    // The spec of a Strategy type (kept for ExecutionPlan::of<S>()).
    template <class S>
    [[nodiscard]] static constexpr StrategySpec of() noexcept {
        return S::spec;
    }

    // The run-time checks of what the policy types check at compile time,
    // with the same sentences (a spec built field by field, or from flags).
    void validate() const {
        LOOM_CHECK(zero_stage >= 0 && zero_stage <= 3, LOOM_RULE_ZERO_STAGE_RANGE);
        LOOM_CHECK(bucket_bytes >= 1, LOOM_RULE_BUCKET_BYTES);
        if (pipelined && schedule == ScheduleKind::interleaved) LOOM_CHECK(chunks >= 2, LOOM_RULE_INTERLEAVED_CHUNKS);
        if (pipelined && schedule != ScheduleKind::interleaved)
            LOOM_CHECK(chunks == fixed_chunks(schedule), LOOM_RULE_SCHEDULE_CHUNKS);
        if (sequence_parallel && sequence_attention == nn::SequenceAttention::hybrid)
            LOOM_CHECK(sequence_ulysses >= 2, LOOM_RULE_ULYSSES_GROUP);
        LOOM_CHECK(!pp_compression.on() || pp_compression.is_cast(), LOOM_RULE_ACTIVATION_CAST);
        LOOM_CHECK(!tp_compression.on() || tp_compression.is_cast(), LOOM_RULE_ACTIVATION_CAST);
        dp_compression.validate();
        if (recompute.mode == RecomputeMode::budget) LOOM_CHECK(recompute.budget_bytes >= 1, LOOM_RULE_RECOMPUTE_BUDGET);
    }

    friend constexpr bool operator==(const StrategySpec&, const StrategySpec&) = default;

    // Exactly what the Strategy type with these policies prints, in the
    // canonical order: DataParallel, Pipeline, the tensor policy, the
    // sequence policy, ZeroShard, the compressors of dp, pp and tp, then
    // Recompute.
    friend std::ostream& operator<<(std::ostream& out, const StrategySpec& s) {
        out << "Strategy<DataParallel<bucket " << bucket_size_text(s.bucket_bytes) << ">";
        if (s.pipelined) {
            out << ", Pipeline<";
            if (s.schedule == ScheduleKind::interleaved) out << "Interleaved<" << s.chunks << ">";
            else out << name(s.schedule);
            out << ">";
        }
        if (s.tensor_parallel) out << (s.tensor_grid ? ", Optimus2D" : ", TensorParallel");
        if (s.sequence_parallel) {
            out << ", SequenceParallel<";
            switch (s.sequence_attention) {
                case nn::SequenceAttention::ring: out << "RingAttention"; break;
                case nn::SequenceAttention::ulysses: out << "Ulysses"; break;
                case nn::SequenceAttention::hybrid: out << "UlyssesRing<" << s.sequence_ulysses << ">"; break;
            }
            out << (s.sequence_zigzag ? "" : ", Contiguous") << ">";
        }
        if (s.zero_stage > 0) out << ", ZeroShard<" << s.zero_stage << ">";
        if (s.dp_compression.on()) out << ", GradCompress<" << s.dp_compression.describe() << ">";
        if (s.pp_compression.on()) out << ", GradCompress<" << s.pp_compression.describe() << ", PpAxis>";
        if (s.tp_compression.on()) out << ", GradCompress<" << s.tp_compression.describe() << ", TpAxis>";
        if (s.recompute.on()) out << ", Recompute<" << s.recompute.describe() << ">";
        return out << ">";
    }
    [[nodiscard]] std::string text() const {
        std::ostringstream out;
        out << *this;
        return out.str();
    }
};

}  // namespace loom

// Strategies as keys (a cache of compiled step programs, a planner's seen set).
template <>
struct std::hash<loom::StrategySpec> {
    [[nodiscard]] std::size_t operator()(const loom::StrategySpec& s) const noexcept {
        std::size_t h = 0;
        const auto mix = [&h](auto value) {
            h ^= std::hash<decltype(value)>{}(value) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
        };
        mix(s.zero_stage);
        mix(s.bucket_bytes);
        mix(s.pipelined);
        mix(static_cast<int>(s.schedule));
        mix(s.chunks);
        mix(s.tensor_parallel);
        mix(s.tensor_grid);
        mix(s.sequence_parallel);
        mix(static_cast<int>(s.sequence_attention));
        mix(s.sequence_zigzag);
        mix(s.sequence_ulysses);
        for (const loom::Compression& c : {s.dp_compression, s.pp_compression, s.tp_compression}) {
            mix(static_cast<int>(c.kind));
            mix(c.ratio);
            mix(c.rank);
            mix(c.block);
        }
        mix(static_cast<int>(s.recompute.mode));
        mix(s.recompute.budget_bytes);
        return h;
    }
};
