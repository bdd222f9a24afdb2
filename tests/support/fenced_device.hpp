// FencedDevice: a stand-in for a GPU on a machine without one, installed as
// the DeviceRuntime and DeviceKernels of DeviceKind::cuda for a test's scope.
// Its memory is host memory, but the pointers it hands out are fenced: bit 62
// is flipped, which makes them non-canonical x86-64 addresses, so any code
// that reads or writes "device" memory directly on the host crashes at once
// instead of passing. Its kernels unfence their pointers and run the host
// kernels, so results must equal the host's bit for bit. A layer, context,
// arena or trainer that runs on this device therefore goes through the
// runtime and the kernel table for everything, as it must on a real GPU.
// Test code only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "loom/core/buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/kernels/chunk_encoding.hpp"
#include "loom/kernels/device_kernels.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/attention_bf16.hpp"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/attention_blocks_bf16.hpp"
#include "loom/kernels/host/cross_entropy.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/embedding.hpp"
#include "loom/kernels/host/gelu.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "loom/kernels/host/layernorm.hpp"
#include "loom/kernels/host/layernorm_grid.hpp"
#include "loom/kernels/host/low_rank.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/optim/adamw.hpp"

namespace loom_test {

inline constexpr std::uintptr_t fence_bit = std::uintptr_t{1} << 62;

template <class T>
T* fence(T* p) {
    return p == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) ^ fence_bit);
}
template <class T>
T* unfence(T* p) {
    return fence(p);  // the flip is its own inverse
}

class FencedDevice final : public loom::DeviceRuntime, public loom::kernels::DeviceKernels {
public:
    FencedDevice()
        : runtime_scope_(loom::DeviceKind::cuda, static_cast<loom::DeviceRuntime*>(this)),
          kernels_scope_(loom::DeviceKind::cuda, static_cast<loom::kernels::DeviceKernels*>(this)) {}

    // Calls made, by name: a test can check that work went through the table.
    // Rank threads share the device, so the counts are behind a lock.
    [[nodiscard]] int calls(const std::string& name) const {
        const std::lock_guard lock(mutex_);
        const auto it = counts_.find(name);
        return it == counts_.end() ? 0 : it->second;
    }

    void check_usable(int index) const override {
        LOOM_CHECK(index == 0, "cuda:", index, " does not exist: the fenced test device has cuda:0 only");
    }
    int device_count() const override { return 1; }
    std::string describe(int) const override { return "fenced test device"; }
    void* allocate(std::size_t bytes, loom::Device where) override {
        return fence(loom::Allocator<loom::Host>::allocate(bytes, where));
    }
    void deallocate(void* p, std::size_t bytes, loom::Device where) noexcept override {
        if (p == nullptr) return;
        loom::Allocator<loom::Host>::deallocate(unfence(p), bytes, where);
    }
    void copy(void* to, loom::Device to_device, const void* from, loom::Device from_device,
              std::size_t bytes) override {
        count("copy");
        void* t = to_device.kind == loom::DeviceKind::host ? to : unfence(to);
        const void* f = from_device.kind == loom::DeviceKind::host ? from : unfence(from);
        std::memmove(t, f, bytes);
    }
    void fill_zero(void* p, loom::Device, std::size_t bytes) override { std::memset(unfence(p), 0, bytes); }
    void fill_floats(float* p, loom::Device, float value, std::int64_t n) override {
        count("fill_floats");
        std::fill_n(unfence(p), n, value);
    }
    void copy_rows(void* to, std::size_t to_pitch, loom::Device to_device, const void* from, std::size_t from_pitch,
                   loom::Device from_device, std::size_t width, std::size_t rows) override {
        count("copy_rows");
        auto* t = static_cast<char*>(to_device.kind == loom::DeviceKind::host ? to : unfence(to));
        const auto* f = static_cast<const char*>(from_device.kind == loom::DeviceKind::host ? from : unfence(from));
        for (std::size_t r = 0; r < rows; ++r) std::memmove(t + r * to_pitch, f + r * from_pitch, width);
    }
    void synchronize(loom::Device) override { count("synchronize"); }

