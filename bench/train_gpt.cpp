// bench/train_gpt: loom's GPT training step against current PyTorch's (eager,
// torch.compile, CPU bf16 autocast) in the same run, on the same configs and
// the same cores, with the sgemm peak of the core measured in that run, so
// each tokens/s reads as a ratio to the peer and as a fraction of the GEMM
// the core can do.
//
//   train_gpt [--groups A,B,2core] [--reps 5] [--steps 20] [--warmup 3]
//             [--no-torch] [--no-compile] [--no-bf16] [--torch-python PATH]
//
// Groups (shapes: bench/gpt_bench_configs.hpp; vocab 256):
//   A      config A (L4 C256 H4 T128), batch 8, one core: loom f32, loom
//          --matmul bf16 (rounded operands; and with vdpbf16ps dot products
//          where the CPU has avx512_bf16, the default where they run at the
//          FMA's rate), PyTorch eager, compile, and bf16
//          autocast eager and compiled
//   B      config B (L2 C64 H4 T64), batch 4, one core: loom, eager, compile
//          (5x the steps: a step takes milliseconds)
//   2core  config A, batch 16 on two cores: loom dp 2 (two rank threads, one
//          GEMM thread each, batch 8 per rank), loom one rank with two GEMM
//          threads, PyTorch eager and compile on torch.set_num_threads(2)
// Rank threads x GEMM threads never exceed the cores this process may use
// (its affinity mask); the 2core group is skipped on one core.
//
// PyTorch is the current release from PyPI in the private venv that
// scripts/torch_venv.sh makes (never Debian's 1.13, kept for the parity
// test), running bench/train_gpt_torch.py --serve as one child process that
// keeps its compiled models: each repetition times every row of a group in
// turn (the order reversed every other repetition), so a neighbour's load
// hits loom and PyTorch alike. A row's figure in one repetition is
// tokens per step over the median of its timed steps; the summary gives the
// median over repetitions with the range, and each ratio is the median of
// the per-repetition ratios (the interleaved pairs). loom's step is
// Executor::step (zero grads, forward, backward, AdamW, the loss), PyTorch's
// zero_grad + forward + loss + backward + AdamW(foreach=True).step().
//
// The sgemm peak is measured in every repetition: loom's host GEMM and
// torch.mm (MKL) at 1024^3 on one thread, and on both cores at once for the
// 2core rows; a row's "of peak" is its model GFLOP/s (gpt::Config::
// flops_per_token) over the best of the two. Every measurement line ends in
// other_cores=X, the cores' worth of CPU time other processes took while it
// ran (bench::ForeignLoad): on a shared machine compare the ratios, which
// the interleaving protects, more than the absolute rates.
#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cpu_model.hpp"
#include "gpt_bench_configs.hpp"
#include "torch_peer.hpp"

#ifndef LOOM_SOURCE_DIR
#define LOOM_SOURCE_DIR "."
#endif

