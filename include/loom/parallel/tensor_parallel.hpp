// TensorParallel (Megatron 1D): each layer's weights cut over the tp axis,
// the f/g conjugate operators the only communication (nn/tensor_group.hpp).
// This header holds the policy tag and the cutting of Params: a shard keeps
// its place in the whole tensor (Param::slice), so it initialises to the
// serial run's values there and a checkpoint can be reassembled whole.
//
//   tp::shard(mlp.fc, nn::Split::columns, rank, t);   // W [4C/t, C], b [4C/t]
//   tp::shard(mlp.proj, nn::Split::rows, rank, t);    // W [C, 4C/t], b [C] whole
//   tp::shard(block.attn, rank, t);                    // heads/t heads per rank
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/tensor_group.hpp"
#include "loom/parallel/policy.hpp"

namespace loom {

struct TensorParallel {
    static constexpr PolicyKind kind = PolicyKind::tensor_parallel;
    static constexpr bool grid = false;
    static void describe(std::ostream& out) { out << "TensorParallel"; }
};

namespace tp {

// Cuts `p` to coordinate `rank`'s 1/degree along `dim`, which is `groups`
// equal blocks cut alike (3 for q, k, v); `what` names it in errors. A Param
// takes at most two cuts, on different dimensions (2D tp cuts a matrix by its
// grid row and its grid column); `axis` says which coordinate `rank` is.
inline void split_param(Param& p, int dim, int rank, int degree, std::string_view what, std::int64_t groups = 1,
                        CutAxis axis = CutAxis::rank) {
    // A second cut is a grid's: one by row, one by column. 1D cuts a Param once.
    const bool second_grid_cut = p.slice.count() == 1 && p.slice.along(dim) == nullptr &&
                                 axis != CutAxis::rank && p.slice.cuts[0].axis != CutAxis::rank &&
                                 axis != p.slice.cuts[0].axis;
    LOOM_CHECK(!p.slice.sliced() || second_grid_cut, what, " is already a shard (", p,
               "); cut a Param once (twice on a 2D grid: once by its row, once by its column)");
    LOOM_CHECK(degree >= 1 && rank >= 0 && rank < degree, what, ": rank ", rank, " of a tp degree ", degree);
    LOOM_CHECK(dim >= 0 && dim < p.shape.rank(), what, ": dimension ", dim, " of ", p.shape, " does not exist");
    const std::int64_t n = p.shape[dim];
    LOOM_CHECK(groups >= 1 && n % groups == 0, what, ": dimension ", dim, " of ", p.shape, " is not ", groups,
               " equal blocks");
    const std::int64_t block = n / groups;
    LOOM_CHECK(block % degree == 0, what, ": tp degree ", degree, " does not divide dimension ", dim, " of ",
               p.shape, groups > 1 ? loom::detail::concat(" (", groups, " blocks of ", block, ")")
                                   : loom::detail::concat(" (", n, ")"),
               "; use a degree that divides ", block);
    if (degree == 1) return;
    if (!p.slice.sliced()) p.slice.full = p.shape;
    p.slice.cuts[p.slice.count()] = ParamCut{dim, rank * (block / degree), groups, axis};
    p.shape[dim] = n / degree;
}

// Makes `layer` rank `rank`'s shard of a column- or row-parallel Linear;
// `groups` > 1 cuts each of that many output blocks alike (columns only).
inline void shard(nn::Linear& layer, nn::Split split, int rank, int degree, std::int64_t groups = 1) {
    LOOM_CHECK(split == nn::Split::columns || split == nn::Split::rows, "tp::shard: Linear ", layer.out(), " x ",
               layer.in(), " needs Split::columns or Split::rows (a 2D grid cuts with tp::shard_grid)");
    LOOM_CHECK(layer.split == nn::Split::none, "tp::shard: Linear ", layer.in(), " -> ", layer.out(),
               " is already cut (its split is not none); cut a layer once");
    const bool columns = split == nn::Split::columns;
    const auto what = loom::detail::concat("Linear ", layer.in(), " -> ", layer.out(), columns ? " (columns)" : " (rows)");
    split_param(layer.weight, columns ? 0 : 1, rank, degree, what + " weight", columns ? groups : 1);
    if (columns && layer.has_bias()) split_param(layer.bias, 0, rank, degree, what + " bias", groups);
    layer.split = degree == 1 ? nn::Split::none : split;
}

// Attention with its heads split: q, k and v of this rank's heads (qkv by
// columns, in three blocks), the output projection by rows.
inline void shard(nn::CausalSelfAttention& layer, int rank, int degree) {
    LOOM_CHECK(degree >= 1 && layer.heads % degree == 0, "CausalSelfAttention: tp degree ", degree,
               " does not divide the ", layer.heads, " heads; use a degree that divides ", layer.heads);
    shard(layer.qkv, nn::Split::columns, rank, degree, 3);
    shard(layer.proj, nn::Split::rows, rank, degree);
}

}  // namespace tp
}  // namespace loom
