// ZeroShard<Stage>: ZeRO over the dp axis. Stage 1 shards the optimizer state,
// stage 2 also the gradients (reduce-scatter instead of all-reduce), stage 3
// also the parameters (each layer's shard is all-gathered before its forward
// and its backward and freed after, the next layer's gather prefetched while
// the current one computes). Every rank owns block `rank` of each shard group,
// groups padded to a multiple of the dp degree. Order: reduce-scatter ->
// optimizer on the shard -> all-gather.
#pragma once

#include <cstdint>
#include <ostream>

#include "loom/core/error.hpp"
#include "loom/parallel/placement.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/strategy_rules.hpp"

namespace loom {

template <int Stage>
struct ZeroShard {
    static_assert(Stage >= 1 && Stage <= 3, LOOM_RULE_ZERO_STAGE_RANGE);

    static constexpr PolicyKind kind = PolicyKind::zero_shard;
    static constexpr int stage = Stage;

    static void describe(std::ostream& out) { out << "ZeroShard<" << Stage << ">"; }
};

// The ZeRO paper's model-state bytes per rank for f32 AdamW training of
// `parameters` parameters on `ranks` ranks at `stage` (0: plain data
// parallel), from what the stage shards (parallel::zero_placement, the rule
// the executor's store follows): 4 bytes of value, 4 of gradient and 8 of
// moments per parameter, each array whole or a 1/N block. So with Psi
// parameters on N ranks (REFERENCE.md, ZeRO): data parallel 16 Psi, stage 1
// 8 Psi + 8 Psi/N, stage 2 4 Psi + 12 Psi/N, stage 3 16 Psi/N.
[[nodiscard]] inline double zero_model_state_bytes(int stage, std::int64_t parameters, int ranks) {
    LOOM_CHECK(stage >= 0 && stage <= 3, "zero_model_state_bytes: stage ", stage, " is not 0, 1, 2 or 3");
    LOOM_CHECK(ranks >= 1, "zero_model_state_bytes: ", ranks, " ranks; there must be at least one");
    const parallel::Placement placed = parallel::zero_placement(stage);
    const double psi = static_cast<double>(parameters), n = ranks;
    const auto share = [&](double bytes_per_parameter, bool sharded) { return bytes_per_parameter * psi / (sharded ? n : 1.0); };
    return share(4, placed.values_sharded) + share(4, placed.gradients_sharded) + share(8, placed.moments_sharded);
}

}  // namespace loom
