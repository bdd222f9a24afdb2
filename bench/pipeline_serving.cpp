// Pipeline-parallel serving (infer/pipeline_parallel_gpt.hpp) on GPT config A
// (4 layers, width 256, 4 heads, sequence 128, vocabulary 256), random
// weights, greedy: a stream of --requests requests (prompts of 4, 8, ..., 64
// tokens in turn, --tokens new tokens each, or with --tokens-spread S from
// --tokens - S to --tokens + S in a fixed shuffle, so that requests do not
// finish in waves; up to --slots running at once) at
// pp 1 (the whole model on one thread, infer::generate) and at pp 2 on two
// rank threads whose link is Shaped to --gbit Gbit/s with 5 us latency
// (comm/shaped.hpp), non-blocking (--groups in flight; 0, the default, is the library's: pp + 1) and
// blocking (1 group: a stage idles while the other runs); each pp 2 step
// admits at most --prefill-tokens prompt tokens (PipelineOptions; 0: no
// limit). One GEMM thread and one BLAS thread per rank. Every pp 2 run is
// checked against pp 1's tokens. --reps rounds, each running pp 1, pp 2
// non-blocking and pp 2 blocking in turn, so that the machine's slow minutes
// fall on all three alike: medians of the times and of each round's ratio;
// the load average and the involuntary context switches say how much the
// machine was shared. Then one traced pp 2 run: its Chrome trace (--trace
// FILE) and the share of its time when both stages computed at once.
//
//   bench_pipeline_serving [--reps 5] [--requests 32] [--tokens 32] [--tokens-spread 0] [--slots 16] [--gbit 10]
//                          [--groups 0] [--prefill-tokens 128] [--trace pipeline_serving_trace.json]
#include <loom/comm/any_comm.hpp>
#include <loom/comm/links.hpp>
#include <loom/comm/shaped.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/exec/trace.hpp>
#include <loom/gpt/model.hpp>
#include <loom/infer/generate.hpp>
#include <loom/infer/pipeline_parallel_gpt.hpp>
#include <loom/infer/pipeline_stage.hpp>
#include <loom/io/atomic_file.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>

#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "timing.hpp"

namespace {

using loom::comm::ThreadComm;
using Clock = std::chrono::steady_clock;

const loom::gpt::Config config_a{.layers = 4, .width = 256, .heads = 4, .seq = 128, .vocab = 256};
constexpr std::uint64_t seed = 5;

struct Flags {
    int reps = 5, groups = 0;
    std::int64_t requests = 32, tokens = 32, tokens_spread = 0, slots = 16, prefill_tokens = 128;
    double gbit = 10;
    std::string trace = "pipeline_serving_trace.json";
};

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(stderr,
                 "bench_pipeline_serving: %s\nusage: bench_pipeline_serving [--reps N] [--requests N] [--tokens N] "
                 "[--tokens-spread N] [--slots N] [--gbit G] [--groups N] [--prefill-tokens N] [--trace FILE]\n",
                 why.c_str());
    std::exit(2);
}

Flags parse(int argc, char** argv) {
    Flags f;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) usage(flag + " needs a value");
        const std::string value = argv[++i];
        if (flag == "--reps") f.reps = std::stoi(value);
        else if (flag == "--requests") f.requests = std::stoll(value);
        else if (flag == "--tokens") f.tokens = std::stoll(value);
        else if (flag == "--tokens-spread") f.tokens_spread = std::stoll(value);
        else if (flag == "--slots") f.slots = std::stoll(value);
        else if (flag == "--gbit") f.gbit = std::stod(value);
        else if (flag == "--groups") f.groups = std::stoi(value);
        else if (flag == "--prefill-tokens") f.prefill_tokens = std::stoll(value);
        else if (flag == "--trace") f.trace = value;
        else usage("unknown flag " + flag);
    }
    if (f.reps < 1 || f.requests < 1 || f.tokens < 1 || f.slots < 1 || f.groups < 0 || f.gbit <= 0 ||
        f.prefill_tokens < 0)
        usage("--reps, --requests, --tokens and --slots must be >= 1, --groups >= 0, --gbit > 0 and --prefill-tokens >= 0");
    if (f.tokens_spread < 0 || f.tokens_spread >= f.tokens)
        usage("--tokens-spread " + std::to_string(f.tokens_spread) + " must be >= 0 and below --tokens " +
              std::to_string(f.tokens));
    if (64 + f.tokens + f.tokens_spread - 1 > config_a.seq)
        usage("--tokens " + std::to_string(f.tokens) + " + --tokens-spread " + std::to_string(f.tokens_spread) +
              " after a 64-token prompt needs more than the 128 positions");
    return f;
}

