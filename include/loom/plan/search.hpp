// The strategy search (AMP's, with loom's whole space): every way to factor
// the cluster's devices into dp x pp x tp x sp (tensor groups inside a
// node), Megatron or 2D tensor parallelism, ring or Ulysses sequence
// parallelism, every pipeline schedule, every micro-batch count and ZeRO
// stage, with the layers split by the min-max partition over the stages'
// device speeds (schedule/partition.hpp). A candidate that cannot hold its
// memory is given the cheapest recomputation with which it fits
// (plan/memory_model.hpp: cheapest_fitting_recompute, the recompute solver on
// each pipeline rank under the memory its devices have left), and priced
// with it: its programs carry the recompute instructions, so the simulator
// charges the extra forwards where they fall in the pipeline. The strategy
// and the recomputation are one search, not two stages: dp 8 with
// recomputation competes with pp 4 without it on predicted step time.
// Such a candidate also tries Recompute<Selective> (every recomputable layer,
// its matrix products kept: more memory than Full, a fraction of its rerun)
// where it fits: both are priced, and the faster stays, one plan per layout
// in the ranking.
// Candidates that fit without recomputing are priced without it (it only
// adds time). What still does not fit is dropped; the rest are sorted by a
// lower bound on their step (the busiest rank's compute, recomputes
// included) and simulated in that order until the bound passes the k-th
// best step found, so a 64-device search simulates a few dozen of its
// thousands of candidates.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/plan/candidate.hpp"
#include "loom/plan/cluster.hpp"
#include "loom/plan/cost_model.hpp"
#include "loom/plan/model_description.hpp"

