// Block kernels for ring attention (sequence parallelism): the sequence is cut
// into chunks held by different ranks; each rank attends its query chunk to the
// key/value chunks that pass it around the ring and folds each partial result
// into a running one with the log-sum-exp rule, so that no rank ever holds the
// whole sequence. The three pieces:
//   attention_block_forward   one (query block, key block) pair, normalised
//                             over that key block alone, with its lse;
//   attention_merge           folds a block's (out, lse) into the running pair;
//   attention_block_backward  one pair's gradients, added into dq, dk and dv,
//                             from the queries' final (merged) out and lse.
// Merged over every key block a query sees, the result equals attention_forward
// on the whole sequence to float rounding (parallel equals serial): the block
// kernels are attention.hpp's FlashAttention-2 tiles (same sgemm calls, same
// exp), only with the causal mask chosen per block and separate q / kv strides.
// Nothing is allocated: scratch is attention.hpp's stack tiles. Their
// MatmulPrecision::bf16 forms are attention_blocks_bf16.hpp.
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>

#include "loom/core/error.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/gemm_threads.hpp"

namespace loom::kernels::host {

// How a query block sees a key block.
enum class BlockMask : std::uint8_t {
    full,    // every query sees every key (a key chunk earlier in the sequence, or non-causal attention)
    causal,  // the same positions (Tq == Tk): query i sees keys 0..i
};

namespace attention_block_detail {

// Every size is >= 1: a block of nothing is a caller's bookkeeping error (an
// empty key chunk would leave lse = -inf and out = 0/0), not a no-op to skip.
inline void check_size(const char* who, const char* what, std::int64_t value) {
    LOOM_CHECK(value >= 1, who, ": ", what, " = ", value, " must be >= 1");
}

inline void check_non_null(const char* who, const char* name, const void* pointer, const char* all) {
    LOOM_CHECK(pointer != nullptr, who, ": ", name, " is null (", all, " must all be non-null)");
}

// B, H, D >= 1 and the out/lse layouts; lse indexes are (b * H + h) * Tq + t.
inline void check_heads(const char* who, std::int64_t B, std::int64_t Tq, std::int64_t H, std::int64_t D) {
    check_size(who, "batch size B", B);
    check_size(who, "query block length Tq", Tq);
    check_size(who, "head count H", H);
    check_size(who, "head size D", D);
    // out rows are H*D floats apart; the BLAS takes int leading dimensions.
    LOOM_CHECK(H <= INT_MAX / D, who, ": row width H*D = ", H, "*", D, " exceeds the BLAS's int range (at most ",
               INT_MAX, ")");
}

// What the forward and backward share: sizes, the mask against them, and the
// strides of q and of k/v (at least a row of H heads, at most an int for the BLAS).
inline void check_block(const char* who, std::int64_t ld_q, std::int64_t ld_kv, std::int64_t B, std::int64_t Tq,
                        std::int64_t Tk, std::int64_t H, std::int64_t D, BlockMask mask) {
    check_heads(who, B, Tq, H, D);
    check_size(who, "key block length Tk", Tk);
    LOOM_CHECK(mask == BlockMask::full || mask == BlockMask::causal, who, ": mask = ", static_cast<int>(mask),
               " is neither BlockMask::full (0) nor BlockMask::causal (1)");
    LOOM_CHECK(mask != BlockMask::causal || Tq == Tk, who,
               ": BlockMask::causal needs Tq == Tk (the same positions), got Tq = ", Tq, ", Tk = ", Tk,
               "; use BlockMask::full for a key block before the queries");
    LOOM_CHECK(ld_q >= H * D && ld_q <= INT_MAX, who, ": ld_q = ", ld_q, " must be in [H*D = ", H * D, ", ", INT_MAX,
               "]");
    LOOM_CHECK(ld_kv >= H * D && ld_kv <= INT_MAX, who, ": ld_kv = ", ld_kv, " must be in [H*D = ", H * D, ", ",
               INT_MAX, "]");
}

// Runs `head(in, offset_out, offset_lse)` for every sequence b and head h: in
// points at head h of sequence b's q, k and v; out/dout offsets (b * Tq * C +
// h * D) and lse offsets ((b * H + h) * Tq) follow the contiguous layouts.
// Each head writes only its own columns and lse rows, so a rank with GEMM
// threads runs ranges of heads side by side (gemm_threads.hpp), each range
// worth at least 64 K multiply-adds so that a page of a few keys stays on
// one thread.
template <class Head>
void for_each_head(const float* q, std::int64_t ld_q, const float* k, const float* v, std::int64_t ld_kv,
                   std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H, std::int64_t D, Head&& head) {
    const std::int64_t head_macs = std::max<std::int64_t>(1, Tq * Tk * D);
    run_in_ranges(B * H, [&](std::int64_t first, std::int64_t end) {
        for (std::int64_t bh = first; bh < end; ++bh) {
            const std::int64_t b = bh / H, h = bh % H;
            const std::int64_t q_at = b * Tq * ld_q + h * D;
            const std::int64_t kv_at = b * Tk * ld_kv + h * D;
            const attention_detail::HeadQkv in{q + q_at, k + kv_at, v + kv_at, ld_q, ld_kv};
            head(in, q_at, kv_at, b * Tq * H * D + h * D, bh * Tq);
        }
    }, std::max<std::int64_t>(1, (std::int64_t{1} << 16) / head_macs));
}

// The checks of attention_block_forward (and its bf16 form).
inline void check_forward(const float* q, std::int64_t ld_q, const float* k, const float* v, std::int64_t ld_kv,
                          const float* out, const float* lse, std::int64_t B, std::int64_t Tq, std::int64_t Tk,
                          std::int64_t H, std::int64_t D, BlockMask mask) {
    constexpr const char* who = "attention_block_forward";
    constexpr const char* all = "q, k, v, out and lse";
    check_block(who, ld_q, ld_kv, B, Tq, Tk, H, D, mask);
    check_non_null(who, "q", q, all);
    check_non_null(who, "k", k, all);
    check_non_null(who, "v", v, all);
    check_non_null(who, "out", out, all);
    check_non_null(who, "lse", lse, all);
}

// The checks of attention_block_backward (and its bf16 form).
inline void check_backward(const float* q, std::int64_t ld_q, const float* k, const float* v, std::int64_t ld_kv,
                           const float* out, const float* dout, const float* lse, const float* dq, const float* dk,
                           const float* dv, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H,
                           std::int64_t D, BlockMask mask) {
    constexpr const char* who = "attention_block_backward";
    constexpr const char* all = "q, k, v, out, dout, lse, dq, dk and dv";
    check_block(who, ld_q, ld_kv, B, Tq, Tk, H, D, mask);
    check_non_null(who, "q", q, all);
    check_non_null(who, "k", k, all);
    check_non_null(who, "v", v, all);
    check_non_null(who, "out", out, all);
    check_non_null(who, "dout", dout, all);
    check_non_null(who, "lse", lse, all);
    check_non_null(who, "dq", dq, all);
    check_non_null(who, "dk", dk, all);
    check_non_null(who, "dv", dv, all);
}

// The forward's heads, after the checks. With `round_products`
// (MatmulPrecision::bf16) q, k and v arrive rounded to bf16, at the strides
// given (kernels/host/attention_blocks_bf16.hpp).
inline void forward_blocks(const float* q, std::int64_t ld_q, const float* k, const float* v, std::int64_t ld_kv,
                           float* out, float* lse, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H,
                           std::int64_t D, BlockMask mask, bool round_products) {
    const float scale = attention_scale(D);
    const std::int64_t C = H * D;
    for_each_head(q, ld_q, k, v, ld_kv, B, Tq, Tk, H, D,
                  [&](const attention_detail::HeadQkv& in, std::int64_t, std::int64_t, std::int64_t out_at,
                      std::int64_t lse_at) {
                      if (mask == BlockMask::causal)
                          attention_detail::forward_head<true>(in, out + out_at, C, lse + lse_at, Tq, Tk, D, scale,
                                                               round_products);
                      else
                          attention_detail::forward_head<false>(in, out + out_at, C, lse + lse_at, Tq, Tk, D, scale,
                                                                round_products);
                  });
}

// The backward's heads, after the checks. `dout_rounded`: null for f32; for
// bf16, dout rounded (contiguous, like dout), and q, k, v arrive rounded.
inline void backward_blocks(const float* q, std::int64_t ld_q, const float* k, const float* v, std::int64_t ld_kv,
                            const float* out, const float* dout, const float* dout_rounded, const float* lse, float* dq,
                            float* dk, float* dv, std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t H,
                            std::int64_t D, BlockMask mask) {
    const float scale = attention_scale(D);
    const std::int64_t C = H * D;
    for_each_head(q, ld_q, k, v, ld_kv, B, Tq, Tk, H, D,
                  [&](const attention_detail::HeadQkv& in, std::int64_t q_at, std::int64_t kv_at, std::int64_t out_at,
                      std::int64_t lse_at) {
                      const attention_detail::HeadGrad grad{dq + q_at, dk + kv_at, dv + kv_at};
                      const float* rounded = dout_rounded == nullptr ? nullptr : dout_rounded + out_at;
                      if (mask == BlockMask::causal)
                          attention_detail::backward_head<true>(in, out + out_at, dout + out_at, C, lse + lse_at, grad,
                                                                Tq, Tk, D, scale, /*accumulate=*/true, rounded);
                      else
                          attention_detail::backward_head<false>(in, out + out_at, dout + out_at, C, lse + lse_at,
                                                                 grad, Tq, Tk, D, scale, /*accumulate=*/true, rounded);
                  });
}

}  // namespace attention_block_detail

// Attention of a query block against one key block, for every sequence b < B and head h < H (D = head size,
// scale 1/sqrt(D)). q: row t of sequence b at q + (b*Tq + t)*ld_q, head h at column h*D; k, v likewise with
// Tk rows and stride ld_kv. Writes out [B, Tq, H*D] (contiguous, normalised over this key block alone) and
// lse [B, H, Tq] (log-sum-exp of the scaled scores this block saw). out and lse must not overlap the inputs.
inline void attention_block_forward(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                    std::int64_t ld_kv, float* out, float* lse, std::int64_t B, std::int64_t Tq,
                                    std::int64_t Tk, std::int64_t H, std::int64_t D, BlockMask mask) {
    attention_block_detail::check_forward(q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask);
    attention_block_detail::forward_blocks(q, ld_q, k, v, ld_kv, out, lse, B, Tq, Tk, H, D, mask,
                                           /*round_products=*/false);
}

// Folds a block's (out_b, lse_b) into the running (out, lse) (same layouts as above), in f32 and stable:
// lse' = m + log(e^(lse - m) + e^(lse_b - m)), m = max(lse, lse_b); out = out e^(lse - lse') + out_b e^(lse_b - lse').
// A running lse of -infinity (nothing seen yet) takes the block as is.
//
// Written with d = -|lse - lse_b| <= 0: lse' = m + log1p(e^d), and the weights
// are 1 / (1 + e^d) for the larger lse and e^d / (1 + e^d) for the smaller, so
// no exponential can overflow and the sum of the weights is 1 to rounding. The
// formula is symmetric in its two sides, so merge(a, b) and merge(b, a) give the
// same bits; merging many blocks in another order differs by rounding only. A
// NaN in either lse makes that row NaN. out_b and lse_b may not overlap out, lse.
inline void attention_merge(float* out, float* lse, const float* out_b, const float* lse_b, std::int64_t B,
                            std::int64_t Tq, std::int64_t H, std::int64_t D) {
    namespace detail = attention_block_detail;
    constexpr const char* who = "attention_merge";
    constexpr const char* all = "out, lse, out_b and lse_b";
    detail::check_heads(who, B, Tq, H, D);
    detail::check_non_null(who, "out", out, all);
    detail::check_non_null(who, "lse", lse, all);
    detail::check_non_null(who, "out_b", out_b, all);
    detail::check_non_null(who, "lse_b", lse_b, all);
    const std::int64_t C = H * D;
    constexpr float minus_infinity = -std::numeric_limits<float>::infinity();
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < Tq; ++t)
            for (std::int64_t h = 0; h < H; ++h) {
                float* running = lse + (b * H + h) * Tq + t;
                const float block = lse_b[(b * H + h) * Tq + t];
                float* row = out + (b * Tq + t) * C + h * D;
                const float* row_b = out_b + (b * Tq + t) * C + h * D;
                if (*running == minus_infinity) {
                    // Nothing seen yet: out may hold anything (0 * NaN would stay NaN), so copy.
                    std::copy(row_b, row_b + D, row);
                    *running = block;
                    continue;
                }
                const float e = std::exp(-std::abs(*running - block));
                const float larger = std::max(*running, block);
                const float w_larger = 1.0f / (1.0f + e);
                const float w_smaller = e * w_larger;
                const bool running_larger = *running >= block;
                const float w_running = running_larger ? w_larger : w_smaller;
                const float w_block = running_larger ? w_smaller : w_larger;
                for (std::int64_t d = 0; d < D; ++d) row[d] = row[d] * w_running + row_b[d] * w_block;
                // max(NaN, x) may drop the NaN; the log1p of a NaN e keeps it.
                *running = larger + std::log1p(e);
            }
}

