// Token + position embedding, as GPT-2's wte/wpe lookup:
//   out[b, t, :] = token_table[tokens[b, t], :] + position_table[t, :].
// Tables are row-major [vocab, C] and [>= T, C]; tokens are [B, T] int32.
#pragma once

#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/kernels/host/elementwise.hpp"

namespace loom::kernels::host {

namespace detail {

inline void check_embedding_sizes(std::int64_t B, std::int64_t T, std::int64_t C) {
    LOOM_CHECK(B >= 0 && T >= 0 && C >= 0, "embedding: sizes B = ", B, ", T = ", T, ", C = ", C,
               " must all be >= 0");
}

LOOM_KERNEL_DISPATCH inline void embedding_forward_rows(const std::int32_t* __restrict tokens,
                                                        const float* __restrict token_table,
                                                        const float* __restrict position_table, float* __restrict out,
                                                        std::int64_t B, std::int64_t T, std::int64_t C) noexcept {
    for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t t = 0; t < T; ++t) {
            const float* __restrict token_row = token_table + static_cast<std::int64_t>(tokens[b * T + t]) * C;
            const float* __restrict position_row = position_table + t * C;
            float* __restrict out_row = out + (b * T + t) * C;
            for (std::int64_t c = 0; c < C; ++c) out_row[c] = token_row[c] + position_row[c];
        }
    }
}

LOOM_KERNEL_DISPATCH inline void embedding_backward_rows(const std::int32_t* __restrict tokens,
                                                         const float* __restrict dout,
                                                         float* __restrict dtoken_table,
                                                         float* __restrict dposition_table, std::int64_t B,
                                                         std::int64_t T, std::int64_t C) noexcept {
    for (std::int64_t b = 0; b < B; ++b) {
        for (std::int64_t t = 0; t < T; ++t) {
            const float* __restrict grad_row = dout + (b * T + t) * C;
            float* __restrict token_row = dtoken_table + static_cast<std::int64_t>(tokens[b * T + t]) * C;
            float* __restrict position_row = dposition_table + t * C;
            for (std::int64_t c = 0; c < C; ++c) {
                token_row[c] += grad_row[c];
                position_row[c] += grad_row[c];
            }
        }
    }
}

inline void check_embedding_slice(std::int64_t n, std::int64_t T, std::int64_t C, std::int64_t start,
                                  std::int64_t stop) {
    LOOM_CHECK(n >= 0 && T >= 1 && n % T == 0 && C >= 0, "embedding: ", n, " tokens in sequences of T = ", T,
               " and C = ", C, "; n must be a multiple of T >= 1 and C >= 0");
    LOOM_CHECK(start >= 0 && stop >= start, "embedding: vocabulary slice [", start, ", ", stop, ") is not a range of ids");
}

// Every id of n tokens in sequences of T is >= 0, else throws naming the
// first negative one and where it is.
inline void check_ids_not_negative(const std::int32_t* tokens, std::int64_t n, std::int64_t T) {
    for (std::int64_t i = 0; i < n; ++i) {
        LOOM_CHECK(tokens[i] >= 0, "embedding backward: token id ", tokens[i], " at batch ", i / T, ", position ",
                   i % T, " is negative; token ids are in [0, vocab)");
    }
}

}  // namespace detail

// out: [B, T, C], written. Every token is checked before anything is written,
// so a bad batch leaves `out` as it was; the error names the first bad id and
// where it sits.
inline void embedding_forward(const std::int32_t* tokens, const float* token_table, const float* position_table,
                              float* out, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t vocab) {
    detail::check_embedding_sizes(B, T, C);
    LOOM_CHECK(vocab >= 1, "embedding: vocab = ", vocab, " has no tokens; pass vocab >= 1");
    for (std::int64_t i = 0; i < B * T; ++i) {
        LOOM_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "embedding: token id ", tokens[i], " at batch ", i / T,
                   ", position ", i % T, " is outside the vocabulary [0, ", vocab, ")");
    }
    detail::embedding_forward_rows(tokens, token_table, position_table, out, B, T, C);
}

// dtoken_table[tokens[b, t], :] += dout[b, t, :];  dposition_table[t, :] += dout[b, t, :].
// Accumulated, so a tied output projection can add its gradient to the same
// table. The tokens are those the forward accepted; only their sign is checked
// again here (there is no vocab to check against), before any write.
inline void embedding_backward(const std::int32_t* tokens, const float* dout, float* dtoken_table,
                               float* dposition_table, std::int64_t B, std::int64_t T, std::int64_t C) {
    detail::check_embedding_sizes(B, T, C);
    detail::check_ids_not_negative(tokens, B * T, T);
    detail::embedding_backward_rows(tokens, dout, dtoken_table, dposition_table, B, T, C);
}

// Vocabulary-parallel pieces: this rank's token table holds ids [start, stop)
// of a vocabulary of `whole_vocab`; tokens are [n / T, T].

// out[i, :] = token_table[tokens[i] - start, :] for the ids this slice holds,
// zeros for the rest (summed over the slices' ranks: the whole lookup); no
// positions. Every id is checked against the whole vocabulary first, so every
// rank throws on the same bad batch before any collective.
inline void embedding_slice_lookup(const std::int32_t* tokens, const float* token_table, float* out, std::int64_t n,
                                   std::int64_t T, std::int64_t C, std::int64_t start, std::int64_t stop,
                                   std::int64_t whole_vocab) {
    detail::check_embedding_slice(n, T, C, start, stop);
    for (std::int64_t i = 0; i < n; ++i) {
        LOOM_CHECK(tokens[i] >= 0 && tokens[i] < whole_vocab, "embedding: token id ", tokens[i], " at batch ", i / T,
                   ", position ", i % T, " is outside the vocabulary [0, ", whole_vocab, ")");
    }
    for (std::int64_t i = 0; i < n; ++i) {
        float* row = out + i * C;
        if (tokens[i] >= start && tokens[i] < stop) {
            const float* from = token_table + (tokens[i] - start) * C;
            for (std::int64_t c = 0; c < C; ++c) row[c] = from[c];
        } else {
            for (std::int64_t c = 0; c < C; ++c) row[c] = 0.0f;
        }
    }
}

// dposition_table[p(i), :] += dout[i, :] for every row, in row order (the
// whole position gradient, on every rank), with p(i) = i % T;
// dtoken_table[tokens[i] - start, :] +=
// dout[i, :] for the ids this slice holds.
inline void embedding_slice_backward(const std::int32_t* tokens, const float* dout, float* dtoken_table,
                                     float* dposition_table, std::int64_t n, std::int64_t T, std::int64_t C,
                                     std::int64_t start, std::int64_t stop) {
    detail::check_embedding_slice(n, T, C, start, stop);
    // As the whole backward (and the device's): a negative id is refused
    // before anything is written, though no slice holds it.
    detail::check_ids_not_negative(tokens, n, T);
    for (std::int64_t i = 0; i < n; ++i) {
        const float* g = dout + i * C;
        float* p = dposition_table + (i % T) * C;
        for (std::int64_t c = 0; c < C; ++c) p[c] += g[c];
        if (tokens[i] < start || tokens[i] >= stop) continue;
        float* t = dtoken_table + (tokens[i] - start) * C;
        for (std::int64_t c = 0; c < C; ++c) t[c] += g[c];
    }
}

}  // namespace loom::kernels::host
