// Which units to recompute under a memory budget (issue 38): the solver
// behind Recompute<...>, pure arithmetic, no executor.
//
// The model is the one-level recomputation the executor runs. A rank holds a
// chain of units; a recomputed unit drops its activations after its forward,
// keeps only its output (the next unit's input, copied aside) and reruns its
// forward once, from that kept input, right before its backward. For a set R
// of recomputed units:
//
//   peak(R) = sum_u copies_u * (u in R ? output_bytes_u : kept_bytes_u)
//             + max_{u in R} transient_bytes_u          (0 when R is empty)
//   cost(R) = sum_{u in R} forward_seconds_u
//
// kept_bytes counts everything a kept unit holds from its forward to its
// backward (saved activations, output, its backward's temporaries); copies is
// how many micro-batches of the unit are in flight at the peak (p - s for 1F1B
// stage s of p). Only one recomputed unit runs at a time, so only the largest
// transient adds. The formula is the bound the executor reserves: it counts
// every unit's bytes while the largest transient runs. That is reached when
// the unit with the largest transient is the last of the chain (the first
// backward); otherwise it overstates by what the units after it have already
// released in that micro-batch's backward, never understates.
//
// Why the answer is exact for what the executor runs: each unit is either
// kept or recomputed once from its own kept input, so the executor's choices
// are exactly the 2^n subsets R, and solve_recompute finds the least-cost one
// under the budget (exactly when the savings share a granule that fits in
// `slots` slots, otherwise within n + 1 slots of memory; see below). Rotor
// (Beaumont et al.; ColossalAI's ckpt_solver_rotor) solves a larger space:
// its table C[m][i][j] lets a "leaf" segment be recomputed from a checkpoint
// several units back and recursively, so one unit's forward may run several
// times. loom's executor runs none of those nested sequences, so Rotor's
// optimum may be one it cannot execute, while a one-level answer costs Rotor
// O(slots * n^3) where this DP needs O(slots * n^2).
//
// Chen's sqrt(n) segments do not apply in this model either: a segment keeps
// only its first input and reruns all its units together, holding several
// units' activations (and, under ZeRO-3, several units' gathered parameters)
// at once. ZeRO-3 gathers one unit's parameters at a time and releases them,
// so the executor recomputes one unit at a time; a coarser segment is a
// coarser unit, chosen where units are drawn, not here.
//
// The algorithm. Write s_u = copies_u * (kept_bytes_u - output_bytes_u) (what
// recomputing u saves) and base = peak({}). The max transient term is handled
// by enumerating its cap: for each distinct transient value t, only units with
// transient <= t may be recomputed, and R fits when sum_{u in R} s_u >= need_t
// = base + t - budget. That is a 0/1 knapsack, solved by a dynamic programme
// twice, and the cheaper answer kept: covering (the recomputed set saves at
// least need_t, least time) and packing (the kept set takes at most spare_t =
// budget - peak(all allowed), most time), so whichever of need_t and spare_t
// is smaller is counted in finer granules. Each counts bytes in granules g,
// a state being the granules of its best set's exact sum (rounded so that
// everything it reports truly fits); then any recomputed unit the room left
// by rounding allows is kept again, so no answer could keep one more unit.
// When every s_u is a multiple of a common granule G and need_t or spare_t is
// at most slots * G, g = G and the answer is exact; otherwise g is
// ceil(need_t / slots) covering, ceil(spare_t / slots) packing, and the answer
// is at least as cheap as the optimum for the budget shrunk by (n + 1) * g for
// the smaller g. Time O(n^2 * slots). Among equally cheap answers the lower
// peak wins.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/policy.hpp"  // readable_bytes

namespace loom::schedule {

struct RecomputeUnit {
    double forward_seconds = 0;       // one extra forward: what recomputing costs
    std::int64_t kept_bytes = 0;      // held from forward to backward when kept
    std::int64_t output_bytes = 0;    // held when recomputed (<= kept_bytes)
    std::int64_t transient_bytes = 0; // taken by its recompute + backward while they run
    int copies = 1;                   // micro-batches of it in flight at the peak
    bool recomputable = true;         // false: always kept
};

// A budget no choice is measured against (recompute_all / recompute_none
// without one).
inline constexpr std::int64_t no_recompute_budget = std::numeric_limits<std::int64_t>::max();

struct RecomputeChoice {
    std::vector<bool> recompute;  // one per unit
    double extra_seconds = 0;     // the recomputes' forwards
    std::int64_t peak_bytes = 0;  // recompute_peak of `recompute`
    bool fits = false;            // peak_bytes <= budget_bytes
    std::int64_t budget_bytes = no_recompute_budget;

