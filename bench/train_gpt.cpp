// bench/train_gpt: loom's GPT training step on one core against PyTorch's
// on the same core, same run, same configs; plus the single-core sgemm peak
// measured in the same run, so the achieved GFLOP/s read as a fraction of it.
// Both sides are limited to one thread for real (OPENBLAS_NUM_THREADS=1 for
// loom's OpenBLAS and for PyTorch's, set before either starts its threads).
//
//   train_gpt [--configs A,B] [--steps 20] [--warmup 3] [--no-torch]
#include <loom/data/corpus.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "gpt_bench_configs.hpp"

#ifndef LOOM_SOURCE_DIR
#define LOOM_SOURCE_DIR "."
#endif

namespace {

using bench::BenchConfig;
using bench::configs;
using bench::median;

// Median seconds per training step (forward, backward, AdamW) after warm-up.
double loom_step_seconds(const BenchConfig& config, int steps, int warmup) {
    loom::gpt::Model model = loom::gpt::make_model(config.model);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, 1);
    loom::optim::AdamW optimizer(arena.size(), {});
    loom::nn::Context ctx;
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 18, 1, static_cast<int>(config.model.vocab));
    const std::int64_t B = config.batch, T = config.model.seq;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(B * T)), targets(inputs.size());
    std::vector<double> times;
    for (int step = 0; step < warmup + steps; ++step) {
        corpus.batch(1, step, B, T, inputs, targets);
        const auto t0 = std::chrono::steady_clock::now();
        arena.zero_grads();
        (void)loom::nn::forward_backward(model, ctx, loom::Tensor::of(inputs.data(), {B, T}),
                                          loom::Tensor::of(targets.data(), {B, T}));
        optimizer.step(arena.values(), arena.grads());
        if (step >= warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return median(times);
}

// Runs the PyTorch script for one config; returns its tokens/s, or 0.
double torch_tokens_per_second(const std::string& config, int steps, int warmup) {
    const std::string command = "OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/python3 " +
                                std::string(LOOM_SOURCE_DIR) + "/bench/train_gpt_torch.py --config " + config +
                                " --steps " + std::to_string(steps) + " --warmup " + std::to_string(warmup) + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return 0;
    char line[1024];
    double tokens = 0;
    while (std::fgets(line, sizeof line, pipe) != nullptr) {
        const std::string_view text = line;
        if (const auto at = text.find("tokens_per_s="); text.starts_with("torch ") && at != std::string_view::npos)
            tokens = std::atof(line + at + 13);
        else
            std::fprintf(stderr, "  torch: %s", line);
    }
    pclose(pipe);
    return tokens;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> which{"A", "B"};
    int steps = 20, warmup = 3;
    bool torch = true;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (flag == "--no-torch") torch = false;
        else if (flag == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
        else if (flag == "--warmup" && i + 1 < argc) warmup = std::atoi(argv[++i]);
        else if (flag == "--configs" && i + 1 < argc) {
            which.clear();
            for (std::string_view rest = argv[++i]; !rest.empty();) {
                const auto comma = rest.find(',');
                which.emplace_back(rest.substr(0, comma));
                rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
            }
        } else {
            std::fprintf(stderr, "train_gpt bench: unknown flag %s; flags are --configs A,B --steps N --warmup N --no-torch\n", argv[i]);
            return 2;
        }
    }
    if (steps < 1 || warmup < 0) {
        std::fprintf(stderr, "train_gpt bench: --steps %d --warmup %d; steps must be at least 1 and warmup at least 0\n", steps, warmup);
        return 2;
    }
    for (const auto& name : which)
        if (!configs().contains(name)) {
            std::fprintf(stderr, "train_gpt bench: config %s is not one of A, B\n", name.c_str());
            return 2;
        }
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    loom::kernels::host::set_blas_threads(1);
    const double peak = loom::kernels::host::measure_sgemm_gflops(1024, 7);
    std::printf("# host GEMM: %s\n", loom::kernels::host::host_gemm_report().c_str());
    std::printf("# single-core sgemm peak (1024^3, that GEMM, 1 thread): %.1f GFLOP/s\n", peak);
    std::printf("# config  impl   tokens/s   step_ms   GFLOP/s  of_peak\n");
    for (const auto& name : which) {
        const BenchConfig& config = configs().at(name);
        const double tokens = static_cast<double>(config.batch * config.model.seq);
        const double flops = config.model.flops_per_token(config.model.seq) * tokens;
        const double seconds = loom_step_seconds(config, steps, warmup);
        const double loom_tps = tokens / seconds;
        std::printf("%-7s  loom  %9.0f  %8.2f  %8.1f  %6.1f%%\n", name.c_str(), loom_tps, seconds * 1e3,
                    flops / seconds / 1e9, 100 * flops / seconds / 1e9 / peak);
        if (torch) {
            const double torch_tps = torch_tokens_per_second(name, steps, warmup);
            if (torch_tps > 0) {
                const double torch_seconds = tokens / torch_tps;
                std::printf("%-7s  torch %9.0f  %8.2f  %8.1f  %6.1f%%\n", name.c_str(), torch_tps, torch_seconds * 1e3,
                            flops / torch_seconds / 1e9, 100 * flops / torch_seconds / 1e9 / peak);
                std::printf("%-7s  loom / torch = %.2fx tokens/s\n", name.c_str(), loom_tps / torch_tps);
            } else {
                std::printf("%-7s  torch: not measured (/usr/bin/python3 cannot import torch; install python3-torch)\n", name.c_str());
            }
        }
        std::fflush(stdout);
    }
    return 0;
}
