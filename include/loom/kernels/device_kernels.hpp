// DeviceKernels: the math a layer needs, on a device chosen at run time. The
// interface mirrors kernels/host/ (same arguments, device pointers, f32);
// loom/cuda_backend.cuh implements it over kernels/cuda/ and registers it
// with the device runtime. Every call runs in the calling thread's order of
// work on the device (for CUDA: the thread's current stream), so a rank
// thread's layers, copies and collectives stay ordered without waits.
// Layers do not call this directly: kernels/ops.hpp takes Tensors, checks
// they share a device and sends host tensors to kernels/host/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/core/device.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/chunk_encoding.hpp"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/kernels/trans.hpp"

namespace loom::optim::detail {
struct AdamWScalars;  // optim/adamw.hpp: one step's constants
}  // namespace loom::optim::detail

namespace loom::kernels {

class DeviceKernels {
public:
    virtual ~DeviceKernels() = default;

    // C[M, N] = alpha op(A) op(B) + beta C, row-major (kernels/host/gemm.hpp).
    virtual void gemm(Device where, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                      const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                      std::int64_t ldc) = 0;
    // The same at MatmulPrecision::bf16: op(A) and op(B) rounded to bf16,
    // products accumulated in f32, C f32 (kernels/host/gemm.hpp's
    // gemm_bf16_inputs, which this equals up to the order of the sums).
    virtual void gemm_bf16_inputs(Device where, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                                  float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                                  float beta, float* C, std::int64_t ldc) = 0;
    // y[r, :] = row for r < rows (a bias before an accumulating GEMM).
    virtual void repeat_rows(Device where, const float* row, float* y, std::int64_t rows, std::int64_t n) = 0;
    // C[M, N] = alpha op(A) op(B) + bias on every row (bias[N]; C written, not
    // read), at f32 or with bf16_inputs as gemm_bf16_inputs. By default the
    // host's order, the bias rows and then an accumulating product; a backend
    // may add the bias in the product's pass instead (CUDA: cuBLASLt's bias
    // epilogue), which equals it up to the order of the sums.
    virtual void gemm_bias(Device where, bool bf16_inputs, Trans ta, Trans tb, std::int64_t M, std::int64_t N,
                           std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
                           std::int64_t ldb, const float* bias, float* C, std::int64_t ldc) {
        LOOM_CHECK(ldc == N, "gemm_bias: ldc = ", ldc, " but the bias rows are written contiguously; pass ldc = N = ",
                   N);
        repeat_rows(where, bias, C, M, N);
        if (bf16_inputs)
            gemm_bf16_inputs(where, ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc);
        else
            gemm(where, ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc);
    }
    virtual void add(Device where, const float* a, const float* b, float* out, std::int64_t n) = 0;
    virtual void accumulate(Device where, float* into, const float* x, std::int64_t n) = 0;
    virtual void add_bias(Device where, float* y, const float* bias, std::int64_t rows, std::int64_t n) = 0;
    virtual void bias_grad(Device where, const float* dy, float* dbias, std::int64_t rows, std::int64_t n) = 0;

    virtual void gelu_forward(Device where, const float* x, float* y, std::int64_t n) = 0;
    virtual void gelu_backward(Device where, const float* x, const float* dy, float* dx, std::int64_t n) = 0;

    virtual void layernorm_forward(Device where, const float* x, const float* gain, const float* shift, float* y,
                                   float* mean, float* rstd, std::int64_t rows, std::int64_t C, float eps) = 0;
    virtual void layernorm_backward_input(Device where, const float* dy, const float* x, const float* gain,
                                          const float* mean, const float* rstd, float* dx, std::int64_t rows,
                                          std::int64_t C) = 0;
    virtual void layernorm_backward_weight(Device where, const float* dy, const float* x, const float* mean,
                                           const float* rstd, float* dgain, float* dshift, std::int64_t rows,
                                           std::int64_t C) = 0;