namespace {

using bench::BenchConfig;
using bench::median;
using loom::kernels::MatmulPrecision;
namespace host = loom::kernels::host;

// The AdamW of train_gpt_torch.py (the step's cost does not depend on it).
constexpr loom::optim::AdamWConfig adamw{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};

// One row of a group: a loom run or a PyTorch mode.
struct Row {
    std::string name;  // as printed: "loom f32", "torch compile", ...
    bool torch = false;
    int dp = 1, threads = 1;  // loom: rank threads, GEMM threads per rank; torch: threads
    MatmulPrecision matmul = MatmulPrecision::f32;
    bool bf16_dot = false;    // loom bf16 through vdpbf16ps
    std::string mode;         // torch: eager, compile, autocast, compile-autocast
};

Row loom_row(std::string name, int dp = 1, int threads = 1, MatmulPrecision matmul = MatmulPrecision::f32,
             bool bf16_dot = false) {
    return Row{std::move(name), false, dp, threads, matmul, bf16_dot, {}};
}

Row torch_row(std::string name, int threads, std::string mode) {
    return Row{std::move(name), true, 1, threads, MatmulPrecision::f32, false, std::move(mode)};
}

struct Group {
    std::string name, config;  // "2core", "A"
    std::int64_t batch = 0;    // global sequences per step
    int cores = 1;             // the cores its rows use (the peak they are read against)
    int step_factor = 1;       // timed and warm-up steps = this x --steps, --warmup
    std::vector<Row> rows;
};

// Median seconds per step of dp rank threads training `batch` sequences a
// step between them (Executor, ZeRO 0): each step's time is its slowest
// rank's.
double loom_step_seconds(const BenchConfig& config, std::int64_t batch, const Row& row, int steps, int warmup) {
    host::set_blas_threads(row.threads);
    if (host::cpu_features().avx512_bf16) host::set_bf16_dot_products(row.bf16_dot);
    BenchConfig per_rank = config;
    per_rank.batch = batch / row.dp;
    const int total = warmup + steps;
    const auto batches = bench::pregenerated_batches(per_rank, row.dp, total, 1);
    std::vector<std::vector<double>> seconds(static_cast<std::size_t>(row.dp),
                                             std::vector<double>(static_cast<std::size_t>(steps)));
    loom::comm::ThreadWorld(row.dp).run([&](loom::comm::ThreadComm& world) {
        loom::comm::Mesh<loom::comm::ThreadComm> mesh(world, {{"dp", row.dp}});
        auto& comm = mesh.axis("dp");
        const int r = comm.rank();
        auto model = loom::gpt::make_model(config.model);
        loom::exec::Executor<loom::comm::ThreadComm> exec(
            model, comm, loom::exec::ExecutionPlan{},
            {.micro_batches = 1, .adamw = adamw, .field_names = {"embed", "blocks", "ln_f", "head", "loss"},
             .matmul = row.matmul});
        exec.initialize(1);
        const std::int64_t B = per_rank.batch, T = config.model.seq;
        for (int s = 0; s < total; ++s) {
            const auto& in = batches.inputs[batches.at(r, s)];
            const auto& out = batches.targets[batches.at(r, s)];
            const auto t0 = std::chrono::steady_clock::now();
            const float loss = exec.step(loom::Tensor::of(in.data(), {B, T}), loom::Tensor::of(out.data(), {B, T}),
                                         adamw.lr);
            const auto t1 = std::chrono::steady_clock::now();
            LOOM_CHECK(std::isfinite(loss), "bench train_gpt: loss became ", loss, " at step ", s);
            if (s >= warmup)
                seconds[static_cast<std::size_t>(r)][static_cast<std::size_t>(s - warmup)] =
                    std::chrono::duration<double>(t1 - t0).count();
        }
    });
    if (host::cpu_features().avx512_bf16) host::set_bf16_dot_products(false);
    host::set_blas_threads(1);
    std::vector<double> slowest(static_cast<std::size_t>(steps));
    for (std::size_t s = 0; s < slowest.size(); ++s)
        for (const auto& rank : seconds) slowest[s] = std::max(slowest[s], rank[s]);
    return median(slowest);
}

// loom's sgemm rate at 1024^3 on `cores` threads at once, one product each
// (one GEMM thread each): the limit for ranks that run their own GEMMs.
double loom_sgemm_gflops(int cores) {
    std::vector<double> rates(static_cast<std::size_t>(cores));
    std::vector<std::thread> threads;
    for (int c = 0; c < cores; ++c)
        threads.emplace_back([&rates, c] { rates[static_cast<std::size_t>(c)] = host::measure_sgemm_gflops(1024, 7); });
    for (auto& t : threads) t.join();
    double sum = 0;
    for (const double r : rates) sum += r;
    return sum;
}

std::vector<std::string> split(std::string_view list) {
    std::vector<std::string> parts;
    while (!list.empty()) {
        const auto comma = list.find(',');
        parts.emplace_back(list.substr(0, comma));
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    }
    return parts;
}

struct Options {
    std::vector<std::string> groups{"A", "B", "2core"};
    int reps = 5, steps = 20, warmup = 3;
    bool torch = true, compile = true, bf16 = true;
    std::string torch_python;
};

std::vector<Group> make_groups(const Options& o, int cores) {
    std::vector<Group> groups;
    const auto torch_rows = [&o](Group& g, int threads, bool autocast) {
        if (!o.torch) return;
        g.rows.push_back(torch_row("torch eager", threads, "eager"));
        if (o.compile) g.rows.push_back(torch_row("torch compile", threads, "compile"));
        if (!autocast) return;
        g.rows.push_back(torch_row("torch autocast bf16", threads, "autocast"));
        if (o.compile) g.rows.push_back(torch_row("torch compile autocast bf16", threads, "compile-autocast"));
    };
    for (const std::string& name : o.groups) {
        Group g;
        g.name = name;
        if (name == "A" || name == "B") {
            g.config = name;
            g.batch = bench::configs().at(name).batch;
            g.step_factor = name == "B" ? 5 : 1;
            g.rows.push_back(loom_row("loom f32"));
            if (name == "A" && o.bf16) {
                g.rows.push_back(loom_row("loom bf16 rounded", 1, 1, MatmulPrecision::bf16));
                if (host::cpu_features().avx512_bf16)
                    g.rows.push_back(loom_row("loom bf16 vdpbf16ps", 1, 1, MatmulPrecision::bf16, true));
            }
            torch_rows(g, 1, name == "A" && o.bf16);
        } else {  // 2core
            if (cores < 2) {
                std::printf("# group 2core skipped: this process may use %d core (its affinity mask)\n", cores);
                continue;
            }
            g.config = "A";
            g.batch = 16;
            g.cores = 2;
            g.rows.push_back(loom_row("loom dp 2", 2, 1));
            g.rows.push_back(loom_row("loom threads 2", 1, 2));
            torch_rows(g, 2, false);
        }
        groups.push_back(std::move(g));
    }
    return groups;
}

int usage(const char* message, const std::string& value) {
    std::fprintf(stderr,
                 "train_gpt bench: %s%s; flags are --groups A,B,2core --reps N --steps N --warmup N --no-torch "
                 "--no-compile --no-bf16 --torch-python PATH\n",
                 message, value.c_str());
    return 2;
}

// "1.23x (1.10-1.31)": the median of the per-repetition ratios and their range.
std::string ratio_text(const std::vector<double>& ratios) {
    if (ratios.empty()) return "not measured";
    char text[96];
    std::snprintf(text, sizeof text, "%.2fx (%.2f-%.2f over %zu reps)", median(ratios),
                  *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
                  ratios.size());
    return text;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        const bool has_value = i + 1 < argc;
        if (flag == "--no-torch") o.torch = false;
        else if (flag == "--no-compile") o.compile = false;
        else if (flag == "--no-bf16") o.bf16 = false;
        else if (flag == "--reps" && has_value) o.reps = std::atoi(argv[++i]);
        else if (flag == "--steps" && has_value) o.steps = std::atoi(argv[++i]);
        else if (flag == "--warmup" && has_value) o.warmup = std::atoi(argv[++i]);
        else if (flag == "--torch-python" && has_value) o.torch_python = argv[++i];
        else if ((flag == "--groups" || flag == "--configs") && has_value) o.groups = split(argv[++i]);
        else return usage("unknown flag or missing value: ", std::string(flag));
    }
    if (o.reps < 1 || o.steps < 1 || o.warmup < 0)
        return usage("need reps >= 1, steps >= 1 and warmup >= 0; got ",
                     "--reps " + std::to_string(o.reps) + " --steps " + std::to_string(o.steps) + " --warmup " +
                         std::to_string(o.warmup));
    for (const auto& g : o.groups)
        if (g != "A" && g != "B" && g != "2core") return usage("group is not one of A, B, 2core: ", g);