    void gemm(loom::Device, loom::kernels::Trans ta, loom::kernels::Trans tb, std::int64_t M, std::int64_t N,
              std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
              float beta, float* C, std::int64_t ldc) override {
        count("gemm");
        loom::kernels::host::gemm(ta, tb, M, N, K, alpha, unfence(A), lda, unfence(B), ldb, beta, unfence(C), ldc);
    }
    void gemm_bf16_inputs(loom::Device, loom::kernels::Trans ta, loom::kernels::Trans tb, std::int64_t M,
                          std::int64_t N, std::int64_t K, float alpha, const float* A, std::int64_t lda,
                          const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) override {
        count("gemm_bf16_inputs");
        loom::kernels::host::gemm_bf16_inputs(ta, tb, M, N, K, alpha, unfence(A), lda, unfence(B), ldb, beta,
                                              unfence(C), ldc);
    }
    void repeat_rows(loom::Device, const float* row, float* y, std::int64_t rows, std::int64_t n) override {
        count("repeat_rows");
        for (std::int64_t r = 0; r < rows; ++r) std::memcpy(unfence(y) + r * n, unfence(row), sizeof(float) * n);
    }
    void add(loom::Device, const float* a, const float* b, float* out, std::int64_t n) override {
        count("add");
        loom::kernels::host::add(unfence(a), unfence(b), unfence(out), n);
    }
    void accumulate(loom::Device, float* into, const float* x, std::int64_t n) override {
        count("accumulate");
        loom::kernels::host::accumulate(unfence(into), unfence(x), n);
    }
    void add_bias(loom::Device, float* y, const float* bias, std::int64_t rows, std::int64_t n) override {
        count("add_bias");
        loom::kernels::host::add_bias(unfence(y), unfence(bias), rows, n);
    }
    void bias_grad(loom::Device, const float* dy, float* dbias, std::int64_t rows, std::int64_t n) override {
        count("bias_grad");
        loom::kernels::host::bias_grad(unfence(dy), unfence(dbias), rows, n);
    }
    void gelu_forward(loom::Device, const float* x, float* y, std::int64_t n) override {
        count("gelu_forward");
        loom::kernels::host::gelu_forward(unfence(x), unfence(y), n);
    }
    void gelu_backward(loom::Device, const float* x, const float* dy, float* dx, std::int64_t n) override {
        count("gelu_backward");
        loom::kernels::host::gelu_backward(unfence(x), unfence(dy), unfence(dx), n);
    }
    void layernorm_forward(loom::Device, const float* x, const float* gain, const float* shift, float* y, float* mean,
                           float* rstd, std::int64_t rows, std::int64_t C, float eps) override {
        count("layernorm_forward");
        loom::kernels::host::layernorm_forward(unfence(x), unfence(gain), unfence(shift), unfence(y), unfence(mean),
                                               unfence(rstd), rows, C, eps);
    }
    void layernorm_backward_input(loom::Device, const float* dy, const float* x, const float* gain, const float* mean,
                                  const float* rstd, float* dx, std::int64_t rows, std::int64_t C) override {
        count("layernorm_backward_input");
        loom::kernels::host::layernorm_backward_input(unfence(dy), unfence(x), unfence(gain), unfence(mean),
                                                      unfence(rstd), unfence(dx), rows, C);
    }
    void layernorm_backward_weight(loom::Device, const float* dy, const float* x, const float* mean,
                                   const float* rstd, float* dgain, float* dshift, std::int64_t rows,
                                   std::int64_t C) override {
        count("layernorm_backward_weight");
        loom::kernels::host::layernorm_backward_weight(unfence(dy), unfence(x), unfence(mean), unfence(rstd),
                                                       unfence(dgain), unfence(dshift), rows, C);
    }
    void embedding_forward(loom::Device, const std::int32_t* tokens, const float* token_table,
                           const float* position_table, float* out, std::int64_t B, std::int64_t T, std::int64_t C,
                           std::int64_t vocab) override {
        count("embedding_forward");
        loom::kernels::host::embedding_forward(unfence(tokens), unfence(token_table), unfence(position_table),
                                               unfence(out), B, T, C, vocab);
    }
    void embedding_backward(loom::Device, const std::int32_t* tokens, const float* dout, float* dtoken_table,
                            float* dposition_table, std::int64_t B, std::int64_t T, std::int64_t C) override {
        count("embedding_backward");
        loom::kernels::host::embedding_backward(unfence(tokens), unfence(dout), unfence(dtoken_table),
                                                unfence(dposition_table), B, T, C);
    }
    void embedding_slice_lookup(loom::Device, const std::int32_t* tokens, const float* token_table, float* out,
                                std::int64_t n, std::int64_t T, std::int64_t C, std::int64_t start, std::int64_t stop,
                                std::int64_t whole_vocab) override {
        count("embedding_slice_lookup");
        loom::kernels::host::embedding_slice_lookup(unfence(tokens), unfence(token_table), unfence(out), n, T, C, start,
                                                    stop, whole_vocab);
    }
    void embedding_slice_backward(loom::Device, const std::int32_t* tokens, const float* dout, float* dtoken_table,
                                  float* dposition_table, std::int64_t n, std::int64_t T, std::int64_t C,
                                  std::int64_t start, std::int64_t stop) override {
        count("embedding_slice_backward");
        loom::kernels::host::embedding_slice_backward(unfence(tokens), unfence(dout), unfence(dtoken_table),
                                                      unfence(dposition_table), n, T, C, start, stop);
    }
    void attention_forward(loom::Device, const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                           std::int64_t H, std::int64_t D) override {
        count("attention_forward");
        loom::kernels::host::attention_forward(unfence(qkv), unfence(out), unfence(lse), B, T, H, D);
    }
    void attention_backward(loom::Device, const float* qkv, const float* out, const float* dout, const float* lse,
                            float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) override {
        count("attention_backward");
        loom::kernels::host::attention_backward(unfence(qkv), unfence(out), unfence(dout), unfence(lse), unfence(dqkv),
                                                B, T, H, D);
    }
    void attention_forward_bf16_inputs(loom::Device, const float* qkv, float* out, float* lse, std::int64_t B,
                                       std::int64_t T, std::int64_t H, std::int64_t D) override {
        count("attention_forward_bf16_inputs");
        loom::kernels::host::attention_forward_bf16_inputs(unfence(qkv), unfence(out), unfence(lse), B, T, H, D);
    }
    void attention_backward_bf16_inputs(loom::Device, const float* qkv, const float* out, const float* dout,
                                        const float* lse, float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                                        std::int64_t D) override {
        count("attention_backward_bf16_inputs");
        loom::kernels::host::attention_backward_bf16_inputs(unfence(qkv), unfence(out), unfence(dout), unfence(lse),
                                                            unfence(dqkv), B, T, H, D);
    }
    void attention_block_forward(loom::Device, const float* q, std::int64_t ld_q, const float* k, const float* v,
                                 std::int64_t ld_kv, float* out, float* lse, std::int64_t B, std::int64_t Tq,
                                 std::int64_t Tk, std::int64_t H, std::int64_t D,
                                 loom::kernels::host::BlockMask mask) override {
        count("attention_block_forward");
        loom::kernels::host::attention_block_forward(unfence(q), ld_q, unfence(k), unfence(v), ld_kv, unfence(out),
                                                     unfence(lse), B, Tq, Tk, H, D, mask);
    }
    void attention_merge(loom::Device, float* out, float* lse, const float* out_b, const float* lse_b, std::int64_t B,
                         std::int64_t Tq, std::int64_t H, std::int64_t D) override {
        count("attention_merge");
        loom::kernels::host::attention_merge(unfence(out), unfence(lse), unfence(out_b), unfence(lse_b), B, Tq, H, D);
    }
    void attention_block_backward(loom::Device, const float* q, std::int64_t ld_q, const float* k, const float* v,
                                  std::int64_t ld_kv, const float* out, const float* dout, const float* lse, float* dq,
                                  float* dk, float* dv, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                                  std::int64_t H, std::int64_t D, loom::kernels::host::BlockMask mask) override {
        count("attention_block_backward");
        loom::kernels::host::attention_block_backward(unfence(q), ld_q, unfence(k), unfence(v), ld_kv, unfence(out),
                                                      unfence(dout), unfence(lse), unfence(dq), unfence(dk),
                                                      unfence(dv), B, Tq, Tk, H, D, mask);
    }
    void attention_block_forward_bf16_inputs(loom::Device, const float* q, std::int64_t ld_q, const float* k,
                                             const float* v, std::int64_t ld_kv, float* out, float* lse,
                                             std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H,
                                             std::int64_t D, loom::kernels::host::BlockMask mask) override {
        count("attention_block_forward_bf16_inputs");
        loom::kernels::host::attention_block_forward_bf16_inputs(unfence(q), ld_q, unfence(k), unfence(v), ld_kv,
                                                                 unfence(out), unfence(lse), B, Tq, Tk, H, D, mask);
    }
    void attention_block_backward_bf16_inputs(loom::Device, const float* q, std::int64_t ld_q, const float* k,
                                              const float* v, std::int64_t ld_kv, const float* out,
                                              const float* dout, const float* lse, float* dq, float* dk, float* dv,
                                              std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H,
                                              std::int64_t D, loom::kernels::host::BlockMask mask) override {
        count("attention_block_backward_bf16_inputs");
        loom::kernels::host::attention_block_backward_bf16_inputs(unfence(q), ld_q, unfence(k), unfence(v), ld_kv,
                                                                  unfence(out), unfence(dout), unfence(lse),
                                                                  unfence(dq), unfence(dk), unfence(dv), B, Tq, Tk, H,
                                                                  D, mask);
    }
    float cross_entropy_forward(loom::Device, const float* logits, const std::int32_t* targets, float* logsumexp,
                                std::int64_t rows, std::int64_t V) override {
        count("cross_entropy_forward");
        return loom::kernels::host::cross_entropy_forward(unfence(logits), unfence(targets), unfence(logsumexp), rows,
                                                          V);
    }
    void cross_entropy_backward(loom::Device, const float* logits, const std::int32_t* targets, const float* logsumexp,
                                float dloss, float* dlogits, std::int64_t rows, std::int64_t V) override {
        count("cross_entropy_backward");
        loom::kernels::host::cross_entropy_backward(unfence(logits), unfence(targets), unfence(logsumexp), dloss,
                                                    unfence(dlogits), rows, V);
    }
    void cross_entropy_slice_max(loom::Device, const float* logits, const std::int32_t* targets, float* row_max,
                                 std::int64_t rows, std::int64_t V, std::int64_t classes) override {
        count("cross_entropy_slice_max");
        loom::kernels::host::cross_entropy_slice_max(unfence(logits), unfence(targets), unfence(row_max), rows, V,
                                                     classes);
    }
    void cross_entropy_slice_sums(loom::Device, const float* logits, const std::int32_t* targets, const float* row_max,
                                  float* sums, std::int64_t rows, std::int64_t V, std::int64_t start) override {
        count("cross_entropy_slice_sums");
        loom::kernels::host::cross_entropy_slice_sums(unfence(logits), unfence(targets), unfence(row_max),
                                                      unfence(sums), rows, V, start);
    }
    void cross_entropy_slice_backward(loom::Device, const float* logits, const std::int32_t* targets,
                                      const float* logsumexp, float dloss, float* dlogits, std::int64_t rows,
                                      std::int64_t V, std::int64_t start, std::int64_t classes) override {
        count("cross_entropy_slice_backward");
        loom::kernels::host::cross_entropy_slice_backward(unfence(logits), unfence(targets), unfence(logsumexp), dloss,
                                                          unfence(dlogits), rows, V, start, classes);
    }
    void pack_cast(loom::Device, loom::kernels::host::Cast to, const float* x, std::int64_t n,
                   std::uint32_t* words) override {
        count("pack_cast");
        loom::kernels::host::pack_cast(to, unfence(x), n, unfence(words));
    }
    void unpack_cast(loom::Device, loom::kernels::host::Cast from, const std::uint32_t* words, std::int64_t n,
                     float* out, float weight, bool add) override {
        count("unpack_cast");
        loom::kernels::host::unpack_cast(from, unfence(words), n, unfence(out), weight, add);
    }
    void layernorm_grid_row_sums(loom::Device, const float* x, float* sums, std::int64_t rows,
                                 std::int64_t C) override {
        count("layernorm_grid_row_sums");
        loom::kernels::host::layernorm_grid_row_sums(unfence(x), unfence(sums), rows, C);
    }
    void layernorm_grid_centered_squares(loom::Device, const float* x, float* mean, float* squares, std::int64_t rows,
                                         std::int64_t C, float inverse_C) override {
        count("layernorm_grid_centered_squares");
        loom::kernels::host::layernorm_grid_centered_squares(unfence(x), unfence(mean), unfence(squares), rows, C,
                                                             inverse_C);
    }
    void layernorm_grid_normalize(loom::Device, const float* x, const float* gain, const float* shift,
                                  const float* mean, float* rstd, float* y, std::int64_t rows, std::int64_t C,
                                  float inverse_C, float eps) override {
        count("layernorm_grid_normalize");
        loom::kernels::host::layernorm_grid_normalize(unfence(x), unfence(gain), unfence(shift), unfence(mean),
                                                      unfence(rstd), unfence(y), rows, C, inverse_C, eps);
    }
    void layernorm_grid_backward_sums(loom::Device, const float* dy, const float* x, const float* gain,
                                      const float* mean, const float* rstd, float* sums, std::int64_t rows,
                                      std::int64_t C) override {
        count("layernorm_grid_backward_sums");
        loom::kernels::host::layernorm_grid_backward_sums(unfence(dy), unfence(x), unfence(gain), unfence(mean),
                                                          unfence(rstd), unfence(sums), rows, C);
    }
    void layernorm_grid_backward_apply(loom::Device, const float* dy, const float* x, const float* gain,
                                       const float* mean, const float* rstd, const float* sums, float* dx,
                                       std::int64_t rows, std::int64_t C, float inverse_C) override {
        count("layernorm_grid_backward_apply");
        loom::kernels::host::layernorm_grid_backward_apply(unfence(dy), unfence(x), unfence(gain), unfence(mean),
                                                           unfence(rstd), unfence(sums), unfence(dx), rows, C,
                                                           inverse_C);
    }
    void pack_chunk(loom::Device, const loom::kernels::ChunkEncoding& e, const float* x, std::int64_t n,
                    std::uint32_t* words, float* residual) override {
        count("pack_chunk");
        thread_local std::vector<std::int32_t> scratch;  // rank threads pack at once
        loom::kernels::host::pack_chunk(e, unfence(x), n, unfence(words), unfence(residual), scratch);
    }
    void unpack_chunk(loom::Device, const loom::kernels::ChunkEncoding& e, const std::uint32_t* words, std::int64_t n,
                      float* out, float weight, bool add) override {
        count("unpack_chunk");
        loom::kernels::host::unpack_chunk(e, unfence(words), n, unfence(out), weight, add);
    }
    void subtract(loom::Device, float* into, const float* x, std::int64_t n) override {
        count("subtract");
        loom::kernels::host::subtract(unfence(into), unfence(x), n);
    }
    void orthonormalize_columns(loom::Device, float* p, std::int64_t rows, std::int64_t cols) override {
        count("orthonormalize_columns");
        loom::kernels::host::orthonormalize_columns(unfence(p), rows, cols);
    }
    void mix_momentum(loom::Device, float* grad, const float* m, std::int64_t n, float beta1) override {
        count("mix_momentum");
        loom::kernels::host::mix_momentum(unfence(grad), unfence(m), n, beta1);
    }
    void unmix_momentum(loom::Device, float* grad, const float* m, std::int64_t n, float beta1) override {
        count("unmix_momentum");
        loom::kernels::host::unmix_momentum(unfence(grad), unfence(m), n, beta1);
    }
    void adamw_update(loom::Device, float* params, const float* grads, float* m, float* v, std::int64_t n,
                      const loom::optim::detail::AdamWScalars& scalars) override {
        count("adamw_update");
        loom::optim::detail::adamw_update(unfence(params), unfence(grads), unfence(m), unfence(v),
                                          static_cast<std::size_t>(n), scalars);
    }

private:
    void count(const char* name) {
        const std::lock_guard lock(mutex_);
        ++counts_[name];
    }

    mutable std::mutex mutex_;
    std::map<std::string, int> counts_;
    loom::BackendScope<loom::DeviceRuntime> runtime_scope_;
    loom::BackendScope<loom::kernels::DeviceKernels> kernels_scope_;
};

}  // namespace loom_test
