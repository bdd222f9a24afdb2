// The CUDA backend of loom's layers: a DeviceRuntime (memory, copies), the
// kernel table (loom/kernels/kernel_list.hpp, filled from kernels/cuda/ and
// optim/adamw.cuh) and a DeviceRankRunner
// (rank threads on one GPU over DeviceThreadWorld) for DeviceKind::cuda,
// registered when the program starts. Include it from one .cu file of the
// program (compiled by nvcc, linked with loom::cuda); the rest of the program,
// layers, executor and trainer alike, stays host C++ and reaches the GPU
// through the registered interfaces:
//
//   // cuda_backend.cu
//   #include "loom/cuda_backend.cuh"
//
// Work runs on the calling thread's current stream: cudaStreamPerThread
// unless a StreamScope names another (a DeviceThreadComm rank runs its layers
// on its communicator's stream, so compute and collectives stay in order).
// Every call makes the tensor's device current for its duration.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/device_ranks.hpp"
#include "loom/comm/device_thread_world.cuh"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/kernels/kernel_list.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/kernels/cuda/attention.cuh"
#include "loom/kernels/cuda/attention_bf16_inputs.cuh"
#include "loom/kernels/cuda/attention_blocks.cuh"
#include "loom/kernels/cuda/chunk_encoding.cuh"
#include "loom/kernels/cuda/cross_entropy.cuh"
#include "loom/kernels/cuda/elementwise.cuh"
#include "loom/kernels/cuda/embedding.cuh"
#include "loom/kernels/cuda/gelu.cuh"
#include "loom/kernels/cuda/gemm.cuh"
#include "loom/kernels/cuda/gemm_bf16_inputs.cuh"
#include "loom/kernels/cuda/layernorm.cuh"
#include "loom/kernels/cuda/layernorm_grid.cuh"
#include "loom/kernels/cuda/low_rank.cuh"
#include "loom/kernels/cuda/quantize.cuh"
#include "loom/optim/adamw.cuh"

namespace loom::cuda_backend {

namespace detail {

[[nodiscard]] inline cudaStream_t& current_stream_slot() {
    thread_local cudaStream_t stream = cudaStreamPerThread;
    return stream;
}

// One cuBLASLt context per (thread, device, stream): contexts are not
// thread-safe, and cudaStreamPerThread names a different stream per device.
using GemmContexts = std::map<std::pair<int, cudaStream_t>, std::unique_ptr<kernels::cuda::GemmContext>>;

[[nodiscard]] inline GemmContexts& gemm_contexts() {
    thread_local GemmContexts contexts;
    return contexts;
}

[[nodiscard]] inline kernels::cuda::GemmContext& gemm_context(int device, cudaStream_t stream) {
    auto& slot = gemm_contexts()[{device, stream}];
    if (!slot) slot = std::make_unique<kernels::cuda::GemmContext>(stream);
    return *slot;
}

// Drops this thread's contexts on `stream` (their workspaces are freed on
// it), while the stream still exists.
inline void release_gemm_contexts(cudaStream_t stream) noexcept {
    std::erase_if(gemm_contexts(), [&](const auto& entry) { return entry.first.second == stream; });
}

[[nodiscard]] inline cudaMemcpyKind copy_kind(Device to, Device from) {
    const bool to_host = to.kind == DeviceKind::host, from_host = from.kind == DeviceKind::host;
    if (to_host) return from_host ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost;
    return from_host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
}

}  // namespace detail

// The stream this thread's layers run on.
[[nodiscard]] inline cudaStream_t current_stream() { return detail::current_stream_slot(); }

// Makes `stream` this thread's stream for a scope, then restores the previous.
// The scope's GEMM contexts on `stream` end with it: the stream may be
// destroyed right after (a rank's communicator stream), and a context frees
// its workspace on its stream.
class StreamScope {
public:
    explicit StreamScope(cudaStream_t stream)
        : stream_(stream), previous_(std::exchange(detail::current_stream_slot(), stream)) {}
    StreamScope(const StreamScope&) = delete;
    StreamScope& operator=(const StreamScope&) = delete;
    ~StreamScope() {
        if (stream_ != previous_) detail::release_gemm_contexts(stream_);
        detail::current_stream_slot() = previous_;
    }

private:
    cudaStream_t stream_;
    cudaStream_t previous_;
};

class CudaRuntime final : public DeviceRuntime {
public:
    void check_usable(int index) const override {
        int count = 0;
        const cudaError_t status = cudaGetDeviceCount(&count);
        if (status != cudaSuccess) {
            (void)cudaGetLastError();  // clear it, so the next CUDA call does not report it again
            LOOM_FAIL("no CUDA device is usable: cudaGetDeviceCount failed with ", cudaGetErrorName(status), " (",
                      cudaGetErrorString(status), "); run on a machine with an NVIDIA GPU and its driver, or on the host");
        }
        LOOM_CHECK(count > 0, "no CUDA device is visible (cudaGetDeviceCount found 0; check CUDA_VISIBLE_DEVICES); "
                              "run on a machine with an NVIDIA GPU, or on the host");
        LOOM_CHECK(index >= 0 && index < count, "cuda:", index, " does not exist: this machine has ", count,
                   " CUDA device", count == 1 ? "" : "s", " (cuda:0 to cuda:", count - 1, ")");
    }

