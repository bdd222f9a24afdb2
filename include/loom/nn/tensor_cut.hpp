// TensorCut: what a layer type declares about how tensor-parallel policies
// may cut it. The walkers of Megatron 1D (tp::shard_model) and Optimus 2D
// (tp::shard_model_grid) read this declaration and nothing else, so a user's
// layer is recognised exactly as loom's own layers are, which declare theirs
// the same way:
//
//   struct Swish {                                   // acts on each element alone
//       static constexpr loom::nn::TensorCut tensor_cut = loom::nn::TensorCut::elementwise;
//       static constexpr std::string_view name = "Swish";   // optional: for messages
//       Tensor forward(Context&, const Tensor&); Tensor backward_input(Context&, const Tensor&);
//   };
//
// A plain aggregate of layers (no forward of its own) needs no declaration:
// it is walked as the chain of its fields. A layer that computes itself and
// declares nothing runs whole on every rank under 1D and is refused by 2D,
// and the executor's cut report says which layers those were.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

namespace loom::nn {

enum class TensorCut : std::uint8_t {
    // Runs whole on every tensor-parallel rank, its input replicated (1D);
    // it needs whole rows or features, so 2D, which cuts every activation,
    // refuses it.
    replicated,
    // Acts on each element alone (GELU, Swish, a scale by a constant): the
    // slice of features a column-parallel Linear leaves passes through it to
    // the row-parallel Linear that follows (1D), and it runs on any q x q
    // block of the activations (2D).
    elementwise,
    // A matrix product (nn::Linear): column-parallel as the first of a pair,
    // row-parallel as the second, column-parallel as the vocabulary head
    // before the loss (1D); a SUMMA block (2D). The walkers cut it with
    // `shard(layer, nn::Split, rank, degree)` and `shard_grid(layer, at)`.
    linear,
    // Attention: heads split (1D, `shard(layer, rank, degree)`); q, k, v and
    // the projection in blocks (2D, `shard_grid`).
    heads,
    // A token table: rows split by vocabulary (1D, `shard`); a block (2D).
    vocabulary,
    // The loss: vocabulary-parallel after a column-parallel head (1D); rows
    // and classes of the grid (2D, `shard_grid`).
    loss,
    // Normalises over the features (LayerNorm): whole under 1D, where its
    // input is replicated; its gain and shift cut by grid column under 2D.
    features,
    // Computes itself, but its forward is its fields in order plus
    // elementwise work (nn::Residual adds its input): the walkers go inside.
    chain,
    // Places its own parts on the ranks (1D only): the walker calls the
    // layer's `place_on_tensor_group(rank, degree)`, which keeps some of its
    // Params on this rank and marks the rest held elsewhere (Param::held_by);
    // its forward and backward then sum over the group through the Context's
    // TensorGroup. Kraken's layer (sub-layer i on rank i) is one.
    own,
};

[[nodiscard]] constexpr std::string_view to_string(TensorCut cut) noexcept {
    switch (cut) {
        case TensorCut::replicated: return "replicated";
        case TensorCut::elementwise: return "elementwise";
        case TensorCut::linear: return "linear";
        case TensorCut::heads: return "heads";
        case TensorCut::vocabulary: return "vocabulary";
        case TensorCut::loss: return "loss";
        case TensorCut::features: return "features";
        case TensorCut::chain: return "chain";
        case TensorCut::own: return "own";
    }
    return "?";
}

// Whether L can do what TensorCut::own promises.
template <class L>
concept PlacesItsOwnParts = requires(L& layer, int rank, int degree) { layer.place_on_tensor_group(rank, degree); };

// Whether L declares its cut: a `static constexpr nn::TensorCut tensor_cut`.
template <class L>
concept DeclaresTensorCut = requires { requires std::is_same_v<decltype(L::tensor_cut), const TensorCut>; };

}  // namespace loom::nn
