// optex_synthetic: OptEx (arXiv 2402.11427) on the paper's synthetic functions,
// its Figure 2: Sphere, Ackley, Rosenbrock and Levy in d dimensions (100000 by
// default), each minimised from the same x0 ~ U(-1, 1) by AdamW three ways for
// T sequential iterations:
//   Vanilla  one true-gradient step per iteration;
//   OptEx    N workers, one per rank thread of a ThreadWorld: N - 1 proxy
//            steps with the GP's gradient estimate, every worker's true
//            gradient at its point, one true step from the last;
//   Target   N true-gradient steps per iteration: OptEx with exact estimates,
//            the ideal it approaches.
// Prints, per function, the optimality gap f(x) - f* after T iterations, the
// sequential iterations each run needs to reach a threshold gap and the
// speed-up over Vanilla beside sqrt(N); checks that OptEx with one worker is
// Vanilla bit for bit. The threshold is the gap Vanilla reaches after
// ceil(F T) of its iterations (--threshold-fraction F, default 1: after all
// T), so Vanilla needs about F T iterations and a faster method fewer. --csv
// writes every iteration's gap for examples/optex_synthetic_plot.py. The
// defaults (d = 1e5, T = 100, N = 1, 2, 4, 8) take about half a minute on two
// cores.
//
//   optex_synthetic [--dim D] [--iterations T] [--workers 1,2,4,8]
//                   [--functions sphere,ackley,rosenbrock,levy] [--seed S] [--lr LR]
//                   [--history T0] [--threshold-fraction F] [--csv FILE]
//
// The four functions and their gradients: optex_test_functions.hpp.
#include <loom/comm/thread_world.hpp>
#include <loom/core/error.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/optex.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numbers>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;
using loom::optim::AdamW;
using loom::optim::AdamWConfig;
using loom::optim::OptEx;
using loom::optim::OptExConfig;

namespace {

constexpr const char* program = "optex_synthetic";

#include "optex_test_functions.hpp"

// --- flags ------------------------------------------------------------------

struct Options {
    std::int64_t dim = 100000;
    int iterations = 100;
    std::vector<int> workers{1, 2, 4, 8};
    std::vector<TestFunction> functions = all_functions();
    std::uint64_t seed = 1;
    float lr = 0.01f;
    int history = 50;
    double threshold_fraction = 1.0;
    std::string csv;
};

constexpr std::array<std::string_view, 9> flags{"--dim", "--iterations", "--workers", "--functions", "--seed",
                                                "--lr", "--history", "--threshold-fraction", "--csv"};
constexpr const char* flag_list =
    "--dim, --iterations, --workers, --functions, --seed, --lr, --history, --threshold-fraction, --csv";
constexpr int max_workers = 64;

[[noreturn]] void refuse(const std::string& line) {
    std::fprintf(stderr, "%s: %s\n", program, line.c_str());
    std::exit(1);
}

template <class... Parts>
std::string text(const Parts&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}

long long parse_whole(std::string_view flag, std::string_view value, long long lo, long long hi) {
    long long parsed = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (value.empty() || ec != std::errc{} || end != value.data() + value.size() || parsed < lo || parsed > hi)
        refuse(text(flag, " ", value, " is not valid; use a whole number in ", lo, "..", hi));
    return parsed;
}

std::uint64_t parse_seed(std::string_view value) {
    std::uint64_t parsed = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (value.empty() || ec != std::errc{} || end != value.data() + value.size())
        refuse(text("--seed ", value, " is not valid; use a whole number in 0..18446744073709551615"));
    return parsed;
}

// A number in (lo, hi].
double parse_number(std::string_view flag, std::string_view value, double lo, double hi) {
    double parsed = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), parsed);
    if (value.empty() || ec != std::errc{} || end != value.data() + value.size() || !(parsed > lo && parsed <= hi))
        refuse(text(flag, " ", value, " is not valid; use a number in (", lo, ", ", hi, "]"));
    return parsed;
}

// The items of a comma-separated list; an empty item is kept, so "1,,4" is refused.
std::vector<std::string_view> split(std::string_view list) {
    std::vector<std::string_view> items;
    for (std::size_t at = 0;;) {
        const std::size_t comma = list.find(',', at);
        items.push_back(list.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at));
        if (comma == std::string_view::npos) return items;
        at = comma + 1;
    }
}

std::vector<int> parse_workers(std::string_view value) {
    std::vector<int> workers;
    for (std::string_view item : split(value)) {
        long long n = 0;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
        if (item.empty() || ec != std::errc{} || end != item.data() + item.size() || n < 1 || n > max_workers)
            refuse(text("--workers ", value, ": '", item, "' is not a worker count; use whole numbers in 1..",
                        max_workers, " separated by commas, e.g. 1,2,4,8"));
        workers.push_back(static_cast<int>(n));
    }
    std::sort(workers.begin(), workers.end());
    workers.erase(std::unique(workers.begin(), workers.end()), workers.end());
    return workers;
}

