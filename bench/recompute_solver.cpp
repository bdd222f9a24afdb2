// bench_recompute_solver: how long schedule::solve_recompute takes (12 to 96
// units, 500 slots, median of 5) beside the greedy baseline and, at 12 units,
// brute force over every subset in the same run; then what its choice costs
// on a GPT-like chain (embedding, 96 blocks, final LayerNorm, head, loss)
// against greedy, Full recomputation and the true optimum (enumerated over
// its kinds of unit) at 5 budgets; and, on heterogeneous 20-unit chains, how
// far the DP and greedy land above brute force's optimum.
//
// The GPT-like chain is made up but sized like GPT-3 175B on one rank of
// tensor + sequence parallelism 8 (s 2048, micro-batch 1, h 12288, 96 heads,
// bf16, no flash attention), with GPT-3's alternating dense and locally
// banded (window 256) attention blocks; Korthikanti et al.'s
// sbh(34/t + 5as/(ht)) bytes per block, forwards at 300 TFLOP/s.
//
//   bench_recompute_solver [--reps 5]
#include <loom/schedule/recompute_solver.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "timing.hpp"

using loom::schedule::RecomputeChoice;
using loom::schedule::RecomputeUnit;

namespace {

constexpr std::int64_t MiB = std::int64_t{1} << 20;

// n units with unaligned bytes and distinct transients: the DP's worst case
// (n caps, every one a full table of `slots`).
std::vector<RecomputeUnit> random_units(int n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::int64_t> bytes(MiB, 400 * MiB);
    std::uniform_real_distribution<double> seconds(1e-4, 5e-3);
    std::vector<RecomputeUnit> units(static_cast<std::size_t>(n));
    for (RecomputeUnit& u : units) {
        u.kept_bytes = bytes(rng);
        u.output_bytes = u.kept_bytes / 50 + 1;
        u.transient_bytes = u.kept_bytes + bytes(rng) / 100;
        u.forward_seconds = seconds(rng);
    }
    return units;
}

// A heterogeneous chain: copies 1..4 (a 1F1B rank with interleaved stages),
// outputs 2..50% of what a unit keeps, transients 50..150% of it.
std::vector<RecomputeUnit> mixed_units(int n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::int64_t> bytes(MiB, 400 * MiB);
    std::uniform_int_distribution<int> copies(1, 4);
    std::uniform_real_distribution<double> seconds(1e-4, 5e-3), output(0.02, 0.5), transient(0.5, 1.5);
    std::vector<RecomputeUnit> units(static_cast<std::size_t>(n));
    for (RecomputeUnit& u : units) {
        u.kept_bytes = bytes(rng);
        u.output_bytes = static_cast<std::int64_t>(output(rng) * static_cast<double>(u.kept_bytes));
        u.transient_bytes = static_cast<std::int64_t>(transient(rng) * static_cast<double>(u.kept_bytes));
        u.copies = copies(rng);
        u.forward_seconds = seconds(rng);
    }
    return units;
}

// Halfway between recomputing everything and keeping everything.
std::int64_t middle_budget(const std::vector<RecomputeUnit>& units) {
    return (loom::schedule::recompute_all(units).peak_bytes + loom::schedule::recompute_none(units).peak_bytes) / 2;
}

// The least cost over every subset (units all recomputable).
double brute_force(const std::vector<RecomputeUnit>& units, std::int64_t budget) {
    double best = 1e300;
    const std::size_t n = units.size();
    std::vector<bool> r(n);
    for (std::uint32_t mask = 0; mask < (1u << n); ++mask) {
        double seconds = 0;
        for (std::size_t u = 0; u < n; ++u) {
            r[u] = (mask >> u) & 1u;
            if (r[u]) seconds += units[u].forward_seconds;
        }
        if (seconds < best && loom::schedule::recompute_peak(units, r) <= budget) best = seconds;
    }
    return best;
}

std::int64_t whole_mib(double bytes) { return static_cast<std::int64_t>(std::ceil(bytes / static_cast<double>(MiB))) * MiB; }

// See the header comment: GPT-3 175B's chain on one tp 8 + sp 8 rank.
std::vector<RecomputeUnit> gpt_chain() {
    const double s = 2048, h = 12288, a = 96, t = 8, vocab = 50257, flops = 300e12, window = 256;
    const double sbh = s * h;
    const std::int64_t boundary = whole_mib(sbh * 2 / t);  // a block's output, bf16, cut by sp
    std::vector<RecomputeUnit> chain;
    // The embedding: its output is all it keeps; outside the policy.
    chain.push_back({1e-5, boundary, boundary, boundary, 1, false});
    for (int block = 0; block < 96; ++block) {
        const bool dense = block % 2 == 0;
        const double span = dense ? s : window;  // keys each query attends to
        const std::int64_t kept = whole_mib(sbh * (34 / t + 5 * a * span / (h * t)));
        const double seconds = (24 * s * h * h + 4 * s * span * h) / t / flops;
        chain.push_back({seconds, kept, boundary, kept, 1, true});
    }
    chain.push_back({0.05e-3, 2 * boundary, boundary, 2 * boundary, 1, true});  // ln_f: input and output
    const std::int64_t logits = whole_mib(s * vocab / t * 2);
    chain.push_back({2 * s * h * vocab / t / flops, boundary + logits, logits, boundary + logits, 1, true});  // head
    const std::int64_t probabilities = whole_mib(s * vocab / t * 4);  // f32 softmax
    chain.push_back({0.1e-3, probabilities, 4, probabilities, 1, true});  // loss: its output is one number
    return chain;
}

// The chain's true optimum: its blocks come in two kinds of 48 identical
// units, and the peak only counts how many of each are recomputed, so every
// choice is (dense count, banded count, ln_f, head, loss): 49 x 49 x 8.
RecomputeChoice gpt_optimum(const std::vector<RecomputeUnit>& chain, std::int64_t budget) {
    RecomputeChoice best;
    best.extra_seconds = 1e300;
    std::vector<bool> r(chain.size());
    for (int dense = 0; dense <= 48; ++dense)
        for (int banded = 0; banded <= 48; ++banded)
            for (int last = 0; last < 8; ++last) {
                for (int block = 0; block < 96; ++block)
                    r[static_cast<std::size_t>(1 + block)] = block % 2 == 0 ? block / 2 < dense : block / 2 < banded;
                for (int k = 0; k < 3; ++k) r[97 + static_cast<std::size_t>(k)] = (last >> k) & 1;
                const std::int64_t peak = loom::schedule::recompute_peak(chain, r);
                double seconds = 0;
                for (std::size_t u = 0; u < chain.size(); ++u)
                    if (r[u]) seconds += chain[u].forward_seconds;
                if (peak <= budget && (seconds < best.extra_seconds ||
                                       (seconds == best.extra_seconds && peak < best.peak_bytes))) {
                    best.recompute = r;
                    best.extra_seconds = seconds;
                    best.peak_bytes = peak;
                    best.fits = true;
                }
            }
    return best;
}

std::string row(const RecomputeChoice& c) {
    char text[96];
    std::snprintf(text, sizeof text, "%3d units %8.2f ms %7.2f GiB%s", c.recomputed(), c.extra_seconds * 1e3,
                  static_cast<double>(c.peak_bytes) / (1 << 30), c.fits ? "" : " (over)");
    return text;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (flag == "--reps") reps = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "bench_recompute_solver: unknown flag %s; the flag is --reps R\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1 || reps > 1000) {
        std::fprintf(stderr, "bench_recompute_solver: --reps %d is not valid; use 1..1000\n", reps);
        return 2;
    }

