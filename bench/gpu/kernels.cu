// bench_gpu_kernels: loom's CUDA kernels against the machine's limits, each
// measured in this run: a bf16 GEMM (8192^3 by default) in TFLOP/s through
// cuBLASLt, the elementwise kernels (GELU forward, AdamW, bf16 cast) in GB/s
// beside cudaMemcpy device to device, and causal attention forward +
// backward in TFLOP/s at sequence 1024 and 4096. Times are CUDA events around
// one launch sequence, median of --reps after --warmup. One line per figure:
//
//   loom gemm_bf16 m=8192 tflops=612.3
//   loom copy_d2d bytes=1073741824 gbps=3012.4
//   loom gelu_forward n=268435456 gbps=2750.1 of_copy=0.913
//   loom attention seq=1024 heads=12 head_dim=64 batch=8 dtype=bf16 fwd_bwd_tflops=41.2
//
// bench/gpu/torch_peer.py prints the same figures for PyTorch, and
// scripts/gpu_run.sh puts the two side by side. Without a GPU it prints why
// and exits 77.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/check_cuda.hpp"
#include "loom/core/dtype.hpp"
#include "loom/kernels/cuda/attention.cuh"
#include "loom/kernels/cuda/attention_bf16_inputs.cuh"
#include "loom/kernels/cuda/gelu.cuh"
#include "loom/kernels/cuda/gemm.cuh"
#include "loom/kernels/cuda/quantize.cuh"
#include "loom/optim/adamw.cuh"
// The kernel lab's wmma attention, not shipped: the reference the mma kernels are timed against.
#include "dev/kernel_lab/attention_wmma.cuh"

namespace {

namespace device = loom::kernels::cuda;

struct Options {
    std::int64_t gemm = 8192;
    std::int64_t elements = std::int64_t{1} << 28;  // 1 GiB of f32
    int reps = 10, warmup = 3;
};

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        const long long value = std::atoll(argv[i + 1]);
        if (flag == "--gemm") o.gemm = value;
        else if (flag == "--elements") o.elements = value;
        else if (flag == "--reps") o.reps = static_cast<int>(value);
        else if (flag == "--warmup") o.warmup = static_cast<int>(value);
        else {
            std::fprintf(stderr, "bench_gpu_kernels: unknown flag %s; flags are --gemm N --elements N --reps N --warmup N\n",
                         argv[i]);
            std::exit(2);
        }
    }
    if (o.gemm < 1 || o.elements < 1 || o.reps < 1 || o.warmup < 0) {
        std::fprintf(stderr, "bench_gpu_kernels: sizes and --reps must be >= 1, --warmup >= 0\n");
        std::exit(2);
    }
    return o;
}

// Device memory of n elements of T, zero-filled (random data below where it
// matters: a GEMM on zeros runs faster than on real values).
template <class T>
struct Device {
    T* p = nullptr;
    explicit Device(std::int64_t n) {
        LOOM_CUDA_CHECK(cudaMalloc(&p, static_cast<std::size_t>(n) * sizeof(T)));
        LOOM_CUDA_CHECK(cudaMemset(p, 0, static_cast<std::size_t>(n) * sizeof(T)));
    }
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;
    ~Device() { cudaFree(p); }
};

__global__ void fill_random(float* x, std::int64_t n, std::uint32_t seed, float scale) {
    for (std::int64_t i = device::grid_index(); i < n; i += device::grid_stride()) {
        std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
        h ^= h >> 16;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = scale * (static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f);
    }
}
__global__ void fill_random_bf16(loom::bf16* x, std::int64_t n, std::uint32_t seed) {
    for (std::int64_t i = device::grid_index(); i < n; i += device::grid_stride()) {
        std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
        h ^= h >> 15;
        x[i] = loom::to_bf16(static_cast<float>(h & 0xffff) / 65536.0f - 0.5f);
    }
}

void randomize(float* x, std::int64_t n, std::uint32_t seed, float scale = 1.0f) {
    fill_random<<<device::blocks_for(n), device::threads_per_block>>>(x, n, seed, scale);
    LOOM_CUDA_CHECK_LAUNCH();
}

