// TensorParallel (Megatron 1D): each layer's weights cut over the tp axis,
// the f/g conjugate operators the only communication (nn/tensor_group.hpp).
// This header holds the policy tag and the cutting of Params: a shard keeps
// its place in the whole tensor (Param::slice), so it initialises to the
// serial run's values there and a checkpoint can be reassembled whole.
//
//   tp::shard(mlp.fc, nn::Split::columns, rank, t);   // W [4C/t, C], b [4C/t]
//   tp::shard(mlp.proj, nn::Split::rows, rank, t);    // W [C, 4C/t], b [C] whole
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/tensor_group.hpp"
#include "loom/parallel/policy.hpp"

namespace loom {

struct TensorParallel {
    static constexpr PolicyKind kind = PolicyKind::tensor_parallel;
    static void describe(std::ostream& out) { out << "TensorParallel"; }
};

namespace tp {

// Cuts `p` to rank `rank`'s 1/degree along `dim`; `what` names it in errors
// ("Linear 3072 x 768 weight").
inline void split_param(Param& p, int dim, int rank, int degree, std::string_view what) {
    LOOM_CHECK(!p.slice.sliced(), what, " is already a shard (", p, "); cut a Param once");
    LOOM_CHECK(degree >= 1 && rank >= 0 && rank < degree, what, ": rank ", rank, " of a tp degree ", degree);
    LOOM_CHECK(dim >= 0 && dim < p.shape.rank(), what, ": dimension ", dim, " of ", p.shape, " does not exist");
    const std::int64_t n = p.shape[dim];
    LOOM_CHECK(n % degree == 0, what, ": tp degree ", degree, " does not divide dimension ", dim, " of ", p.shape,
               " (", n, "); use a degree that divides ", n);
    if (degree == 1) return;
    p.slice = ParamSlice{p.shape, dim, rank * (n / degree)};
    p.shape[dim] = n / degree;
}

// Makes `layer` rank `rank`'s shard of a column- or row-parallel Linear.
inline void shard(nn::Linear& layer, nn::Split split, int rank, int degree) {
    LOOM_CHECK(split != nn::Split::none, "tp::shard: Linear ", layer.out(), " x ", layer.in(),
               " needs Split::columns or Split::rows");
    const bool columns = split == nn::Split::columns;
    const auto what = loom::detail::concat("Linear ", layer.in(), " -> ", layer.out(), columns ? " (columns)" : " (rows)");
    split_param(layer.weight, columns ? 0 : 1, rank, degree, what + " weight");
    if (columns && layer.has_bias()) split_param(layer.bias, 0, rank, degree, what + " bias");
    layer.split = degree == 1 ? nn::Split::none : split;
}

}  // namespace tp
}  // namespace loom
