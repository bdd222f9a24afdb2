// ZeroShard<Stage>: ZeRO over the dp axis. Stage 1 shards the optimizer state,
// stage 2 also the gradients (reduce-scatter instead of all-reduce), stage 3
// also the parameters (each layer's shard is all-gathered before its forward
// and its backward and freed after, the next layer's gather prefetched while
// the current one computes). Every rank owns block `rank` of each shard group,
// groups padded to a multiple of the dp degree. Order: reduce-scatter ->
// optimizer on the shard -> all-gather.
#pragma once

#include <ostream>

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

}  // namespace loom
