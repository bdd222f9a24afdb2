// The recomputation solver against brute force over every subset of random
// chains, the peak formula by hand, the baselines, and every bad input's
// sentence.
//
// What the brute-force tests guarantee:
// - always: `fits` is true exactly when some subset fits; a fitting answer's
//   peak is recompute_peak of its choice and at most the budget; its cost is
//   never below the true optimum.
// - granule-aligned savings (every copies x (kept - output) a multiple of G,
//   slots >= total savings / G): the cost equals the optimum within 1e-12
//   relative, and no other optimal subset has a lower peak.
// - unaligned bytes: the cost is at most the optimum for the budget shrunk by
//   (n + 1) x g, g the less of ceil(bytes to save / slots) and ceil(bytes to
//   spare / slots), where the bytes to save are at most keep-all peak +
//   largest transient - budget, and the bytes to spare at most budget - the
//   least peak any subset reaches.
// - every fitting answer is minimal: keeping any recomputed unit (that costs
//   time) breaks the budget.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "loom/schedule/recompute_solver.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::schedule::recompute_all;
using loom::schedule::recompute_greedy;
using loom::schedule::recompute_none;
using loom::schedule::recompute_peak;
using loom::schedule::RecomputeChoice;
using loom::schedule::RecomputeUnit;
using loom::schedule::solve_recompute;
using Catch::Contains;