std::vector<TestFunction> parse_functions(std::string_view value) {
    std::vector<TestFunction> chosen;
    for (std::string_view item : split(value)) {
        const auto& all = all_functions();
        const auto found = std::find_if(all.begin(), all.end(), [&](const TestFunction& f) { return f.name == item; });
        if (found == all.end())
            refuse(text("--functions ", value, ": '", item,
                        "' is not a function; use sphere, ackley, rosenbrock or levy, separated by commas"));
        if (std::none_of(chosen.begin(), chosen.end(), [&](const TestFunction& f) { return f.name == item; }))
            chosen.push_back(*found);
    }
    return chosen;
}

Options parse(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (std::find(flags.begin(), flags.end(), flag) == flags.end())
            refuse(text("unknown flag ", flag, "; flags are ", flag_list));
        if (i + 1 >= argc) refuse(text(flag, " needs a value"));
        const std::string_view value = argv[i + 1];
        if (flag == "--dim") options.dim = parse_whole(flag, value, 2, 100'000'000);
        else if (flag == "--iterations") options.iterations = static_cast<int>(parse_whole(flag, value, 1, 100'000));
        else if (flag == "--workers") options.workers = parse_workers(value);
        else if (flag == "--functions") options.functions = parse_functions(value);
        else if (flag == "--seed") options.seed = parse_seed(value);
        else if (flag == "--lr") options.lr = static_cast<float>(parse_number(flag, value, 0, 10));
        else if (flag == "--history") options.history = static_cast<int>(parse_whole(flag, value, 2, 1000));
        else if (flag == "--threshold-fraction") options.threshold_fraction = parse_number(flag, value, 0, 1);
        else options.csv = value;  // --csv
    }
    if (options.dim < options.workers.back())
        refuse(text("--dim ", options.dim, " is smaller than --workers ", options.workers.back(),
                    "; each worker keeps a slice of at least one element: use --dim ", options.workers.back(),
                    " or more"));
    return options;
}

// --- the three methods ------------------------------------------------------

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// x0 ~ U(-1, 1): 24 random bits per element, so the same seed gives the same
// x0 with any standard library (std::uniform_real_distribution's algorithm is
// the library's choice).
std::vector<float> starting_point(std::int64_t dim, std::uint64_t seed) {
    std::mt19937_64 bits(seed);
    std::vector<float> x(static_cast<std::size_t>(dim));
    for (float& v : x) v = static_cast<float>(bits() >> 40) * 0x1p-23f - 1.0f;  // k / 2^23 - 1, exact
    return x;
}

// gaps[t]: f(x_t) - f* after t sequential iterations (gaps[0] at x0).
struct Trajectory {
    std::vector<double> gaps;
    std::vector<float> final_x;
    double seconds = 0;
};

// A line on stderr every ~10 s of one run, so a long run shows it is alive.
struct Progress {
    std::string what;
    int iterations;
    clock_type::time_point start = clock_type::now(), last = start;
    void at(int t) {
        if (std::chrono::duration<double>(clock_type::now() - last).count() < 10) return;
        last = clock_type::now();
        std::fprintf(stderr, "%s: %s: iteration %d of %d, %.0f s\n", program, what.c_str(), t, iterations,
                     seconds_since(start));
    }
    void done(double seconds) const {
        std::fprintf(stderr, "%s: %s: %d iterations in %.2f s (%.1f ms each)\n", program, what.c_str(), iterations,
                     seconds, 1e3 * seconds / iterations);
    }
};

// Vanilla (steps_per_iteration = 1) and Target (= N): plain AdamW with true
// gradients, `steps_per_iteration` steps per sequential iteration.
Trajectory run_adamw(const TestFunction& f, const std::vector<float>& x0, int steps_per_iteration, int iterations,
                     const AdamWConfig& adam, const std::string& what) {
    const auto start = clock_type::now();
    Progress progress{what, iterations};
    Trajectory out;
    out.gaps.push_back(f.value(x0) - f.minimum);
    std::vector<float> x = x0, grad(x0.size());
    AdamW optimizer(static_cast<std::int64_t>(x.size()), adam);
    for (int t = 1; t <= iterations; ++t) {
        for (int s = 0; s < steps_per_iteration; ++s) {
            (void)f.value_and_gradient(x, grad);
            optimizer.step(x, grad);
        }
        out.gaps.push_back(f.value(x) - f.minimum);
        progress.at(t);
    }
    out.final_x = std::move(x);
    out.seconds = seconds_since(start);
    progress.done(out.seconds);
    return out;
}

// OptEx<AdamW> with N workers on N rank threads. After each iteration every
// rank contributes its slice of the new iterate and rank 0 evaluates f there:
// the honest measure, rather than the loss a worker saw at its own point.
Trajectory run_optex(const TestFunction& f, const std::vector<float>& x0, int workers, int iterations,
                     const AdamWConfig& adam, const OptExConfig& config, const std::string& what) {
    const auto start = clock_type::now();
    Progress progress{what, iterations};
    Trajectory out;
    out.gaps.assign(static_cast<std::size_t>(iterations) + 1, 0.0);
    out.gaps[0] = f.value(x0) - f.minimum;
    ThreadWorld(workers).run([&](ThreadComm& comm) {
        OptEx<AdamW, ThreadComm> optex(
            comm, x0, [&](std::int64_t slice) { return AdamW(slice, adam); }, config);
        // This rank's worker: the true gradient at the point it is handed.
        const auto true_gradient = [&](std::span<const float> x, std::span<float> grad) {
            return static_cast<float>(f.value_and_gradient(x, grad));
        };
        std::vector<float> iterate(x0.size());
        for (int t = 1; t <= iterations; ++t) {
            (void)optex.iterate(true_gradient);
            optex.gather_params(iterate);
            if (comm.rank() == 0) {
                out.gaps[static_cast<std::size_t>(t)] = f.value(iterate) - f.minimum;
                progress.at(t);
            }
        }
        if (comm.rank() == 0) out.final_x = std::move(iterate);
    });
    out.seconds = seconds_since(start);
    progress.done(out.seconds);
    return out;
}

// The first sequential iteration (1..T) whose gap is at most `threshold`; 0
// when none is.
int iterations_to(const Trajectory& run, double threshold) {
    for (std::size_t t = 1; t < run.gaps.size(); ++t)
        if (run.gaps[t] <= threshold) return static_cast<int>(t);
    return 0;
}

// Bit for bit: every iteration's gap, and the last iterate's bits.
bool identical(const Trajectory& a, const Trajectory& b) {
    return a.gaps == b.gaps && a.final_x.size() == b.final_x.size() &&
           std::memcmp(a.final_x.data(), b.final_x.data(), a.final_x.size() * sizeof(float)) == 0;
}

std::string count_text(int iterations, int limit) {
    return iterations > 0 ? std::to_string(iterations) : "> " + std::to_string(limit);
}
// Vanilla always reaches its own gap, so vanilla > 0; "-": the other never did.
std::string ratio_text(int vanilla, int other) {
    if (other == 0) return "-";
    char out[32];
    std::snprintf(out, sizeof out, "%.2f", static_cast<double>(vanilla) / other);
    return out;
}

}  // namespace

