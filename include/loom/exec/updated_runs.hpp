// Which gradient and parameter elements this rank's optimizer step updates,
// which of them it owns, and what a sharded checkpoint reads and writes of
// them (exec/sharded_checkpoint.hpp). A custom policy's GradientView
// (exec/policy_component.hpp) and a sharded checkpoint's owned state
// (exec/executor_state.hpp) both read the same runs, so that "owned" means
// one thing: every element of the model has exactly one owner in the world.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "loom/exec/parameter_store.hpp"
#include "loom/exec/policy_component.hpp"
#include "loom/parallel/shard_layout.hpp"

namespace loom::exec {

// A rank's part of a sharded checkpoint: the parameters and AdamW moments it
// owns (each element of the model owned by exactly one rank of the world),
// with their places in the whole model's serial order.
struct OwnedState {
    std::vector<float> values, m, v;
    std::vector<std::int64_t> runs;  // (first whole index, count) pairs, in the order of the values
};

// What a loader must read for one rank alone: the whole-model (first, count)
// runs of the parameters and of the AdamW moments the rank keeps. Its
// pipeline stage's and tp cut's part of the model; of that, the rank's blocks
// of each array its placement shards (parallel/placement.hpp).
struct HeldRuns {
    std::vector<std::int64_t> values, moments;
};

// Where the elements this rank updates are, for one rank of a strategy.
struct UpdatedElements {
    const parallel::ShardLayout* layout = nullptr;
    parallel::Placement placement{};
    int rank = 0;  // on the gradient (dp) axis
    // Runs [first, last) of the rank's dense order holding a copy of a Param
    // the tensor-parallel cut left whole that another tp rank owns
    // (TensorShards::copies); empty without tp.
    std::vector<std::pair<std::int64_t, std::int64_t>> copies;
};

// Calls f(group, first, a, b, owner) for each run [a, b) of a group's
// elements that the rank's optimizer step updates (its storage starts at
// element `first` of the group: 0 with whole moments, the rank's block when
// they are sharded), split where the owner changes: with whole moments every
// dp rank's runs are copies of the first's, and a tp rank's copy of a Param the cut left whole belongs to one tp rank.
template <class F>
void for_each_updated_run(const UpdatedElements& at, F&& f) {
    const bool blocks = at.placement.moments_sharded;
    const int r = at.rank;
    const bool dp_owner = blocks || r == 0;
    for (int gi = 0; gi < static_cast<int>(at.layout->groups().size()); ++gi) {
        const auto& g = at.layout->group(gi);
        const std::int64_t lo = blocks ? r * g.block : 0;
        const std::int64_t end = std::min(g.numel, blocks ? lo + g.block : g.numel);
        const auto emit = [&](std::int64_t from, std::int64_t to, bool owner) {
            if (to > from) f(gi, lo, from, to, owner && dp_owner);
        };
        std::int64_t k = lo;
        for (const auto& [first, last] : at.copies) {
            const std::int64_t a = std::clamp(first - g.dense_offset, k, std::max(k, end));
            const std::int64_t b = std::clamp(last - g.dense_offset, a, std::max(a, end));
            emit(k, a, true);
            emit(a, b, false);
            k = b;
        }
        emit(k, end, true);
    }
}

// The gradients the rank's optimizer step updates, as the runs above, in the
// store's host memory (the whole gradient, or the shard where it is sharded).
[[nodiscard]] inline std::vector<GradientBlock> gradient_blocks(const UpdatedElements& at, const ParameterStore& store) {
    std::vector<GradientBlock> blocks;
    for_each_updated_run(at, [&](int gi, std::int64_t first, std::int64_t a, std::int64_t b, bool owner) {
        const auto& g = at.layout->group(gi);
        float* base = at.placement.gradients_sharded ? store.grad_shard.data<float>() + g.shard_offset
                                                     : store.grads.data<float>() + g.offset + first;
        blocks.push_back({{base + (a - first), static_cast<std::size_t>(b - a)}, owner});
    });
    return blocks;
}

}  // namespace loom::exec
