// bench_gpu_train: loom's GPT training step on one GPU (exec::SerialTrainer
// on cuda:0, f32 weights and activations, AdamW; matrix products with bf16
// operands and f32 sums unless --matmul f32), in tokens per second, on
// random tokens made before the clock starts. Default: GPT-2 124M (12 layers,
// width 768, 12 heads, seq 1024, vocab 50257), batch 8. One step is timed at a
// time (the trainer reads the loss back, so each step ends on the host), the
// median of --steps after --warmup. One line:
//
//   loom gpt layers=12 width=768 heads=12 seq=1024 vocab=50257 batch=8 matmul=bf16 tokens_per_s=198515.5 step_ms=41.27
//
// bench/gpu/torch_peer.py --gpt prints the same line for PyTorch (eager and
// torch.compile, bf16 autocast, SDPA). Host C++: the CUDA backend comes from
// cuda_backend.cu beside it. Without a GPU it prints why and exits 77.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string_view>
#include <vector>

#include "loom/core/device_runtime.hpp"
#include "loom/exec/serial_trainer.hpp"
#include "loom/gpt/model.hpp"
#include "loom/kernels/matmul_precision.hpp"

int main(int argc, char** argv) {
    loom::gpt::Config config{.layers = 12, .width = 768, .heads = 12, .seq = 1024, .vocab = 50257};
    std::int64_t batch = 8;
    int steps = 10, warmup = 3;
    // bf16 operands by default: the peer runs PyTorch's bf16 autocast.
    loom::kernels::MatmulPrecision matmul = loom::kernels::MatmulPrecision::bf16;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        const long long value = std::atoll(argv[i + 1]);
        if (flag == "--matmul") {
            try {
                matmul = loom::kernels::parse_matmul_precision(argv[i + 1]);
            } catch (const loom::Error& e) {
                std::fprintf(stderr, "bench_gpu_train: --matmul: %s\n", e.message().c_str());
                return 2;
            }
        } else if (flag == "--layers") config.layers = value;
        else if (flag == "--width") config.width = value;
        else if (flag == "--heads") config.heads = value;
        else if (flag == "--seq") config.seq = value;
        else if (flag == "--vocab") config.vocab = value;
        else if (flag == "--batch") batch = value;
        else if (flag == "--steps") steps = static_cast<int>(value);
        else if (flag == "--warmup") warmup = static_cast<int>(value);
        else {
            std::fprintf(stderr, "bench_gpu_train: unknown flag %s; flags are --layers --width --heads --seq --vocab "
                                 "--batch --steps --warmup --matmul\n", argv[i]);
            return 2;
        }
    }
    try {
        config.validate();
        if (batch < 1 || steps < 1 || warmup < 0) {
            std::fprintf(stderr, "bench_gpu_train: --batch and --steps must be >= 1, --warmup >= 0\n");
            return 2;
        }
        try {
            loom::check_device_usable(loom::cuda_device(0));
        } catch (const loom::Error& e) {
            std::printf("SKIPPED: %s\n", e.message().c_str());
            return 77;
        }
        std::printf("device %s\n", loom::device_runtime(loom::cuda_device(0)).describe(0).c_str());
        auto model = loom::gpt::make_model(config);
        loom::exec::SerialTrainer trainer(model, loom::cuda_device(0),
                                          {.adamw = loom::optim::AdamWConfig{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0},
                                           .matmul = matmul});
        trainer.initialize(1);
        std::vector<std::int32_t> inputs(static_cast<std::size_t>(batch * config.seq)), targets(inputs.size());
        std::mt19937 rng(1);
        std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(config.vocab) - 1);
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            inputs[i] = id(rng);
            targets[i] = id(rng);
        }
        const auto in = loom::Tensor::of(inputs.data(), {batch, config.seq});
        const auto out = loom::Tensor::of(targets.data(), {batch, config.seq});
        std::vector<double> seconds;
        float loss = 0;
        for (int s = 0; s < warmup + steps; ++s) {
            const auto t0 = std::chrono::steady_clock::now();
            loss = trainer.step(in, out, 3e-4f);
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (s >= warmup) seconds.push_back(dt);
        }
        std::sort(seconds.begin(), seconds.end());
        const double median = seconds[seconds.size() / 2];
        std::printf("loom gpt layers=%lld width=%lld heads=%lld seq=%lld vocab=%lld batch=%lld matmul=%s "
                    "tokens_per_s=%.1f step_ms=%.2f loss=%.4f activation_mib=%.0f\n",
                    static_cast<long long>(config.layers), static_cast<long long>(config.width),
                    static_cast<long long>(config.heads), static_cast<long long>(config.seq),
                    static_cast<long long>(config.vocab), static_cast<long long>(batch), loom::kernels::name_of(matmul),
                    static_cast<double>(batch * config.seq) / median, median * 1e3, static_cast<double>(loss),
                    static_cast<double>(trainer.activation_bytes()) / (1 << 20));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