    [[nodiscard]] int recomputed() const {
        return static_cast<int>(std::count(recompute.begin(), recompute.end(), true));
    }

    // "recompute 5 of 12 units, +3.2 ms, peak 41.0 MiB (fits 48 MiB)"
    friend std::ostream& operator<<(std::ostream& out, const RecomputeChoice& c) {
        std::ostringstream time;
        time.precision(1);
        time << std::fixed;
        if (c.extra_seconds >= 1) time << c.extra_seconds << " s";
        else if (c.extra_seconds >= 1e-3 || c.extra_seconds == 0) time << c.extra_seconds * 1e3 << " ms";
        else time << c.extra_seconds * 1e6 << " us";
        out << "recompute " << c.recomputed() << " of " << c.recompute.size() << " units, +" << time.str()
            << ", peak " << readable_bytes(c.peak_bytes);
        if (c.budget_bytes == no_recompute_budget) return out;
        return out << (c.fits ? " (fits " : " (over the budget of ") << readable_bytes(c.budget_bytes) << ")";
    }
};

namespace detail {

inline void check_recompute_units(const std::vector<RecomputeUnit>& units) {
    // Sums stay far from int64's end: no unit's share may pass 2^62 / n.
    const double limit = std::ldexp(1.0, 62) / static_cast<double>(std::max<std::size_t>(units.size(), 1));
    for (std::size_t u = 0; u < units.size(); ++u) {
        const RecomputeUnit& x = units[u];
        LOOM_CHECK(std::isfinite(x.forward_seconds) && x.forward_seconds >= 0, "recompute: unit ", u,
                   " has forward_seconds ", x.forward_seconds, "; it must be a finite time >= 0");
        LOOM_CHECK(x.kept_bytes >= 0, "recompute: unit ", u, " has kept_bytes ", x.kept_bytes, "; byte counts are >= 0");
        LOOM_CHECK(x.output_bytes >= 0, "recompute: unit ", u, " has output_bytes ", x.output_bytes,
                   "; byte counts are >= 0");
        LOOM_CHECK(x.transient_bytes >= 0, "recompute: unit ", u, " has transient_bytes ", x.transient_bytes,
                   "; byte counts are >= 0");
        LOOM_CHECK(x.output_bytes <= x.kept_bytes, "recompute: unit ", u, " has output_bytes ", x.output_bytes,
                   " > kept_bytes ", x.kept_bytes, "; a kept unit holds its output too, so output_bytes <= kept_bytes");
        LOOM_CHECK(x.copies >= 1, "recompute: unit ", u, " has copies ", x.copies,
                   "; at least 1 micro-batch of it is in flight");
        LOOM_CHECK(static_cast<double>(x.copies) * static_cast<double>(x.kept_bytes) + static_cast<double>(x.transient_bytes) < limit,
                   "recompute: unit ", u, " holds ", x.copies, " x ", x.kept_bytes, " bytes (+ ", x.transient_bytes,
                   " transient); the solver counts at most 2^62 bytes over all ", units.size(), " units");
    }
}

inline void check_recompute_budget(std::int64_t budget_bytes) {
    LOOM_CHECK(budget_bytes >= 0, "recompute: budget ", budget_bytes, " bytes; a budget is >= 0 bytes");
}

// What recomputing u saves; 0 when it saves nothing (never worth choosing).
[[nodiscard]] inline std::int64_t recompute_saving(const RecomputeUnit& u) {
    return u.copies * (u.kept_bytes - u.output_bytes);
}

// recompute_peak without the checks (the units are checked once per call).
[[nodiscard]] inline std::int64_t peak_unchecked(const std::vector<RecomputeUnit>& units, const std::vector<bool>& r) {
    std::int64_t held = 0, transient = 0;
    for (std::size_t u = 0; u < units.size(); ++u) {
        const RecomputeUnit& x = units[u];
        held += x.copies * (r[u] ? x.output_bytes : x.kept_bytes);
        if (r[u]) transient = std::max(transient, x.transient_bytes);
    }
    return held + transient;
}

[[nodiscard]] inline RecomputeChoice make_choice(const std::vector<RecomputeUnit>& units, std::vector<bool> r,
                                                 std::int64_t budget_bytes) {
    RecomputeChoice c;
    for (std::size_t u = 0; u < units.size(); ++u)
        if (r[u]) c.extra_seconds += units[u].forward_seconds;
    c.peak_bytes = peak_unchecked(units, r);
    c.recompute = std::move(r);
    c.budget_bytes = budget_bytes;
    c.fits = c.peak_bytes <= budget_bytes;
    return c;
}

// Least time, then least peak.
[[nodiscard]] inline bool cheaper(const RecomputeChoice& a, const RecomputeChoice& b) {
    return a.extra_seconds < b.extra_seconds || (a.extra_seconds == b.extra_seconds && a.peak_bytes < b.peak_bytes);
}

// The units worth recomputing (recomputable, saving something) whose
// transient is at most `cap`.
[[nodiscard]] inline std::vector<std::size_t> recompute_candidates(const std::vector<RecomputeUnit>& units,
                                                                   std::int64_t cap) {
    std::vector<std::size_t> out;
    for (std::size_t u = 0; u < units.size(); ++u)
        if (units[u].recomputable && recompute_saving(units[u]) > 0 && units[u].transient_bytes <= cap) out.push_back(u);
    return out;
}

// One 0/1 knapsack over `items` (the units allowed under a cap), both ways:
// covering picks the recomputed set X (least seconds, sum_X saving >= bound),
// packing picks the kept set X (most seconds, sum_X saving <= bound). Bytes are
// counted in granules; a state is the granules of the exact sum its best set
// saves (floor for covering, ceil for packing), so rounding never lets an
// answer break the bound, and it does not pile up item by item: the state's
// best set lags any other set in its state by less than one granule. Ties go
// to the set that saves more (covering) or keeps less (packing). Returns X,
// or nothing when no state meets the bound.
[[nodiscard]] inline std::vector<bool> knapsack_savings(const std::vector<RecomputeUnit>& units,
                                                        const std::vector<std::size_t>& items, std::int64_t bound,
                                                        int slots, bool covering) {
    std::int64_t common = 0;
    for (std::size_t u : items) common = std::gcd(common, recompute_saving(units[u]));
    std::int64_t granule = 1, states = 0;  // covering: reach `states`; packing: stay within it
    if (covering && bound > 0) {
        granule = common > 0 && (bound + common - 1) / common <= slots ? common : (bound + slots - 1) / slots;
        states = (bound + granule - 1) / granule;
    } else if (!covering && bound > 0) {
        granule = common > 0 && bound / common <= slots ? common : (bound + slots - 1) / slots;
        states = bound / granule;
    }
    const double sign = covering ? 1 : -1;  // both minimise sign * seconds
    struct Best {
        double score = std::numeric_limits<double>::infinity();
        std::int64_t saved = 0;  // the set's exact saving
    };
    const auto better = [covering](const Best& a, const Best& b) {
        return a.score < b.score || (a.score == b.score && (covering ? a.saved > b.saved : a.saved < b.saved));
    };
    const auto width = static_cast<std::size_t>(states + 1);
    std::vector<Best> best(width), next;
    best[0].score = 0;
    // from[i * width + k]: the state item i was added to on the way to k; -1 when not added.
    std::vector<std::int32_t> from(items.size() * width, -1);
    for (std::size_t i = 0; i < items.size(); ++i) {
        const RecomputeUnit& x = units[items[i]];
        const std::int64_t saving = recompute_saving(x);
        next = best;
        for (std::size_t k = 0; k < width; ++k) {
            const Best& at = best[k];
            if (!std::isfinite(at.score)) continue;
            const std::int64_t saved = at.saved + saving;
            std::int64_t to = covering ? std::min(states, saved / granule) : (saved + granule - 1) / granule;
            if (to > states) continue;  // packing: over the bound
            const Best taken{at.score + sign * x.forward_seconds, saved};
            if (better(taken, next[static_cast<std::size_t>(to)])) {
                next[static_cast<std::size_t>(to)] = taken;
                from[i * width + static_cast<std::size_t>(to)] = static_cast<std::int32_t>(k);
            }
        }
        best.swap(next);
    }
    std::size_t end = width - 1;  // covering ends in the last state; packing in its best one
    if (!covering)
        for (std::size_t k = 0; k < width; ++k)
            if (better(best[k], best[end])) end = k;
    if (!std::isfinite(best[end].score)) return {};
    std::vector<bool> chosen(units.size(), false);
    std::size_t k = end;
    for (std::size_t i = items.size(); i-- > 0;) {
        const std::int32_t was = from[i * width + k];
        if (was < 0) continue;
        chosen[items[i]] = true;
        k = static_cast<std::size_t>(was);
    }
    return chosen;
}

// Keeps again, dearest first, every recomputed unit the budget still allows
// once the others are chosen: rounding leaves the DP's answer some room. (A
// free recompute stays: it only lowers the peak.)
inline void keep_while_it_fits(const std::vector<RecomputeUnit>& units, std::vector<bool>& r, std::int64_t budget) {
    std::vector<std::size_t> chosen;
    for (std::size_t u = 0; u < units.size(); ++u)
        if (r[u] && units[u].forward_seconds > 0) chosen.push_back(u);
    std::stable_sort(chosen.begin(), chosen.end(), [&](std::size_t a, std::size_t b) {
        return units[a].forward_seconds > units[b].forward_seconds;
    });
    // Keeping the unit with the largest transient lowers the max, which may
    // let one passed over before fit: repeat until nothing changes.
    for (bool changed = true; changed;) {
        changed = false;
        for (std::size_t u : chosen) {
            if (!r[u]) continue;
            r[u] = false;
            if (peak_unchecked(units, r) > budget) r[u] = true;
            else changed = true;
        }
    }
}

// The distinct transients of the units worth recomputing, ascending.
[[nodiscard]] inline std::vector<std::int64_t> transient_caps(const std::vector<RecomputeUnit>& units) {
    std::vector<std::int64_t> caps;
    for (const RecomputeUnit& x : units)
        if (x.recomputable && recompute_saving(x) > 0) caps.push_back(x.transient_bytes);
    std::sort(caps.begin(), caps.end());
    caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
    return caps;
}

}  // namespace detail

// The peak of a choice (the formula above). Every recomputed unit must be
// recomputable.
[[nodiscard]] inline std::int64_t recompute_peak(const std::vector<RecomputeUnit>& units,
                                                 const std::vector<bool>& recompute) {
    detail::check_recompute_units(units);
    LOOM_CHECK(recompute.size() == units.size(), "recompute: a choice of ", recompute.size(), " flags for ",
               units.size(), " units; give one per unit");
    for (std::size_t u = 0; u < units.size(); ++u)
        LOOM_CHECK(!recompute[u] || units[u].recomputable, "recompute: unit ", u,
                   " is chosen for recomputation but is not recomputable; leave it kept");
    return detail::peak_unchecked(units, recompute);
}

// Keep every unit: no extra time, the largest peak.
[[nodiscard]] inline RecomputeChoice recompute_none(const std::vector<RecomputeUnit>& units,
                                                    std::int64_t budget_bytes = no_recompute_budget) {
    detail::check_recompute_units(units);
    detail::check_recompute_budget(budget_bytes);
    return detail::make_choice(units, std::vector<bool>(units.size(), false), budget_bytes);
}

// Full recomputation: every recomputable unit.
[[nodiscard]] inline RecomputeChoice recompute_all(const std::vector<RecomputeUnit>& units,
                                                   std::int64_t budget_bytes = no_recompute_budget) {
    detail::check_recompute_units(units);
    detail::check_recompute_budget(budget_bytes);
    std::vector<bool> r(units.size());
    for (std::size_t u = 0; u < units.size(); ++u) r[u] = units[u].recomputable;
    return detail::make_choice(units, std::move(r), budget_bytes);
}

// The cheap baseline: recompute units in decreasing order of bytes saved per
// second of recompute until the peak fits (fits = false, with every unit worth
// recomputing chosen, when it never does).
[[nodiscard]] inline RecomputeChoice recompute_greedy(const std::vector<RecomputeUnit>& units,
                                                      std::int64_t budget_bytes) {
    detail::check_recompute_units(units);
    detail::check_recompute_budget(budget_bytes);
    std::vector<std::size_t> order = detail::recompute_candidates(units, no_recompute_budget);
    const auto rate = [&](std::size_t u) {  // bytes per second; a free recompute first
        const double seconds = units[u].forward_seconds;
        const auto saved = static_cast<double>(detail::recompute_saving(units[u]));
        return seconds > 0 ? saved / seconds : std::numeric_limits<double>::infinity();
    };
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return rate(a) > rate(b); });
    std::vector<bool> r(units.size(), false);
    for (std::size_t i = 0; i <= order.size(); ++i) {
        if (detail::peak_unchecked(units, r) <= budget_bytes || i == order.size()) break;
        r[order[i]] = true;
    }
    return detail::make_choice(units, std::move(r), budget_bytes);
}

