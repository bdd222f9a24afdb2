// Peer memory pooling (infer/pooled_gpt.hpp, infer/block_prefetcher.hpp): a
// GPT (--layers 8, --width 512, 8 heads, vocabulary 256, random weights)
// decoding --steps tokens for --batch sequences after a 16-token prompt each,
// with every block resident, then with some blocks pooled outside the
// engine's memory and staged --lookahead blocks ahead by the copy thread
// (one compute thread with one GEMM thread, one copy thread: the 2 cores),
// and with the pooled blocks read in place (no copy). Every pooled run's
// logits are checked bit for bit against the resident run's. --reps rounds,
// each running every configuration in turn; medians. The copy thread's
// bytes per second and a plain memcpy's in the same run (the machine's
// copy limit), the share of the copy time the engine waited for, and the
// bytes each configuration keeps in the engine's memory.
//
// A second part: two replicas on two threads, each serving its own batch,
// either each holding the whole model or each holding half the blocks and
// reading the other half from its peer's memory in place.
//
// Last, two traced runs staged one ahead, half the blocks pooled (drawn as
// rank 0) and every block (rank 1), both shifted to start at time 0: the
// engine's blocks and waits (lane 0) and the copy thread's copies (lane 1) as
// a Chrome trace (--trace FILE; scripts/draw_trace.py draws it).
//
//   bench_pooled_serving [--reps 5] [--layers 8] [--width 512] [--batch 1] [--steps 32] [--link-gbs 0]
//                        [--trace pooled_serving_trace.json]
#include <loom/gpt/model.hpp>
#include <loom/exec/trace.hpp>
#include <loom/infer/block_prefetcher.hpp>
#include <loom/infer/cached_gpt.hpp>
#include <loom/infer/kv_cache.hpp>
#include <loom/infer/pooled_gpt.hpp>
#include <loom/io/atomic_file.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cpu_model.hpp"
#include "timing.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using loom::infer::BlockPrefetcher;
using loom::infer::PooledGpt;

struct Flags {
    int reps = 5;
    std::int64_t layers = 8, width = 512, batch = 1, steps = 32;
    double link_gbs = 0;
    std::string trace = "pooled_serving_trace.json";
};

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(stderr,
                 "bench_pooled_serving: %s\nusage: bench_pooled_serving [--reps N] [--layers N] [--width N] "
                 "[--batch N] [--steps N] [--link-gbs G] [--trace FILE]\n",
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
        else if (flag == "--layers") f.layers = std::stoll(value);
        else if (flag == "--width") f.width = std::stoll(value);
        else if (flag == "--batch") f.batch = std::stoll(value);
        else if (flag == "--steps") f.steps = std::stoll(value);
        else if (flag == "--link-gbs") f.link_gbs = std::stod(value);
        else if (flag == "--trace") f.trace = value;
        else usage("unknown flag " + flag);
    }
    if (f.reps < 1 || f.layers < 4 || f.width < 8 || f.width % 8 != 0 || f.batch < 1 || f.steps < 1 ||
        f.link_gbs < 0)
        usage("--reps, --batch and --steps must be >= 1, --layers >= 4, --width a multiple of 8 and --link-gbs >= 0");
    return f;
}

// One configuration: which blocks are pooled (none: resident), staged how far ahead (0: read in place).
struct Setup {
    std::string name;
    std::vector<std::int64_t> pooled;
    std::int64_t lookahead = 0;
};

struct Run {
    double seconds = 0;
    std::vector<float> logits;  // the last step's
    loom::infer::PrefetchCounts counts;
};