    // LayerNorm on an Optimus 2D grid, between its all-reduces over the grid
    // row (kernels/host/layernorm_grid.hpp).
    virtual void layernorm_grid_row_sums(Device where, const float* x, float* sums, std::int64_t rows,
                                         std::int64_t C) = 0;
    virtual void layernorm_grid_centered_squares(Device where, const float* x, float* mean, float* squares,
                                                 std::int64_t rows, std::int64_t C, float inverse_C) = 0;
    virtual void layernorm_grid_normalize(Device where, const float* x, const float* gain, const float* shift,
                                          const float* mean, float* rstd, float* y, std::int64_t rows, std::int64_t C,
                                          float inverse_C, float eps) = 0;
    virtual void layernorm_grid_backward_sums(Device where, const float* dy, const float* x, const float* gain,
                                              const float* mean, const float* rstd, float* sums, std::int64_t rows,
                                              std::int64_t C) = 0;
    virtual void layernorm_grid_backward_apply(Device where, const float* dy, const float* x, const float* gain,
                                               const float* mean, const float* rstd, const float* sums, float* dx,
                                               std::int64_t rows, std::int64_t C, float inverse_C) = 0;

    virtual void embedding_forward(Device where, const std::int32_t* tokens, const float* token_table,
                                   const float* position_table, float* out, std::int64_t B, std::int64_t T,
                                   std::int64_t C, std::int64_t vocab) = 0;
    virtual void embedding_backward(Device where, const std::int32_t* tokens, const float* dout, float* dtoken_table,
                                    float* dposition_table, std::int64_t B, std::int64_t T, std::int64_t C) = 0;

    // Vocabulary-parallel embedding (kernels/host/embedding.hpp): n tokens in
    // sequences of T, this table holding ids [start, stop).
    virtual void embedding_slice_lookup(Device where, const std::int32_t* tokens, const float* token_table, float* out,
                                        std::int64_t n, std::int64_t T, std::int64_t C, std::int64_t start,
                                        std::int64_t stop, std::int64_t whole_vocab) = 0;
    virtual void embedding_slice_backward(Device where, const std::int32_t* tokens, const float* dout,
                                          float* dtoken_table, float* dposition_table, std::int64_t n, std::int64_t T,
                                          std::int64_t C, std::int64_t start, std::int64_t stop) = 0;

    virtual void attention_forward(Device where, const float* qkv, float* out, float* lse, std::int64_t B,
                                   std::int64_t T, std::int64_t H, std::int64_t D) = 0;
    virtual void attention_backward(Device where, const float* qkv, const float* out, const float* dout,
                                    const float* lse, float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                                    std::int64_t D) = 0;
    // The same at MatmulPrecision::bf16 (kernels/host/attention_bf16.hpp,
    // which these equal up to the order of the sums): bf16 operands on the
    // tensor cores, f32 softmax, f32 out, lse and dqkv.
    virtual void attention_forward_bf16_inputs(Device where, const float* qkv, float* out, float* lse, std::int64_t B,
                                               std::int64_t T, std::int64_t H, std::int64_t D) = 0;
    virtual void attention_backward_bf16_inputs(Device where, const float* qkv, const float* out, const float* dout,
                                                const float* lse, float* dqkv, std::int64_t B, std::int64_t T,
                                                std::int64_t H, std::int64_t D) = 0;

    // Sequence parallelism's block attention (kernels/host/attention_blocks.hpp).
    virtual void attention_block_forward(Device where, const float* q, std::int64_t ld_q, const float* k,
                                         const float* v, std::int64_t ld_kv, float* out, float* lse, std::int64_t B,
                                         std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D,
                                         host::BlockMask mask) = 0;
    virtual void attention_merge(Device where, float* out, float* lse, const float* out_b, const float* lse_b,
                                 std::int64_t B, std::int64_t Tq, std::int64_t H, std::int64_t D) = 0;
    virtual void attention_block_backward(Device where, const float* q, std::int64_t ld_q, const float* k,
                                          const float* v, std::int64_t ld_kv, const float* out, const float* dout,
                                          const float* lse, float* dq, float* dk, float* dv, std::int64_t B,
                                          std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D,
                                          host::BlockMask mask) = 0;
    // The forward and backward at MatmulPrecision::bf16
    // (kernels/host/attention_blocks_bf16.hpp, which these equal up to the
    // order of the sums).
    virtual void attention_block_forward_bf16_inputs(Device where, const float* q, std::int64_t ld_q, const float* k,
                                                     const float* v, std::int64_t ld_kv, float* out, float* lse,
                                                     std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H,
                                                     std::int64_t D, host::BlockMask mask) = 0;
    virtual void attention_block_backward_bf16_inputs(Device where, const float* q, std::int64_t ld_q, const float* k,
                                                      const float* v, std::int64_t ld_kv, const float* out,
                                                      const float* dout, const float* lse, float* dq, float* dk,
                                                      float* dv, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                                                      std::int64_t H, std::int64_t D, host::BlockMask mask) = 0;

