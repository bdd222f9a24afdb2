// The kernels on Tensors, wherever they live: each op checks that its
// operands share one device, then runs its kernel there (kernels/
// kernel_table.hpp: kernels/host/ for host tensors, the device backend's
// entry for a device's). This is how one layer type runs on the host and on
// a GPU without being a template, and without the host core naming a CUDA
// type. Each kernel is declared once, in kernels/kernel_list.hpp.
// Sizes are the callers' (as in kernels/host/); operands are f32 unless
// named otherwise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/attention_bf16.hpp"
#include "loom/kernels/host/cross_entropy.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/embedding.hpp"
#include "loom/kernels/host/gelu.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "loom/kernels/host/layernorm.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/kernels/kernel_list.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/kernels/trans.hpp"

namespace loom::kernels {


namespace detail {

// The device every operand with elements is on; an empty operand (a missing
// bias) does not count. Throws naming the first operand that differs.
[[nodiscard]] inline Device common_device(const char* op, std::initializer_list<const Tensor*> operands) {
    const Tensor* first = nullptr;
    for (const Tensor* t : operands) {
        if (t->numel() == 0) continue;
        if (first == nullptr) first = t;
        else
            LOOM_CHECK(t->device() == first->device(), op, ": operands on ", first->device(), " and ", t->device(),
                       " (", *first, " and ", *t, "); every operand must be on one device");
    }
    return first == nullptr ? host_device : first->device();
}

template <class T>
[[nodiscard]] T* ptr(const Tensor& t) {
    return t.numel() == 0 ? nullptr : t.data<T>();
}

}  // namespace detail


inline void gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, const Tensor& A,
                 std::int64_t lda, const Tensor& B, std::int64_t ldb, float beta, const Tensor& C, std::int64_t ldc) {
    const Device d = detail::common_device("gemm", {&A, &B, &C});
    run<kernel::gemm>(d, ta, tb, M, N, K, alpha, detail::ptr<float>(A), lda, detail::ptr<float>(B), ldb, beta, detail::ptr<float>(C), ldc);
}

