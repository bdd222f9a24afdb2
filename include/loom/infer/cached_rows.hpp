// The pieces a cached forward runs over its packed rows (infer/cached_gpt.hpp,
// infer/cached_glide.hpp, infer/cached_kraken.hpp): the embeddings and the
// layers' own f32 host kernels on raw row buffers the engine keeps, so a
// decode step allocates nothing, and the
// attention of new rows over a slot's cached pages. One copy for every engine:
// the target and its GliDe draft must compute a shared layer the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/infer/engine.hpp"
#include "loom/infer/few_rows_linear.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/tree_attention.hpp"
#include "loom/kernels/attention_block_ops.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layernorm.hpp"

namespace loom::infer {

// n floats of host memory as a 1-D tensor (a view: nothing is copied).
[[nodiscard]] inline Tensor host_rows(const float* data, std::int64_t n) { return Tensor::of(data, Shape{n}); }

// out [rows, C] = token row + position row (nn::Embedding's sum) for the
// segments' packed tokens, each segment at its slot's next positions
// (starts[i] on); a tree's node at starts[i] + its depth. depths: scratch.
inline void embed_rows(const nn::Embedding& embed, std::span<const Segment> segments,
                       std::span<const std::int64_t> starts, std::vector<std::int64_t>& depths, float* out) {
    const std::int64_t C = embed.width();
    const float* token = embed.token.value.data<float>();
    const float* position = embed.position.value.data<float>();
    std::int64_t row = 0;
    for (std::size_t i = 0; i < segments.size(); ++i) {
        const Segment& s = segments[i];
        if (!s.parents.empty()) tree_depths(s.parents, depths);
        for (std::size_t t = 0; t < s.tokens.size(); ++t, ++row) {
            const float* a = token + static_cast<std::int64_t>(s.tokens[t]) * C;
            const std::int64_t offset = s.parents.empty() ? static_cast<std::int64_t>(t) : depths[t];
            const float* b = position + (starts[i] + offset) * C;
            float* y = out + row * C;
            for (std::int64_t c = 0; c < C; ++c) y[c] = a[c] + b[c];
        }
    }
}

// nn::LayerNorm's forward over `rows` rows; mean and rstd: `rows` floats of scratch.
inline void layernorm_rows(const nn::LayerNorm& norm, const float* in, float* out, std::int64_t rows, float* mean,
                           float* rstd) {
    const std::int64_t C = norm.features();
    kernels::layernorm_forward(host_rows(in, rows * C), norm.gain.value, norm.shift.value, host_rows(out, rows * C),
                               host_rows(mean, rows), host_rows(rstd, rows), rows, C, norm.eps);
}

// out [rows, n] = in [rows, k] w^T (+ bias): nn::Linear's forward at f32, with w
// [n, k] row-major and bias [n] or null. A decode step's or a verification's
// few rows run as blocks of dot products (infer/few_rows_linear.hpp): packing
// the weights for the GEMM would cost as much as the product.
inline void matmul_rows(const float* in, const float* w, const float* bias, float* out, std::int64_t rows,
                        std::int64_t k, std::int64_t n) {
    if (rows <= few_rows()) {
        few_rows_linear(in, w, bias, out, rows, k, n);
        return;
    }
    using kernels::Trans;
    const Tensor x = host_rows(in, rows * k), y = host_rows(out, rows * n), weight = host_rows(w, n * k);
    if (bias != nullptr)
        kernels::gemm_bias(kernels::MatmulPrecision::f32, Trans::no, Trans::yes, rows, n, k, x, k, weight, k,
                           host_rows(bias, n), y);
    else
        kernels::gemm(Trans::no, Trans::yes, rows, n, k, 1.0f, x, k, weight, k, 0.0f, y, n);
}

// x += branch (nn::Residual's add, in place: the skip connection's sum).
inline void add_rows(float* x, const float* branch, std::int64_t n) {
    const Tensor t = host_rows(x, n);
    kernels::add(t, host_rows(branch, n), t);
}

// Keeps the keys and values of `count` new rows of one slot, positions [start,
// start + count) of `layer`: row t's K and V are the 2 * width floats at
// kv + t * ld (a qkv row's last two thirds).
inline void cache_keys_values(KvCache& cache, std::int64_t layer, std::int64_t slot, std::int64_t start,
                              std::int64_t count, const float* kv, std::int64_t ld) {
    const auto floats = static_cast<std::size_t>(cache.row_stride());
    for (std::int64_t t = 0; t < count; ++t)
        std::memcpy(cache.row(layer, slot, start + t), kv + t * ld, floats * sizeof(float));
}

// Folds every cached position before `start` of `slot` in `layer` into the
// attention of `count` query rows (q, row stride ld_q; H heads of D), page by
// page, each page in full, merged into out and lse by log-sum-exp (ring
// attention's rule); scratch_out and scratch_lse hold one page's result.
inline void attend_cached_pages(KvCache& cache, std::int64_t layer, std::int64_t slot, std::int64_t start,
                                const float* q, std::int64_t ld_q, std::int64_t count, std::int64_t H, std::int64_t D,
                                float* out, float* lse, float* scratch_out, float* scratch_lse) {
    using kernels::BlockMask;
    const std::int64_t C = H * D, ld_kv = cache.row_stride(), size = cache.block_size();
    const std::span<const std::int32_t> table = cache.block_table(slot);
    for (std::int64_t b = 0; b * size < start; ++b) {
        const float* kv = cache.block_rows(layer, table[static_cast<std::size_t>(b)]);
        const std::int64_t keys = std::min(size, start - b * size);
        kernels::attention_block_forward(host_device, q, ld_q, kv, kv + C, ld_kv, scratch_out, scratch_lse, 1, count,
                                         keys, H, D, BlockMask::full);
        kernels::attention_merge(host_device, out, lse, scratch_out, scratch_lse, 1, count, H, D);
    }
}

}  // namespace loom::infer