namespace {

constexpr std::int64_t KiB = 1024, MiB = 1024 * KiB;

// A random chain of 1..12 units: copies 1..4, about one in six units not
// recomputable, one in ten saving nothing (output = kept), times 1e-5..1e-2 s
// (log-uniform). Aligned (granule > 0): kept - output is a whole number of
// granules up to 10 MiB, the other sizes whole KiB; otherwise bytes are any
// count in 1 KiB..10 MiB.
std::vector<RecomputeUnit> random_chain(std::mt19937& rng, std::int64_t granule) {
    std::uniform_int_distribution<int> count(1, 12), copies(1, 4), die(0, 59);
    std::uniform_real_distribution<double> log_time(std::log(1e-5), std::log(1e-2));
    std::uniform_int_distribution<std::int64_t> bytes(KiB, 10 * MiB);
    std::vector<RecomputeUnit> units(static_cast<std::size_t>(count(rng)));
    for (RecomputeUnit& u : units) {
        u.forward_seconds = std::exp(log_time(rng));
        u.copies = copies(rng);
        const int roll = die(rng);
        u.recomputable = roll >= 10;
        if (granule > 0) {
            std::uniform_int_distribution<std::int64_t> granules(1, 10 * MiB / granule);
            u.output_bytes = bytes(rng) / KiB * KiB;
            u.kept_bytes = u.output_bytes + (roll < 16 && roll >= 10 ? 0 : granules(rng) * granule);
            u.transient_bytes = bytes(rng) / KiB * KiB;
        } else {
            u.output_bytes = bytes(rng);
            u.kept_bytes = std::max(u.output_bytes, bytes(rng));
            if (roll < 16 && roll >= 10) u.kept_bytes = u.output_bytes;
            u.transient_bytes = std::max(bytes(rng), u.kept_bytes / 2);
        }
    }
    return units;
}

struct Subset {
    std::vector<bool> recompute;
    double seconds;
    std::int64_t peak;
};

// Every legal subset (non-recomputable units always kept) with its cost and peak.
std::vector<Subset> every_subset(const std::vector<RecomputeUnit>& units) {
    std::vector<Subset> out;
    const std::size_t n = units.size();
    for (std::uint32_t mask = 0; mask < (1u << n); ++mask) {
        Subset s{std::vector<bool>(n), 0, 0};
        bool legal = true;
        for (std::size_t u = 0; u < n; ++u) {
            s.recompute[u] = (mask >> u) & 1u;
            if (s.recompute[u] && !units[u].recomputable) legal = false;
            if (s.recompute[u]) s.seconds += units[u].forward_seconds;
        }
        if (!legal) continue;
        std::int64_t held = 0, transient = 0;
        for (std::size_t u = 0; u < n; ++u) {
            held += units[u].copies * (s.recompute[u] ? units[u].output_bytes : units[u].kept_bytes);
            if (s.recompute[u]) transient = std::max(transient, units[u].transient_bytes);
        }
        s.peak = held + transient;
        out.push_back(std::move(s));
    }
    return out;
}

// The least cost of a subset fitting `budget`; infinity when none fits.
double least_cost(const std::vector<Subset>& subsets, std::int64_t budget) {
    double best = std::numeric_limits<double>::infinity();
    for (const Subset& s : subsets)
        if (s.peak <= budget) best = std::min(best, s.seconds);
    return best;
}

bool same_time(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(std::abs(b), 1e-300); }

// ~25 budgets from below the least peak to above the keep-all peak, and the
// peaks of a few subsets exactly (the edges where `<=` matters).
std::vector<std::int64_t> budget_sweep(const std::vector<Subset>& subsets, std::mt19937& rng) {
    std::int64_t low = std::numeric_limits<std::int64_t>::max(), high = 0;
    for (const Subset& s : subsets) {
        low = std::min(low, s.peak);
        high = std::max(high, s.peak);
    }
    const std::int64_t from = low - low / 10 - 1, to = high + high / 10 + 1;
    std::vector<std::int64_t> budgets;
    for (int i = 0; i < 20; ++i) budgets.push_back(from + (to - from) * i / 19);
    std::uniform_int_distribution<std::size_t> pick(0, subsets.size() - 1);
    for (int i = 0; i < 5; ++i) budgets.push_back(subsets[pick(rng)].peak);
    budgets.push_back(low);
    for (std::int64_t& b : budgets) b = std::max<std::int64_t>(b, 0);
    return budgets;
}

// What holds of every answer, exact or not.
void check_answer(const std::vector<RecomputeUnit>& units, const std::vector<Subset>& subsets, std::int64_t budget,
                  const RecomputeChoice& got) {
    const double optimum = least_cost(subsets, budget);
    INFO("budget " << budget << ": " << got);
    REQUIRE(got.recompute.size() == units.size());
    REQUIRE(got.fits == std::isfinite(optimum));
    REQUIRE(got.peak_bytes == recompute_peak(units, got.recompute));
    REQUIRE(got.budget_bytes == budget);
    double seconds = 0;
    for (std::size_t u = 0; u < units.size(); ++u)
        if (got.recompute[u]) seconds += units[u].forward_seconds;
    REQUIRE(same_time(got.extra_seconds, seconds));
    if (got.fits) {
        REQUIRE(got.peak_bytes <= budget);
        REQUIRE(got.extra_seconds >= optimum * (1 - 1e-12));
        for (std::size_t u = 0; u < units.size(); ++u) {
            if (!got.recompute[u] || units[u].forward_seconds == 0) continue;
            auto kept = got.recompute;
            kept[u] = false;
            REQUIRE(recompute_peak(units, kept) > budget);
        }
    } else {
        // Nothing fits: the answer is the least peak any subset reaches.
        std::int64_t least = std::numeric_limits<std::int64_t>::max();
        for (const Subset& s : subsets) least = std::min(least, s.peak);
        REQUIRE(got.peak_bytes == least);
    }
}

}  // namespace

TEST_CASE("recompute: the peak of a choice, by hand", "[recompute]") {
    // u0 saves 2 x 90, u1 saves nothing, u2 saves 60 but its transient is 90.
    const std::vector<RecomputeUnit> units{{1e-3, 100, 10, 100, 2, true},
                                           {2e-3, 50, 50, 60, 1, true},
                                           {4e-3, 80, 20, 90, 1, true}};
    CHECK(recompute_peak(units, {false, false, false}) == 2 * 100 + 50 + 80);
    CHECK(recompute_peak(units, {true, false, false}) == 2 * 10 + 50 + 80 + 100);
    CHECK(recompute_peak(units, {true, false, true}) == 2 * 10 + 50 + 20 + 100);
    CHECK(recompute_peak(units, {false, false, true}) == 2 * 100 + 50 + 20 + 90);  // worse than keeping it
    CHECK(recompute_peak(units, {false, true, false}) == 2 * 100 + 50 + 80 + 60);
    CHECK(recompute_peak({}, {}) == 0);

    const RecomputeChoice at_250 = solve_recompute(units, 250);
    CHECK(at_250.recompute == std::vector<bool>{true, false, false});
    CHECK(at_250.peak_bytes == 250);
    CHECK(at_250.fits);
    CHECK(at_250.extra_seconds == 1e-3);
    const RecomputeChoice at_200 = solve_recompute(units, 200);
    CHECK(at_200.recompute == std::vector<bool>{true, false, true});
    CHECK(at_200.peak_bytes == 190);
    CHECK(solve_recompute(units, 330).recompute == std::vector<bool>{false, false, false});

    // Below 190 nothing fits: the least-memory choice comes back, not thrown.
    const RecomputeChoice at_189 = solve_recompute(units, 189);
    CHECK_FALSE(at_189.fits);
    CHECK(at_189.recompute == std::vector<bool>{true, false, true});
    CHECK(at_189.peak_bytes == 190);
}