namespace loom::plan {

// How the search treats recomputation: never (shard until it fits),
// when a candidate does not fit without it (the joint search: the cheapest
// fitting Budget or Full, or Selective when it fits and is faster), or
// always Full or always Selective (for comparison).
enum class RecomputeSearch : std::uint8_t { never, when_needed, always_full, always_selective };

struct SearchOptions {
    int top = 5;
    bool tensor_grid = true;         // consider Optimus 2D
    bool sequence = true;            // consider sequence parallelism
    int max_micro_batches = 64;
    std::vector<ScheduleKind> schedules{ScheduleKind::one_f_one_b, ScheduleKind::gpipe, ScheduleKind::interleaved,
                                        ScheduleKind::zero_bubble_h1, ScheduleKind::zero_bubble_v};
    std::vector<int> zero_stages{0, 1, 2, 3};
    RecomputeSearch recompute = RecomputeSearch::when_needed;
};

struct RankedPlan {
    Candidate candidate;
    Estimate estimate;
};

struct SearchReport {
    std::vector<RankedPlan> plans;   // best first, at most `top`
    std::int64_t candidates = 0;     // valid candidates enumerated
    std::int64_t over_memory = 0;    // dropped because some device cannot hold them (even recomputing)
    std::int64_t recomputing = 0;    // priced with recomputation (when_needed: they fit only with it)
    std::int64_t simulated = 0;
    double seconds = 0;              // the search's own wall time
};

namespace detail {

[[nodiscard]] inline std::vector<int> divisors(std::int64_t n) {
    std::vector<int> out;
    for (std::int64_t k = 1; k <= n; ++k)
        if (n % k == 0) out.push_back(static_cast<int>(k));
    return out;
}

// Every valid candidate, partition left to the cost model.
[[nodiscard]] inline std::vector<Candidate> enumerate(const ModelDescription& model, const Cluster& cluster,
                                                      const SearchOptions& options) {
    std::vector<Candidate> out;
    const int n = cluster.size(), node = cluster.smallest_node();
    const auto layers = static_cast<int>(model.layers.size());
    for (int tp : divisors(n)) {
        if (tp > node && tp > 1) continue;  // tensor groups stay inside a node
        for (int grid = 0; grid <= (options.tensor_grid && tp > 1 && grid_side(tp) > 1 ? 1 : 0); ++grid)
            for (int sp : divisors(n / tp))
                for (int ulysses = 0; ulysses <= (sp > 1 ? 1 : 0); ++ulysses) {
                    if (sp > 1 && !options.sequence) continue;
                    for (int pp : divisors(n / (tp * sp))) {
                        if (pp > layers) continue;
                        const int dp = n / (tp * sp * pp);
                        if (model.batch % dp != 0) continue;
                        for (int m : divisors(model.batch / dp)) {
                            if (m > options.max_micro_batches) continue;
                            std::vector<std::pair<ScheduleKind, int>> schedules{{ScheduleKind::one_f_one_b, 1}};
                            if (pp > 1) {
                                schedules.clear();
                                for (ScheduleKind s : options.schedules)
                                    schedules.emplace_back(s, s == ScheduleKind::interleaved || s == ScheduleKind::zero_bubble_v ? 2 : 1);
                            } else if (m > 1 && (dp * sp == 1)) {
                                continue;  // one rank: more micro-batches only cost time
                            }
                            for (const auto& [schedule, chunks] : schedules)
                                for (int zero : options.zero_stages) {
                                    if (zero > 0 && dp * sp == 1) continue;
                                    Candidate c{dp, pp, tp, sp, grid == 1, ulysses == 1, schedule, chunks, m, zero, {}, {}, {}};
                                    if (why_invalid(model, cluster, c).empty()) out.push_back(c);
                                }
                        }
                    }
                }
    }
    return out;
}

}  // namespace detail

// The best `options.top` plans, fastest first. Throws loom::Error when no
// candidate fits the devices' memory, naming the least memory any needs.
[[nodiscard]] inline SearchReport search(const ModelDescription& model, const Cluster& cluster,
                                         const SearchOptions& options = {}) {
    const auto t0 = std::chrono::steady_clock::now();
    model.validate();
    LOOM_CHECK(options.top >= 1, "search: top ", options.top, "; ask for 1 or more plans");
    SearchReport report;
    const std::vector<Candidate> all = detail::enumerate(model, cluster, options);
    report.candidates = static_cast<std::int64_t>(all.size());
    LOOM_CHECK(!all.empty(), "search: no way to place ", model.name, " on ", cluster.size(),
               " devices (check that the batch of ", model.batch, " splits over the devices)");

    struct Scored {
        Candidate candidate;
        double bound;
        std::size_t layout;  // the candidate of `all` it prices (a layout may be priced with two recomputations)
    };
    std::vector<Scored> scored;
    double least_memory = std::numeric_limits<double>::infinity();
    std::string least_plan;
    int least_device = 0;
    for (std::size_t layout = 0; layout < all.size(); ++layout) {
        Candidate c = all[layout];
        detail::CostModel priced(model, cluster, c);  // holds c by reference: it sees the partition set next
        if (c.pp > 1) c.partition = priced.balanced_partition();
        if (options.recompute == RecomputeSearch::always_full || options.recompute == RecomputeSearch::always_selective) {
            c.recompute = {options.recompute == RecomputeSearch::always_full ? RecomputeMode::full : RecomputeMode::selective, 0};
            c.recomputed = recompute_choice(model, cluster, c, c.partition, c.recompute).layers;
        }
        // Memory first: it is cheap and prunes the most.
        Estimate e;
        e.partition = c.partition;
        double need = priced.memory_only(e);
        std::optional<FittingRecompute> selective;
        if (!e.fits && options.recompute == RecomputeSearch::when_needed) {
            selective = fitting_selective_recompute(model, cluster, c, c.partition);
            if (auto fitting = cheapest_fitting_recompute(model, cluster, c, c.partition)) {
                c.recompute = fitting->spec;
                c.recomputed = std::move(fitting->layers);
            } else {
                // The least it could need, for the message: every layer recomputed.
                c.recompute = {RecomputeMode::full, 0};
                c.recomputed = recompute_choice(model, cluster, c, c.partition, c.recompute).layers;
            }
            need = priced.memory_only(e);
        }
        if (c.recompute.on() && (e.fits || selective)) ++report.recomputing;
        if (selective) {
            // Priced beside the Budget (or Full): the ranking keeps the faster.
            Candidate s = c;
            s.recompute = selective->spec;
            s.recomputed = std::move(selective->layers);
            const double bound = detail::CostModel(model, cluster, s).lower_bound();
            scored.push_back({std::move(s), bound, layout});
            if (!e.fits) continue;  // the Budget's solver found nothing (its granules), Selective fits
        }
        if (!e.fits) {
            ++report.over_memory;
            if (need < least_memory) {
                least_memory = need;
                std::ostringstream s;
                s << c;
                least_plan = s.str();
                least_device = e.peak_device;
            }
            continue;
        }
        scored.push_back({c, priced.lower_bound(), layout});
    }
    if (scored.empty()) {
        std::ostringstream message;
        message << "no plan fits " << model.name << " in the memory of the cluster's devices: the least any plan needs is "
                << least_memory / 1e9 << " GB on device " << cluster.device(least_device).name << " (which has "
                << cluster.device(least_device).memory / 1e9 << " GB), with " << least_plan
                << "; add devices or memory, or shrink the batch or the model";
        LOOM_FAIL(message.str());
    }
    std::stable_sort(scored.begin(), scored.end(), [](const Scored& a, const Scored& b) { return a.bound < b.bound; });
    // One plan per layout: its Selective and its Budget (or Full) compete, the
    // faster stays. Still exact: a pricing whose bound passes the k-th best
    // step can neither enter the top k nor beat its layout's pricing in it.
    std::vector<std::size_t> layouts;  // of report.plans, in its order
    for (const Scored& s : scored) {
        if (static_cast<int>(report.plans.size()) >= options.top &&
            s.bound >= report.plans.back().estimate.step_seconds)
            break;  // sorted by bound: nothing later can enter the top k
        Estimate e = detail::CostModel(model, cluster, s.candidate).run(false);
        ++report.simulated;
        const auto same = std::find(layouts.begin(), layouts.end(), s.layout);
        if (same != layouts.end()) {
            const auto i = same - layouts.begin();
            if (e.step_seconds >= report.plans[static_cast<std::size_t>(i)].estimate.step_seconds) continue;
            report.plans.erase(report.plans.begin() + i);
            layouts.erase(same);
        }
        RankedPlan ranked{s.candidate, std::move(e)};
        const auto at = std::upper_bound(report.plans.begin(), report.plans.end(), ranked.estimate.step_seconds,
                                         [](double t, const RankedPlan& p) { return t < p.estimate.step_seconds; });
        layouts.insert(layouts.begin() + (at - report.plans.begin()), s.layout);
        report.plans.insert(at, std::move(ranked));
        if (static_cast<int>(report.plans.size()) > options.top) {
            report.plans.pop_back();
            layouts.pop_back();
        }
    }
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return report;
}

}  // namespace loom::plan
