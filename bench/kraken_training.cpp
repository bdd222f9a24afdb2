// Kraken's training step beside the standard GPT's of the same shape (and so
// the same matrix weights), tensor parallel on rank threads through the
// executor: the GPT cut by Megatron (two all-reduces per block forward, two
// backward), Kraken with sub-layer i on tp rank i (KrakenLayer places its own
// parts: one all-reduce per layer forward, one backward). For each model, tp 1
// on one thread, then tp 2 with every tp link Shaped to each --gbit rate
// (5 us latency); the bytes each step puts on the tp axis, counted by
// comm::Counted. One loom GEMM thread and one BLAS thread per rank, so tp 2
// uses the 2 cores and tp 1 one of them.
//
//   bench_kraken_training [--layers 4] [--width 256] [--heads 8] [--seq 128] [--batch 8]
//                         [--steps 5] [--reps 3] [--gbit 10,100]
//
// --reps rounds, each running every configuration once (`--steps` timed
// steps after an untimed one, their median), so a slow minute of the machine
// falls on all of them; the table gives the median over the rounds. Both
// models train the same batches from the same seed; their losses are printed
// so a run that diverged shows.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <loom/comm/counted.hpp>
#include <loom/comm/links.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/comm/shaped.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/kraken.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/kernels/host/gemm_threads.hpp>

#include "cpu_model.hpp"
#include "timing.hpp"