TEST_CASE("recompute: a choice prints itself", "[recompute]") {
    const std::vector<RecomputeUnit> units{{2e-3, 10 * MiB, 1 * MiB, 2 * MiB, 1, true},
                                           {1.2e-3, 20 * MiB, 2 * MiB + 512 * KiB, 4 * MiB, 1, true},
                                           {1e-3, 30 * MiB, 3 * MiB, 30 * MiB, 1, false}};
    std::ostringstream fits, over, open, tiny, micro;
    fits << solve_recompute(units, 48 * MiB);
    CHECK(fits.str() == "recompute 1 of 3 units, +1.2 ms, peak 46.5 MiB (fits 48 MiB)");
    over << recompute_all(units, 36 * MiB);
    CHECK(over.str() == "recompute 2 of 3 units, +3.2 ms, peak 37.5 MiB (over the budget of 36 MiB)");
    open << recompute_none(units);
    CHECK(open.str() == "recompute 0 of 3 units, +0.0 ms, peak 60 MiB");
    tiny << recompute_none({{5e-5, 2 * KiB, KiB, KiB, 1, true}}, KiB);
    CHECK(tiny.str() == "recompute 0 of 1 units, +0.0 ms, peak 2.0 KiB (over the budget of 1.0 KiB)");
    micro << recompute_all({{5e-5, 2 * KiB, KiB, KiB, 1, true}});
    CHECK(micro.str() == "recompute 1 of 1 units, +50.0 us, peak 2.0 KiB");
}

TEST_CASE("recompute: Full, none and greedy on a hand example; greedy costs at least the optimum", "[recompute]") {
    // Keep-all peak 275; every transient 10. At 185 bytes the units must save
    // 100: a alone (0.7 ms) does. Greedy takes c first (150 bytes per ms
    // beats a's 143), which is not enough, then a: 1.0 ms.
    const std::vector<RecomputeUnit> units{{0.7e-3, 110, 10, 10, 1, true},   // a: saves 100
                                           {0.5e-3, 70, 10, 10, 1, true},    // b: saves 60
                                           {0.3e-3, 55, 10, 10, 1, true},    // c: saves 45
                                           {0.1e-3, 40, 5, 10, 1, false}};   // never recomputed
    const RecomputeChoice none = recompute_none(units, 145);
    CHECK(none.recompute == std::vector<bool>{false, false, false, false});
    CHECK(none.peak_bytes == 275);
    CHECK(none.extra_seconds == 0);
    CHECK_FALSE(none.fits);
    const RecomputeChoice full = recompute_all(units, 145);
    CHECK(full.recompute == std::vector<bool>{true, true, true, false});
    CHECK(full.peak_bytes == 30 + 40 + 10);
    CHECK(full.extra_seconds == Approx(1.5e-3));
    CHECK(full.fits);
    CHECK(recompute_all(units).budget_bytes == loom::schedule::no_recompute_budget);

    const RecomputeChoice greedy = recompute_greedy(units, 185);
    CHECK(greedy.recompute == std::vector<bool>{true, false, true, false});
    CHECK(greedy.peak_bytes == 275 - 145 + 10);
    CHECK(greedy.extra_seconds == Approx(1.0e-3));
    const RecomputeChoice best = solve_recompute(units, 185);
    CHECK(best.recompute == std::vector<bool>{true, false, false, false});
    CHECK(best.peak_bytes == 185);
    CHECK(best.extra_seconds == Approx(0.7e-3));

    CHECK(recompute_greedy(units, 275).recompute == std::vector<bool>{false, false, false, false});
    const RecomputeChoice never = recompute_greedy(units, 79);
    CHECK_FALSE(never.fits);
    CHECK(never.recompute == std::vector<bool>{true, true, true, false});

    // On random chains greedy never beats the optimum, and fits whenever Full does.
    std::mt19937 rng(38);
    for (int trial = 0; trial < 200; ++trial) {
        const auto chain = random_chain(rng, 0);
        const auto subsets = every_subset(chain);
        for (std::int64_t budget : budget_sweep(subsets, rng)) {
            const RecomputeChoice g = recompute_greedy(chain, budget);
            const double optimum = least_cost(subsets, budget);
            INFO("trial " << trial << ", budget " << budget << ": " << g);
            REQUIRE(g.peak_bytes == recompute_peak(chain, g.recompute));
            if (g.fits) REQUIRE(g.extra_seconds >= optimum * (1 - 1e-12));
            if (recompute_all(chain, budget).fits) REQUIRE(g.fits);
        }
    }
}