// The least-cost choice whose peak fits `budget_bytes` (then the least peak).
// `slots` bounds the DP's memory axis (time O(n^2 * slots), memory
// O(n * slots)): the answer is
// exact when the units' savings share a granule G and the bytes to save (or
// to spare) are at most slots * G, and otherwise at least as cheap as the
// optimum for a budget (n + 1) slots smaller, a slot being 1/slots of the
// bytes to save or of the bytes to spare, whichever is less; and no
// recomputed unit could be kept without breaking the budget. When
// nothing fits it returns the choice with the least peak, with fits = false:
// recomputing every recomputable unit that saves bytes, unless a unit's
// transient costs more than recomputing it saves.
[[nodiscard]] inline RecomputeChoice solve_recompute(const std::vector<RecomputeUnit>& units,
                                                     std::int64_t budget_bytes, int slots = 500) {
    detail::check_recompute_units(units);
    detail::check_recompute_budget(budget_bytes);
    LOOM_CHECK(slots >= 1, "recompute: ", slots, " slots; the solver needs at least 1 (500 is usual)");
    RecomputeChoice best = detail::make_choice(units, std::vector<bool>(units.size(), false), budget_bytes);
    RecomputeChoice least_memory = best;
    const std::int64_t base = best.peak_bytes;
    for (std::int64_t cap : detail::transient_caps(units)) {
        const std::vector<std::size_t> items = detail::recompute_candidates(units, cap);
        std::vector<bool> all(units.size(), false);
        for (std::size_t u : items) all[u] = true;
        RecomputeChoice every = detail::make_choice(units, std::move(all), budget_bytes);
        if (every.peak_bytes < least_memory.peak_bytes ||
            (every.peak_bytes == least_memory.peak_bytes && every.extra_seconds < least_memory.extra_seconds))
            least_memory = every;
        if (!every.fits) continue;  // not even all of them: nothing under this cap fits
        // Covering counts the bytes to save, packing the bytes to spare: the
        // smaller of the two gets the finer granule, so both run.
        const std::int64_t need = base + cap - budget_bytes, spare = budget_bytes - every.peak_bytes;
        for (const bool covering : {true, false}) {
            std::vector<bool> r = detail::knapsack_savings(units, items, covering ? need : spare, slots, covering);
            if (r.empty()) continue;
            if (!covering)  // r is the kept set: recompute the rest
                for (std::size_t u : items) r[u] = !r[u];
            detail::keep_while_it_fits(units, r, budget_bytes);
            RecomputeChoice found = detail::make_choice(units, std::move(r), budget_bytes);
            if (!best.fits || detail::cheaper(found, best)) best = std::move(found);
        }
    }
    if (best.fits || !least_memory.fits) return best.fits ? best : least_memory;
    // Rounding hid every fitting choice but the least-memory one.
    detail::keep_while_it_fits(units, least_memory.recompute, budget_bytes);
    return detail::make_choice(units, std::move(least_memory.recompute), budget_bytes);
}

}  // namespace loom::schedule
