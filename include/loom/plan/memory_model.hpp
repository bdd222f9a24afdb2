// The planner's memory model: the bytes each device needs to run a
// Candidate, from the partition alone (no step programs built), so that the
// search drops what does not fit before pricing it (plan/cost_model.hpp).
// Per device: parameters, gradients and AdamW state (each divided over the
// dp x sp ranks from the ZeRO stage that shards it), ZeRO's working slots
// (two of the largest group it gathers or reduces at once), and the saved
// activations of the micro-batches the schedule keeps in flight.
//
// Activations have the recompute solver's shape (schedule/recompute_solver.hpp),
// one unit per layer of a pipeline rank:
//
//   activations = sum_layers copies x (recomputed ? kept_when_recomputed : held)
//                 + the largest rerun_peak of a recomputed layer
//
// where a layer holds what its forward saved and its backward allocated
// (loom's micro-batch arenas keep both until the micro-batch ends)
//
// per micro-batch's samples / (tp x sp), where copies is what the schedule
// keeps in flight: 1 without a pipeline, its activation_bound with one chunk
// per rank, activation_bound / chunks (rounded up) of each chunk otherwise.
// With nothing recomputed and one chunk per rank that is the bound the
// planner always used (bound x the stage's saved bytes); with several chunks
// it counts each chunk's share of the bound rather than the bound times the
// largest chunk, which is the same for balanced chunks.
// Under Recompute<Selective> a recomputed layer keeps kept_when_selective
// (its products too) and its rerun costs selective_recompute; its transient
// is its rerun_peak less the products, which stay with the micro-batch.
// recompute_choice picks the layers (Full and Selective: every recomputable
// one; Budget: the solver under it); cheapest_fitting_recompute the least
// recomputation that fits every device, and fitting_selective_recompute
// Selective where it fits, for the joint search (plan/search.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/recompute.hpp"
#include "loom/plan/candidate.hpp"
#include "loom/plan/cluster.hpp"
#include "loom/plan/model_description.hpp"
#include "loom/schedule/pipeline.hpp"
#include "loom/schedule/recompute_solver.hpp"