// The same product at a MatmulPrecision: f32 is gemm above; bf16 rounds
// op(A) and op(B) to bf16 and accumulates in f32 (kernels/matmul_precision.hpp).
inline void gemm(MatmulPrecision precision, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                 float alpha, const Tensor& A, std::int64_t lda, const Tensor& B, std::int64_t ldb, float beta,
                 const Tensor& C, std::int64_t ldc) {
    if (precision == MatmulPrecision::f32) {
        gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const Device d = detail::common_device("gemm", {&A, &B, &C});
    run<kernel::gemm_bf16_inputs>(d, ta, tb, M, N, K, alpha, detail::ptr<float>(A), lda, detail::ptr<float>(B), ldb, beta, detail::ptr<float>(C), ldc);
}

// y[r, :] = row for each of `rows` rows of n.
inline void repeat_rows(const Tensor& row, const Tensor& y, std::int64_t rows, std::int64_t n) {
    const Device d = detail::common_device("repeat_rows", {&row, &y});
    run<kernel::repeat_rows>(d, detail::ptr<float>(row), detail::ptr<float>(y), rows, n);
}

// C[M, N] = op(A) op(B) + bias[N] on every row, at a MatmulPrecision: a
// Linear's forward. On the host the bias rows first and then the product
// onto them (beta = 1); a device may add the bias in the product's own pass
// (host::gemm_bias says how), equal up to the order of the sums. C is
// contiguous (ldc = N).
inline void gemm_bias(MatmulPrecision precision, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K,
                      const Tensor& A, std::int64_t lda, const Tensor& B, std::int64_t ldb, const Tensor& bias,
                      const Tensor& C) {
    const Device d = detail::common_device("gemm_bias", {&A, &B, &bias, &C});
    LOOM_CHECK(bias.numel() == N && C.numel() == M * N && C.is_contiguous(), "gemm_bias: the bias has ", bias.numel(),
               " elements and C is ", C, "; pass N = ", N, " biases and a contiguous [", M, ", ", N, "] C");
    run<kernel::gemm_bias>(d, precision == MatmulPrecision::bf16, ta, tb, M, N, K, 1.0f, detail::ptr<float>(A), lda,
                           detail::ptr<float>(B), ldb, detail::ptr<float>(bias), detail::ptr<float>(C), N);
}

inline void add(const Tensor& a, const Tensor& b, const Tensor& out) {
    const Device d = detail::common_device("add", {&a, &b, &out});
    run<kernel::add>(d, detail::ptr<float>(a), detail::ptr<float>(b), detail::ptr<float>(out), out.numel());
}

// into += x, the first n elements.
inline void accumulate(const Tensor& into, const Tensor& x, std::int64_t n) {
    const Device d = detail::common_device("accumulate", {&into, &x});
    run<kernel::accumulate>(d, detail::ptr<float>(into), detail::ptr<float>(x), n);
}

inline void add_bias(const Tensor& y, const Tensor& bias, std::int64_t rows, std::int64_t n) {
    const Device d = detail::common_device("add_bias", {&y, &bias});
    run<kernel::add_bias>(d, detail::ptr<float>(y), detail::ptr<float>(bias), rows, n);
}

// dbias += the column sums of dy [rows, n].
inline void bias_grad(const Tensor& dy, const Tensor& dbias, std::int64_t rows, std::int64_t n) {
    const Device d = detail::common_device("bias_grad", {&dy, &dbias});
    run<kernel::bias_grad>(d, detail::ptr<float>(dy), detail::ptr<float>(dbias), rows, n);
}

inline void gelu_forward(const Tensor& x, const Tensor& y) {
    const Device d = detail::common_device("gelu_forward", {&x, &y});
    run<kernel::gelu_forward>(d, detail::ptr<float>(x), detail::ptr<float>(y), x.numel());
}

inline void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
    const Device d = detail::common_device("gelu_backward", {&x, &dy, &dx});
    run<kernel::gelu_backward>(d, detail::ptr<float>(x), detail::ptr<float>(dy), detail::ptr<float>(dx), dy.numel());
}

inline void layernorm_forward(const Tensor& x, const Tensor& gain, const Tensor& shift, const Tensor& y,
                              const Tensor& mean, const Tensor& rstd, std::int64_t rows, std::int64_t C, float eps) {
    const Device d = detail::common_device("layernorm_forward", {&x, &gain, &shift, &y, &mean, &rstd});
    run<kernel::layernorm_forward>(d, detail::ptr<float>(x), detail::ptr<float>(gain), detail::ptr<float>(shift), detail::ptr<float>(y), detail::ptr<float>(mean), detail::ptr<float>(rstd), rows, C, eps);
}

inline void layernorm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& gain, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& dx, std::int64_t rows, std::int64_t C) {
    const Device d = detail::common_device("layernorm_backward_input", {&dy, &x, &gain, &mean, &rstd, &dx});
    run<kernel::layernorm_backward_input>(d, detail::ptr<float>(dy), detail::ptr<float>(x), detail::ptr<float>(gain), detail::ptr<float>(mean), detail::ptr<float>(rstd), detail::ptr<float>(dx), rows, C);
}

// dgain and dshift are accumulated.
inline void layernorm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& dgain, const Tensor& dshift, std::int64_t rows, std::int64_t C) {
    const Device d = detail::common_device("layernorm_backward_weight", {&dy, &x, &mean, &rstd, &dgain, &dshift});
    run<kernel::layernorm_backward_weight>(d, detail::ptr<float>(dy), detail::ptr<float>(x), detail::ptr<float>(mean), detail::ptr<float>(rstd), detail::ptr<float>(dgain), detail::ptr<float>(dshift), rows, C);
}