namespace {

using loom::comm::ThreadComm;
using Tp = loom::Strategy<loom::DataParallel<>, loom::TensorParallel>;

struct Options {
    std::int64_t layers = 4, width = 256, heads = 8, seq = 128, batch = 8;
    int steps = 5, reps = 3;
    std::vector<double> gbits{10, 100};
};

struct Run {
    double step_ms = 0;
    float loss = 0;
    double tp_bytes = 0;  // payload on the tp axis in the last step (Counted runs only)
};

// `steps` timed steps of `kraken` (or the GPT) at tp `t`, each rank's world
// a C made by `wrap`. Rank 0's figures.
template <class C, class Wrap>
Run train(const Options& o, bool kraken, int t, Wrap wrap) {
    Run result;
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 18, 3, 256);
    loom::comm::ThreadWorld(t).run([&](ThreadComm& thread_comm) {
        loom::kernels::host::set_blas_threads(1);
        loom::kernels::host::set_gemm_threads(1);
        C world = wrap(std::move(thread_comm));
        loom::comm::Mesh<C> mesh(world, {{"dp", 1}, {"tp", t}});
        const loom::gpt::Config gpt{o.layers, o.width, o.heads, o.seq, 256};
        const auto measure = [&](auto& model, const std::vector<std::string>& fields) {
            auto exec = loom::exec::Executor<C>::template make<Tp>(model, mesh, {.field_names = fields});
            exec.initialize(7);
            std::vector<std::int32_t> x(static_cast<std::size_t>(o.batch * o.seq)), y(x.size());
            std::vector<double> ms;
            for (int s = 0; s <= o.steps; ++s) {  // step 0 warms up
                corpus.batch(3, s, o.batch, o.seq, x, y);
                if constexpr (requires { world.reset(); }) {
                    if (s == o.steps) world.reset();  // count the last step alone
                }
                world.barrier();
                const auto t0 = std::chrono::steady_clock::now();
                const float loss = exec.step(loom::Tensor::of(x.data(), {o.batch, o.seq}),
                                             loom::Tensor::of(y.data(), {o.batch, o.seq}), 1e-3f);
                const auto t1 = std::chrono::steady_clock::now();
                if (s > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
                if (world.rank() == 0) result.loss = loss;
            }
            if (world.rank() != 0) return;
            result.step_ms = bench::median(ms);
            if constexpr (requires { world.counts_with_splits(); })
                result.tp_bytes = static_cast<double>(mesh.axis("tp").counts_with_splits().total().bytes);
        };
        if (kraken) {
            auto model = loom::gpt::make_kraken({o.layers, o.width, o.heads, o.seq, 256, t == 1 ? 2 : t});
            measure(model, loom::gpt::kraken_field_names);
        } else {
            auto model = loom::gpt::make_model(gpt);
            measure(model, {});
        }
    });
    return result;
}

Run plain(const Options& o, bool kraken) {
    return train<ThreadComm>(o, kraken, 1, [](ThreadComm c) { return c; });
}

Run counted(const Options& o, bool kraken) {
    return train<loom::comm::Counted<ThreadComm>>(o, kraken, 2, [](ThreadComm c) {
        return loom::comm::Counted<ThreadComm>(std::move(c));
    });
}

Run shaped(const Options& o, bool kraken, double gbit) {
    const loom::comm::Links links(2, loom::comm::Link::gbit(gbit, 5e-6));
    return train<loom::comm::Shaped<ThreadComm>>(o, kraken, 2, [&](ThreadComm c) {
        return loom::comm::Shaped<ThreadComm>(std::move(c), links);
    });
}

[[noreturn]] void usage(const std::string& why) {
    std::fprintf(stderr,
                 "bench_kraken_training: %s\nusage: bench_kraken_training [--layers N] [--width N] [--heads N] "
                 "[--seq N] [--batch N] [--steps N] [--reps N] [--gbit G,G...]\n",
                 why.c_str());
    std::exit(2);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) usage(flag + " needs a value");
        const std::string value = argv[++i];
        if (flag == "--layers") o.layers = std::stoll(value);
        else if (flag == "--width") o.width = std::stoll(value);
        else if (flag == "--heads") o.heads = std::stoll(value);
        else if (flag == "--seq") o.seq = std::stoll(value);
        else if (flag == "--batch") o.batch = std::stoll(value);
        else if (flag == "--steps") o.steps = std::stoi(value);
        else if (flag == "--reps") o.reps = std::stoi(value);
        else if (flag == "--gbit") {
            o.gbits.clear();
            std::stringstream list(value);
            for (std::string item; std::getline(list, item, ',');) o.gbits.push_back(std::stod(item));
        } else {
            usage("unknown flag " + flag);
        }
    }
    if (o.layers < 1 || o.width < 1 || o.seq < 1 || o.batch < 1 || o.steps < 1 || o.reps < 1 || o.gbits.empty())
        usage("--layers, --width, --seq, --batch, --steps and --reps must be >= 1, and --gbit a list of rates");
    if (o.heads < 2 || o.heads % 2 != 0 || o.width % o.heads != 0)
        usage("--heads " + std::to_string(o.heads) + " must be even (2 ranks) and divide --width " +
              std::to_string(o.width));
    for (double g : o.gbits)
        if (!(g > 0)) usage("--gbit rates must be > 0");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    std::printf("CPU: %s; GEMM: loom host kernels at %s, 1 thread per rank, BLAS 1 thread\n",
                bench::cpu_model().c_str(), bench::cpu_level().c_str());
    std::printf("GPT(layers=%lld, width=%lld, heads=%lld, seq=%lld, vocab=256) and Kraken of the same shape "
                "(degree 2; at tp 1 the same Kraken on one rank); batch %lld, AdamW; %d timed steps, %d rounds\n\n",
                static_cast<long long>(o.layers), static_cast<long long>(o.width), static_cast<long long>(o.heads),
                static_cast<long long>(o.seq), static_cast<long long>(o.batch), o.steps, o.reps);
    const Run gpt_bytes = counted(o, false), kraken_bytes = counted(o, true);
    // rounds[r][k]: configuration k of round r, in the order below
    std::vector<std::vector<Run>> rounds;
    for (int r = 0; r < o.reps; ++r) {
        std::vector<Run> round;
        for (const bool kraken : {false, true}) {
            round.push_back(plain(o, kraken));
            for (double g : o.gbits) round.push_back(shaped(o, kraken, g));
        }
        rounds.push_back(std::move(round));
        std::fprintf(stderr, "round %d of %d done\n", r + 1, o.reps);
    }
    const std::size_t per_model = 1 + o.gbits.size();
    const auto median_ms = [&](std::size_t k) {
        std::vector<double> v;
        for (const auto& round : rounds) v.push_back(round[k].step_ms);
        return bench::median(v);
    };
    std::printf("| model | tp | link | step ms | tp 1 / this | tp bytes per step | Kraken's step vs the GPT's | "
                "last loss |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (const bool kraken : {false, true}) {
        const std::size_t base = kraken ? per_model : 0;
        const double one = median_ms(base);
        for (std::size_t k = 0; k < per_model; ++k) {
            const double ms = median_ms(base + k);
            char link[32] = "-", bytes[32] = "-", versus[32] = "";
            if (k > 0) {
                std::snprintf(link, sizeof link, "%g Gbit/s", o.gbits[k - 1]);
                std::snprintf(bytes, sizeof bytes, "%.1f MB", (kraken ? kraken_bytes : gpt_bytes).tp_bytes / 1e6);
            }
            if (kraken) std::snprintf(versus, sizeof versus, "%.2fx", ms / median_ms(k));
            std::printf("| %s | %d | %s | %.1f | %.2fx | %s | %s | %.4f |\n", kraken ? "Kraken" : "GPT", k == 0 ? 1 : 2,
                        link, ms, one / ms, bytes, versus, static_cast<double>(rounds.back()[base + k].loss));
        }
    }
    return 0;
}