TEST_CASE("recompute: the optimum over every subset, exactly, when savings share a granule", "[recompute]") {
    std::mt19937 rng(20260038);
    const std::int64_t granules[] = {256 * KiB, 1 * MiB};
    int fitted = 0, unfit = 0;
    for (int trial = 0; trial < 160; ++trial) {
        const std::int64_t granule = granules[trial % 2];
        const auto units = random_chain(rng, granule);
        const auto subsets = every_subset(units);
        std::int64_t total_saving = 0;
        for (const auto& u : units) total_saving += u.copies * (u.kept_bytes - u.output_bytes);
        // Exact once the savings fit in `slots` granules (at least 1 slot).
        const int slots = static_cast<int>(std::max<std::int64_t>(1, total_saving / granule));
        for (std::int64_t budget : budget_sweep(subsets, rng)) {
            INFO("trial " << trial << ", " << units.size() << " units, slots " << slots);
            const RecomputeChoice got = solve_recompute(units, budget, slots);
            check_answer(units, subsets, budget, got);
            if (!got.fits) {
                ++unfit;
                continue;
            }
            ++fitted;
            const double optimum = least_cost(subsets, budget);
            REQUIRE(same_time(got.extra_seconds, optimum));
            for (const Subset& s : subsets)  // ties go to the least peak
                if (s.peak <= budget && same_time(s.seconds, optimum)) REQUIRE(got.peak_bytes <= s.peak);
        }
    }
    CHECK(fitted > 1000);  // the sweep really tests both outcomes
    CHECK(unfit > 100);
}

TEST_CASE("recompute: on unaligned bytes the answer beats the optimum for a budget n + 1 slots smaller",
          "[recompute]") {
    std::mt19937 rng(1338);
    int tight = 0;
    for (const int slots : {500, 40, 3}) {
        for (int trial = 0; trial < 150; ++trial) {
            const auto units = random_chain(rng, 0);
            const auto subsets = every_subset(units);
            std::int64_t keep_all = 0, largest_transient = 0, least_peak = std::numeric_limits<std::int64_t>::max();
            for (const Subset& s : subsets) least_peak = std::min(least_peak, s.peak);
            for (const auto& u : units) {
                keep_all += u.copies * u.kept_bytes;
                if (u.recomputable) largest_transient = std::max(largest_transient, u.transient_bytes);
            }
            const auto n = static_cast<std::int64_t>(units.size());
            for (std::int64_t budget : budget_sweep(subsets, rng)) {
                INFO("slots " << slots << ", trial " << trial << ", " << n << " units");
                const RecomputeChoice got = solve_recompute(units, budget, slots);
                check_answer(units, subsets, budget, got);
                const std::int64_t need = std::max<std::int64_t>(0, keep_all + largest_transient - budget);
                const std::int64_t spare = std::max<std::int64_t>(0, budget - least_peak);
                const std::int64_t granule = std::min((need + slots - 1) / slots, (spare + slots - 1) / slots);
                const double shrunk = least_cost(subsets, budget - (n + 1) * granule);
                if (std::isfinite(shrunk)) {
                    REQUIRE(got.fits);
                    REQUIRE(got.extra_seconds <= shrunk * (1 + 1e-12));
                    if (!same_time(shrunk, least_cost(subsets, budget))) ++tight;
                }
            }
        }
    }
    CHECK(tight > 0);  // the bound was not only ever met by the exact optimum
}

