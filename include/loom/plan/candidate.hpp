// Candidate: one way to train a model on a cluster, the point the planner
// searches over: the degrees of data, pipeline, tensor (Megatron 1D or an
// Optimus 2D grid) and sequence (ring or Ulysses) parallelism, the pipeline
// schedule, the micro-batches per step, the ZeRO stage, the layers of
// each virtual stage, and which layers are recomputed (Recompute<...>). It says which strategy realises it (a StrategySpec,
// whose text train_gpt --strategy reads), and why_invalid() names the first
// rule a candidate breaks for a model and a cluster.
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
#include "loom/plan/model_description.hpp"
#include "loom/schedule/pipeline.hpp"

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

// The side of a square grid of `tp` ranks, or 0 if `tp` is not a square.
[[nodiscard]] constexpr int grid_side(int tp) noexcept {
    int q = 1;
    while ((q + 1) * (q + 1) <= tp) ++q;
    return q * q == tp ? q : 0;
}

// Empty when `c` can train `model` on `cluster`; else the first rule it
// breaks, as a sentence naming the values.
[[nodiscard]] inline std::string why_invalid(const ModelDescription& model, const Cluster& cluster, const Candidate& c) {
    std::ostringstream why;
    const auto layers = static_cast<int>(model.layers.size());
    if (c.dp < 1 || c.pp < 1 || c.tp < 1 || c.sp < 1)
        why << "the degrees dp " << c.dp << ", pp " << c.pp << ", tp " << c.tp << ", sp " << c.sp << " must be 1 or more";
    else if (c.devices() != cluster.size())
        why << "dp " << c.dp << " x pp " << c.pp << " x tp " << c.tp << " x sp " << c.sp << " = " << c.devices()
            << " ranks, but the cluster has " << cluster.size() << " devices; the degrees must multiply to "
            << cluster.size();
    else if (c.micro_batches < 1 || model.batch % (static_cast<std::int64_t>(c.dp) * c.micro_batches) != 0)
        why << "batch " << model.batch << " does not split into dp " << c.dp << " x " << c.micro_batches
            << " micro-batches of whole samples";
    else if (c.zero < 0 || c.zero > 3)
        why << "ZeRO stage " << c.zero << " is not 0, 1, 2 or 3";
    else if (c.pp > 1 && c.virtual_stages() > layers)
        why << c.virtual_stages() << " pipeline stages for " << layers << " layers; every stage needs a layer";
    else if (c.tp_grid && grid_side(c.tp) == 0)
        why << "a 2D tensor grid of " << c.tp << " ranks is not a square";
    else if (c.tp > 1 && !c.tp_grid && model.heads > 0 && model.heads % c.tp != 0)
        why << "tp " << c.tp << " does not divide the " << model.heads << " attention heads";
    else if (c.tp > 1 && model.vocab > 0 && model.vocab % (c.tp_grid ? grid_side(c.tp) : c.tp) != 0)
        why << "tp " << c.tp << " does not divide the vocabulary of " << model.vocab;
    else if (c.tp_grid && model.heads > 0 && model.heads % grid_side(c.tp) != 0)
        why << "the 2D grid's side " << grid_side(c.tp) << " does not divide the " << model.heads << " heads";
    else if (c.tp_grid && (model.batch / (c.dp * c.micro_batches)) % grid_side(c.tp) != 0)
        why << "the 2D grid's side " << grid_side(c.tp) << " does not divide the "
            << model.batch / (c.dp * c.micro_batches) << " samples of a micro-batch";
    else if (c.sp > 1 && model.sequence == 0)
        why << "sequence parallelism needs the model's sequence length";
    else if (c.sp > 1 && model.sequence % (2 * c.sp) != 0)
        why << "sp " << c.sp << " does not cut the sequence of " << model.sequence << " into " << 2 * c.sp
            << " equal chunks (the zigzag layout)";
    else if (c.sp > 1 && c.tp_grid)
        why << "sequence parallelism does not combine with a 2D tensor grid";
    else if (c.sp > 1 && c.ulysses && model.heads > 0 && (model.heads / c.tp) % c.sp != 0)
        why << "Ulysses over sp " << c.sp << " needs it to divide the " << model.heads / c.tp << " heads per tp rank";
    else if (!c.recomputed.empty() && c.recomputed.size() != model.layers.size())
        why << "the recompute choice covers " << c.recomputed.size() << " layers but the model has " << layers
            << "; give one entry per layer";
    if (!why.str().empty()) return why.str();
    for (std::size_t i = 0; i < c.recomputed.size(); ++i)
        if (c.recomputed[i] && !model.layers[i].recomputable)
            return "layer " + model.layers[i].name + " is recomputed but says it is not recomputable";
    if (c.pp > 1) {
        try {
            (void)schedule::pipeline_program(c.schedule, c.pp, c.micro_batches, c.chunks);
        } catch (const Error& e) {
            return e.message();
        }
        if (!c.partition.empty()) {
            int sum = 0;
            for (int n : c.partition) sum += n < 1 ? layers + 1 : n;
            if (static_cast<int>(c.partition.size()) != c.virtual_stages() || sum != layers)
                return "partition of " + std::to_string(c.partition.size()) + " stages summing to " +
                       std::to_string(sum) + " layers; give " + std::to_string(c.virtual_stages()) +
                       " counts of 1 or more summing to " + std::to_string(layers);
        }
    }
    return {};
}

}  // namespace loom::plan