    // One thread per core: OpenBLAS (LOOM_HOST_GEMM=blas) reads this when it
    // starts; loom's GEMM threads are set per row.
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    host::set_blas_threads(1);
    const int cores = bench::usable_cores();
    std::printf("# CPU: %s; loom's level %s; %d usable cores\n", bench::cpu_model().c_str(), bench::cpu_level().c_str(),
                cores);
    std::printf("# loom host GEMM: %s\n", host::host_gemm_report().c_str());
    if (host::cpu_features().avx512_bf16) {
        host::set_bf16_dot_products(true);
        std::printf("# loom bf16 vdpbf16ps rows: %s\n", host::host_gemm_description().c_str());
        host::set_bf16_dot_products(false);
    }

    std::optional<bench::TorchPeer> peer;
    if (o.torch) {
        if (o.torch_python.empty()) o.torch_python = bench::torch_venv_python(LOOM_SOURCE_DIR);
        if (o.torch_python.empty()) {
            std::printf("# torch: not measured: no PyTorch venv; run %s/scripts/torch_venv.sh (installs current "
                        "PyTorch from PyPI) or pass --torch-python\n",
                        LOOM_SOURCE_DIR);
            o.torch = false;
        } else {
            peer.emplace(o.torch_python, std::string(LOOM_SOURCE_DIR) + "/bench/train_gpt_torch.py");
            const auto info = peer->ask("info");
            if (!info || !info->starts_with("torch info")) {
                std::printf("# torch: not measured: %s did not start the peer (%s)\n", o.torch_python.c_str(),
                            info ? info->c_str() : "no answer");
                o.torch = false;
                peer.reset();
            } else {
                std::printf("# %s (%s)\n", info->c_str(), o.torch_python.c_str());
            }
        }
    }
    const std::vector<Group> groups = make_groups(o, cores);