// tokens: i32 [B, T]; out [B, T, C] written.
inline void embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                              const Tensor& out, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t vocab) {
    const Device d = detail::common_device("embedding_forward", {&tokens, &token_table, &position_table, &out});
    run<kernel::embedding_forward>(d, detail::ptr<std::int32_t>(tokens), detail::ptr<float>(token_table), detail::ptr<float>(position_table), detail::ptr<float>(out), B, T, C, vocab);
}

// The tables' gradients are accumulated.
inline void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                               const Tensor& dposition_table, std::int64_t B, std::int64_t T, std::int64_t C) {
    const Device d = detail::common_device("embedding_backward", {&tokens, &dout, &dtoken_table, &dposition_table});
    run<kernel::embedding_backward>(d, detail::ptr<std::int32_t>(tokens), detail::ptr<float>(dout), detail::ptr<float>(dtoken_table), detail::ptr<float>(dposition_table), B, T, C);
}

// Vocabulary-parallel lookup: rows of the ids in [start, stop) from this
// rank's table, zeros for the rest; every id checked against whole_vocab.
inline void embedding_slice_lookup(const Tensor& tokens, const Tensor& token_table, const Tensor& out, std::int64_t T,
                                   std::int64_t C, std::int64_t start, std::int64_t stop, std::int64_t whole_vocab) {
    const Device d = detail::common_device("embedding_slice_lookup", {&tokens, &token_table, &out});
    const std::int64_t n = tokens.numel();
    run<kernel::embedding_slice_lookup>(d, detail::ptr<std::int32_t>(tokens), detail::ptr<float>(token_table), detail::ptr<float>(out), n, T, C, start, stop, whole_vocab);
}

// Its gradients, accumulated: the slice's token rows and the whole position
// table (positions 0..T-1 of each sequence).
inline void embedding_slice_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                                     const Tensor& dposition_table, std::int64_t T, std::int64_t C, std::int64_t start,
                                     std::int64_t stop) {
    const Device d = detail::common_device("embedding_slice_backward", {&tokens, &dout, &dtoken_table, &dposition_table});
    const std::int64_t n = tokens.numel();
    run<kernel::embedding_slice_backward>(d, detail::ptr<std::int32_t>(tokens), detail::ptr<float>(dout), detail::ptr<float>(dtoken_table), detail::ptr<float>(dposition_table), n, T, C, start, stop);
}

// Causal attention over qkv [B, T, 3 H D]: out [B, T, H D] and lse [B, H, T]
// written. At MatmulPrecision::bf16 its products read bf16 operands
// (kernels/host/attention_bf16.hpp); the softmax and the outputs stay f32.
inline void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, std::int64_t B, std::int64_t T,
                              std::int64_t H, std::int64_t D, MatmulPrecision precision = MatmulPrecision::f32) {
    const Device d = detail::common_device("attention_forward", {&qkv, &out, &lse});
    const float* in = detail::ptr<float>(qkv);
    float* o = detail::ptr<float>(out);
    float* l = detail::ptr<float>(lse);
    if (precision == MatmulPrecision::bf16)
        run<kernel::attention_forward_bf16_inputs>(d, in, o, l, B, T, H, D);
    else
        run<kernel::attention_forward>(d, in, o, l, B, T, H, D);
}

inline void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse,
                               const Tensor& dqkv, std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D,
                               MatmulPrecision precision = MatmulPrecision::f32) {
    const Device d = detail::common_device("attention_backward", {&qkv, &out, &dout, &lse, &dqkv});
    const float* in = detail::ptr<float>(qkv);
    const float* o = detail::ptr<float>(out);
    const float* g = detail::ptr<float>(dout);
    const float* l = detail::ptr<float>(lse);
    float* dg = detail::ptr<float>(dqkv);
    if (precision == MatmulPrecision::bf16)
        run<kernel::attention_backward_bf16_inputs>(d, in, o, g, l, dg, B, T, H, D);
    else
        run<kernel::attention_backward>(d, in, o, g, l, dg, B, T, H, D);
}

