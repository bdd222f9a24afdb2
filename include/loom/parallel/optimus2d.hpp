// Optimus2D: tensor parallelism on a q x q grid (tp = q^2 ranks; Xu et al.,
// arXiv 2104.05343). Rank (i, j) holds block (i, j) of every matrix, weights
// and activations alike, so each takes 1/q^2 of both; the Linears are SUMMA
// products (nn/summa.hpp). This header holds the policy tag and the cutting:
//
//   activations [B, T, C]     -> [B/q, T, C/q]: sequences i, features j
//   Linear W [out, in]        -> [out/q, in/q]: outputs i, inputs j (Split::grid);
//                                bias [out/q]: outputs j, on every row of the grid
//   LayerNorm gain, shift [C] -> [C/q]: features j
//   attention                 -> qkv and proj cut as Linears (q, k, v each by
//                                blocks), heads/q heads of column j per rank
//   Embedding token [V, C]    -> [V/q, C/q]: tokens i, features j;
//                                position [S, C] -> [S, C/q]: features j
//   CrossEntropy              -> rows i, classes j, reduced over the grid row
//
// Vectors (biases, LayerNorm, positions) are cut q ways, not q^2: they are
// small, and each grid row holds the same copy, its gradient summed down the
// grid column. Every layer of the model must declare one of these cuts
// (nn/tensor_cut.hpp: linear, features, heads, vocabulary, loss), or
// elementwise (Gelu, or a user's layer that declares it), or be a chain or
// composite of them: every activation is cut, so a layer that needs whole
// rows (replicated, or one that declares nothing) cannot run.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/type_name.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layernorm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/tensor_cut.hpp"
#include "loom/parallel/cut_report.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/grid2d.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_model.hpp"

namespace loom {

struct Optimus2D {
    static constexpr PolicyKind kind = PolicyKind::tensor_parallel;
    static constexpr bool grid = true;
    static void describe(std::ostream& out) { out << "Optimus2D"; }
};

namespace tp {

// Makes `layer` grid rank `at`'s block of a Linear; `groups` > 1 cuts each
// of that many output blocks alike (q, k, v).
inline void shard_grid(nn::Linear& layer, GridPosition at, std::int64_t groups = 1) {
    const auto what = loom::detail::concat("Linear ", layer.in(), " -> ", layer.out(), " (Optimus 2D)");
    split_param(layer.weight, 0, at.i, at.q, what + " weight outputs", groups, CutAxis::grid_row);
    split_param(layer.weight, 1, at.j, at.q, what + " weight inputs", 1, CutAxis::grid_column);
    if (layer.has_bias()) split_param(layer.bias, 0, at.j, at.q, what + " bias", groups, CutAxis::grid_column);
    layer.split = at.q == 1 ? nn::Split::none : nn::Split::grid;
}

inline void shard_grid(nn::LayerNorm& layer, GridPosition at) {
    const auto what = loom::detail::concat("LayerNorm of ", layer.features(), " features (Optimus 2D)");
    split_param(layer.gain, 0, at.j, at.q, what, 1, CutAxis::grid_column);
    split_param(layer.shift, 0, at.j, at.q, what, 1, CutAxis::grid_column);
}

inline void shard_grid(nn::CausalSelfAttention& layer, GridPosition at) {
    LOOM_CHECK(layer.heads % at.q == 0, "CausalSelfAttention: the ", layer.heads,
               " heads do not split over the q = ", at.q, " columns of the Optimus 2D grid; use a grid side that "
               "divides ", layer.heads);
    shard_grid(layer.qkv, at, 3);
    shard_grid(layer.proj, at);
}

inline void shard_grid(nn::Embedding& layer, GridPosition at) {
    const std::int64_t vocab = layer.token.full_shape().dim(0);
    LOOM_CHECK(vocab % at.q == 0, "Embedding: the grid side q = ", at.q, " does not divide the vocabulary of ",
               vocab, " tokens; use a q that divides ", vocab);
    split_param(layer.token, 0, at.i, at.q, "Embedding token table (Optimus 2D)", 1, CutAxis::grid_row);
    split_param(layer.token, 1, at.j, at.q, "Embedding token table (Optimus 2D)", 1, CutAxis::grid_column);
    split_param(layer.position, 1, at.j, at.q, "Embedding position table (Optimus 2D)", 1, CutAxis::grid_column);
}

inline void shard_grid(nn::CrossEntropy& loss, GridPosition at) {
    LOOM_CHECK(!loss.vocab_parallel(), "CrossEntropy: already vocabulary-parallel (from class ", loss.vocab_start,
               ", grid ", loss.grid, "); shard a loss once");
    loss.grid = at.q > 1;
}

namespace detail {

// Cuts every layer of a model for one grid position (see the header).
class GridWalker {
public:
    GridWalker(GridPosition at, CutRecorder recorder) : at_(at), recorder_(recorder) {}