    [[nodiscard]] int device_count() const override {
        int count = 0;
        if (cudaGetDeviceCount(&count) == cudaSuccess) return count;
        (void)cudaGetLastError();  // as in check_usable: no driver reads as no device
        return 0;
    }

    [[nodiscard]] std::string describe(int index) const override {
        cudaDeviceProp props{};
        LOOM_CUDA_CHECK(cudaGetDeviceProperties(&props, index));
        return std::string(props.name) + " (sm_" + std::to_string(props.major) + std::to_string(props.minor) + ", " +
               std::to_string(props.totalGlobalMem >> 30) + " GiB)";
    }

    [[nodiscard]] void* allocate(std::size_t bytes, Device where) override {
        return Allocator<Cuda>::allocate(bytes, where);
    }
    void deallocate(void* p, std::size_t bytes, Device where) noexcept override {
        Allocator<Cuda>::deallocate(p, bytes, where);
    }

    // Host memory involved: waits for the copy, so the host may read what it
    // asked for, or reuse what it gave, as soon as this returns.
    void copy(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes) override {
        const Device on = to_device.kind == DeviceKind::cuda ? to_device : from_device;
        loom::detail::CudaDeviceScope scope(on.index);
        const cudaStream_t stream = current_stream();
        if (to_device.kind == DeviceKind::cuda && from_device.kind == DeviceKind::cuda &&
            to_device.index != from_device.index)
            LOOM_CUDA_CHECK(cudaMemcpyPeerAsync(to, to_device.index, from, from_device.index, bytes, stream));
        else
            LOOM_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, detail::copy_kind(to_device, from_device), stream));
        if (to_device.kind == DeviceKind::host || from_device.kind == DeviceKind::host)
            LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    void fill_zero(void* p, Device where, std::size_t bytes) override {
        loom::detail::CudaDeviceScope scope(where.index);
        LOOM_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_stream()));
    }
    void fill_floats(float* p, Device where, float value, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::fill(p, value, n, current_stream());
    }

    // Rows of `width` bytes at pitches: one 2D copy (cudaMemcpy2DAsync).
    void copy_rows(void* to, std::size_t to_pitch, Device to_device, const void* from, std::size_t from_pitch,
                   Device from_device, std::size_t width, std::size_t rows) override {
        LOOM_CHECK(to_device.kind != DeviceKind::cuda || from_device.kind != DeviceKind::cuda ||
                       to_device.index == from_device.index,
                   "copy_rows: ", from_device, " to ", to_device, "; rows move within one device or to or from the host");
        const Device on = to_device.kind == DeviceKind::cuda ? to_device : from_device;
        loom::detail::CudaDeviceScope scope(on.index);
        const cudaStream_t stream = current_stream();
        LOOM_CUDA_CHECK(cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, width, rows,
                                          detail::copy_kind(to_device, from_device), stream));
        if (to_device.kind == DeviceKind::host || from_device.kind == DeviceKind::host)
            LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    }

    void synchronize(Device where) override {
        loom::detail::CudaDeviceScope scope(where.index);
        LOOM_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
    }
};

// The CUDA launchers of the kernel table (loom/kernels/kernel_list.hpp), each
// taking its kernel's host arguments and then the stream. A kernel's launcher
// is found by qualified lookup in this namespace: the ones defined here (the
// kernels that need more than a stream: a cuBLASLt context, scratch), else,
// through the using-directive, kernels/cuda/'s function of the kernel's name.
// So a new kernel whose CUDA function follows that convention needs no line
// here.
namespace launchers {

using namespace kernels::cuda;

namespace launch_state {

[[nodiscard]] inline int current_device() {
    int device = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&device));
    return device;
}

// Launchers' reusable memory (top-k's sort, a bf16 GEMM's rounded operands,
// the bf16 attention's row terms), per calling thread (rank threads work at
// once) and device: a thread makes one call at a time, so one scratch serves
// all of its calls. Freed in stream order when the thread ends.
[[nodiscard]] inline kernels::cuda::StreamScratch& scratch() {
    thread_local std::map<int, kernels::cuda::StreamScratch> scratch;
    return scratch[current_device()];
}

[[nodiscard]] inline kernels::cuda::GemmContext& gemm_context(cudaStream_t stream) {
    return cuda_backend::detail::gemm_context(current_device(), stream);
}

}  // namespace launch_state

