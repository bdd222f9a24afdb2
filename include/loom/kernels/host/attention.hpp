// Causal multi-head self-attention on the host, FlashAttention-2 style: the
// causal triangle is tiled into blocks of queries x keys, the forward keeps a
// running max and sum per query row (online softmax) and the backward recomputes
// the probabilities from the saved log-sum-exp, so no T x T matrix ever exists.
// The block matmuls run on the host GEMM (kernels/host/gemm_dispatch.hpp:
// loom's kernels at the CPU's level, or the BLAS), which picks AVX2/AVX-512
// kernels at run time, as the baseline x86-64 (SSE2) build cannot. Measured
// on one core, forward + backward with the same tiles, sgemm against
// auto-vectorised loops for the block products: 3.8x faster at B=8 T=128 H=4
// D=64 (72 vs 19 GFLOP/s), 4.3x at B=4 T=64 H=4 D=16 (36 vs 8.4). What is left
// to plain loops is elementwise (mask, exp, running max and sum), written so
// the compiler vectorises it. Scratch lives on the stack (one 16 KiB tile in
// the forward, two in the backward), except the forward's transposed query
// block, a thread's buffer that grows once.
#pragma once

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/gemm_dispatch.hpp"
#include "loom/kernels/host/gemm_threads.hpp"