// Median seconds of `reps` timed runs of `work` after `warmup` untimed ones.
double median_seconds(const Options& o, const std::function<void()>& work) {
    for (int i = 0; i < o.warmup; ++i) work();
    cudaEvent_t start, stop;
    LOOM_CUDA_CHECK(cudaEventCreate(&start));
    LOOM_CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<double> times;
    for (int i = 0; i < o.reps; ++i) {
        LOOM_CUDA_CHECK(cudaEventRecord(start));
        work();
        LOOM_CUDA_CHECK(cudaEventRecord(stop));
        LOOM_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms * 1e-3);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

void bench_gemm(const Options& o) {
    const std::int64_t n = o.gemm;
    Device<loom::bf16> a(n * n), b(n * n);
    Device<float> c(n * n);
    fill_random_bf16<<<device::blocks_for(n * n), device::threads_per_block>>>(a.p, n * n, 1);
    fill_random_bf16<<<device::blocks_for(n * n), device::threads_per_block>>>(b.p, n * n, 2);
    LOOM_CUDA_CHECK_LAUNCH();
    device::GemmContext context(nullptr);
    const double s = median_seconds(o, [&] {
        device::gemm(loom::kernels::Trans::no, loom::kernels::Trans::yes, n, n, n, 1.0f, a.p, n, b.p, n, 0.0f, c.p, n, context);
    });
    std::printf("loom gemm_bf16 m=%lld tflops=%.1f\n", static_cast<long long>(n), 2.0 * n * n * n / s / 1e12);
}

void bench_elementwise(const Options& o) {
    const std::int64_t n = o.elements;
    Device<float> x(n), y(n), g(n), m(n), v(n);
    randomize(x.p, n, 3);
    randomize(g.p, n, 4, 1e-2f);
    Device<std::uint32_t> words(device::cast_words(n));
    const double bytes_copy = 2.0 * static_cast<double>(n) * sizeof(float);  // read + write
    const double copy = median_seconds(o, [&] {
        LOOM_CUDA_CHECK(cudaMemcpyAsync(y.p, x.p, static_cast<std::size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice));
    });
    const double copy_gbps = bytes_copy / copy / 1e9;
    std::printf("loom copy_d2d bytes=%lld gbps=%.1f\n", static_cast<long long>(n * 4), copy_gbps);
    const auto report = [&](const char* name, double bytes, double seconds) {
        const double gbps = bytes / seconds / 1e9;
        std::printf("loom %s n=%lld gbps=%.1f of_copy=%.3f\n", name, static_cast<long long>(n), gbps, gbps / copy_gbps);
    };
    report("gelu_forward", 2.0 * n * 4, median_seconds(o, [&] { device::gelu_forward(x.p, y.p, n); }));
    loom::optim::AdamWConfig config{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
    const auto scalars = loom::optim::detail::adamw_scalars(config, 10);
    // AdamW reads params, grads, m, v and writes params, m, v: 7 floats per element.
    report("adamw", 7.0 * n * 4, median_seconds(o, [&] { loom::optim::cuda::adamw_update(x.p, g.p, m.p, v.p, n, scalars); }));
    // The bf16 cast reads 4 bytes and writes 2 per element.
    report("cast_bf16", 6.0 * n, median_seconds(o, [&] { device::pack_cast(device::Cast::bf16, x.p, n, words.p); }));
}

// f32 on the CUDA cores (attention.cuh), then bf16 operands on the tensor
// cores: the mma.sync kernels (attention_mma.cuh, what --matmul bf16 runs)
// as dtype=bf16, beside SDPA's bf16, and the kernel lab's wmma kernels
// (dev/kernel_lab/attention_wmma.cuh, not shipped) as dtype=bf16_wmma.
void bench_attention(const Options& o, std::int64_t T, std::int64_t B) {
    constexpr std::int64_t H = 12, D = 64, C = H * D;
    Device<float> qkv(B * T * 3 * C), out(B * T * C), lse(B * H * T), dout(B * T * C), dqkv(B * T * 3 * C);
    randomize(qkv.p, B * T * 3 * C, 5);
    randomize(dout.p, B * T * C, 6);
    // FlashAttention's count: forward 2 matmuls (QK^T, PV), backward 2.5x
    // that (dV, dP, dQ, dK and half of the recomputed QK^T), each causal
    // matmul 2 B H T^2 D / 2 FLOPs; torch_peer.py counts SDPA the same way.
    const double matmul = 2.0 * B * H * T * T * D / 2.0;
    const auto report = [&](const char* dtype, double seconds) {
        std::printf("loom attention seq=%lld heads=%lld head_dim=%lld batch=%lld dtype=%s fwd_bwd_tflops=%.2f\n",
                    static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(D),
                    static_cast<long long>(B), dtype, 7.0 * matmul / seconds / 1e12);
    };
    report("f32", median_seconds(o, [&] {
               device::attention_forward(qkv.p, out.p, lse.p, B, T, H, D);
               device::attention_backward(qkv.p, out.p, dout.p, lse.p, dqkv.p, B, T, H, D);
           }));
    device::StreamScratch scratch;
    report("bf16", median_seconds(o, [&] {
               device::attention_forward_bf16_mma(qkv.p, out.p, lse.p, B, T, H, D);
               device::attention_backward_bf16_mma(qkv.p, out.p, dout.p, lse.p, dqkv.p, B, T, H, D, scratch);
           }));
    report("bf16_wmma", median_seconds(o, [&] {
               device::attention_forward_bf16_wmma(qkv.p, out.p, lse.p, B, T, H, D);
               device::attention_backward_bf16_wmma(qkv.p, out.p, dout.p, lse.p, dqkv.p, B, T, H, D);
           }));
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("SKIPPED: no usable CUDA device; bench_gpu_kernels measures nothing here\n");
        return 77;
    }
    cudaDeviceProp props{};
    LOOM_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
    std::printf("device %s sm_%d%d\n", props.name, props.major, props.minor);
    try {
        bench_gemm(o);
        bench_elementwise(o);
        bench_attention(o, 1024, 8);
        bench_attention(o, 4096, 2);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    return 0;
}
