// Vocabulary parallelism (Megatron 1D) for a language model's two ends, so
// that no tp rank holds the whole token table or a whole row of logits:
//
//   tp::shard(model.embed, rank, t);                     // token rows [r V/t, (r+1) V/t)
//   tp::shard_vocab_head(model.head, model.loss, rank, t);  // logits of those classes
//
// The embedding's partial lookups are summed over the group (nn/embedding.hpp);
// the head is a column-parallel Linear whose logits the loss never gathers:
// it reduces each row's max, sum of exponentials and target logit instead
// (nn/cross_entropy.hpp). The position table stays whole, replicated.
#pragma once

#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/tensor_group.hpp"
#include "loom/parallel/tensor_parallel.hpp"

namespace loom::tp {

// Makes `layer` rank `rank`'s shard of a vocabulary-parallel embedding: the
// token table by rows, the position table whole.
inline void shard(nn::Embedding& layer, int rank, int degree) {
    const std::int64_t vocab = layer.token.full_shape().dim(0);
    // degree < 1 falls through to split_param, which names it.
    LOOM_CHECK(degree < 1 || vocab % degree == 0, "Embedding: tp degree ", degree,
               " does not divide the vocabulary of ", vocab, " tokens; use a degree that divides ", vocab);
    split_param(layer.token, 0, rank, degree, "Embedding token table");
}

// Makes `head` rank `rank`'s column shard of the vocabulary projection and
// tells `loss` which classes its logits are.
inline void shard_vocab_head(nn::Linear& head, nn::CrossEntropy& loss, int rank, int degree) {
    const std::int64_t vocab = head.weight.full_shape().dim(0);
    LOOM_CHECK(degree < 1 || vocab % degree == 0, "Linear ", head.in(), " -> ", vocab,
               " (vocabulary head): tp degree ", degree, " does not divide the vocabulary of ", vocab,
               " tokens; use a degree that divides ", vocab);
    LOOM_CHECK(!loss.vocab_parallel(), "CrossEntropy: already vocabulary-parallel from class ", loss.vocab_start,
               "; shard a loss once");
    shard(head, nn::Split::columns, rank, degree);
    loss.vocab_start = head.split == nn::Split::columns ? head.weight.slice.start() : -1;
}

}  // namespace loom::tp