TEST_CASE("recompute: among equally cheap choices the lower peak wins", "[recompute]") {
    // Within one transient cap: y and x cost the same, x saves more.
    const std::vector<RecomputeUnit> same_cap{{1e-3, 100, 50, 10, 1, true},   // y: saves 50
                                              {1e-3, 100, 10, 10, 1, true}};  // x: saves 90
    const RecomputeChoice within = solve_recompute(same_cap, 170);
    CHECK(within.recompute == std::vector<bool>{false, true});
    CHECK(within.peak_bytes == 120);
    // Across caps: b alone fits under the smaller cap, a (larger transient,
    // same time) under the larger one with a lower peak.
    const std::vector<RecomputeUnit> two_caps{{1e-3, 100, 10, 10, 1, true},   // b: 310 - 90 + 10
                                              {1e-3, 210, 10, 20, 1, true}};  // a: 310 - 200 + 20
    const RecomputeChoice across = solve_recompute(two_caps, 250);
    CHECK(across.recompute == std::vector<bool>{false, true});
    CHECK(across.peak_bytes == 130);
}

TEST_CASE("recompute: coarse slots still find the optimum, counting bytes to save or bytes to spare", "[recompute]") {
    // a saves 10 bytes in 1 ms; b, c, d save 1000 each in 5 ms. Keep-all 3320.
    const std::vector<RecomputeUnit> units{{1e-3, 20, 10, 0, 1, true},
                                           {5e-3, 1100, 100, 0, 1, true},
                                           {5e-3, 1100, 100, 0, 1, true},
                                           {5e-3, 1100, 100, 0, 1, true}};
    // 10 bytes to save, 3000 to spare: one slot of the bytes to save finds a
    // (one of the bytes to spare keeps a, b and c, recomputing d for 5 ms).
    const RecomputeChoice save_10 = solve_recompute(units, 3310, 1);
    CHECK(save_10.recompute == std::vector<bool>{true, false, false, false});
    CHECK(save_10.extra_seconds == 1e-3);
    // 1501 bytes to save, 1050 to spare (found by a search against a solver
    // that only counts the bytes to save): two slots of the bytes to spare
    // keep b and d, so a and c are recomputed for 9 ms, where one that counts
    // only the bytes to save lands on 15 ms.
    const std::vector<RecomputeUnit> four{{1e-3, 800, 100, 0, 1, true},    // a: saves 700
                                          {6e-3, 150, 100, 0, 1, true},    // b: saves 50
                                          {8e-3, 950, 100, 0, 1, true},    // c: saves 850
                                          {7e-3, 900, 100, 0, 1, true}};   // d: saves 800
    const RecomputeChoice save_1501 = solve_recompute(four, 1299, 2);
    CHECK(save_1501.recompute == std::vector<bool>{true, false, true, false});
    CHECK(save_1501.extra_seconds == Approx(9e-3));
    CHECK(save_1501.peak_bytes == 2800 - 1550);
}

TEST_CASE("recompute: keeping the largest transient again can let another unit be kept", "[recompute]") {
    // Kept again dearest first, b (transient 500) does not fit at first while
    // a's transient 900 counts; once a is kept, b fits too.
    const std::vector<RecomputeUnit> units{{1e-3, 200, 100, 900, 1, true},    // a
                                           {2e-3, 200, 100, 500, 1, true},    // b
                                           {1e-4, 10000, 10, 400, 1, true}};  // c: must go
    // Keep-all 10400; {a, b, c}: 10400 - 10190 + 900 = 1110; {c}: 810.
    std::vector<bool> r{true, true, true};
    loom::schedule::detail::keep_while_it_fits(units, r, 900);  // b is passed over first: 1210 > 900
    CHECK(r == std::vector<bool>{false, false, true});
    const RecomputeChoice got = solve_recompute(units, 900);
    CHECK(got.recompute == std::vector<bool>{false, false, true});
    CHECK(got.peak_bytes == 810);
}

