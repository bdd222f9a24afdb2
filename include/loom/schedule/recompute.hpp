// Recomputation in the step program: what Recompute<...> (parallel/recompute.hpp)
// lowers itself into. A chosen unit's forward keeps only its input (and hands
// on a copy of its output), and an Op::recompute runs that forward again just
// before the unit's backward, so between the two the unit holds none of its
// saved activations:
//
//   forward u3 c0 mb0 (keep input)        ... forward u3 c0 mb1 (keep input)
//   ...
//   recompute u3 c0 mb0                   <- inserted before the backward
//   backward_input u3 c0 mb0
//
// Selective keeps the unit's matrix products too (`(keep input, products)`),
// and its `recompute ... (kept products)` replays them instead of running
// the products again: only the cheap rest of the forward runs twice.
//
// Because it is instructions, the trace draws the recomputation and the
// planner prices it as one more forward of the unit; the verifier checks that
// each dropped forward is recomputed once, before its backward. Recomputing
// runs the same kernels on the same input, so the step's losses and
// gradients are bit-identical to the program without it.
//
// The recompute sits right before the backward, after the waits that
// backward needed (ZeRO-3's gather of the unit's parameters), so it needs
// nothing the backward does not: one unit at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/schedule/program.hpp"

namespace loom::schedule {

// Rewrites `program` so that exactly the units with recompute[u] drop their
// activations after the forward and recompute them before the backward;
// `keep` says what they keep (Keep::input, or Keep::products for Selective).
// Undoes an earlier lowering first, so a policy may choose again (Budget does,
// after its first step has measured the units).
inline void lower_recompute(StepProgram& program, const std::vector<bool>& recompute, Keep keep = Keep::input) {
    LOOM_CHECK(keep != Keep::all, "lower_recompute: Keep::all keeps everything; recomputation keeps the input "
               "(Keep::input) or the input and products (Keep::products)");
    for (int i = static_cast<int>(program.code.size()) - 1; i >= 0; --i)
        if (program.code[static_cast<std::size_t>(i)].op == Op::recompute) program.erase(i);
    for (int i = 0; i < static_cast<int>(program.code.size()); ++i) {
        Instruction& in = program.code[static_cast<std::size_t>(i)];
        if (in.op == Op::forward) in.keep = Keep::all;
        if (in.unit < 0) continue;
        LOOM_CHECK(in.unit < static_cast<int>(recompute.size()), "lower_recompute: the program names unit ", in.unit,
                   " but the choice covers ", recompute.size(), " units; give one entry per unit");
        if (!recompute[static_cast<std::size_t>(in.unit)]) continue;
        if (in.op == Op::forward) {
            in.keep = keep;
        } else if (in.op == Op::backward || in.op == Op::backward_input) {
            program.insert(i, Instruction{.op = Op::recompute, .unit = in.unit, .micro_batch = in.micro_batch,
                                          .chunk = in.chunk, .keep = keep});
            ++i;
        }
    }
}

// The units whose forward keeps only its input in `program`.
[[nodiscard]] inline std::vector<bool> recomputed_units(const StepProgram& program, int units) {
    std::vector<bool> out(static_cast<std::size_t>(units), false);
    for (const Instruction& in : program.code)
        if (in.op == Op::forward && in.keep != Keep::all && in.unit >= 0 && in.unit < units)
            out[static_cast<std::size_t>(in.unit)] = true;
    return out;
}

// The most micro-batches of each chunk in flight at once on this rank:
// opened by the forward of the chunk's first unit (`first_unit[chunk]`),
// closed by its backward (or W, when split). Everything a chunk keeps from
// forward to backward is held this many times at the rank's peak.
[[nodiscard]] inline std::vector<int> micro_batches_in_flight(const StepProgram& program,
                                                              const std::vector<int>& first_unit) {
    std::vector<int> open(first_unit.size(), 0), most(first_unit.size(), 0);
    for (const Instruction& in : program.code) {
        const auto v = static_cast<std::size_t>(in.chunk < 0 ? 0 : in.chunk);
        if (v >= first_unit.size() || in.unit != first_unit[v]) continue;
        if (in.op == Op::forward) most[v] = std::max(most[v], ++open[v]);
        else if (in.op == Op::backward || in.op == Op::backward_weight) --open[v];
    }
    return most;
}

}  // namespace loom::schedule