    // Returns the mean loss (waits for the device).
    [[nodiscard]] virtual float cross_entropy_forward(Device where, const float* logits, const std::int32_t* targets,
                                                      float* logsumexp, std::int64_t rows, std::int64_t V) = 0;
    virtual void cross_entropy_backward(Device where, const float* logits, const std::int32_t* targets,
                                        const float* logsumexp, float dloss, float* dlogits, std::int64_t rows,
                                        std::int64_t V) = 0;

    // Vocabulary-parallel cross-entropy (kernels/host/cross_entropy.hpp).
    virtual void cross_entropy_slice_max(Device where, const float* logits, const std::int32_t* targets,
                                         float* row_max, std::int64_t rows, std::int64_t V, std::int64_t classes) = 0;
    virtual void cross_entropy_slice_sums(Device where, const float* logits, const std::int32_t* targets,
                                          const float* row_max, float* sums, std::int64_t rows, std::int64_t V,
                                          std::int64_t start) = 0;
    virtual void cross_entropy_slice_backward(Device where, const float* logits, const std::int32_t* targets,
                                              const float* logsumexp, float dloss, float* dlogits, std::int64_t rows,
                                              std::int64_t V, std::int64_t start, std::int64_t classes) = 0;

    // 16-bit casts (kernels/host/quantize.hpp), two values a word: what
    // GradCompress<Cast, PpAxis | TpAxis> sends.
    virtual void pack_cast(Device where, host::Cast to, const float* x, std::int64_t n, std::uint32_t* words) = 0;
    virtual void unpack_cast(Device where, host::Cast from, const std::uint32_t* words, std::int64_t n, float* out,
                             float weight, bool add) = 0;

    // Data-parallel gradient compression (kernels/compression_ops.hpp): a
    // chunk into its words and back (kernels/chunk_encoding.hpp, whose host
    // functions these must equal), PowerSGD's error update and
    // orthonormalisation (kernels/host/low_rank.hpp), and 1-bit Adam's
    // momentum exchange (kernels/host/elementwise.hpp).
    virtual void pack_chunk(Device where, const ChunkEncoding& e, const float* x, std::int64_t n,
                            std::uint32_t* words, float* residual) = 0;
    virtual void unpack_chunk(Device where, const ChunkEncoding& e, const std::uint32_t* words, std::int64_t n,
                              float* out, float weight, bool add) = 0;
    virtual void subtract(Device where, float* into, const float* x, std::int64_t n) = 0;
    virtual void orthonormalize_columns(Device where, float* p, std::int64_t rows, std::int64_t cols) = 0;
    virtual void mix_momentum(Device where, float* grad, const float* m, std::int64_t n, float beta1) = 0;
    virtual void unmix_momentum(Device where, float* grad, const float* m, std::int64_t n, float beta1) = 0;

    // One AdamW step of n elements with this step's constants.
    virtual void adamw_update(Device where, float* params, const float* grads, float* m, float* v, std::int64_t n,
                              const optim::detail::AdamWScalars& scalars) = 0;
};

// The kernels of a device that is not the host; throws naming how to build
// the backend in when they are missing.
[[nodiscard]] inline DeviceKernels& device_kernels(Device where) {
    LOOM_CHECK(where.kind != DeviceKind::host, "device_kernels: ", where, " is the host; use kernels/host/");
    DeviceKernels* kernels = detail::backend_slot<DeviceKernels>(where.kind);
    LOOM_CHECK(kernels != nullptr, "tensors on ", where, " need the ", where.kind,
               " backend's kernels, which this program was built without: compile one .cu file that includes "
               "loom/cuda_backend.cuh and link loom::cuda");
    return *kernels;
}

}  // namespace loom::kernels