namespace loom::kernels::host {

namespace attention_detail {

// Tile sizes: 32 queries x up to 128 keys. A key tile is trimmed at the causal
// bound of its query block, so the only wasted work is the masked half of a
// 32 x 32 square on the diagonal (T = 128: 10240 scores formed for 8256 needed).
// Measured on one core (OpenBLAS Haswell kernels), forward + backward at
// B=8 T=128 H=4 D=64: 32 x 128 beats 32 x 64 by ~3%, 16 x 64 by ~3% (less
// waste, but sgemm calls half as wide) and 64 x 64 by ~12% (twice the waste);
// at B=4 T=64 H=4 D=16 all are within 2% except 64 x 64 (~13% slower).
inline constexpr std::int64_t query_block = 32;
inline constexpr std::int64_t key_block = 128;

// exp(x) as a branch-free sequence the compiler vectorises (std::exp is a libm
// call per element, which GCC does not vectorise). n = round(x / ln2), r = x - n ln2 with a two-part ln2 (Cody-Waite),
// e^r by a degree-5 minimax polynomial on |r| <= ln2 / 2 (XNNPACK's rr2-p5
// coefficients), times 2^n built in the exponent bits: within 1.9e-7 relative
// (3 ulp) of exp for every float in [-87, 88.37], checked exhaustively; the
// degree-7 Cephes polynomial gains 1.7 ulp for 4 more operations per element,
// far below what a softmax row sum keeps anyway. Below -87 the result is 0 (the
// true value is under 1.7e-38, nothing a softmax sum can see), above 88.37 it
// is +inf (2^n would need n = 128), NaN stays NaN. Out-of-range arguments are
// masked at the end with integer selects: a float clamp of x against a
// constant lets GCC split the loop into branches (it then folds the constant
// path), and a loop with branches is not vectorised.
[[nodiscard]] LOOM_KERNEL_INLINE float exp_approx(float x) {
    // Adding 1.5 * 2^23 leaves round(x / ln2) in the low mantissa bits.
    constexpr float round_shift = 12582912.0f;
    const float shifted = x * 1.44269504088896341f + round_shift;
    const float n = shifted - round_shift;
    float r = x - n * 0.693359375f;  // ln2's high part: n * it is exact
    r = r - n * -2.12194440e-4f;     // ln2's low part
    float p = 0x1.0F9F9Cp-7f;
    p = p * r + 0x1.573A1Ap-5f;
    p = p * r + 0x1.555A80p-3f;
    p = p * r + 0x1.FFFDC6p-2f;
    p = p * r + 0x1.FFFFF6p-1f;
    const float e_r = p * r + 1.0f;
    // Unsigned so that the garbage n of an out-of-range x wraps instead of overflowing.
    const std::uint32_t biased_n =
        std::bit_cast<std::uint32_t>(shifted) - std::bit_cast<std::uint32_t>(round_shift) + 127u;
    const float y = e_r * std::bit_cast<float>(biased_n << 23);
    const std::uint32_t underflow_mask = x < -87.0f ? 0u : ~0u;
    const std::uint32_t overflow_mask = x > 88.37f ? 0u : ~0u;
    const std::uint32_t infinity_bits = ~overflow_mask & 0x7F800000u;
    return std::bit_cast<float>((std::bit_cast<std::uint32_t>(y) & underflow_mask & overflow_mask) | infinity_bits);
}

// The tiles are stored transposed, one row per key and one column per query
// (S^T = K Q^T), so that every per-query quantity (running max, running sum,
// lse, D_i) is a vector along the contiguous index: the softmax becomes
// elementwise loops the compiler vectorises, with no horizontal reductions
// (a running float max or sum is a dependency chain GCC will not reorder
// without -ffast-math).

// A tile's softmax loops, whole tiles at a time so that each is one call into
// the CPU's own clone (LOOM_KERNEL_DISPATCH: 16 queries per AVX-512 vector
// instead of SSE2's 4; a 1,024-token prefill spent 10% of its time in them at
// the baseline). Row c of a tile (n_keys rows of n_queries) is key c's scores;
// the queries before clamp(first_seen + c, 0, n_queries) do not see it (the
// causal mask on the diagonal; first_seen <= -n_keys for none).

// tile_max[r] = max(tile_max[r], the scores of query r's seen keys).
LOOM_KERNEL_DISPATCH inline void tile_running_max(const float* __restrict tile, float* __restrict tile_max,
                                                  std::int64_t n_keys, std::int64_t n_queries,
                                                  std::int64_t first_seen) noexcept {
    for (std::int64_t c = 0; c < n_keys; ++c) {
        const float* __restrict row = tile + c * n_queries;
        for (std::int64_t r = std::clamp<std::int64_t>(first_seen + c, 0, n_queries); r < n_queries; ++r)
            tile_max[r] = row[r] > tile_max[r] ? row[r] : tile_max[r];
    }
}

// The tile in place: exp(score - shift[r]) where seen, 0 where masked; each
// row's values added to sum[r] unless sum is null.
LOOM_KERNEL_DISPATCH inline void tile_exp(float* __restrict tile, const float* __restrict shift,
                                          float* __restrict sum, std::int64_t n_keys, std::int64_t n_queries,
                                          std::int64_t first_seen) noexcept {
    for (std::int64_t c = 0; c < n_keys; ++c) {
        float* __restrict row = tile + c * n_queries;
        const std::int64_t begin = std::clamp<std::int64_t>(first_seen + c, 0, n_queries);
        for (std::int64_t r = 0; r < begin; ++r) row[r] = 0.0f;
        if (sum != nullptr) {
            for (std::int64_t r = begin; r < n_queries; ++r) {
                const float p = exp_approx(row[r] - shift[r]);
                row[r] = p;
                sum[r] += p;
            }
        } else {
            for (std::int64_t r = begin; r < n_queries; ++r) row[r] = exp_approx(row[r] - shift[r]);
        }
    }
}

// dS^T = P^T * (dP^T - D_r), in place over dP^T.
LOOM_KERNEL_DISPATCH inline void tile_softmax_grad(const float* __restrict probs, float* __restrict dscores,
                                                   const float* __restrict out_dot_dout, std::int64_t n_keys,
                                                   std::int64_t n_queries) noexcept {
    for (std::int64_t c = 0; c < n_keys; ++c) {
        const float* __restrict p = probs + c * n_queries;
        float* __restrict ds = dscores + c * n_queries;
        for (std::int64_t r = 0; r < n_queries; ++r) ds[r] = p[r] * (ds[r] - out_dot_dout[r]);
    }
}

// tile_running_max's and tile_exp's first_seen for the tile of keys from j0
// against queries from i0.
template <bool Causal>
[[nodiscard]] std::int64_t first_seen_offset(std::int64_t j0, std::int64_t i0, std::int64_t n_keys) {
    return Causal ? j0 - i0 : -n_keys;
}

[[nodiscard]] inline float dot(const float* a, const float* b, std::int64_t n) {
    // Eight partial sums: one running float would be a chain of dependent adds.
    constexpr int lanes = 8;
    float partial[lanes] = {};
    const std::int64_t full = n - n % lanes;
    for (std::int64_t c = 0; c < full; c += lanes)
        for (int l = 0; l < lanes; ++l) partial[l] += a[c + l] * b[c + l];
    float sum = 0.0f;
    for (std::int64_t c = full; c < n; ++c) sum += a[c] * b[c];
    for (int l = 0; l < lanes; ++l) sum += partial[l];
    return sum;
}

inline void scale_row(float* row, std::int64_t n, float factor) {
    for (std::int64_t c = 0; c < n; ++c) row[c] *= factor;
}

inline void fill_zero(float* row, std::int64_t n) {
    for (std::int64_t c = 0; c < n; ++c) row[c] = 0.0f;
}

// x[i] rounded to bf16 (to nearest, ties to even) and widened back: what a
// tile of P or dS becomes before a bf16 product reads it
// (MatmulPrecision::bf16, kernels/host/attention_bf16.hpp).
inline void round_to_bf16(float* x, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) x[i] = to_float(to_bf16(x[i]));
}

// Row-major sgemm with the three transpositions attention needs; sizes are the
// tile's, which the shape check keeps inside int (for the BLAS path).
// C[m x n] = alpha * A[m x k] * B[n x k]^T + beta * C
inline void gemm_nt(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
                    const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
    gemm_detail::dispatched_gemm(Trans::no, Trans::yes, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
// C[m x n] = alpha * A[m x k] * B[k x n] + beta * C
inline void gemm_nn(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
                    const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
    gemm_detail::dispatched_gemm(Trans::no, Trans::no, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
// C[m x n] = alpha * A[k x m]^T * B[k x n] + beta * C
inline void gemm_tn(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
                    const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
    gemm_detail::dispatched_gemm(Trans::yes, Trans::no, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// One head of one sequence: rows of q are `ld_q` floats apart, rows of k and v
// `ld_kv` (both 3C inside one qkv tensor; ring attention's key/value blocks
// arrive in their own buffers).
struct HeadQkv {
    const float* q;
    const float* k;
    const float* v;
    std::int64_t ld_q;
    std::int64_t ld_kv;
};

// Where the keys seen by the query block [i0, block_end) end: Causal means
// queries and keys are the same positions (query i sees keys 0..i), otherwise
// every query sees all Tk keys.
template <bool Causal>
[[nodiscard]] std::int64_t key_end(std::int64_t block_end, std::int64_t Tk) {
    return Causal ? block_end : Tk;
}

// Tq queries against Tk keys (Tq == Tk when Causal); out is normalised over
// these keys alone and lse is their log-sum-exp. Tk >= 1: key 0 is seen by
// every query, so every running max starts on the first key tile.
// `round_products` is MatmulPrecision::bf16: q, k and v arrive rounded to
// bf16 (the caller's copies), the running max moves in multiples of ln 2
// (bf16_softmax_shift), and each tile of P is rounded before P V reads it;
// the row sums add the unrounded P, as a tensor-core kernel's do.
template <bool Causal, std::int64_t QueryBlock = query_block, std::int64_t KeyBlock = key_block>
void forward_head(const HeadQkv& in, float* out, std::int64_t ld_out, float* lse, std::int64_t Tq, std::int64_t Tk,
                  std::int64_t D, float scale, bool round_products = false) {
    alignas(64) float tile[KeyBlock * QueryBlock];  // S^T, then P^T, of one tile
    alignas(64) float max_so_far[QueryBlock];
    alignas(64) float sum_so_far[QueryBlock];
    alignas(64) float tile_max[QueryBlock];
    // The query block transposed once (D rows of n_queries) for every key tile
    // it meets: a plain B, which a full block's GEMM reads in place (one
    // AVX-512 panel, gemm_blocked.hpp) instead of gathering the transpose of
    // Q again for each tile. The same products, so the same bits.
    thread_local std::vector<float> q_transposed;
    q_transposed.resize(static_cast<std::size_t>(D * QueryBlock));
    for (std::int64_t i0 = 0; i0 < Tq; i0 += QueryBlock) {
        const std::int64_t n_queries = std::min(QueryBlock, Tq - i0);
        // Keys at or past keys_seen are seen by no query of the block: their tiles are never formed.
        const std::int64_t keys_seen = key_end<Causal>(i0 + n_queries, Tk);
        float* out_block = out + i0 * ld_out;
        for (std::int64_t r = 0; r < n_queries; ++r)
            for (std::int64_t d = 0; d < D; ++d)
                q_transposed[static_cast<std::size_t>(d * n_queries + r)] = in.q[(i0 + r) * in.ld_q + d];
        for (std::int64_t j0 = 0; j0 < keys_seen; j0 += KeyBlock) {
            const std::int64_t n_keys = std::min(KeyBlock, keys_seen - j0);
            const bool first = j0 == 0;  // key 0 is seen by every query, so every running max starts here
            gemm_nn(n_keys, n_queries, D, scale, in.k + j0 * in.ld_kv, in.ld_kv, q_transposed.data(), n_queries, 0.0f,
                    tile, n_queries);
            const std::int64_t first_seen = first_seen_offset<Causal>(j0, i0, n_keys);
            for (std::int64_t r = 0; r < n_queries; ++r)
                tile_max[r] = first ? -std::numeric_limits<float>::infinity() : max_so_far[r];
            tile_running_max(tile, tile_max, n_keys, n_queries, first_seen);
            // bf16: a shift that moved moves to a whole multiple of ln 2 (bf16_softmax_shift).
            if (round_products)
                for (std::int64_t r = 0; r < n_queries; ++r)
                    if (first || tile_max[r] > max_so_far[r]) tile_max[r] = bf16_softmax_shift(tile_max[r]);
            // Online softmax: what earlier tiles summed against the old max is
            // moved to the new one (a factor of 1 for rows whose max held).
            if (first) {
                fill_zero(sum_so_far, n_queries);
            } else {
                for (std::int64_t r = 0; r < n_queries; ++r) {
                    const float rescale = exp_approx(max_so_far[r] - tile_max[r]);
                    sum_so_far[r] *= rescale;
                    if (rescale != 1.0f) scale_row(out_block + r * ld_out, D, rescale);
                }
            }
            tile_exp(tile, tile_max, sum_so_far, n_keys, n_queries, first_seen);
            std::copy(tile_max, tile_max + n_queries, max_so_far);
            if (round_products) round_to_bf16(tile, n_keys * n_queries);
            // out_block (+)= P V, unnormalised.
            gemm_tn(n_queries, D, n_keys, 1.0f, tile, n_queries, in.v + j0 * in.ld_kv, in.ld_kv,
                    first ? 0.0f : 1.0f, out_block, ld_out);
        }
        for (std::int64_t r = 0; r < n_queries; ++r) {
            scale_row(out_block + r * ld_out, D, 1.0f / sum_so_far[r]);
            lse[i0 + r] = max_so_far[r] + std::log(sum_so_far[r]);
        }
    }
}

// Gradients of one head; dq has the row stride of q, dk and dv that of k and v.
// Overwritten unless `accumulate`: dQ rows by their first key tile (beta = 0),
// dK and dV rows zeroed by the query block that first reaches them, just before
// use. With `accumulate` every product adds (ring attention sums the gradients
// of one chunk over the blocks it meets).
struct HeadGrad {
    float* dq;
    float* dk;
    float* dv;
};

// out, dout and lse are the queries' final ones (merged over every key block
// they see), so P = exp(S - lse) is this block's share of the whole softmax.
// `dout_rounded` (MatmulPrecision::bf16; null for f32) is dout rounded to
// bf16, with the row stride of dout, for the products; q, k and v then arrive
// rounded too, and P and dS are rounded where they are formed, before the
// products that read them. D_i and dS = P * (dP - D_i) stay f32, from the
// unrounded out, dout and P.
template <bool Causal, std::int64_t QueryBlock = query_block, std::int64_t KeyBlock = key_block>
void backward_head(const HeadQkv& in, const float* out, const float* dout, std::int64_t ld_out, const float* lse,
                   const HeadGrad& grad, std::int64_t Tq, std::int64_t Tk, std::int64_t D, float scale,
                   bool accumulate, const float* dout_rounded = nullptr) {
    const bool round_products = dout_rounded != nullptr;
    const float* dout_products = round_products ? dout_rounded : dout;
    alignas(64) float probs[KeyBlock * QueryBlock];     // P^T of one tile
    alignas(64) float dscores[KeyBlock * QueryBlock];   // dP^T, then dS^T
    alignas(64) float out_dot_dout[QueryBlock];         // FlashAttention-2's D_i = rowsum(dO_i * O_i)
    std::int64_t keys_reached = 0;  // dK and dV rows below this are written already
    for (std::int64_t i0 = 0; i0 < Tq; i0 += QueryBlock) {
        const std::int64_t n_queries = std::min(QueryBlock, Tq - i0);
        const std::int64_t keys_seen = key_end<Causal>(i0 + n_queries, Tk);
        const float* q_block = in.q + i0 * in.ld_q;
        const float* dout_block = dout_products + i0 * ld_out;
        const float* lse_block = lse + i0;
        for (std::int64_t r = 0; r < n_queries; ++r)
            out_dot_dout[r] = dot(out + (i0 + r) * ld_out, dout + (i0 + r) * ld_out, D);
        // Keys [keys_reached, keys_seen) get their first gradient from this
        // block (causal: [i0, i0 + n_queries), earlier blocks' tiles ended before i0).
        if (!accumulate)
            for (std::int64_t t = keys_reached; t < keys_seen; ++t) {
                fill_zero(grad.dk + t * in.ld_kv, D);
                fill_zero(grad.dv + t * in.ld_kv, D);
            }
        keys_reached = std::max(keys_reached, keys_seen);
        for (std::int64_t j0 = 0; j0 < keys_seen; j0 += KeyBlock) {
            const std::int64_t n_keys = std::min(KeyBlock, keys_seen - j0);
            const float* k_block = in.k + j0 * in.ld_kv;
            const float* v_block = in.v + j0 * in.ld_kv;
            // P^T = exp(scale * K Q^T - lse), zero where masked.
            gemm_nt(n_keys, n_queries, D, scale, k_block, in.ld_kv, q_block, in.ld_q, 0.0f, probs, n_queries);
            tile_exp(probs, lse_block, nullptr, n_keys, n_queries, first_seen_offset<Causal>(j0, i0, n_keys));
            // dP^T = V_j dO_i^T, then dS^T = P^T * (dP^T - D_i) in place
            // (masked entries have P = 0, so dS = 0 there).
            gemm_nt(n_keys, n_queries, D, 1.0f, v_block, in.ld_kv, dout_block, ld_out, 0.0f, dscores, n_queries);
            tile_softmax_grad(probs, dscores, out_dot_dout, n_keys, n_queries);
            if (round_products) {
                round_to_bf16(probs, n_keys * n_queries);
                round_to_bf16(dscores, n_keys * n_queries);
            }
            // dV_j += P^T dO_i (after dS, which reads the unrounded P)
            gemm_nn(n_keys, D, n_queries, 1.0f, probs, n_queries, dout_block, ld_out, 1.0f,
                    grad.dv + j0 * in.ld_kv, in.ld_kv);
            // dQ_i += scale * dS K_j;  dK_j += scale * dS^T Q_i
            gemm_tn(n_queries, D, n_keys, scale, dscores, n_queries, k_block, in.ld_kv,
                    accumulate || j0 > 0 ? 1.0f : 0.0f, grad.dq + i0 * in.ld_q, in.ld_q);
            gemm_nn(n_keys, D, n_queries, scale, dscores, n_queries, q_block, in.ld_q, 1.0f,
                    grad.dk + j0 * in.ld_kv, in.ld_kv);
        }
    }
}

// The heads of every sequence, one after another (the public functions below
// and kernels/host/attention_bf16.hpp). With `round_products`, qkv is already
// rounded to bf16.
inline void forward_heads(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T, std::int64_t H,
                          std::int64_t D, bool round_products) {
    const std::int64_t C = H * D;
    const float scale = attention_scale(D);
    // Heads are independent: a rank with GEMM threads runs them side by side.
    run_in_ranges(B * H, [&](std::int64_t first, std::int64_t end) {
        for (std::int64_t bh = first; bh < end; ++bh) {
            const std::int64_t b = bh / H, h = bh % H;
            const float* row0 = qkv + b * T * 3 * C + h * D;
            const HeadQkv in{row0, row0 + C, row0 + 2 * C, 3 * C, 3 * C};
            forward_head<true>(in, out + b * T * C + h * D, C, lse + bh * T, T, T, D, scale, round_products);
        }
    });
}

// dout_rounded: null for f32; for bf16, dout rounded (and qkv already is).
inline void backward_heads(const float* qkv, const float* out, const float* dout, const float* dout_rounded,
                           const float* lse, float* dqkv, std::int64_t B, std::int64_t T, std::int64_t H,
                           std::int64_t D) {
    const std::int64_t C = H * D;
    const float scale = attention_scale(D);
    // Each head writes its own columns of dqkv: heads run side by side.
    run_in_ranges(B * H, [&](std::int64_t first, std::int64_t end) {
        for (std::int64_t bh = first; bh < end; ++bh) {
            const std::int64_t b = bh / H, h = bh % H;
            const float* row0 = qkv + b * T * 3 * C + h * D;
            float* grad0 = dqkv + b * T * 3 * C + h * D;
            const HeadQkv in{row0, row0 + C, row0 + 2 * C, 3 * C, 3 * C};
            const HeadGrad grad{grad0, grad0 + C, grad0 + 2 * C};
            const std::int64_t offset = b * T * C + h * D;
            backward_head<true>(in, out + offset, dout + offset, C, lse + bh * T, grad, T, T, D, scale,
                                /*accumulate=*/false, dout_rounded == nullptr ? nullptr : dout_rounded + offset);
        }
    });
}

}  // namespace attention_detail

// Causal multi-head self-attention. qkv: [B, T, 3C] as produced by one Linear
// (C = H*D): q = qkv[b, t, 0:C], k = qkv[b, t, C:2C], v = qkv[b, t, 2C:3C];
// head h uses columns [h*D, (h+1)*D) of each (PyTorch GPT: q.view(B, T, H, D)).
// out: [B, T, C] (heads concatenated the same way). Scale 1/sqrt(D). Token t
// attends to tokens 0..t. lse: [B, H, T] log-sum-exp of the scaled scores per
// query row, saved for backward. out and lse must not overlap qkv. Runs on
// the GEMM threads (gemm_threads.hpp: set_gemm_threads), a range of heads
// each, with the same bits for any thread count; sequences are independent,
// so a caller may also run slices of the batch on different threads.
inline void attention_forward(const float* qkv, float* out, float* lse, std::int64_t B, std::int64_t T,
                              std::int64_t H, std::int64_t D) {
    check_attention_forward_arguments(qkv, out, lse, B, T, H, D);
    if (B == 0 || T == 0) return;
    attention_detail::forward_heads(qkv, out, lse, B, T, H, D, /*round_products=*/false);
}

// dqkv: [B, T, 3C], written (not accumulated). Uses the saved out and lse
// (FlashAttention-2 backward: D_i = rowsum(dO_i * O_i), recompute P from q, k,
// lse; dV += P^T dO; dP = dO V^T; dS = P * (dP - D_i); dQ = dS K * scale;
// dK = dS^T Q * scale). dqkv must not overlap the inputs.
inline void attention_backward(const float* qkv, const float* out, const float* dout, const float* lse, float* dqkv,
                               std::int64_t B, std::int64_t T, std::int64_t H, std::int64_t D) {
    check_attention_backward_arguments(qkv, out, dout, lse, dqkv, B, T, H, D);
    if (B == 0 || T == 0) return;
    attention_detail::backward_heads(qkv, out, dout, /*dout_rounded=*/nullptr, lse, dqkv, B, T, H, D);
}

}  // namespace loom::kernels::host