std::vector<loom::infer::Request> stream_of(const Flags& f) {
    std::vector<loom::infer::Request> requests;
    for (std::int64_t i = 0; i < f.requests; ++i) {
        loom::infer::Request r;
        const std::int64_t length = 4 * (1 + i % 16);
        for (std::int64_t t = 0; t < length; ++t) r.prompt.push_back(static_cast<std::int32_t>((t * 7 + i * 13) % 256));
        // Neighbours differ by 7 (mod the spread's width), so requests admitted together end apart.
        const std::int64_t width = 2 * f.tokens_spread + 1;
        r.max_new_tokens = f.tokens - f.tokens_spread + (i * 7) % width;
        r.sampling.greedy = true;
        requests.push_back(std::move(r));
    }
    return requests;
}

double load_average() {
    std::ifstream in("/proc/loadavg");
    double one = 0;
    in >> one;
    return one;
}

// CPU time of the calling thread: what a rank computed, whether or not another process held its core meanwhile.
double thread_cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

long involuntary_switches() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_nivcsw;
}

// Total time both ranks' compute intervals overlap, in microseconds.
double both_busy_us(const std::vector<std::vector<loom::exec::TraceEvent>>& events) {
    auto intervals = [](const std::vector<loom::exec::TraceEvent>& rank) {
        std::vector<std::pair<double, double>> out;
        for (const auto& e : rank)
            if (e.lane == loom::exec::compute_lane) out.emplace_back(e.start_us, e.start_us + e.duration_us);
        std::sort(out.begin(), out.end());
        return out;
    };
    const auto a = intervals(events[0]), b = intervals(events[1]);
    double both = 0;
    std::size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        both += std::max(0.0, std::min(a[i].second, b[j].second) - std::max(a[i].first, b[j].first));
        if (a[i].second < b[j].second) ++i;
        else ++j;
    }
    return both;
}

struct Pp2Run {
    double seconds = 0;
    double cpu[2] = {0, 0};  // each rank's CPU seconds
    bool same = true;
    std::vector<std::vector<loom::exec::TraceEvent>> events;
};

// One pipelined run on 2 rank threads under Shaped links (each stage's model
// cut and loaded off the clock; rank 0 times the run from a barrier to a
// barrier): whether every rank gave `expected`, and, when `traced`, the
// events.
Pp2Run pp2(const Flags& f, const loom::nn::ParamArena& whole, const std::vector<loom::infer::Request>& requests,
           const std::vector<loom::infer::Completion>& expected, int groups, bool traced) {
    Pp2Run result;
    result.events.resize(2);
    std::vector<int> agreed(2, 1);
    const loom::comm::Links links(2, loom::comm::Link::gbit(f.gbit, 5e-6));
    loom::comm::ThreadWorld(2).run([&](ThreadComm& thread_comm) {
        loom::comm::Shaped<ThreadComm> shaped(std::move(thread_comm), links);
        loom::comm::AnyComm pp = loom::comm::AnyComm::view(shaped);
        const auto where = loom::infer::pipeline_stage(config_a, pp.rank(), pp.size());
        auto stage = loom::infer::make_stage_model(config_a, where);
        loom::nn::ParamArena arena(stage);
        loom::infer::load_stage_values(stage, config_a, where, whole.values());
        loom::exec::Trace trace(traced);
        const auto rank = static_cast<std::size_t>(pp.rank());
        pp.barrier();
        const auto start = Clock::now();
        const double cpu_start = thread_cpu_seconds();
        const auto done =
            loom::infer::generate_pipelined(stage, config_a, pp, requests, f.slots,
                                            {.groups = groups, .trace = &trace, .prefill_tokens = f.prefill_tokens});
        result.cpu[rank] = thread_cpu_seconds() - cpu_start;
        pp.barrier();
        if (pp.rank() == 0) result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
        for (std::size_t i = 0; i < done.size(); ++i)
            if (done[i].tokens != expected[i].tokens) agreed[rank] = 0;
        result.events[rank] = trace.events();
    });
    result.same = agreed[0] == 1 && agreed[1] == 1;
    return result;
}

// The medians over rounds of one path's runs.
struct PathSummary {
    std::vector<double> seconds, ratios, cpu[2];
    bool same = true;

    void add(const Pp2Run& run, double pp1_seconds) {
        seconds.push_back(run.seconds);
        ratios.push_back(pp1_seconds / run.seconds);
        for (std::size_t r = 0; r < 2; ++r) cpu[r].push_back(run.cpu[r]);
        same = same && run.same;
    }
};

}  // namespace