// A prompt per sequence, then the timed decode steps.
Run decode(loom::gpt::Model& model, const loom::gpt::Config& config, const Flags& f, BlockPrefetcher* prefetcher) {
    loom::infer::KvCache cache(config.layers, config.width, f.batch, config.seq);
    loom::infer::CachedGpt engine(model, config, cache);
    if (prefetcher != nullptr) engine.prefetch_blocks(*prefetcher);
    std::vector<std::vector<std::int32_t>> prompts;
    std::vector<loom::infer::Segment> segments;
    for (std::int64_t s = 0; s < f.batch; ++s) {
        prompts.emplace_back();
        for (std::int64_t t = 0; t < 16; ++t)
            prompts.back().push_back(static_cast<std::int32_t>((t * 7 + s * 13) % 256));
    }
    for (std::int64_t s = 0; s < f.batch; ++s) segments.push_back({s, prompts[static_cast<std::size_t>(s)]});
    (void)engine.forward(segments);
    std::vector<std::int64_t> slots;
    std::vector<std::int32_t> tokens;
    for (std::int64_t s = 0; s < f.batch; ++s) slots.push_back(s);
    Run run;
    const loom::infer::PrefetchCounts before =
        prefetcher != nullptr ? prefetcher->counts() : loom::infer::PrefetchCounts{};
    const auto start = Clock::now();
    std::span<const float> logits;
    for (std::int64_t step = 0; step < f.steps; ++step) {
        tokens.assign(static_cast<std::size_t>(f.batch), static_cast<std::int32_t>(step % 256));
        logits = engine.decode(slots, tokens);
    }
    run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    run.logits.assign(logits.begin(), logits.end());
    if (prefetcher != nullptr) {
        const auto after = prefetcher->counts();
        run.counts = {after.copies - before.copies, after.copied_bytes - before.copied_bytes,
                      after.copy_ns - before.copy_ns, after.acquires - before.acquires,
                      after.waited_ns - before.waited_ns};
    }
    return run;
}

// A plain memcpy of one block's bytes, best of several: the copy limit on this machine.
double memcpy_bytes_per_second(std::int64_t floats) {
    std::vector<float> from(static_cast<std::size_t>(floats), 1.0f), to(static_cast<std::size_t>(floats));
    double best = 1e30;
    for (int i = 0; i < 20; ++i) {
        const auto start = Clock::now();
        std::memcpy(to.data(), from.data(), from.size() * sizeof(float));
        bench::keep_memory(to.data());
        best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
    }
    return static_cast<double>(floats) * sizeof(float) / best;
}

}  // namespace