    std::printf("solve_recompute, 500 slots, budget halfway between Full and keep-all (median of %d)\n", reps);
    std::printf("%6s %14s %14s %16s\n", "units", "DP", "greedy", "brute force");
    for (const int n : {12, 24, 48, 96}) {
        const auto units = random_units(n, 38u + static_cast<std::uint32_t>(n));
        const std::int64_t budget = middle_budget(units);
        RecomputeChoice dp, greedy;
        const double dp_s = bench::median_seconds(reps, [&] { dp = loom::schedule::solve_recompute(units, budget); });
        const double greedy_s =
            bench::median_seconds(reps, [&] { greedy = loom::schedule::recompute_greedy(units, budget); });
        std::string brute = "-";
        if (n <= 12) {
            double best = 0;
            const double brute_s = bench::median_seconds(reps, [&] { best = brute_force(units, budget); });
            char text[64];
            std::snprintf(text, sizeof text, "%.3f ms%s", brute_s * 1e3, std::abs(best - dp.extra_seconds) <= 1e-12 * best ? " (same)" : " (differs)");
            brute = text;
        }
        std::printf("%6d %11.3f ms %11.3f ms %16s   DP +%.2f ms, greedy +%.2f ms\n", n, dp_s * 1e3, greedy_s * 1e3,
                    brute.c_str(), dp.extra_seconds * 1e3, greedy.extra_seconds * 1e3);
    }