inline void gemm(kernels::Trans ta, kernels::Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                 const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                 std::int64_t ldc, cudaStream_t stream) {
    kernels::cuda::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, launch_state::gemm_context(stream));
}
inline void gemm_bf16_inputs(kernels::Trans ta, kernels::Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                             float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                             float beta, float* C, std::int64_t ldc, cudaStream_t stream) {
    kernels::cuda::gemm_bf16_inputs(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                    launch_state::gemm_context(stream), launch_state::scratch());
}
// The bias in cuBLASLt's epilogue: one pass over C, not a pass writing the
// bias rows and a product reading them back (kernels/cuda/gemm.cuh).
inline void gemm_bias(bool bf16_inputs, kernels::Trans ta, kernels::Trans tb, std::int64_t M, std::int64_t N,
                      std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                      const float* bias, float* C, std::int64_t ldc, cudaStream_t stream) {
    kernels::cuda::GemmContext& context = launch_state::gemm_context(stream);
    if (bf16_inputs)
        kernels::cuda::gemm_bias_bf16_inputs(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, C, ldc, context,
                                             launch_state::scratch());
    else
        kernels::cuda::gemm_bias(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, C, ldc, context);
}
inline void attention_forward_bf16_inputs(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                                          std::int64_t H, std::int64_t D, cudaStream_t stream) {
    kernels::cuda::attention_forward_bf16_inputs(qkv, out, lse, B, T, H, D, stream);
}
inline void attention_backward_bf16_inputs(const float* qkv, const float* out, const float* dout, const float* lse,
                                           float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                                           std::int64_t D, cudaStream_t stream) {
    kernels::cuda::attention_backward_bf16_inputs(qkv, out, dout, lse, dqkv, B, T, H, D, stream, &launch_state::scratch());
}
inline void pack_chunk(const kernels::ChunkEncoding& e, const float* x, std::int64_t n, std::uint32_t* words,
                       float* residual, cudaStream_t stream) {
    kernels::cuda::pack_chunk(e, x, n, words, residual, launch_state::scratch(), stream);
}
inline void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t n,
                         const optim::detail::AdamWScalars& scalars, cudaStream_t stream) {
    optim::cuda::adamw_update(params, grads, m, v, static_cast<std::int64_t>(n), scalars, stream);
}

}  // namespace launchers

namespace detail {

// A kernel's device entry from its launcher: the device made current for the
// call, the calling thread's stream appended.
template <auto Launcher, class Signature>
struct OnStream;
template <auto Launcher, class R, class... Args>
struct OnStream<Launcher, R(Args...)> {
    static R call(Device where, Args... args) {
        loom::detail::CudaDeviceScope scope(where.index);
        return Launcher(args..., current_stream());
    }
};
template <auto Launcher, class R, class... Args>
struct OnStream<Launcher, R(Args...) noexcept> : OnStream<Launcher, R(Args...)> {};

}  // namespace detail

// Every kernel of loom/kernels/kernel_list.hpp, on the calling thread's stream.
[[nodiscard]] inline kernels::BackendKernels kernel_table() {
    kernels::BackendKernels table;
#define LOOM_CUDA_ENTRY(k, host_function) \
    table.k = &detail::OnStream<&launchers::k, kernels::kernel::k::Signature>::call;
    LOOM_BACKEND_KERNELS(LOOM_CUDA_ENTRY)
#undef LOOM_CUDA_ENTRY
    return table;
}

// Ranks as threads on one GPU (DeviceThreadWorld), each running its layers on
// its communicator's stream, so compute, copies and collectives are ordered
// without waits; host code sees each rank's communicator as an AnyComm.
class CudaRankRunner final : public comm::DeviceRankRunner {
public:
    void run(int ranks, Device device, const std::function<void(comm::AnyComm&)>& body) const override {
        comm::DeviceThreadWorld(ranks, device.index).run([&](comm::DeviceThreadComm& rank_comm) {
            const StreamScope stream(rank_comm.stream());
            comm::AnyComm any = comm::AnyComm::view(rank_comm);
            body(any);
        });
    }
};

// The process's instances (function statics: usable during static
// initialisation, whatever the order of translation units).
[[nodiscard]] inline CudaRuntime& runtime() {
    static CudaRuntime instance;
    return instance;
}
[[nodiscard]] inline CudaRankRunner& rank_runner() {
    static CudaRankRunner instance;
    return instance;
}

// Installs the CUDA backend; idempotent. Called at start-up by the variable
// below; call it yourself only after something unregistered it.
inline bool install() {
    install_backend<DeviceRuntime>(DeviceKind::cuda, &runtime());
    (void)kernels::install_kernels(DeviceKind::cuda, kernel_table());
    install_backend<comm::DeviceRankRunner>(DeviceKind::cuda, &rank_runner());
    return true;
}

// An inline variable: initialised once per program, before main, in whichever
// translation unit that includes this header the linker keeps.
inline const bool installed = install();

}  // namespace loom::cuda_backend
