// Pipeline<Schedule>: the model cut into stages along the pp axis, one stage
// (or several chunks, for interleaved and V schedules) per rank, micro-batches
// flowing through them in the order the schedule tag names. The tags only name
// the schedule; its per-rank programs come from schedule/pipeline.hpp, which
// reads `kind` and `chunks` off the tag.
//
//   using S = loom::Strategy<loom::Pipeline<loom::OneFOneB>>;   // Pipeline<1F1B>
#pragma once

#include <concepts>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>

#include "loom/core/error.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/strategy_rules.hpp"

namespace loom {

// Lives here, not in schedule/, so that policies can name a schedule while
// parallel/ stays below schedule/ in the include layering.
enum class ScheduleKind : std::uint8_t { gpipe, one_f_one_b, interleaved, zero_bubble_h1, zero_bubble_v };

// "GPipe", "1F1B", "Interleaved", "ZB-H1", "ZB-V".
[[nodiscard]] constexpr std::string_view name(ScheduleKind kind) {
    switch (kind) {
        case ScheduleKind::gpipe: return "GPipe";
        case ScheduleKind::one_f_one_b: return "1F1B";
        case ScheduleKind::interleaved: return "Interleaved";
        case ScheduleKind::zero_bubble_h1: return "ZB-H1";
        case ScheduleKind::zero_bubble_v: return "ZB-V";
    }
    return "?";
}

// All forwards, then all backwards: m micro-batches of activations in flight.
struct GPipe {
    static constexpr ScheduleKind kind = ScheduleKind::gpipe;
    static constexpr int chunks = 1;
    static void describe(std::ostream& out) { out << "GPipe"; }
};

// PipeDream-flush (Megatron's default): warm-up, one forward / one backward, drain.
struct OneFOneB {
    static constexpr ScheduleKind kind = ScheduleKind::one_f_one_b;
    static constexpr int chunks = 1;
    static void describe(std::ostream& out) { out << "1F1B"; }
};

// Megatron's interleaved 1F1B: V chunks per rank, virtual stage c*p + r on
// rank r; the bubble shrinks by V at V times the p2p traffic.
template <int V>
struct Interleaved {
    static_assert(V >= 2, LOOM_RULE_INTERLEAVED_CHUNKS);
    static constexpr ScheduleKind kind = ScheduleKind::interleaved;
    static constexpr int chunks = V;
    static void describe(std::ostream& out) { out << "Interleaved<" << V << ">"; }
};

// Zero Bubble H1 (arXiv 2401.10241): backward split into input and weight
// gradients, the weight gradients deferred into the bubbles, 1F1B's memory.
struct ZeroBubbleH1 {
    static constexpr ScheduleKind kind = ScheduleKind::zero_bubble_h1;
    static constexpr int chunks = 1;
    static void describe(std::ostream& out) { out << "ZB-H1"; }
};

// Zero Bubble V: two chunks per rank in a V (rank s holds virtual stages s and
// 2p-1-s), split backward; near-zero bubble at 1F1B's activation memory.
struct ZeroBubbleV {
    static constexpr ScheduleKind kind = ScheduleKind::zero_bubble_v;
    static constexpr int chunks = 2;
    static void describe(std::ostream& out) { out << "ZB-V"; }
};

// A pipeline schedule tag: a ScheduleKind, a chunk count and describe.
template <class S>
concept PipelineSchedule = requires(std::ostream& out) {
    { S::kind } -> std::convertible_to<ScheduleKind>;
    { S::chunks } -> std::convertible_to<int>;
    S::describe(out);
};

namespace detail {
// Checked separately so a wrong argument stops at this sentence.
template <class S>
constexpr bool check_pipeline_schedule() {
    static_assert(PipelineSchedule<S>,
                  "loom::Pipeline<Schedule>: Schedule must be a pipeline schedule: GPipe, OneFOneB, Interleaved<V>, "
                  "ZeroBubbleH1 or ZeroBubbleV");
    return PipelineSchedule<S>;
}
}  // namespace detail

template <class Schedule = OneFOneB>
struct Pipeline {
    static_assert(detail::check_pipeline_schedule<Schedule>());

    static constexpr PolicyKind kind = PolicyKind::pipeline;
    using schedule = Schedule;
    static constexpr ScheduleKind schedule_kind = Schedule::kind;
    static constexpr int chunks = Schedule::chunks;

    // "Pipeline<1F1B>", "Pipeline<Interleaved<2>>".
    static void describe(std::ostream& out) {
        out << "Pipeline<";
        Schedule::describe(out);
        out << ">";
    }
};

}  // namespace loom