    template <class F>
    void visit(F& field, const Where& where = {}) {
        using T = std::remove_cvref_t<F>;
        constexpr Role role = role_of<T>();
        if constexpr (role == Role::skip) {
            // not a layer
        } else if constexpr (role == Role::sequence) {
            std::size_t i = 0;
            for (auto& element : field) visit(element, CutRecorder::element(where, i++));
        } else if constexpr (role == Role::composite) {
            walk_fields(field, where.root ? where : CutRecorder::at<T>(where));
        } else if constexpr (role == Role::declared) {
            cut(field, CutRecorder::at<T>(where));
        } else {
            refuse<T>(role == Role::undeclared ? "it computes itself and declares no nn::TensorCut"
                                               : "reflection cannot see inside it");
        }
    }

    [[nodiscard]] int layers() const noexcept { return layers_; }

private:
    template <class L>
    void walk_fields(L& composite, const Where& where) {
        // a chain: its fields run in order (Residual adds its input)
        reflect::for_each_field(composite, [&](auto& member, std::size_t i) { visit(member, recorder_.field(where, i)); });
    }

    template <class T>
    void cut(T& field, const Where& where) {
        constexpr nn::TensorCut kind = declared_cut<T>();
        if constexpr (kind == nn::TensorCut::chain) {
            walk_fields(field, where);
        } else if constexpr (kind == nn::TensorCut::elementwise) {
            check_elementwise(field, "Optimus 2D");
            (void)recorder_.record(field, where, LayerAction::on_shard);  // any block of the activations will do
        } else if constexpr (kind == nn::TensorCut::replicated) {
            refuse<T>("it declares TensorCut::replicated (it needs whole rows or features)");
        } else if constexpr (kind == nn::TensorCut::own) {
            refuse<T>("it declares TensorCut::own (it places its own parts on a 1D group)");
        } else {
            shard_grid(field, at_);
            (void)recorder_.record(field, where, LayerAction::grid);
            ++layers_;
        }
    }

    // A layer whose forward would see a block of the activations and could
    // mix sequences or features: it cannot run on a block.
    template <class T>
    [[noreturn]] static void refuse(std::string_view why) {
        LOOM_FAIL("Optimus 2D: layer ", loom::layer_name<T>(true), " has no 2D form: ", why, ". Every activation is "
                  "cut in q x q blocks, so each layer must declare a 2D cut (loom's Linear, LayerNorm, "
                  "CausalSelfAttention, Embedding, CrossEntropy; an elementwise layer of your own declares "
                  "`static constexpr loom::nn::TensorCut tensor_cut = loom::nn::TensorCut::elementwise;`) or be a "
                  "composite of such layers");
    }

    GridPosition at_;
    CutRecorder recorder_;
    int layers_ = 0;
};

}  // namespace detail

// Makes `model` tp rank `rank`'s block of itself on a grid of `ranks` = q^2
// ranks: every layer cut as the header says, by walking the model's own
// structure. Returns how many layers were cut; `report`, when given,
// receives what was done to each (as tp::shard_model's does). Call before the Params are
// bound (the executor does).
template <class Model>
int shard_model_grid(Model& model, int rank, int ranks, CutReport* report = nullptr,
                     const std::vector<std::string>& field_names = {}) {
    const GridPosition at = GridPosition::of(rank, ranks);
    if (report != nullptr) *report = CutReport("Optimus2D", ranks);
    detail::GridWalker walker(at, detail::CutRecorder(report, field_names));
    walker.visit(model);
    return walker.layers();
}

}  // namespace tp
}  // namespace loom
