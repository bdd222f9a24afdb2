// Placement: which of a rank's arrays hold the whole model (of this rank's
// stage and tp cut) and which only the rank's dp block of it. ZeroShard<S>
// decides (S = 1 shards the optimizer moments, 2 also the gradients, 3 also
// the values; plain data parallelism shards none); the parameter store, the
// checkpoints and the optimizer step read only this, so they name no policy.
#pragma once

#include <ostream>

#include "loom/core/error.hpp"
#include "loom/parallel/strategy_rules.hpp"

namespace loom::parallel {

struct Placement {
    bool moments_sharded = false;    // AdamW's m and v
    bool gradients_sharded = false;  // reduce-scattered into the rank's block
    bool values_sharded = false;     // gathered before use, released after

    // Whether every array is whole on every rank of the dp axis.
    [[nodiscard]] constexpr bool all_whole() const noexcept {
        return !moments_sharded && !gradients_sharded && !values_sharded;
    }

    friend bool operator==(const Placement&, const Placement&) = default;

    // "every array whole", or what is sharded: "the moments, gradients and values sharded".
    friend std::ostream& operator<<(std::ostream& out, const Placement& p) {
        if (p.all_whole()) return out << "every array whole";
        out << "the moments";
        if (p.values_sharded) out << ", gradients and values";
        else if (p.gradients_sharded) out << " and gradients";
        return out << " sharded";
    }
};

// What ZeroShard<stage> shards (stage 0: none).
[[nodiscard]] constexpr Placement zero_placement(int stage) {
    LOOM_CHECK(stage >= 0 && stage <= 3, LOOM_RULE_ZERO_STAGE_RANGE);
    return {stage >= 1, stage >= 2, stage >= 3};
}

}  // namespace loom::parallel
