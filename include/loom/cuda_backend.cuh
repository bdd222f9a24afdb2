// The CUDA backend of loom's layers: a DeviceRuntime (memory, copies), the
// DeviceKernels (kernels/cuda/, optim/adamw.cuh) and a DeviceRankRunner
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
#include "loom/kernels/device_kernels.hpp"
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

// Each kernel on the calling thread's stream, with the tensor's device current.
class CudaKernels final : public kernels::DeviceKernels {
public:
    void gemm(Device where, kernels::Trans ta, kernels::Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
              float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
              std::int64_t ldc) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                            detail::gemm_context(where.index, current_stream()));
    }
    void gemm_bf16_inputs(Device where, kernels::Trans ta, kernels::Trans tb, std::int64_t M, std::int64_t N,
                          std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
                          std::int64_t ldb, float beta, float* C, std::int64_t ldc) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::gemm_bf16_inputs(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                        detail::gemm_context(where.index, current_stream()), scratch(where));
    }
    // The bias in cuBLASLt's epilogue: one pass over C, not a pass writing
    // the bias rows and a product reading them back (kernels/cuda/gemm.cuh).
    void gemm_bias(Device where, bool bf16_inputs, kernels::Trans ta, kernels::Trans tb, std::int64_t M,
                   std::int64_t N, std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
                   std::int64_t ldb, const float* bias, float* C, std::int64_t ldc) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::GemmContext& context = detail::gemm_context(where.index, current_stream());
        if (bf16_inputs)
            kernels::cuda::gemm_bias_bf16_inputs(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, C, ldc, context,
                                                 scratch(where));
        else
            kernels::cuda::gemm_bias(ta, tb, M, N, K, alpha, A, lda, B, ldb, bias, C, ldc, context);
    }
    void repeat_rows(Device where, const float* row, float* y, std::int64_t rows, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::repeat_rows(row, y, rows, n, current_stream());
    }
    void add(Device where, const float* a, const float* b, float* out, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::add(a, b, out, n, current_stream());
    }
    void accumulate(Device where, float* into, const float* x, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::accumulate(into, x, n, current_stream());
    }
    void add_bias(Device where, float* y, const float* bias, std::int64_t rows, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::add_bias(y, bias, rows, n, current_stream());
    }
    void bias_grad(Device where, const float* dy, float* dbias, std::int64_t rows, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::bias_grad(dy, dbias, rows, n, current_stream());
    }
    void gelu_forward(Device where, const float* x, float* y, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::gelu_forward(x, y, n, current_stream());
    }
    void gelu_backward(Device where, const float* x, const float* dy, float* dx, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::gelu_backward(x, dy, dx, n, current_stream());
    }
    void layernorm_forward(Device where, const float* x, const float* gain, const float* shift, float* y, float* mean,
                           float* rstd, std::int64_t rows, std::int64_t C, float eps) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::layernorm_forward(x, gain, shift, y, mean, rstd, rows, C, eps, current_stream());
    }
    void layernorm_backward_input(Device where, const float* dy, const float* x, const float* gain, const float* mean,
                                  const float* rstd, float* dx, std::int64_t rows, std::int64_t C) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::layernorm_backward_input(dy, x, gain, mean, rstd, dx, rows, C, current_stream());
    }
    void layernorm_backward_weight(Device where, const float* dy, const float* x, const float* mean, const float* rstd,
                                   float* dgain, float* dshift, std::int64_t rows, std::int64_t C) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::layernorm_backward_weight(dy, x, mean, rstd, dgain, dshift, rows, C, current_stream());
    }
    void embedding_forward(Device where, const std::int32_t* tokens, const float* token_table,
                           const float* position_table, float* out, std::int64_t B, std::int64_t T, std::int64_t C,
                           std::int64_t vocab) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::embedding_forward(tokens, token_table, position_table, out, B, T, C, vocab, current_stream());
    }
    void embedding_backward(Device where, const std::int32_t* tokens, const float* dout, float* dtoken_table,
                            float* dposition_table, std::int64_t B, std::int64_t T, std::int64_t C) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::embedding_backward(tokens, dout, dtoken_table, dposition_table, B, T, C, current_stream());
    }
    void embedding_slice_lookup(Device where, const std::int32_t* tokens, const float* token_table, float* out,
                                std::int64_t n, std::int64_t T, std::int64_t C, std::int64_t start, std::int64_t stop,
                                std::int64_t whole_vocab) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::embedding_slice_lookup(tokens, token_table, out, n, T, C, start, stop, whole_vocab,
                                              current_stream());
    }
    void embedding_slice_backward(Device where, const std::int32_t* tokens, const float* dout, float* dtoken_table,
                                  float* dposition_table, std::int64_t n, std::int64_t T, std::int64_t C,
                                  std::int64_t start, std::int64_t stop) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::embedding_slice_backward(tokens, dout, dtoken_table, dposition_table, n, T, C, start, stop,
                                                current_stream());
    }
    void attention_forward(Device where, const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                           std::int64_t H, std::int64_t D) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_forward(qkv, out, lse, B, T, H, D, current_stream());
    }
    void attention_backward(Device where, const float* qkv, const float* out, const float* dout, const float* lse,
                            float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_backward(qkv, out, dout, lse, dqkv, B, T, H, D, current_stream());
    }
    void attention_forward_bf16_inputs(Device where, const float* qkv, float* out, float* lse, std::int64_t B,
                                       std::int64_t T, std::int64_t H, std::int64_t D) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_forward_bf16_inputs(qkv, out, lse, B, T, H, D, current_stream());
    }
    void attention_backward_bf16_inputs(Device where, const float* qkv, const float* out, const float* dout,
                                        const float* lse, float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                                        std::int64_t D) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_backward_bf16_inputs(qkv, out, dout, lse, dqkv, B, T, H, D, current_stream(),
                                                      &scratch(where));
    }
    [[nodiscard]] float cross_entropy_forward(Device where, const float* logits, const std::int32_t* targets,
                                              float* logsumexp, std::int64_t rows, std::int64_t V) override {
        loom::detail::CudaDeviceScope scope(where.index);
        return kernels::cuda::cross_entropy_forward(logits, targets, logsumexp, rows, V, current_stream());
    }
    void cross_entropy_backward(Device where, const float* logits, const std::int32_t* targets, const float* logsumexp,
                                float dloss, float* dlogits, std::int64_t rows, std::int64_t V) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::cross_entropy_backward(logits, targets, logsumexp, dloss, dlogits, rows, V, current_stream());
    }
    void attention_block_forward(Device where, const float* q, std::int64_t ld_q, const float* k, const float* v,
                                 std::int64_t ld_kv, float* out, float* lse, std::int64_t B, std::int64_t Tq,
                                 std::int64_t Tk, std::int64_t H, std::int64_t D,
                                 kernels::host::BlockMask mask) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_block_forward(q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask,
                                               current_stream());
    }
    void attention_merge(Device where, float* out, float* lse, const float* out_b, const float* lse_b, std::int64_t B,
                         std::int64_t Tq, std::int64_t H, std::int64_t D) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_merge(out, lse, out_b, lse_b, B, Tq, H, D, current_stream());
    }
    void attention_block_backward(Device where, const float* q, std::int64_t ld_q, const float* k, const float* v,
                                  std::int64_t ld_kv, const float* out, const float* dout, const float* lse, float* dq,
                                  float* dk, float* dv, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                                  std::int64_t H, std::int64_t D, kernels::host::BlockMask mask) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_block_backward(q, ld_q, k, v, ld_kv, out, dout, lse, dq, dk, dv, B, Tq, Tk, H, D,
                                                mask, current_stream());
    }
    void attention_block_forward_bf16_inputs(Device where, const float* q, std::int64_t ld_q, const float* k,
                                             const float* v, std::int64_t ld_kv, float* out, float* lse,
                                             std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H,
                                             std::int64_t D, kernels::host::BlockMask mask) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_block_forward_bf16_inputs(q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask,
                                                           current_stream());
    }
    void attention_block_backward_bf16_inputs(Device where, const float* q, std::int64_t ld_q, const float* k,
                                              const float* v, std::int64_t ld_kv, const float* out,
                                              const float* dout, const float* lse, float* dq, float* dk, float* dv,
                                              std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H,
                                              std::int64_t D, kernels::host::BlockMask mask) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::attention_block_backward_bf16_inputs(q, ld_q, k, v, ld_kv, out, dout, lse, dq, dk, dv, B, Tq,
                                                            Tk, H, D, mask, current_stream());
    }
    void cross_entropy_slice_max(Device where, const float* logits, const std::int32_t* targets, float* row_max,
                                 std::int64_t rows, std::int64_t V, std::int64_t classes) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::cross_entropy_slice_max(logits, targets, row_max, rows, V, classes, current_stream());
    }
    void cross_entropy_slice_sums(Device where, const float* logits, const std::int32_t* targets, const float* row_max,
                                  float* sums, std::int64_t rows, std::int64_t V, std::int64_t start) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::cross_entropy_slice_sums(logits, targets, row_max, sums, rows, V, start, current_stream());
    }
    void cross_entropy_slice_backward(Device where, const float* logits, const std::int32_t* targets,
                                      const float* logsumexp, float dloss, float* dlogits, std::int64_t rows,
                                      std::int64_t V, std::int64_t start, std::int64_t classes) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::cross_entropy_slice_backward(logits, targets, logsumexp, dloss, dlogits, rows, V, start, classes,
                                                    current_stream());
    }
    void pack_cast(Device where, kernels::host::Cast to, const float* x, std::int64_t n,
                   std::uint32_t* words) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::pack_cast(to, x, n, words, nullptr, current_stream());
    }
    void unpack_cast(Device where, kernels::host::Cast from, const std::uint32_t* words, std::int64_t n, float* out,
                     float weight, bool add) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::unpack_cast(from, words, n, out, weight, add, current_stream());
    }
    void layernorm_grid_row_sums(Device where, const float* x, float* sums, std::int64_t rows,
                                 std::int64_t C) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::layernorm_grid_row_sums(x, sums, rows, C, current_stream());
    }
    void layernorm_grid_centered_squares(Device where, const float* x, float* mean, float* squares, std::int64_t rows,
                                         std::int64_t C, float inverse_C) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::layernorm_grid_centered_squares(x, mean, squares, rows, C, inverse_C, current_stream());
    }
    void layernorm_grid_normalize(Device where, const float* x, const float* gain, const float* shift,
                                  const float* mean, float* rstd, float* y, std::int64_t rows, std::int64_t C,
                                  float inverse_C, float eps) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::layernorm_grid_normalize(x, gain, shift, mean, rstd, y, rows, C, inverse_C, eps,
                                                current_stream());
    }
    void layernorm_grid_backward_sums(Device where, const float* dy, const float* x, const float* gain,
                                      const float* mean, const float* rstd, float* sums, std::int64_t rows,
                                      std::int64_t C) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::layernorm_grid_backward_sums(dy, x, gain, mean, rstd, sums, rows, C, current_stream());
    }
    void layernorm_grid_backward_apply(Device where, const float* dy, const float* x, const float* gain,
                                       const float* mean, const float* rstd, const float* sums, float* dx,
                                       std::int64_t rows, std::int64_t C, float inverse_C) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::layernorm_grid_backward_apply(dy, x, gain, mean, rstd, sums, dx, rows, C, inverse_C,
                                                     current_stream());
    }
    void pack_chunk(Device where, const kernels::ChunkEncoding& e, const float* x, std::int64_t n,
                    std::uint32_t* words, float* residual) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::pack_chunk(e, x, n, words, residual, scratch(where), current_stream());
    }
    void unpack_chunk(Device where, const kernels::ChunkEncoding& e, const std::uint32_t* words, std::int64_t n,
                      float* out, float weight, bool add) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::unpack_chunk(e, words, n, out, weight, add, current_stream());
    }
    void subtract(Device where, float* into, const float* x, std::int64_t n) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::subtract(into, x, n, current_stream());
    }
    void orthonormalize_columns(Device where, float* p, std::int64_t rows, std::int64_t cols) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::orthonormalize_columns(p, rows, cols, current_stream());
    }
    void mix_momentum(Device where, float* grad, const float* m, std::int64_t n, float beta1) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::mix_momentum(grad, m, n, beta1, current_stream());
    }
    void unmix_momentum(Device where, float* grad, const float* m, std::int64_t n, float beta1) override {
        loom::detail::CudaDeviceScope scope(where.index);
        kernels::cuda::unmix_momentum(grad, m, n, beta1, current_stream());
    }
    void adamw_update(Device where, float* params, const float* grads, float* m, float* v, std::int64_t n,
                      const optim::detail::AdamWScalars& scalars) override {
        loom::detail::CudaDeviceScope scope(where.index);
        optim::cuda::adamw_update(params, grads, m, v, n, scalars, current_stream());
    }

private:
    // Launchers' reusable memory (top-k's sort, a bf16 GEMM's rounded
    // operands), per calling thread (rank threads work at once) and device:
    // a thread makes one call at a time, so one scratch serves all of its
    // calls. Freed in stream order when the thread ends.
    [[nodiscard]] static kernels::cuda::StreamScratch& scratch(Device where) {
        thread_local std::map<int, kernels::cuda::StreamScratch> scratch;
        return scratch[where.index];
    }
};

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
[[nodiscard]] inline CudaKernels& device_kernels() {
    static CudaKernels instance;
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
    install_backend<kernels::DeviceKernels>(DeviceKind::cuda, &device_kernels());
    install_backend<comm::DeviceRankRunner>(DeviceKind::cuda, &rank_runner());
    return true;
}

// An inline variable: initialised once per program, before main, in whichever
// translation unit that includes this header the linker keeps.
inline const bool installed = install();

}  // namespace loom::cuda_backend
