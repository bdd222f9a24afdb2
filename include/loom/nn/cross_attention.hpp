// CrossAttention: GliDe's draft sub-layer (Du et al. 2024, arXiv 2402.02082),
// attention whose keys and values are not its own. It has only a query and
// an output projection; the keys and values are another model's (the
// target's cached ones, already computed, never trained here), attached to
// the Context before each forward (attach()). Input and output are [B, T, C]
// (the draft's width); the memory is [B, S, M] keys and values (the
// target's width M, split into the target's heads), and q = x Wq^T projects
// C -> M, the output M -> C.
//
// The stale-block mask: a query at position t sees memory positions s with
// floor(s / b) < floor(t / b) -- a prefix of the memory, the first
// floor(t / b) * b positions. In training (b = 5, GliDe's) the draft sees the
// target's keys as speculative decoding will: the target's cache is up to
// one speculation block old. stale_block = 0 is no mask (inference: every
// position the memory holds). A query that sees no key gives a zero output
// (the projection's bias alone).
//
// The host loops are per (batch, head, query) with an online softmax's two
// passes: forward out and lse, backward dq from them (the memory has no
// gradient). Memory positions per query are few (a training sequence), so
// no tiling.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/tensor_cut.hpp"

namespace loom::nn {

// Keys and values a CrossAttention reads: row (b, s) of the keys at
// keys + b * batch_stride + s * row_stride, its value at the same offset from
// `values`; `width` floats each (all heads). A view: the owner keeps them alive.
struct CrossMemory {
    const float* keys = nullptr;
    const float* values = nullptr;
    std::int64_t width = 0;
    std::int64_t row_stride = 0;
    std::int64_t batch_stride = 0;
    std::int64_t batch = 0;
    std::int64_t length = 0;  // positions per sequence

    // The keys and values packed in a CausalSelfAttention's qkv [B, S, 3M]
    // (its saved forward): k in columns [M, 2M), v in [2M, 3M).
    [[nodiscard]] static CrossMemory of_qkv(const Tensor& qkv) {
        LOOM_CHECK(qkv.rank() == 3 && qkv.dim(2) % 3 == 0 && qkv.dim(2) > 0, "CrossMemory: qkv of shape ",
                   qkv.shape(), " is not [batch, sequence, 3 x width]");
        LOOM_CHECK(qkv.device().kind == DeviceKind::host, "CrossMemory: qkv lives on ", qkv.device(),
                   "; cross-attention runs on the host");
        const std::int64_t M = qkv.dim(2) / 3;
        const float* base = qkv.data<float>();
        return {base + M, base + 2 * M, M, 3 * M, qkv.dim(1) * 3 * M, qkv.dim(0), qkv.dim(1)};
    }
};

// Memory positions a query at `position` sees: the stale-block prefix, or all of them (stale_block 0).
[[nodiscard]] constexpr std::int64_t visible_memory(std::int64_t position, std::int64_t length,
                                                    std::int64_t stale_block) noexcept {
    if (stale_block == 0) return length;
    return std::min(length, position / stale_block * stale_block);
}

// ALiBi's slope for head h of H (Press et al. 2022): 2^(-8 (h + 1) / H). A
// query at position t scores memory position s lower by slope * (t - s).
[[nodiscard]] inline float recency_slope(std::int64_t h, std::int64_t H) {
    return std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(H));
}

// One query row of all heads against the first `count` memory rows of one
// sequence: out (M floats) and lse (one per head, natural log; -inf and a
// zero output where count is 0). `scores` is scratch. With `position` >= 0
// (the query's position), each head's scores carry the recency bias.
inline void cross_attend_row(const float* q, const float* keys, const float* values, std::int64_t row_stride,
                             std::int64_t count, std::int64_t H, std::int64_t D, float* out, float* lse,
                             std::vector<float>& scores, std::int64_t position = -1) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    scores.resize(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)));
    for (std::int64_t h = 0; h < H; ++h) {
        float* o = out + h * D;
        std::fill(o, o + D, 0.0f);
        if (count == 0) {
            lse[h] = -std::numeric_limits<float>::infinity();
            continue;
        }
        float best = -std::numeric_limits<float>::infinity();
        const float slope = position >= 0 ? recency_slope(h, H) : 0.0f;
        for (std::int64_t s = 0; s < count; ++s) {
            const float* k = keys + s * row_stride + h * D;
            float dot = 0;
            for (std::int64_t d = 0; d < D; ++d) dot += q[h * D + d] * k[d];
            const float score = dot * scale - (position >= 0 ? slope * static_cast<float>(position - s) : 0.0f);
            scores[static_cast<std::size_t>(s)] = score;
            best = std::max(best, score);
        }
        float sum = 0;
        for (std::int64_t s = 0; s < count; ++s) {
            const float p = std::exp(scores[static_cast<std::size_t>(s)] - best);
            sum += p;
            const float* v = values + s * row_stride + h * D;
            for (std::int64_t d = 0; d < D; ++d) o[d] += p * v[d];
        }
        for (std::int64_t d = 0; d < D; ++d) o[d] /= sum;
        lse[h] = best + std::log(sum);
    }
}

struct CrossAttention {
    // Its tensor-parallel cut: none (it runs whole; the memory is whole).
    static constexpr TensorCut tensor_cut = TensorCut::replicated;
    Linear query;  // C -> M
    Linear proj;   // M -> C
    std::int64_t heads = 1;        // the memory's heads
    std::int64_t stale_block = 5;  // 0: no mask
    bool recency = false;          // ALiBi's recency bias on the scores (recency_slope)