// Returns the mean loss over rows (on a device this waits for it).
[[nodiscard]] inline float cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& logsumexp,
                                                 std::int64_t rows, std::int64_t V) {
    const Device d = detail::common_device("cross_entropy_forward", {&logits, &targets, &logsumexp});
    return run<kernel::cross_entropy_forward>(d, detail::ptr<float>(logits), detail::ptr<std::int32_t>(targets), detail::ptr<float>(logsumexp), rows, V);
}

inline void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& logsumexp, float dloss,
                                   const Tensor& dlogits, std::int64_t rows, std::int64_t V) {
    const Device d = detail::common_device("cross_entropy_backward", {&logits, &targets, &logsumexp, &dlogits});
    run<kernel::cross_entropy_backward>(d, detail::ptr<float>(logits), detail::ptr<std::int32_t>(targets), detail::ptr<float>(logsumexp), dloss, detail::ptr<float>(dlogits), rows, V);
}

// x (f32, n) as 16-bit values, two to a word of `words` (i32, cast_words(n)).
inline void pack_cast(host::Cast to, const Tensor& x, const Tensor& words) {
    const Device d = detail::common_device("pack_cast", {&x, &words});
    LOOM_CHECK(x.dtype() == DType::f32 && words.numel() >= host::cast_words(x.numel()), "pack_cast: ", x, " into ",
               words, "; f32 values need cast_words(n) words");
    auto* w = static_cast<std::uint32_t*>(words.raw());
    run<kernel::pack_cast>(d, to, detail::ptr<float>(x), x.numel(), w, nullptr);
}

// out (f32, n) = weight * the values of `words`; with `add`, out += that.
inline void unpack_cast(host::Cast from, const Tensor& words, const Tensor& out, float weight = 1.0f,
                        bool add = false) {
    const Device d = detail::common_device("unpack_cast", {&words, &out});
    LOOM_CHECK(out.dtype() == DType::f32 && words.numel() >= host::cast_words(out.numel()), "unpack_cast: ", words,
               " into ", out, "; f32 values need cast_words(n) words");
    const auto* w = static_cast<const std::uint32_t*>(words.raw());
    run<kernel::unpack_cast>(d, from, w, out.numel(), detail::ptr<float>(out), weight, add);
}

// Vocabulary-parallel cross-entropy (kernels/host/cross_entropy.hpp): logits
// [rows, V] are columns [start, start + V) of `classes`.
inline void cross_entropy_slice_max(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                                    std::int64_t rows, std::int64_t V, std::int64_t classes) {
    const Device d = detail::common_device("cross_entropy_slice_max", {&logits, &targets, &row_max});
    run<kernel::cross_entropy_slice_max>(d, detail::ptr<float>(logits), detail::ptr<std::int32_t>(targets), detail::ptr<float>(row_max), rows, V, classes);
}

inline void cross_entropy_slice_sums(const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                                     const Tensor& sums, std::int64_t rows, std::int64_t V, std::int64_t start) {
    const Device d = detail::common_device("cross_entropy_slice_sums", {&logits, &targets, &row_max, &sums});
    run<kernel::cross_entropy_slice_sums>(d, detail::ptr<float>(logits), detail::ptr<std::int32_t>(targets), detail::ptr<float>(row_max), detail::ptr<float>(sums), rows, V, start);
}

inline void cross_entropy_slice_backward(const Tensor& logits, const Tensor& targets, const Tensor& logsumexp,
                                         float dloss, const Tensor& dlogits, std::int64_t rows, std::int64_t V,
                                         std::int64_t start, std::int64_t classes) {
    const Device d = detail::common_device("cross_entropy_slice_backward", {&logits, &targets, &logsumexp, &dlogits});
    run<kernel::cross_entropy_slice_backward>(d, detail::ptr<float>(logits), detail::ptr<std::int32_t>(targets), detail::ptr<float>(logsumexp), dloss, detail::ptr<float>(dlogits), rows, V, start, classes);
}

}  // namespace loom::kernels