TEST_CASE("recompute: units that cannot or need not be recomputed stay kept", "[recompute]") {
    const std::vector<RecomputeUnit> units{{1e-3, 100, 10, 0, 1, false},  // the policy says no
                                           {0, 100, 100, 0, 1, true},     // saves nothing, costs nothing
                                           {1e-3, 100, 10, 0, 3, true}};
    const RecomputeChoice got = solve_recompute(units, 0);
    CHECK_FALSE(got.fits);
    CHECK(got.recompute == std::vector<bool>{false, false, true});
    CHECK(got.peak_bytes == 100 + 100 + 30);
    CHECK(solve_recompute({}, 0).fits);
    CHECK(solve_recompute({}, 0).recompute.empty());
}

TEST_CASE("recompute: every bad input is refused with a sentence naming it", "[recompute]") {
    const RecomputeUnit good{1e-3, 100, 10, 100, 1, true};
    const auto with = [&](auto change) {
        std::vector<RecomputeUnit> units{good, good};
        change(units[1]);
        return units;
    };
    const auto negative_time = with([](RecomputeUnit& u) { u.forward_seconds = -1; });
    REQUIRE_THROWS_WITH(solve_recompute(negative_time, 1000),
                        Contains("recompute: unit 1 has forward_seconds -1; it must be a finite time >= 0"));
    const auto nan_time = with([](RecomputeUnit& u) { u.forward_seconds = std::nan(""); });
    REQUIRE_THROWS_WITH(recompute_greedy(nan_time, 1000), Contains("unit 1 has forward_seconds nan"));
    const auto negative_kept = with([](RecomputeUnit& u) { u.kept_bytes = -5; });
    REQUIRE_THROWS_WITH(recompute_all(negative_kept), Contains("recompute: unit 1 has kept_bytes -5; byte counts are >= 0"));
    const auto negative_output = with([](RecomputeUnit& u) { u.output_bytes = -5; });
    REQUIRE_THROWS_WITH(recompute_none(negative_output),
                        Contains("recompute: unit 1 has output_bytes -5; byte counts are >= 0"));
    const auto negative_transient = with([](RecomputeUnit& u) { u.transient_bytes = -5; });
    REQUIRE_THROWS_WITH(recompute_peak(negative_transient, {false, false}),
                        Contains("recompute: unit 1 has transient_bytes -5; byte counts are >= 0"));
    const auto output_over_kept = with([](RecomputeUnit& u) { u.output_bytes = 101; });
    REQUIRE_THROWS_WITH(solve_recompute(output_over_kept, 1000),
                        Contains("recompute: unit 1 has output_bytes 101 > kept_bytes 100; a kept unit holds its "
                                 "output too, so output_bytes <= kept_bytes"));
    const auto no_copies = with([](RecomputeUnit& u) { u.copies = 0; });
    REQUIRE_THROWS_WITH(solve_recompute(no_copies, 1000),
                        Contains("recompute: unit 1 has copies 0; at least 1 micro-batch of it is in flight"));
    const auto huge = with([](RecomputeUnit& u) {
        u.kept_bytes = std::int64_t{1} << 61;
        u.copies = 4;
    });
    REQUIRE_THROWS_WITH(solve_recompute(huge, 1000),
                        Contains("recompute: unit 1 holds 4 x 2305843009213693952 bytes (+ 100 transient); the "
                                 "solver counts at most 2^62 bytes over all 2 units"));
    const std::vector<RecomputeUnit> units{good, good};
    REQUIRE_THROWS_WITH(solve_recompute(units, -1), Contains("recompute: budget -1 bytes; a budget is >= 0 bytes"));
    REQUIRE_THROWS_WITH(recompute_greedy(units, -2), Contains("recompute: budget -2 bytes"));
    REQUIRE_THROWS_WITH(recompute_all(units, -3), Contains("recompute: budget -3 bytes"));
    REQUIRE_THROWS_WITH(solve_recompute(units, 1000, 0),
                        Contains("recompute: 0 slots; the solver needs at least 1 (500 is usual)"));
    REQUIRE_THROWS_WITH(recompute_peak(units, {true}),
                        Contains("recompute: a choice of 1 flags for 2 units; give one per unit"));
    auto fixed = units;
    fixed[0].recomputable = false;
    REQUIRE_THROWS_WITH(recompute_peak(fixed, {true, false}),
                        Contains("recompute: unit 0 is chosen for recomputation but is not recomputable; leave it kept"));
}

}  // namespace LOOM_TEST_FILE