    // results[group][row] = tokens/s per repetition (NaN: not measured).
    std::map<std::string, std::map<std::string, std::vector<double>>> results;
    std::map<int, std::vector<double>> loom_peak, torch_peak;  // cores -> per repetition
    const auto torch_sgemm = [&](int threads) {
        if (!peer) return 0.0;
        const auto answer = peer->ask("sgemm " + std::to_string(threads));
        return answer ? std::atof(bench::answer_fields(*answer)["gflops"].c_str()) : 0.0;
    };
    std::printf("# rep group row tokens_per_s step_ms other_cores\n");
    for (int rep = 1; rep <= o.reps; ++rep) {
        for (const int c : {1, 2}) {
            if (c > 1 && std::none_of(groups.begin(), groups.end(), [c](const Group& g) { return g.cores == c; }))
                continue;
            const bench::ForeignLoad load(peer ? peer->pid() : 0);
            loom_peak[c].push_back(loom_sgemm_gflops(c));
            torch_peak[c].push_back(torch_sgemm(c));
            std::printf("rep=%d sgemm cores=%d loom_gflops=%.1f torch_gflops=%.1f other_cores=%.2f\n", rep, c,
                        loom_peak[c].back(), torch_peak[c].back(), load.cores());
        }
        for (const Group& g : groups) {
            const BenchConfig& config = bench::configs().at(g.config);
            const int steps = o.steps * g.step_factor, warmup = o.warmup * g.step_factor;
            const double tokens = static_cast<double>(g.batch * config.model.seq);
            std::vector<Row> order = g.rows;
            if (rep % 2 == 0) std::reverse(order.begin(), order.end());
            for (const Row& row : order) {
                double tokens_per_s = std::nan("");
                const bench::ForeignLoad load(peer ? peer->pid() : 0);
                std::string note;
                if (!row.torch) {
                    tokens_per_s = tokens / loom_step_seconds(config, g.batch, row, steps, warmup);
                } else if (peer) {
                    const auto answer = peer->ask("train " + g.config + " " + row.mode + " " + std::to_string(row.threads) +
                                                  " " + std::to_string(g.batch) + " " + std::to_string(steps) + " " +
                                                  std::to_string(warmup));
                    if (!answer) note = " (the PyTorch peer exited)";
                    else if (answer->starts_with("torch train")) tokens_per_s = std::atof(bench::answer_fields(*answer)["tokens_per_s"].c_str());
                    else note = " (" + *answer + ")";
                }
                results[g.name][row.name].push_back(tokens_per_s);
                std::printf("rep=%d group=%s row=\"%s\" tokens_per_s=%.0f step_ms=%.2f other_cores=%.2f%s\n", rep,
                            g.name.c_str(), row.name.c_str(), tokens_per_s, tokens / tokens_per_s * 1e3, load.cores(),
                            note.c_str());
                std::fflush(stdout);
            }
        }
    }