int main(int argc, char** argv) {
    const Flags f = parse(argc, argv);
    loom::kernels::host::set_blas_threads(1);
    const loom::gpt::Config config{.layers = f.layers, .width = f.width, .heads = 8, .seq = 16 + f.steps, .vocab = 256};
    loom::gpt::Model whole = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(whole);
    arena.initialize(whole, 7);
    const std::int64_t block_bytes = PooledGpt::gpt_block_floats(config) * 4;
    std::printf("CPU: %s; GEMM: loom host kernels at %s, 1 thread, plus the copy thread\n", bench::cpu_model().c_str(),
                bench::cpu_level().c_str());
    std::printf("%s, batch %lld, %lld decode steps, a block %.1f MB, link %s; median of %d rounds\n",
                loom::detail::concat(config).c_str(), static_cast<long long>(f.batch),
                static_cast<long long>(f.steps), static_cast<double>(block_bytes) / 1e6,
                f.link_gbs > 0 ? (std::to_string(f.link_gbs) + " GB/s").c_str() : "not modelled", f.reps);

    std::vector<std::int64_t> half, all;
    for (std::int64_t b = 0; b < f.layers; ++b) {
        if (b % 2 == 1) half.push_back(b);
        all.push_back(b);
    }
    const std::vector<Setup> setups = {{"resident", {}, 0},
                                       {"half pooled, read in place", half, 0},
                                       {"half pooled, staged 1 ahead", half, 1},
                                       {"half pooled, staged 2 ahead", half, 2},
                                       {"all pooled, staged 1 ahead", all, 1},
                                       {"all pooled, staged 2 ahead", all, 2}};
    std::vector<std::vector<double>> seconds(setups.size()), waited(setups.size()), copy_rate(setups.size());
    std::vector<std::unique_ptr<PooledGpt>> pooled;
    std::vector<std::unique_ptr<BlockPrefetcher>> prefetchers;
    for (const Setup& s : setups) {
        pooled.push_back(s.pooled.empty() ? nullptr : std::make_unique<PooledGpt>(config, arena.values(), s.pooled));
        prefetchers.push_back(s.lookahead == 0 ? nullptr
                                               : std::make_unique<BlockPrefetcher>(
                                                     *pooled.back(), loom::infer::PrefetchOptions{
                                                                         s.lookahead, f.link_gbs * 1e9}));
    }
    bool same = true;
    for (int rep = 0; rep < f.reps; ++rep) {
        std::vector<float> expected;
        for (std::size_t i = 0; i < setups.size(); ++i) {
            loom::gpt::Model& model = pooled[i] ? pooled[i]->model() : whole;
            const Run run = decode(model, config, f, prefetchers[i].get());
            if (i == 0) expected = run.logits;
            else same = same && run.logits == expected;
            seconds[i].push_back(run.seconds);
            if (run.counts.copies > 0) {
                const auto copy_ns = static_cast<double>(run.counts.copy_ns);
                waited[i].push_back(static_cast<double>(run.counts.waited_ns) / copy_ns);
                copy_rate[i].push_back(static_cast<double>(run.counts.copied_bytes) * 1e9 /
                                       static_cast<double>(run.counts.copy_ns));
            }
        }
    }
    const double memcpy_rate = memcpy_bytes_per_second(PooledGpt::gpt_block_floats(config));
    const double resident_s = bench::median(seconds[0]);
    std::printf("\n%-30s %12s %8s %14s %14s %12s\n", "configuration", "tokens/s", "ratio", "engine MB", "copy GB/s",
                "waited");
    for (std::size_t i = 0; i < setups.size(); ++i) {
        const double s = bench::median(seconds[i]);
        const double engine_mb =
            static_cast<double>((pooled[i] ? pooled[i]->resident_bytes() : config.parameters() * 4) +
                                (prefetchers[i] ? prefetchers[i]->staging_bytes() : 0)) / 1e6;
        std::printf("%-30s %12.0f %7.2fx %14.1f", setups[i].name.c_str(),
                    static_cast<double>(f.batch * f.steps) / s, resident_s / s, engine_mb);
        if (!copy_rate[i].empty())
            std::printf(" %14.1f %11.0f%%\n", bench::median(copy_rate[i]) / 1e9, 100 * bench::median(waited[i]));
        else
            std::printf(" %14s %12s\n", "-", "-");
    }
    std::printf("memcpy of a block, best of 20: %.1f GB/s; every pooled run's logits equal the resident run's: %s\n",
                memcpy_rate / 1e9, same ? "yes" : "NO");
    prefetchers.clear();  // their copy threads stop before the replicas run

    // Two replicas at once, one thread each: whole models, or half each from the other's memory.
    std::vector<std::int64_t> even;
    for (std::int64_t b = 0; b < f.layers; b += 2) even.push_back(b);
    PooledGpt a(config, arena.values(), half), b(config, arena.values(), even);
    a.pool_from(b);
    b.pool_from(a);
    const auto two = [&](loom::gpt::Model& first, loom::gpt::Model& second) {
        double took[2] = {0, 0};
        std::thread other([&] { took[1] = decode(second, config, f, nullptr).seconds; });
        took[0] = decode(first, config, f, nullptr).seconds;
        other.join();
        return std::max(took[0], took[1]);
    };
    loom::gpt::Model whole_copy = loom::gpt::make_model(config);
    loom::nn::ParamArena copy_arena(whole_copy);
    std::copy(arena.values().begin(), arena.values().end(), copy_arena.values().begin());
    std::vector<double> own, peered;
    for (int rep = 0; rep < f.reps; ++rep) {
        own.push_back(two(whole, whole_copy));
        peered.push_back(two(a.model(), b.model()));
    }
    std::printf("\ntwo replicas on two threads: each whole %.0f tokens/s (%.1f MB of weights between them), each "
                "half from the peer %.0f tokens/s (%.1f MB): %.2fx\n",
                static_cast<double>(2 * f.batch * f.steps) / bench::median(own),
                static_cast<double>(2 * config.parameters() * 4) / 1e6,
                static_cast<double>(2 * f.batch * f.steps) / bench::median(peered),
                static_cast<double>(a.resident_bytes() + b.resident_bytes()) / 1e6,
                bench::median(own) / bench::median(peered));

    // Two traced runs, staged one ahead: half the blocks pooled, then all of them.
    std::vector<std::vector<loom::exec::TraceEvent>> traces;
    for (const std::size_t setup : {std::size_t{2}, std::size_t{4}}) {
        BlockPrefetcher traced(*pooled[setup], {.lookahead = 1, .link_bytes_per_second = f.link_gbs * 1e9,
                                                .trace = true});
        (void)decode(pooled[setup]->model(), config, f, &traced);
        traces.push_back(traced.trace_events());
        double first = 1e300;
        for (const auto& e : traces.back()) first = std::min(first, e.start_us);
        for (auto& e : traces.back()) e.start_us -= first;  // both runs from time 0
    }
    loom::io::write_file_atomically(f.trace, loom::exec::chrome_trace_json(traces));
    std::printf("traces of a run with half the blocks pooled (rank 0) and with every block (rank 1), staged 1 "
                "ahead: %s (scripts/draw_trace.py draws it)\n", f.trace.c_str());
    return same ? 0 : 1;
}
