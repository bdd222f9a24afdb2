// Kraken against the standard GPT of the same shape (and so the same matrix
// weights) served tensor parallel on rank threads over Shaped links: time to
// first token (one prompt's prefill) and decode tokens/s (batch 1), for
// tp = N = 2 and 4 at 10 and 100 Gbit/s (5 us latency). The GPT runs
// Megatron's cut (infer/tensor_parallel_gpt.hpp: two all-reduces per
// layer); Kraken runs one all-reduce per layer, overlapped with the next
// layer's attention (infer/cached_kraken.hpp), and once more with each
// all-reduce waited for at once, to show what the overlap alone buys.
//
//   bench_kraken [--layers 8] [--width 512] [--heads 8] [--prompt 512] [--decode 32] [--reps 3]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <loom/comm/any_comm.hpp>
#include <loom/comm/links.hpp>
#include <loom/comm/shaped.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/gpt/kraken.hpp>
#include <loom/infer/cached_kraken.hpp>
#include <loom/infer/sampler.hpp>
#include <loom/infer/tensor_parallel_gpt.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>

namespace {

using loom::comm::ThreadComm;
using Clock = std::chrono::steady_clock;

struct Options {
    std::int64_t layers = 8, width = 512, heads = 8, prompt = 512, decode = 32;
    int reps = 3;
};

struct Timing {
    double first_token_ms = 0, decode_tokens_per_s = 0, waiting_ms = 0;
};

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Median over reps of a prefill of `prompt` then `decode` greedy steps on slot 0.
template <class Engine>
Timing time_engine(Engine& engine, loom::comm::AnyComm& group, const Options& o) {
    std::vector<std::int32_t> prompt;
    for (std::int64_t i = 0; i < o.prompt; ++i) prompt.push_back(static_cast<std::int32_t>((i * 7 + 3) % 256));
    std::vector<double> first, decode;
    for (int r = 0; r <= o.reps; ++r) {  // rep 0 warms the buffers
        engine.cache().release(0);
        group.barrier();
        const auto t0 = Clock::now();
        auto logits = engine.prefill(0, prompt);
        const double ttft = ms_since(t0);
        std::int32_t token = loom::infer::argmax(logits);
        const std::int64_t slot = 0;
        const auto t1 = Clock::now();
        for (std::int64_t k = 0; k < o.decode; ++k)
            token = loom::infer::argmax(engine.decode(std::span(&slot, 1), std::span(&token, 1)));
        const double decode_ms = ms_since(t1);
        if (r > 0) {
            first.push_back(ttft);
            decode.push_back(static_cast<double>(o.decode) / (decode_ms / 1e3));
        }
    }
    std::sort(first.begin(), first.end());
    std::sort(decode.begin(), decode.end());
    return {first[first.size() / 2], decode[decode.size() / 2], 0};
}

// CachedKraken has no decode(): the same step as CachedGpt's, over forward().
struct KrakenEngine {
    loom::infer::CachedKraken& engine;
    loom::infer::KvCache& cache() { return engine.cache(); }
    std::span<const float> prefill(std::int64_t slot, std::span<const std::int32_t> p) { return engine.prefill(slot, p); }
    std::span<const float> decode(std::span<const std::int64_t> slots, std::span<const std::int32_t> tokens) {
        const loom::infer::Segment segment{slots[0], tokens};
        return engine.forward(std::span(&segment, 1));
    }
};

template <class Body>
Timing on_shaped_threads(int tp, double gbit, Body&& body) {
    Timing rank0;
    const loom::comm::Links links(tp, loom::comm::Link::gbit(gbit, 5e-6));
    loom::comm::ThreadWorld(tp).run([&](ThreadComm& comm) {
        loom::comm::Shaped<ThreadComm> shaped(std::move(comm), links);
        loom::comm::AnyComm group = loom::comm::AnyComm::view(shaped);
        const Timing t = body(group);
        if (group.rank() == 0) rank0 = t;
    });
    return rank0;
}

Timing gpt_tp(const loom::gpt::Config& config, const std::vector<float>& whole, int tp, double gbit, const Options& o) {
    return on_shaped_threads(tp, gbit, [&](loom::comm::AnyComm& group) {
        auto shard = loom::gpt::make_model(config);
        loom::infer::shard_for_serving(shard, group.rank(), tp);
        loom::nn::ParamArena arena(shard);
        loom::infer::load_whole_values(shard, whole);
        auto cache = loom::infer::serving_cache(config, tp, 1, config.seq);
        loom::infer::CachedGpt engine(shard, config, cache, group);
        return time_engine(engine, group, o);
    });
}

Timing kraken_tp(const loom::gpt::KrakenConfig& config, const std::vector<float>& whole, int tp, double gbit,
                 bool overlap, const Options& o) {
    return on_shaped_threads(tp, gbit, [&](loom::comm::AnyComm& group) {
        auto shard = loom::infer::kraken_serving_shard(config, group.rank(), tp);
        loom::nn::ParamArena arena(shard);
        loom::infer::load_kraken_shard(shard, config, group.rank(), whole);
        auto cache = loom::infer::kraken_cache(config, tp, 1, config.seq);
        loom::infer::CachedKraken engine(shard, config, cache, group, overlap);
        KrakenEngine wrapped{engine};
        Timing t = time_engine(wrapped, group, o);
        t.waiting_ms = engine.seconds_waiting() * 1e3 / (o.reps + 1);
        return t;
    });
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const long long v = std::atoll(argv[i + 1]);
        if (flag == "--layers") o.layers = v;
        else if (flag == "--width") o.width = v;
        else if (flag == "--heads") o.heads = v;
        else if (flag == "--prompt") o.prompt = v;
        else if (flag == "--decode") o.decode = v;
        else if (flag == "--reps") o.reps = static_cast<int>(v);
        else {
            std::fprintf(stderr, "bench_kraken: unknown flag %s; use --layers, --width, --heads, --prompt, --decode or --reps\n",
                         flag.c_str());
            std::exit(2);
        }
    }
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    // Each rank thread runs its own products: one GEMM thread and one BLAS
    // thread each, so a BLAS left at its default does not wake a thread of
    // its own beside the ranks.
    loom::kernels::host::set_blas_threads(1);
    const loom::gpt::Config gpt{o.layers, o.width, o.heads, o.prompt + o.decode, 256};
    std::printf("GPT %lld layers, width %lld, %lld heads: %lld parameters; prompt %lld, decode %lld, median of %d\n",
                static_cast<long long>(o.layers), static_cast<long long>(o.width), static_cast<long long>(o.heads),
                static_cast<long long>(gpt.parameters()), static_cast<long long>(o.prompt),
                static_cast<long long>(o.decode), o.reps);
    auto reference = loom::gpt::make_model(gpt);
    loom::nn::ParamArena reference_arena(reference);
    reference_arena.initialize(reference, 1);
    const std::vector<float> gpt_values(reference_arena.values().begin(), reference_arena.values().end());
    std::printf("%-26s %3s %6s %10s %12s %12s\n", "model", "tp", "Gbit/s", "TTFT ms", "decode tok/s", "waited ms");
    for (const int tp : {2, 4}) {
        const loom::gpt::KrakenConfig kraken{o.layers, o.width, o.heads, o.prompt + o.decode, 256, tp};
        auto whole = loom::gpt::make_kraken(kraken);
        loom::nn::ParamArena arena(whole);
        arena.initialize(whole, 1);
        const std::vector<float> kraken_values(arena.values().begin(), arena.values().end());
        for (const double gbit : {10.0, 100.0}) {
            const Timing g = gpt_tp(gpt, gpt_values, tp, gbit, o);
            std::printf("%-26s %3d %6.0f %10.1f %12.1f %12s\n", "GPT (Megatron tp)", tp, gbit, g.first_token_ms,
                        g.decode_tokens_per_s, "-");
            const std::string name = "Kraken N=" + std::to_string(tp);
            const Timing k = kraken_tp(kraken, kraken_values, tp, gbit, true, o);
            std::printf("%-26s %3d %6.0f %10.1f %12.1f %12.1f\n", (name + ", overlapped").c_str(), tp, gbit,
                        k.first_token_ms, k.decode_tokens_per_s, k.waiting_ms);
            const Timing b = kraken_tp(kraken, kraken_values, tp, gbit, false, o);
            std::printf("%-26s %3d %6.0f %10.1f %12.1f %12.1f\n", (name + ", blocking").c_str(), tp, gbit,
                        b.first_token_ms, b.decode_tokens_per_s, b.waiting_ms);
            std::printf("  Kraken TTFT vs GPT: %+.1f%%\n", 100.0 * (k.first_token_ms / g.first_token_ms - 1.0));
        }
    }
    return 0;
}
