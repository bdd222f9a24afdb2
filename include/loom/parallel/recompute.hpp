// Recompute<Which>: activation recomputation as a policy. A recomputed unit
// keeps only its input (and a copy of its output, the next unit's input)
// from its forward to its backward; its forward runs again just before its
// backward. Memory falls from everything the unit saved to its output, for
// one more forward of the unit; losses and parameters stay bit-identical,
// since the same kernels run on the same input.
//
//   Recompute<Full>                every unit worth it (below) is recomputed:
//                                  the least activation memory
//   Recompute<Selective>           every such unit keeps its matrix products
//                                  too and recomputes only the rest (norms,
//                                  the attention core, activations, sums):
//                                  between Full and none in memory, a small
//                                  fraction of a forward in time
//   Recompute<Budget<64 << 20>>    the fewest seconds of recomputation whose
//                                  activations fit 64 MiB per rank, chosen
//                                  after the first step has measured each
//                                  unit (which runs as Full, so it fits too)
//
// The policy lowers itself into the step program (schedule/recompute.hpp):
// forwards that keep only their input, and Op::recompute instructions before
// the backwards, which the executor interprets, the trace draws and the
// planner prices. It composes with every other policy: it changes when a
// unit's activations exist, not what any unit computes or communicates.
//
// Which units: a unit whose layer says `static constexpr bool
// worth_recomputing = false` is never recomputed (nn::Unit::worth_recomputing). loom's single layers whose
// only activation is their output (Linear, Embedding, Gelu) say so:
// recomputing them would keep the same bytes and cost a forward.
#pragma once

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>

#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/strategy_rules.hpp"

namespace loom {

enum class RecomputeMode : std::uint8_t { none, full, selective, budget };

// The policy as a value (a StrategySpec field).
struct RecomputeSpec {
    RecomputeMode mode = RecomputeMode::none;
    std::int64_t budget_bytes = 0;  // Budget: activation bytes per rank

    [[nodiscard]] constexpr bool on() const noexcept { return mode != RecomputeMode::none; }
    friend constexpr bool operator==(const RecomputeSpec&, const RecomputeSpec&) = default;

    // "Full", "Budget 64 MiB": what goes between Recompute's brackets.
    [[nodiscard]] std::string describe() const {
        if (mode == RecomputeMode::full) return "Full";
        if (mode == RecomputeMode::selective) return "Selective";
        if (mode == RecomputeMode::budget) return "Budget " + bucket_size_text(budget_bytes);
        return "none";
    }
};

// Recompute every unit worth it.
struct Full {
    static constexpr RecomputeSpec spec{RecomputeMode::full, 0};
};

// Recompute every unit worth it, but keep what its matrix products made
// (nn::Context::product): what costs the most to recompute and the least to
// keep. The rest of its activations (LayerNorm's output, the attention
// core's output and statistics, GeLU's output, the residual sums) are
// computed again before its backward. Megatron's selective recomputation
// keeps everything but the attention core's T x T scores; loom's attention
// never stores those (it is blockwise), so the same idea moves to the
// pieces that are cheap to recompute for their bytes.
struct Selective {
    static constexpr RecomputeSpec spec{RecomputeMode::selective, 0};
};

// Recompute the least (in measured seconds) that fits Bytes of activations per rank.
template <std::int64_t Bytes>
struct Budget {
    static_assert(Bytes >= 1, LOOM_RULE_RECOMPUTE_BUDGET);
    static constexpr RecomputeSpec spec{RecomputeMode::budget, Bytes};
};

template <class Which>
struct Recompute {
    static_assert(requires { Which::spec; }, "loom::Recompute<Which>: Which is loom::Full, loom::Selective or loom::Budget<Bytes>");
    static constexpr PolicyKind kind = PolicyKind::recompute;
    static constexpr RecomputeSpec spec = Which::spec;
    static void describe(std::ostream& out) { out << "Recompute<" << spec.describe() << ">"; }
};

}  // namespace loom
