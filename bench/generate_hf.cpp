// loom's side of bench/generate_transformers.py: the cached engine on a GPT
// checkpoint that Hugging Face transformers loads too (scripts/loom_to_hf_gpt2.py),
// timed on a list of requests the script writes, so both sides run the same
// weights on the same prompts. The script interleaves calls of this binary
// with transformers' generate(); each call loads the checkpoint off the clock.
//
//   bench_generate_hf --write-checkpoint FILE [shape] [--seed S]
//       random weights (nn::ParamArena::initialize, seed S) saved as a
//       train_gpt --save checkpoint
//   bench_generate_hf --checkpoint FILE --requests FILE [shape] [--threads N] [--reps R]
//                     [--max-batch B] [--pad-to-longest] [--warm-up] [--engine gpt|model]
//       runs the requests (greedy) R times with infer::generate, continuously
//       batched (B at once; 0, the default: all); prints each run's seconds,
//       the work the engine counted against the packed tokens' own work, and
//       the tokens of the last run. --warm-up runs them once more first, off
//       the clock, and prints that run's seconds as `warm-up:`: the first run
//       in a process also pays for first touching the engine's scratch (page
//       faults), which a serving process pays once, not per request.
//       --engine model runs them on infer::CachedModel<gpt::Model>, the
//       engine for any model composed from loom's layers, instead of
//       CachedGpt: the same tokens, and the generic walk's cost beside it
//
// shape: --layers --width --heads --seq --vocab (defaults 4, 256, 4, 1152, 256).
// The requests file has one request a line: max_new_tokens, then the prompt's
// token ids, separated by spaces.
//
// --pad-to-longest is padded batching, for the padding-removal comparison:
// every prompt is left-padded with token 0 to the longest prompt's length
// before it reaches the engine, so every Linear, LayerNorm and GELU runs on
// the padding rows and attention attends over them, as a static batch padded
// to its longest request does (a mask hides padding from the softmax but
// dense kernels still compute it). Its tokens differ from the packed run's
// (the padding is attended, not masked); only its time and work are read.
#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/model.hpp>
#include <loom/infer/cached_model.hpp>
#include <loom/infer/generate.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_model.hpp"

namespace {

struct Flags {
    loom::gpt::Config config{.layers = 4, .width = 256, .heads = 4, .seq = 1152, .vocab = 256};
    std::string write_checkpoint, checkpoint, requests;
    std::uint64_t seed = 1;
    int threads = 1, reps = 1;
    std::int64_t max_batch = 0;
    bool pad_to_longest = false;
    bool warm_up = false;
    bool generic = false;  // --engine model: CachedModel<gpt::Model> rather than CachedGpt
};

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(stderr,
                 "bench_generate_hf: %s\nusage: bench_generate_hf --write-checkpoint FILE [shape] [--seed S]\n"
                 "       bench_generate_hf --checkpoint FILE --requests FILE [shape] [--threads N] [--reps R] "
                 "[--max-batch B] [--pad-to-longest] [--warm-up] [--engine gpt|model]\n"
                 "shape: --layers --width --heads --seq --vocab\n",
                 why.c_str());
    std::exit(2);
}

Flags parse(int argc, char** argv) {
    Flags f;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--pad-to-longest" || flag == "--warm-up") {
            (flag == "--warm-up" ? f.warm_up : f.pad_to_longest) = true;
            continue;
        }
        if (i + 1 >= argc) usage(flag + " needs a value");
        const std::string value = argv[++i];
        const long long number = std::atoll(value.c_str());
        if (flag == "--write-checkpoint") f.write_checkpoint = value;
        else if (flag == "--checkpoint") f.checkpoint = value;
        else if (flag == "--requests") f.requests = value;
        else if (flag == "--seed") f.seed = static_cast<std::uint64_t>(number);
        else if (flag == "--threads") f.threads = static_cast<int>(number);
        else if (flag == "--reps") f.reps = static_cast<int>(number);
        else if (flag == "--max-batch") f.max_batch = number;
        else if (flag == "--engine" && (value == "gpt" || value == "model")) f.generic = value == "model";
        else if (flag == "--engine") usage("--engine " + value + " is not gpt or model");
        else if (flag == "--layers") f.config.layers = number;
        else if (flag == "--width") f.config.width = number;
        else if (flag == "--heads") f.config.heads = number;
        else if (flag == "--seq") f.config.seq = number;
        else if (flag == "--vocab") f.config.vocab = number;
        else usage("unknown flag " + flag);
    }
    if (f.write_checkpoint.empty() == (f.checkpoint.empty() || f.requests.empty()))
        usage("give --write-checkpoint, or --checkpoint and --requests");
    if (f.threads < 1 || f.reps < 1 || f.max_batch < 0) usage("--threads and --reps must be >= 1, --max-batch >= 0");
    return f;
}