int main(int argc, char** argv) try {
    const Options options = parse(argc, argv);
    std::FILE* csv = nullptr;
    if (!options.csv.empty()) {
        csv = std::fopen(options.csv.c_str(), "w");
        if (csv == nullptr) refuse(text("--csv ", options.csv, ": cannot open it for writing: ", std::strerror(errno)));
        std::fprintf(csv, "function,method,workers,iteration,gap\n");
    }
    const int T = options.iterations;
    // optax.adam's defaults (betas 0.9 / 0.999, eps 1e-8), no weight decay.
    const AdamWConfig adam{.lr = options.lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f};
    const auto optex_config = [&](int workers) {
        OptExConfig config{.workers = workers};
        config.estimator.history = options.history;  // T0; l = 0.1 and sigma^2 = 1e-3 are the reference's
        return config;
    };
    // The threshold: the gap Vanilla reaches after this many iterations, so
    // Vanilla needs (about) that many and a faster method fewer.
    const int threshold_iteration =
        std::clamp(static_cast<int>(std::ceil(options.threshold_fraction * T - 1e-9)), 1, T);

    const std::vector<float> x0 = starting_point(options.dim, options.seed);
    std::printf("OptEx on synthetic functions (arXiv 2402.11427, Figure 2): d = %lld, T = %d sequential iterations\n",
                static_cast<long long>(options.dim), T);
    std::printf("AdamW lr %g, betas 0.9/0.999, eps 1e-8, no weight decay; x0 ~ U(-1, 1) from seed %llu, the same for "
                "every method\n",
                static_cast<double>(options.lr), static_cast<unsigned long long>(options.seed));
    std::printf("%s\n", text(optex_config(options.workers.back())).c_str());
    std::printf("Vanilla: 1 true step per iteration; OptEx N: N workers (N - 1 proxy steps, N true gradients); "
                "Target N: N true steps per iteration\n");
    std::printf("threshold: the gap Vanilla reaches after %d of its %d iterations (--threshold-fraction %g)\n\n",
                threshold_iteration, T, options.threshold_fraction);

    const auto total_start = clock_type::now();
    bool all_identical = true;
    for (const TestFunction& f : options.functions) {
        const std::string name(f.name);
        const Trajectory vanilla = run_adamw(f, x0, 1, T, adam, name + " Vanilla");
        std::vector<Trajectory> optex, target;
        for (int n : options.workers) {
            optex.push_back(run_optex(f, x0, n, T, adam, optex_config(n), text(name, " OptEx N=", n)));
            target.push_back(run_adamw(f, x0, n, T, adam, text(name, " Target N=", n)));
        }
        if (csv != nullptr) {
            const auto rows = [&](const char* method, int n, const Trajectory& run) {
                for (std::size_t t = 0; t < run.gaps.size(); ++t)
                    std::fprintf(csv, "%s,%s,%d,%zu,%.9g\n", name.c_str(), method, n, t, run.gaps[t]);
            };
            rows("vanilla", 1, vanilla);
            for (std::size_t k = 0; k < options.workers.size(); ++k) {
                rows("optex", options.workers[k], optex[k]);
                rows("target", options.workers[k], target[k]);
            }
            std::fflush(csv);
        }

        const double threshold = vanilla.gaps[static_cast<std::size_t>(threshold_iteration)];
        const int vanilla_count = iterations_to(vanilla, threshold);
        std::printf("%s: f* = %g, gap at x0 %.6g; threshold gap %.6g; Vanilla after %d iterations: gap %.6g, "
                    "reaches the threshold in %d\n",
                    name.c_str(), f.minimum, vanilla.gaps[0], threshold, T, vanilla.gaps.back(), vanilla_count);
        std::printf("  %3s  %-41s   %-23s   %-21s\n", "", "gap after T", "iterations to threshold",
                    "speed-up over Vanilla");
        std::printf("  %3s  %13s %13s %13s   %11s %11s   %10s %10s  %7s\n", "N", "Vanilla", "OptEx", "Target",
                    "OptEx", "Target", "OptEx", "Target", "sqrt(N)");
        for (std::size_t k = 0; k < options.workers.size(); ++k) {
            const int n = options.workers[k];
            const int optex_count = iterations_to(optex[k], threshold);
            const int target_count = iterations_to(target[k], threshold);
            std::printf("  %3d  %13.6g %13.6g %13.6g   %11s %11s   %10s %10s  %7.2f\n", n, vanilla.gaps.back(),
                        optex[k].gaps.back(), target[k].gaps.back(), count_text(optex_count, T).c_str(),
                        count_text(target_count, T).c_str(), ratio_text(vanilla_count, optex_count).c_str(),
                        ratio_text(vanilla_count, target_count).c_str(), std::sqrt(static_cast<double>(n)));
        }
        for (std::size_t k = 0; k < options.workers.size(); ++k) {
            const int n = options.workers[k];
            if (n == 1) {
                const bool same = identical(optex[k], vanilla);
                all_identical = all_identical && same;
                std::printf(same ? "%s: OptEx N=1 equals Vanilla bit for bit (the gap at all %d iterations and the "
                                   "final iterate)\n"
                                 : "%s: OptEx N=1 DIFFERS from Vanilla (over %d iterations); it should be the same "
                                   "optimizer\n",
                            name.c_str(), T);
                continue;
            }
            const int optex_count = iterations_to(optex[k], threshold);
            const char* outcome = optex_count > 0 && optex_count < vanilla_count    ? "faster than Vanilla"
                                  : optex_count > 0 && optex_count == vanilla_count ? "as fast as Vanilla, no faster"
                                                                                    : "slower than Vanilla";
            if (optex_count > 0)
                std::printf("%s: OptEx N=%d reaches the threshold in %d iterations, Vanilla in %d: %s\n", name.c_str(),
                            n, optex_count, vanilla_count, outcome);
            else
                std::printf("%s: OptEx N=%d does not reach the threshold in %d iterations, Vanilla in %d: %s\n",
                            name.c_str(), n, T, vanilla_count, outcome);
        }
        std::printf("\n");
        std::fflush(stdout);
    }
    if (csv != nullptr) {
        std::fclose(csv);
        std::printf("wrote %s\n", options.csv.c_str());
    }
    std::printf("total %.1f s\n", seconds_since(total_start));
    if (!all_identical) {
        std::fprintf(stderr, "%s: OptEx with one worker did not reproduce Vanilla bit for bit\n", program);
        return 3;
    }
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", program, error.what());
    return 1;
}