namespace loom::plan {

// What each device of the cluster needs, and whether every device holds it.
struct DeviceMemory {
    std::vector<double> bytes;  // per device, in world rank order
    double peak = 0;
    int peak_device = 0;
    bool fits = true;
};

namespace detail {

// Bytes per parameter element: the f32 value, the gradient, and the rest
// (AdamW's moments) of bytes_per_param.
struct StateBytes {
    double value = 4, gradient = 4, optimizer = 8;
};

[[nodiscard]] inline StateBytes state_bytes(const ModelDescription& model) {
    const double gradient = model.gradient_bytes;
    const double value = std::min(4.0, std::max(0.0, model.bytes_per_param - gradient));
    return {value, gradient, std::max(0.0, model.bytes_per_param - value - gradient)};
}

// Bytes one device keeps of `params` elements at ZeRO `zero` over `shards` ranks.
[[nodiscard]] inline double static_bytes(const StateBytes& b, double params, int zero, int shards) {
    const double n = shards;
    return params * (zero >= 3 ? b.value / n : b.value) + params * (zero >= 2 ? b.gradient / n : b.gradient) +
           params * (zero >= 1 ? b.optimizer / n : b.optimizer);
}

// Where each layer runs and what one device of its pipeline rank holds for
// it: the rank's parameter elements and the largest ZeRO group, per rank.
struct Placement {
    std::vector<int> rank_of_layer, copies;  // per layer
    std::vector<double> params, largest;     // per pipeline rank
    std::vector<double> static_bytes;        // per pipeline rank: parameters, gradients, AdamW, ZeRO's slots
};

[[nodiscard]] inline Placement place(const ModelDescription& model, const Candidate& c, const std::vector<int>& partition) {
    const auto pipe = c.pp > 1 ? schedule::pipeline_program(c.schedule, c.pp, c.micro_batches, c.chunks)
                               : schedule::PipelineProgram{};
    const int copies = c.pp == 1 ? 1 : (pipe.activation_bound + c.chunks - 1) / c.chunks;
    Placement out;
    out.params.assign(static_cast<std::size_t>(c.pp), 0.0);
    out.largest = out.params;
    std::size_t layer = 0;
    for (int v = 0; v < c.virtual_stages(); ++v) {
        const auto p = static_cast<std::size_t>(c.pp > 1 ? pipe.rank_of_chunk[static_cast<std::size_t>(v)] : 0);
        const int count = c.pp > 1 ? partition[static_cast<std::size_t>(v)] : static_cast<int>(model.layers.size());
        double chunk_params = 0;
        for (int k = 0; k < count; ++k, ++layer) {
            const LayerSpec& l = model.layers[layer];
            const auto n = static_cast<double>(l.params_per_tp_rank(c.tp, c.tp_grid));
            chunk_params += n;
            out.rank_of_layer.push_back(static_cast<int>(p));
            out.copies.push_back(copies);
            // ZeRO-3 without a pipeline gathers one layer at a time; ZeRO-2 reduces buckets.
            out.largest[p] = std::max(out.largest[p], c.zero == 2 && c.pp == 1
                                                          ? std::max(n, static_cast<double>(default_bucket_bytes) / 4)
                                                          : n);
        }
        out.params[p] += chunk_params;
        if (c.pp > 1 && c.zero >= 2) out.largest[p] = std::max(out.largest[p], chunk_params);  // ZeroPP: a chunk at once
    }
    const StateBytes b = state_bytes(model);
    for (std::size_t p = 0; p < out.params.size(); ++p) {
        double bytes = static_bytes(b, out.params[p], c.zero, c.dp * c.sp);
        if (c.zero >= 2) bytes += 2 * out.largest[p] * (b.gradient + (c.zero >= 3 ? b.value : 0));
        out.static_bytes.push_back(bytes);
    }
    return out;
}

// The least of `field` over the devices of pipeline rank p.
template <class Field>
[[nodiscard]] double least_of_stage(const Cluster& cluster, const Candidate& c, int p, Field field) {
    double least = std::numeric_limits<double>::infinity();
    for (int d = 0; d < c.dp; ++d)
        for (int s = 0; s < c.sp; ++s)
            for (int t = 0; t < c.tp; ++t) least = std::min(least, field(cluster.device(c.device(p, d, s, t))));
    return least;
}

// Pipeline rank p's activations as the solver's units, one per layer of the
// model (a layer elsewhere holds nothing), in bytes of one device and
// seconds of its slowest device; a recomputed unit keeps and reruns what
// `how` does (Selective: its products kept, not rerun; otherwise Full's).
[[nodiscard]] inline std::vector<schedule::RecomputeUnit> activation_units(const ModelDescription& model,
                                                                           const Cluster& cluster, const Candidate& c,
                                                                           const Placement& at, int p,
                                                                           RecomputeMode how = RecomputeMode::full) {
    const bool selective = how == RecomputeMode::selective;
    // A zero-bubble schedule splits each backward into B and W; a recomputed
    // unit's rerun stays until its W and the W of the unit below it, which
    // reads the gradient it left (parallel/recomputation.hpp counts the same).
    const bool split = c.pp > 1 && (c.schedule == ScheduleKind::zero_bubble_h1 ||
                                    c.schedule == ScheduleKind::zero_bubble_v);
    const double share = static_cast<double>(model.batch) / (c.dp * c.micro_batches) / (c.tp * c.sp);
    const double speed = least_of_stage(cluster, c, p, [](const DeviceSpec& d) { return d.flops; });
    std::vector<schedule::RecomputeUnit> units(model.layers.size());
    for (std::size_t u = 0; u < units.size(); ++u) {
        if (at.rank_of_layer[u] != p) {
            units[u].recomputable = false;
            continue;
        }
        const LayerSpec& l = model.layers[u];
        schedule::RecomputeUnit& x = units[u];
        x.kept_bytes = std::llround(l.held_bytes() * share);
        const double kept = selective ? l.kept_when_selective() : l.kept_when_recomputed();
        x.output_bytes = std::min<std::int64_t>(x.kept_bytes, std::llround(kept * share));
        double rerun = l.rerun_peak(selective);  // while its rerun and backward run
        if (split && u > 0 && at.rank_of_layer[u - 1] == p && model.layers[u - 1].recomputable)
            rerun += model.layers[u - 1].rerun_peak(selective);
        x.transient_bytes = std::llround(rerun * share);
        x.copies = at.copies[u];
        x.recomputable = l.recomputable;
        const double seconds = (selective ? l.selective_recompute() : l.recompute()) * share;
        x.forward_seconds = speed > 0 && std::isfinite(speed) ? seconds / speed : seconds;
    }
    return units;
}

// A budget the strategy text prints compactly and reads back exactly, at
// most `bytes`: whole half GiB above 8 GiB, whole MiB above 1 MiB, whole KiB.
[[nodiscard]] inline std::int64_t printable_budget(double bytes) {
    const auto b = static_cast<std::int64_t>(std::min(std::floor(bytes), 4e18));
    const std::int64_t half_gib = std::int64_t{1} << 29, mib = std::int64_t{1} << 20, kib = std::int64_t{1} << 10;
    if (b >= 16 * half_gib) return b / half_gib * half_gib;
    if (b >= mib) return b / mib * mib;
    if (b >= kib) return b / kib * kib;
    return b;
}

}  // namespace detail

// The bytes per device of `c` on `cluster` with `partition` layers per
// virtual stage (empty without a pipeline), recomputing the layers
// `recompute` marks (empty: none) as c.recompute does: Selective keeps
// their products, anything else (Full, Budget, or none with marks given)
// only what Full keeps.
[[nodiscard]] inline DeviceMemory device_memory(const ModelDescription& model, const Cluster& cluster,
                                                const Candidate& c, const std::vector<int>& partition,
                                                const std::vector<bool>& recompute = {}) {
    DeviceMemory out;
    const detail::Placement at = detail::place(model, c, partition);
    std::vector<bool> chosen = recompute;
    chosen.resize(model.layers.size(), false);
    out.bytes.assign(static_cast<std::size_t>(cluster.size()), 0.0);
    for (int p = 0; p < c.pp; ++p) {
        const auto units = detail::activation_units(model, cluster, c, at, p, c.recompute.mode);
        std::vector<bool> here(units.size(), false);
        for (std::size_t u = 0; u < units.size(); ++u) here[u] = chosen[u] && at.rank_of_layer[u] == p;
        const double bytes = at.static_bytes[static_cast<std::size_t>(p)] +
                             static_cast<double>(schedule::recompute_peak(units, here));
        for (int d = 0; d < c.dp; ++d)
            for (int s = 0; s < c.sp; ++s)
                for (int t = 0; t < c.tp; ++t) out.bytes[static_cast<std::size_t>(c.device(p, d, s, t))] = bytes;
    }
    for (int i = 0; i < cluster.size(); ++i) {
        const double need = out.bytes[static_cast<std::size_t>(i)];
        if (need > out.peak) {
            out.peak = need;
            out.peak_device = i;
        }
        if (need > cluster.device(i).memory) out.fits = false;
    }
    return out;
}

// The layers `spec` recomputes on `c` (one entry per layer): none, every
// recomputable layer (Full, Selective), or for a Budget what the solver
// chooses on each pipeline rank under it, as train_gpt's executor does with
// its measured units. `fits` is false when some rank's activations exceed
// the budget even so; extra_seconds prices Selective's reruns without their
// products.
struct RecomputeLayers {
    std::vector<bool> layers;
    bool fits = true;
    double extra_seconds = 0;  // the slowest rank's recompute forwards per micro-batch
};

[[nodiscard]] inline RecomputeLayers recompute_choice(const ModelDescription& model, const Cluster& cluster,
                                                      const Candidate& c, const std::vector<int>& partition,
                                                      const RecomputeSpec& spec) {
    RecomputeLayers out;
    out.layers.assign(model.layers.size(), false);
    if (!spec.on()) return out;
    const detail::Placement at = detail::place(model, c, partition);
    for (int p = 0; p < c.pp; ++p) {
        const auto units = detail::activation_units(model, cluster, c, at, p, spec.mode);
        schedule::RecomputeChoice choice;
        if (spec.mode == RecomputeMode::full || spec.mode == RecomputeMode::selective) {
            choice = schedule::recompute_all(units);
        } else {
            choice = schedule::solve_recompute(units, spec.budget_bytes, 200);
            out.fits = out.fits && choice.fits;
        }
        for (std::size_t u = 0; u < units.size(); ++u)
            if (at.rank_of_layer[u] == p && choice.recompute[u]) out.layers[u] = true;
        out.extra_seconds = std::max(out.extra_seconds, choice.extra_seconds);
    }
    return out;
}

// The cheapest recomputation with which every device holds `c`: a Budget of
// the least memory any device has left after its model states (printed
// round, so the strategy line reads back the same), solved on every
// pipeline rank as train_gpt will solve it; Full when that recomputes every
// recomputable layer. None when even recomputing everything does not fit.
struct FittingRecompute {
    RecomputeSpec spec;
    std::vector<bool> layers;
};

[[nodiscard]] inline std::optional<FittingRecompute> cheapest_fitting_recompute(const ModelDescription& model,
                                                                               const Cluster& cluster, Candidate c,
                                                                               const std::vector<int>& partition) {
    const detail::Placement at = detail::place(model, c, partition);
    double room = std::numeric_limits<double>::infinity();
    for (int p = 0; p < c.pp; ++p)
        room = std::min(room, detail::least_of_stage(cluster, c, p, [](const DeviceSpec& d) { return d.memory; }) -
                                  at.static_bytes[static_cast<std::size_t>(p)]);
    if (!(room >= 1) || !std::isfinite(room)) return std::nullopt;
    const RecomputeSpec budget{RecomputeMode::budget, detail::printable_budget(room)};
    c.recompute = budget;  // its layers priced as a Budget keeps them, whatever c said
    RecomputeLayers chosen = recompute_choice(model, cluster, c, partition, budget);
    if (!chosen.fits || !device_memory(model, cluster, c, partition, chosen.layers).fits) return std::nullopt;
    bool every = true;
    for (std::size_t u = 0; u < model.layers.size(); ++u)
        every = every && (chosen.layers[u] || !model.layers[u].recomputable);
    return FittingRecompute{every ? RecomputeSpec{RecomputeMode::full, 0} : budget, std::move(chosen.layers)};
}

// Selective on `c` when every device holds it: the layers it recomputes
// (every recomputable one) with their products kept. None when it does not
// fit, or when no recomputable layer describes products (then Selective is
// Full, which cheapest_fitting_recompute already considers).
[[nodiscard]] inline std::optional<FittingRecompute> fitting_selective_recompute(const ModelDescription& model,
                                                                                const Cluster& cluster, Candidate c,
                                                                                const std::vector<int>& partition) {
    const bool differs = std::any_of(model.layers.begin(), model.layers.end(),
                                     [](const LayerSpec& l) { return l.recomputable && l.keeps_products(); });
    if (!differs) return std::nullopt;
    c.recompute = {RecomputeMode::selective, 0};
    std::vector<bool> layers = recompute_choice(model, cluster, c, partition, c.recompute).layers;
    if (!device_memory(model, cluster, c, partition, layers).fits) return std::nullopt;
    return FittingRecompute{c.recompute, std::move(layers)};
}

}  // namespace loom::plan