int main(int argc, char** argv) {
    const Flags f = parse(argc, argv);
    loom::kernels::host::set_blas_threads(1);
    auto model = loom::gpt::make_model(config_a);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, seed);
    const auto requests = stream_of(f);
    double new_tokens = 0;
    for (const auto& r : requests) new_tokens += static_cast<double>(r.max_new_tokens);
    std::ostringstream shape;
    shape << config_a;
    std::printf("%s, random weights (seed %llu), greedy; %lld requests (prompts of 4..64 tokens), %lld +- %lld new tokens "
                "each, up to %lld at once; pp 2 over Shaped links of %g Gbit/s, 5 us, admitting up to %lld prompt "
                "tokens a step (0: no limit); %d rounds\n",
                shape.str().c_str(), static_cast<unsigned long long>(seed), static_cast<long long>(f.requests),
                static_cast<long long>(f.tokens), static_cast<long long>(f.tokens_spread),
                static_cast<long long>(f.slots), f.gbit,
                static_cast<long long>(f.prefill_tokens), f.reps);
    const double load_before = load_average();
    const long switches_before = involuntary_switches();

    std::vector<loom::infer::Completion> expected;
    std::vector<double> pp1_times, pp1_cpu_times;
    PathSummary nonblocking, blocking;
    for (int r = 0; r < f.reps; ++r) {
        const auto start = Clock::now();
        const double cpu_start = thread_cpu_seconds();
        expected = loom::infer::generate(model, config_a, requests, f.slots);
        pp1_cpu_times.push_back(thread_cpu_seconds() - cpu_start);
        pp1_times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
        nonblocking.add(pp2(f, arena, requests, expected, f.groups, false), pp1_times.back());
        blocking.add(pp2(f, arena, requests, expected, 1, false), pp1_times.back());
    }
    const double pp1 = bench::median(pp1_times), pp1_cpu = bench::median(pp1_cpu_times);
    const double load_after = load_average();
    const long switches = involuntary_switches() - switches_before;

    std::printf("\n| path | time | tokens/s | vs pp 1 (median of the rounds' ratios) | CPU time per rank "
                "| same tokens |\n| --- | ---: | ---: | ---: | ---: | --- |\n");
    std::printf("| pp 1 (one thread) | %.1f ms | %.0f | 1.00x | %.1f ms | |\n", pp1 * 1e3, new_tokens / pp1,
                pp1_cpu * 1e3);
    const int in_flight = loom::infer::groups_in_flight({.groups = f.groups}, 2);
    const std::string nonblocking_name = "pp 2, " + std::to_string(in_flight) + " groups in flight (non-blocking)";
    using Path = std::pair<std::string, const PathSummary*>;
    for (const auto& [name, path] : {Path{nonblocking_name, &nonblocking}, Path{"pp 2, 1 group (blocking)", &blocking}}) {
        const double seconds = bench::median(path->seconds);
        std::printf("| %s | %.1f ms | %.0f | %.2fx | %.1f + %.1f ms | %s |\n", name.c_str(), seconds * 1e3,
                    new_tokens / seconds, bench::median(path->ratios), bench::median(path->cpu[0]) * 1e3,
                    bench::median(path->cpu[1]) * 1e3, path->same ? "yes" : "NO");
    }
    // With a core per stage and no bubble, a run takes its busier stage's CPU time.
    std::printf("\nwith a core per stage, non-blocking pp 2 could take its busier stage's CPU time: %.2fx pp 1's "
                "(pp 1's CPU time / the busier stage's)\n",
                pp1_cpu / std::max(bench::median(nonblocking.cpu[0]), bench::median(nonblocking.cpu[1])));
    std::printf("\nload average %.2f before, %.2f after; %ld involuntary context switches in these runs\n",
                load_before, load_after, switches);

    const Pp2Run traced = pp2(f, arena, requests, expected, f.groups, true);
    double first = 1e300, last = 0;
    for (const auto& rank : traced.events)
        for (const auto& e : rank) {
            first = std::min(first, e.start_us);
            last = std::max(last, e.start_us + e.duration_us);
        }
    double busy[2] = {0, 0};
    for (std::size_t r = 0; r < 2; ++r)
        for (const auto& e : traced.events[r])
            if (e.lane == loom::exec::compute_lane) busy[r] += e.duration_us;
    const double span = last - first, both = both_busy_us(traced.events);
    const std::string json = loom::exec::chrome_trace_json(traced.events);
    loom::io::write_file_atomically(f.trace, std::string_view(json));
    std::printf("traced pp 2 run (%s): %.1f ms; stage 0 computes %.0f%% of it, stage 1 %.0f%%, both at once %.0f%%\n",
                f.trace.c_str(), span * 1e-3, 100 * busy[0] / span, 100 * busy[1] / span, 100 * both / span);
    return nonblocking.same && blocking.same && traced.same ? 0 : 1;
}