std::vector<loom::infer::Request> read_requests(const std::string& path) {
    std::ifstream in(path);
    if (!in) usage("cannot read " + path);
    std::vector<loom::infer::Request> requests;
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        loom::infer::Request r;
        if (!(fields >> r.max_new_tokens)) continue;
        for (std::int32_t token = 0; fields >> token;) r.prompt.push_back(token);
        r.sampling.greedy = true;
        requests.push_back(std::move(r));
    }
    if (requests.empty()) usage(path + " holds no requests");
    return requests;
}

// The work the packed tokens themselves need, from the requests alone: each
// request's prompt and every new token but the last pass once through every
// block's Linears (12 C^2 multiply-adds a row: qkv 3C^2, proj C^2, fc and its
// projection 4C^2 each; 2 FLOPs each) and attend causally to their prefix; each new token's
// logits are one row through the head.
loom::infer::WorkCount packed_work(const loom::gpt::Config& c, const std::vector<loom::infer::Request>& requests) {
    loom::infer::WorkCount w;
    for (const loom::infer::Request& r : requests) {
        const auto rows = static_cast<std::int64_t>(r.prompt.size()) + r.max_new_tokens - 1;
        w.linear_rows += c.layers * rows;
        w.linear_flops += c.layers * rows * 2 * 12 * c.width * c.width + r.max_new_tokens * 2 * c.width * c.vocab;
        const std::int64_t pairs = c.layers * rows * (rows + 1) / 2;
        w.attention_pairs += pairs;
        w.attention_flops += pairs * 4 * c.width;  // 4 D per pair and head, over H heads: 4 C
    }
    return w;
}

}  // namespace

int main(int argc, char** argv) {
    const Flags flags = parse(argc, argv);
    const loom::gpt::Config& config = flags.config;
    auto model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model);
    loom::optim::AdamW optimizer(arena.size(), {});  // the checkpoint format carries moments; zeros here
    if (!flags.write_checkpoint.empty()) {
        arena.initialize(model, flags.seed);
        loom::gpt::save_checkpoint(flags.write_checkpoint, config, arena, optimizer, 0, "random weights");
        std::printf("wrote %s: random weights, seed %llu\n", flags.write_checkpoint.c_str(),
                    static_cast<unsigned long long>(flags.seed));
        return 0;
    }
    (void)loom::gpt::load_checkpoint(flags.checkpoint, config, arena, optimizer);
    std::vector<loom::infer::Request> requests = read_requests(flags.requests);
    const loom::infer::WorkCount real = packed_work(config, requests);  // before any padding
    if (flags.pad_to_longest) {
        std::size_t longest = 0;
        for (const auto& r : requests) longest = std::max(longest, r.prompt.size());
        for (auto& r : requests) r.prompt.insert(r.prompt.begin(), longest - r.prompt.size(), 0);
    }
    loom::kernels::host::set_blas_threads(flags.threads);
    std::printf("CPU: %s\nGEMM: loom host kernels at %s, %d thread%s\n", bench::cpu_model().c_str(),
                bench::cpu_level().c_str(), flags.threads, flags.threads == 1 ? "" : "s");

    const loom::infer::CacheShape shape = loom::infer::cache_shape_for(config, requests, flags.max_batch);
    loom::infer::KvCache cache(config.layers, config.width, shape.slots, shape.capacity);
    std::vector<loom::infer::Completion> done;
    const auto run = [&](auto& engine) -> loom::infer::WorkCount {
        if (flags.warm_up) {
            const auto start = std::chrono::steady_clock::now();
            done = loom::infer::generate(engine, requests);
            std::printf("warm-up: %.6f\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        std::printf("seconds:");
        for (int rep = 0; rep < flags.reps; ++rep) {
            engine.reset_work();
            const auto start = std::chrono::steady_clock::now();
            done = loom::infer::generate(engine, requests);
            std::printf(" %.6f", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        std::printf("\n");
        return engine.work();
    };
    std::printf("engine: %s\n", flags.generic ? "CachedModel<gpt::Model>" : "CachedGpt");
    loom::infer::WorkCount counted;
    if (flags.generic) {
        loom::infer::CachedModel<loom::gpt::Model> engine(model, cache);
        counted = run(engine);
    } else {
        loom::infer::CachedGpt engine(model, config, cache);
        counted = run(engine);
    }
    std::printf("work counted: linear_rows %lld linear_flops %lld attention_pairs %lld attention_flops %lld\n",
                static_cast<long long>(counted.linear_rows), static_cast<long long>(counted.linear_flops),
                static_cast<long long>(counted.attention_pairs), static_cast<long long>(counted.attention_flops));
    std::printf("work of the real tokens: linear_rows %lld linear_flops %lld attention_pairs %lld "
                "attention_flops %lld\n",
                static_cast<long long>(real.linear_rows), static_cast<long long>(real.linear_flops),
                static_cast<long long>(real.attention_pairs), static_cast<long long>(real.attention_flops));
    for (std::size_t i = 0; i < done.size(); ++i) {
        std::printf("tokens %zu:", i);
        for (std::int32_t t : done[i].tokens) std::printf(" %d", t);
        std::printf("\n");
    }
    return 0;
}