    // Summary: medians over repetitions, fractions of the best peak, ratios.
    const auto best_peak = [&](int c) {
        return std::max(median(loom_peak[c]), torch_peak[c].empty() ? 0.0 : median(torch_peak[c]));
    };
    std::printf("\n# sgemm peak 1024^3, median over reps (GFLOP/s; 2 cores: loom runs one product per core, torch.mm "
                "one product on 2 threads):");
    for (const auto& [c, rates] : loom_peak) {
        std::printf(" %d core%s loom %.1f", c, c == 1 ? "" : "s", median(rates));
        if (peer) std::printf(", torch.mm %.1f", median(torch_peak[c]));
        std::printf(";");
    }
    std::printf("\n# group  row                          tokens/s (median; range)   step_ms  GFLOP/s  of_peak\n");
    const auto finite = [](const std::vector<double>& v) {
        std::vector<double> kept;
        for (const double x : v)
            if (std::isfinite(x)) kept.push_back(x);
        return kept;
    };
    for (const Group& g : groups) {
        const BenchConfig& config = bench::configs().at(g.config);
        const double flops_per_token = config.model.flops_per_token(config.model.seq);
        const double tokens = static_cast<double>(g.batch * config.model.seq);
        for (const Row& row : g.rows) {
            const auto kept = finite(results[g.name][row.name]);
            if (kept.empty()) {
                std::printf("  %-6s %-28s not measured\n", g.name.c_str(), row.name.c_str());
                continue;
            }
            const double tps = median(kept), gflops = tps * flops_per_token / 1e9;
            std::printf("  %-6s %-28s %9.0f (%.0f-%.0f) %9.2f %8.1f %7.1f%%\n", g.name.c_str(), row.name.c_str(), tps,
                        *std::min_element(kept.begin(), kept.end()), *std::max_element(kept.begin(), kept.end()),
                        tokens / tps * 1e3, gflops, 100 * gflops / best_peak(g.cores));
        }
    }

    // Per-repetition ratios a/b of two rows (of possibly different groups).
    const auto ratios = [&](const std::string& ga, const std::string& ra, const std::string& gb, const std::string& rb) {
        std::vector<double> r;
        if (!results.contains(ga) || !results.contains(gb)) return r;
        const auto& a = results[ga][ra];
        const auto& b = results[gb][rb];
        for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
            if (std::isfinite(a[i]) && std::isfinite(b[i]) && b[i] > 0) r.push_back(a[i] / b[i]);
        return r;
    };
    const auto verdict = [&](const char* what, const std::vector<double>& r, double target) {
        if (r.empty()) return;  // a group or the peer that this run did not measure
        std::printf("  %-52s %-30s target >= %.2fx: %s\n", what, ratio_text(r).c_str(), target,
                    r.empty() ? "not measured" : median(r) >= target ? "met" : "missed");
    };
    std::printf("\n# ratios (median of the interleaved per-repetition ratios) against issue 36's targets\n");
    verdict("A: loom / torch eager", ratios("A", "loom f32", "A", "torch eager"), 1.5);
    verdict("A: loom / torch compile", ratios("A", "loom f32", "A", "torch compile"), 1.3);
    verdict("B: loom / torch eager", ratios("B", "loom f32", "B", "torch eager"), 3.0);
    const auto plain = [&](const char* what, const std::vector<double>& r) {
        if (!r.empty()) std::printf("  %-52s %s\n", what, ratio_text(r).c_str());
    };
    plain("B: loom / torch compile", ratios("B", "loom f32", "B", "torch compile"));
    verdict("2core: loom dp 2 / torch eager 2 threads", ratios("2core", "loom dp 2", "2core", "torch eager"), 1.3);
    plain("2core: loom dp 2 / torch compile 2 threads", ratios("2core", "loom dp 2", "2core", "torch compile"));
    verdict("2core: loom dp 2 / loom 1 core (A)", ratios("2core", "loom dp 2", "A", "loom f32"), 1.85);
    verdict("2core: loom threads 2 / loom 1 core (A)", ratios("2core", "loom threads 2", "A", "loom f32"), 1.7);
    // The target is --matmul bf16's: whichever of the two rows loom runs by
    // default on this CPU (kernels/host/cpu_features.hpp, bf16_dot_full_rate).
    const bool dot_default = host::cpu_features().bf16_dot_full_rate;
    const char* bf16_row = dot_default ? "loom bf16 vdpbf16ps" : "loom bf16 rounded";
    const char* other_row = dot_default ? "loom bf16 rounded" : "loom bf16 vdpbf16ps";
    verdict((std::string("A: ") + bf16_row + " (the default) / loom f32").c_str(), ratios("A", bf16_row, "A", "loom f32"),
            1.6);
    plain((std::string("A: ") + other_row + " / loom f32").c_str(), ratios("A", other_row, "A", "loom f32"));
    plain((std::string("A: ") + bf16_row + " / torch autocast bf16").c_str(),
          ratios("A", bf16_row, "A", "torch autocast bf16"));
    plain("A: torch compile autocast bf16 / compile f32", ratios("A", "torch compile autocast bf16", "A", "torch compile"));
    plain("A: torch autocast bf16 / torch eager f32", ratios("A", "torch autocast bf16", "A", "torch eager"));
    return 0;
}