// The gradients of one (query block, key block) pair, ADDED into dq (layout of q, stride ld_q) and dk, dv
// (layout of k and v, stride ld_kv), from the queries' final out, dout ([B, Tq, H*D]) and lse ([B, H, Tq]),
// i.e. merged over all key blocks (FlashAttention-2 backward: D_i = rowsum(dO_i * O_i); P = exp(scale q k^T - lse);
// dV += P^T dO; dS = P * (dO V^T - D_i); dQ += scale dS K; dK += scale dS^T Q).
// Adding lets a rank sum a chunk's gradients over the blocks it meets (its dq
// over every key block, a travelling dk/dv over every query block). dq, dk and
// dv must not overlap the inputs or each other's written columns; columns past
// H*D of a row are left alone.
inline void attention_block_backward(const float* q, std::int64_t ld_q, const float* k, const float* v,
                                     std::int64_t ld_kv, const float* out, const float* dout, const float* lse,
                                     float* dq, float* dk, float* dv, std::int64_t B, std::int64_t Tq,
                                     std::int64_t Tk, std::int64_t H, std::int64_t D, BlockMask mask) {
    attention_block_detail::check_backward(q, ld_q, k, v, ld_kv, out, dout, lse, dq, dk, dv, B, Tq, Tk, H, D, mask);
    attention_block_detail::backward_blocks(q, ld_q, k, v, ld_kv, out, dout, /*dout_rounded=*/nullptr, lse, dq, dk,
                                            dv, B, Tq, Tk, H, D, mask);
}

}  // namespace loom::kernels::host
