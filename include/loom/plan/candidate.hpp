// Candidate: one way to train a model on a cluster, the point the planner
// searches over: the degrees of data, pipeline, tensor (Megatron 1D or an
// Optimus 2D grid) and sequence (ring or Ulysses) parallelism, the pipeline
// schedule, the micro-batches per step, the ZeRO stage, the layers of
// each virtual stage, and which layers are recomputed (Recompute<...>). It says which strategy realises it (a StrategySpec,
// whose text train_gpt --strategy reads) and which Layout (plan/layout_rules.hpp),
// and why_invalid() names the first rule a candidate breaks for a model and a cluster.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "loom/parallel/pipeline.hpp"
#include "loom/parallel/recompute.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/plan/cluster.hpp"
#include "loom/plan/layout_rules.hpp"
#include "loom/plan/model_description.hpp"

namespace loom::plan {

struct Candidate {
    int dp = 1, pp = 1, tp = 1, sp = 1;
    bool tp_grid = false;  // Optimus 2D: tp = q x q
    bool ulysses = false;  // sequence parallelism by Ulysses all-to-alls instead of ring attention
    ScheduleKind schedule = ScheduleKind::one_f_one_b;
    int chunks = 1;        // virtual stages per pipeline rank (Interleaved<V>, ZB-V)
    int micro_batches = 1;
    int zero = 0;
    std::vector<int> partition;  // layers per virtual stage; empty: balanced by the planner
    // Recompute<Full> or Recompute<Budget<bytes>>, as train_gpt runs it, and
    // the layers the planner expects it to recompute (one per layer; empty:
    // none). The search sets both (plan/memory_model.hpp: recompute_choice).
    RecomputeSpec recompute{};
    std::vector<bool> recomputed;

    [[nodiscard]] int devices() const noexcept { return dp * pp * tp * sp; }
    [[nodiscard]] Layout layout() const { return {dp, pp, tp, sp, micro_batches, strategy(), partition}; }
    [[nodiscard]] int virtual_stages() const noexcept { return pp > 1 ? pp * chunks : 1; }
    // The world rank of coordinates (pipeline stage, replica, sequence, tensor)
    // in loom's Mesh order: pp outermost, then dp, sp, and tp innermost.
    [[nodiscard]] int device(int stage, int replica, int sequence, int tensor) const noexcept {
        return ((stage * dp + replica) * sp + sequence) * tp + tensor;
    }

    // The strategy this candidate runs, as one value: it prints as
    // "Strategy<DataParallel<bucket 2 MiB>, Pipeline<1F1B>, TensorParallel, ZeroShard<1>>",
    // which parse_strategy and train_gpt --strategy read back.
    [[nodiscard]] StrategySpec strategy() const {
        StrategySpec s;
        s.zero_stage = zero;
        s.pipelined = pp > 1;
        if (s.pipelined) {
            s.schedule = schedule;
            s.chunks = chunks;
        }
        s.tensor_parallel = tp > 1;
        s.tensor_grid = tp > 1 && tp_grid;
        s.sequence_parallel = sp > 1;
        if (sp > 1 && ulysses) {
            s.sequence_attention = nn::SequenceAttention::ulysses;
            s.sequence_ulysses = 0;
        }
        s.recompute = recompute;
        return s;
    }

    // "dp 2 x pp 2 x tp 2, 1F1B, 8 micro-batches, ZeRO-1, partition 12,12"
    // (", recompute Full (24 of 24 layers)" when it recomputes).
    friend std::ostream& operator<<(std::ostream& out, const Candidate& c) {
        out << "dp " << c.dp;
        if (c.pp > 1) out << " x pp " << c.pp;
        if (c.tp > 1) out << " x tp " << c.tp << (c.tp_grid ? " (2D)" : "");
        if (c.sp > 1) out << " x sp " << c.sp << (c.ulysses ? " (Ulysses)" : " (ring)");
        if (c.pp > 1) {
            out << ", " << name(c.schedule);
            if (c.schedule == ScheduleKind::interleaved) out << "<" << c.chunks << ">";
        }
        out << ", " << c.micro_batches << " micro-batch" << (c.micro_batches == 1 ? "" : "es");
        if (c.zero > 0) out << ", ZeRO-" << c.zero;
        if (c.pp > 1 && !c.partition.empty()) {
            out << ", partition ";
            for (std::size_t i = 0; i < c.partition.size(); ++i) out << (i ? "," : "") << c.partition[i];
        }
        if (c.recompute.on()) {
            out << ", recompute " << c.recompute.describe();
            const auto n = std::count(c.recomputed.begin(), c.recomputed.end(), true);
            if (!c.recomputed.empty()) out << " (" << n << " of " << c.recomputed.size() << " layers)";
        }
        return out;
    }
};

// Empty when `c` can train `model` on `cluster`; else the first rule it
// breaks, as a sentence naming the values: the layout's rules, which
// train_gpt checks its flags by too (plan/layout_rules.hpp), then the
// planner's recomputation choice.
[[nodiscard]] inline std::string why_invalid(const ModelDescription& model, const Cluster& cluster, const Candidate& c) {
    if (std::string why = why_invalid(model, c.layout(), cluster.size()); !why.empty()) return why;
    if (!c.recomputed.empty() && c.recomputed.size() != model.layers.size())
        return "the recompute choice covers " + std::to_string(c.recomputed.size()) + " layers but the model has " +
               std::to_string(model.layers.size()) + "; give one entry per layer";
    for (std::size_t i = 0; i < c.recomputed.size(); ++i)
        if (c.recomputed[i] && !model.layers[i].recomputable)
            return "layer " + model.layers[i].name + " is recomputed but says it is not recomputable";
    return {};
}

}  // namespace loom::plan