    // `width` C is the input's (the draft's), `memory_width` M and `heads` the memory's (the target's).
    [[nodiscard]] static CrossAttention make(std::int64_t width, std::int64_t memory_width, std::int64_t heads,
                                             std::int64_t stale_block = 5, float std = 0.02f,
                                             float residual_std = 0.02f) {
        LOOM_CHECK(heads >= 1 && memory_width % heads == 0, "CrossAttention: the memory's width ", memory_width,
                   " does not split into ", heads, " heads; use a divisor of it");
        LOOM_CHECK(stale_block >= 0, "CrossAttention: stale_block = ", stale_block,
                   "; give the block size of the stale mask (5 in GliDe), or 0 for no mask");
        return CrossAttention{Linear::make(width, memory_width, Init::normal(std)),
                              Linear::make(memory_width, width, Init::normal(residual_std)), heads, stale_block};
    }

    [[nodiscard]] std::int64_t width() const { return query.in(); }
    [[nodiscard]] std::int64_t memory_width() const { return query.out(); }
    [[nodiscard]] std::int64_t head_dim() const { return memory_width() / heads; }

    struct Attached {
        CrossMemory memory;
        bool set = false;
    };
    struct Saved {
        Tensor q, out, lse;
    };

    // The memory the next forward (and its backward) reads in this context.
    void attach(Context& ctx, const CrossMemory& memory) const {
        LOOM_CHECK(memory.keys != nullptr && memory.values != nullptr, "CrossAttention: attaching a memory with no ",
                   "keys or values");
        LOOM_CHECK(memory.width == memory_width(), "CrossAttention: the memory is ", memory.width,
                   " wide but the layer's query projects to ", memory_width(),
                   "; attach the keys and values of the model it was built for");
        LOOM_CHECK(memory.batch >= 1 && memory.length >= 0, "CrossAttention: a memory of ", memory.batch,
                   " sequences of ", memory.length, " positions; give at least one sequence");
        ctx.saved<Attached>(this) = {memory, true};
    }

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& x) {
        LOOM_CHECK(x.rank() == 3 && x.dim(2) == width(), "CrossAttention: input of shape ", x.shape(),
                   " is not [batch, sequence, ", width(), "]");
        LOOM_CHECK(x.device().kind == DeviceKind::host, "CrossAttention: input on ", x.device(),
                   "; cross-attention runs on the host");
        const Attached& attached = ctx.saved<Attached>(this);
        LOOM_CHECK(attached.set, "CrossAttention: no memory attached in this context; call attach(ctx, memory) "
                   "with the target's keys and values before the forward");
        const CrossMemory& m = attached.memory;
        const std::int64_t B = x.dim(0), T = x.dim(1), H = heads, D = head_dim(), M = memory_width();
        LOOM_CHECK(m.batch == B, "CrossAttention: the memory holds ", m.batch, " sequences but the input has ", B,
                   "; attach the keys and values of the same batch");
        auto& saved = ctx.saved<Saved>(this);
        saved.q = query.forward(ctx, x);
        saved.out = ctx.alloc(Shape{B, T, M});
        saved.lse = ctx.alloc(Shape{B, T, H});
        std::vector<float> scores;
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < T; ++t) {
                const std::int64_t row = b * T + t;
                cross_attend_row(saved.q.data<float>() + row * M, m.keys + b * m.batch_stride,
                                 m.values + b * m.batch_stride, m.row_stride, visible_memory(t, m.length, stale_block),
                                 H, D, saved.out.data<float>() + row * M, saved.lse.data<float>() + row * H, scores,
                                 recency ? t : -1);
            }
        return proj.forward(ctx, saved.out);
    }

    // dq from dout: with p_s = exp(q.k_s * scale - lse) and
    // delta = dout . out, ds = p_s (dout . v_s - delta), dq = scale sum_s ds k_s.
    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        const Tensor dout = proj.backward_input(ctx, dy);
        const auto& saved = ctx.saved<Saved>(this);
        const CrossMemory& m = ctx.saved<Attached>(this).memory;
        const std::int64_t B = saved.q.dim(0), T = saved.q.dim(1), H = heads, D = head_dim(), M = memory_width();
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        Tensor dq = ctx.alloc(saved.q.shape());
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < T; ++t) {
                const std::int64_t row = b * T + t, count = visible_memory(t, m.length, stale_block);
                const float* q = saved.q.data<float>() + row * M;
                const float* out = saved.out.data<float>() + row * M;
                const float* g = dout.data<float>() + row * M;
                float* dqr = dq.data<float>() + row * M;
                std::fill(dqr, dqr + M, 0.0f);
                for (std::int64_t h = 0; h < H; ++h) {
                    if (count == 0) continue;
                    const float lse = saved.lse.data<float>()[row * H + h];
                    const float slope = recency ? recency_slope(h, H) : 0.0f;
                    float delta = 0;
                    for (std::int64_t d = 0; d < D; ++d) delta += g[h * D + d] * out[h * D + d];
                    for (std::int64_t s = 0; s < count; ++s) {
                        const float* k = m.keys + b * m.batch_stride + s * m.row_stride + h * D;
                        const float* v = m.values + b * m.batch_stride + s * m.row_stride + h * D;
                        float dot = 0, dp = 0;
                        for (std::int64_t d = 0; d < D; ++d) {
                            dot += q[h * D + d] * k[d];
                            dp += g[h * D + d] * v[d];
                        }
                        const float bias = recency ? slope * static_cast<float>(t - s) : 0.0f;
                        const float ds = std::exp(dot * scale - bias - lse) * (dp - delta) * scale;
                        for (std::int64_t d = 0; d < D; ++d) dqr[h * D + d] += ds * k[d];
                    }
                }
            }
        return query.backward_input(ctx, dq);
    }

    void backward_weight(Context& ctx) {
        proj.backward_weight(ctx);
        query.backward_weight(ctx);
    }
};

}  // namespace loom::nn