    // Against brute force over all 2^20 subsets: how far above the optimum
    // the DP (500 slots) and greedy land, at 5 budgets between Full and keep-all.
    {
        double dp_worst = 0, dp_sum = 0, greedy_worst = 0, greedy_sum = 0;
        int cases = 0, dp_exact = 0;
        for (std::uint32_t seed = 0; seed < 8; ++seed) {
            const auto units = mixed_units(20, 1000 + seed);
            const std::int64_t low = loom::schedule::recompute_all(units).peak_bytes,
                               high = loom::schedule::recompute_none(units).peak_bytes;
            for (const double at : {0.9, 0.7, 0.5, 0.3, 0.1}) {
                const auto budget = low + static_cast<std::int64_t>(at * static_cast<double>(high - low));
                const double optimum = brute_force(units, budget);
                if (optimum >= 1e300) continue;
                const double dp = loom::schedule::solve_recompute(units, budget).extra_seconds / optimum - 1;
                const double greedy = loom::schedule::recompute_greedy(units, budget).extra_seconds / optimum - 1;
                dp_worst = std::max(dp_worst, dp);
                greedy_worst = std::max(greedy_worst, greedy);
                dp_sum += dp;
                greedy_sum += greedy;
                dp_exact += dp <= 1e-12;
                ++cases;
            }
        }
        std::printf("\n20-unit mixed chains (copies 1..4), %d budgets, against brute force over every subset:\n", cases);
        std::printf("  DP (500 slots): optimal in %d, above the optimum by %.2f%% on average, %.2f%% at worst\n", dp_exact,
                    100 * dp_sum / cases, 100 * dp_worst);
        std::printf("  greedy:         above the optimum by %.2f%% on average, %.2f%% at worst\n", 100 * greedy_sum / cases,
                    100 * greedy_worst);
    }

    const auto chain = gpt_chain();
    const RecomputeChoice full = loom::schedule::recompute_all(chain), none = loom::schedule::recompute_none(chain);
    std::printf("\nGPT-like chain: %zu units, keep-all %.2f GiB, Full %.2f GiB at +%.1f ms\n", chain.size(),
                static_cast<double>(none.peak_bytes) / (1 << 30), static_cast<double>(full.peak_bytes) / (1 << 30),
                full.extra_seconds * 1e3);
    std::printf("%10s | %-36s | %-36s | %-36s | %s\n", "budget", "DP, 500 slots", "optimum (enumerated)", "greedy",
                "Full");
    for (const double at : {0.9, 0.7, 0.5, 0.3, 0.1}) {
        const auto budget = full.peak_bytes + static_cast<std::int64_t>(at * static_cast<double>(none.peak_bytes - full.peak_bytes));
        RecomputeChoice dp;
        const double dp_s = bench::median_seconds(reps, [&] { dp = loom::schedule::solve_recompute(chain, budget); });
        const RecomputeChoice optimum = gpt_optimum(chain, budget);
        const RecomputeChoice greedy = loom::schedule::recompute_greedy(chain, budget);
        std::printf("%6.2f GiB | %s | %s | %s | +%.1f ms   (DP %.2f ms to solve)\n",
                    static_cast<double>(budget) / (1 << 30), row(dp).c_str(), row(optimum).c_str(), row(greedy).c_str(),
                    full.extra_seconds * 1e3, dp_s * 1e3);
    }
    return 0;
}
