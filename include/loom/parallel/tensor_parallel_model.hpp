// tp::shard_model: tensor parallelism for a whole model, by walking its
// structure as reflection sees it and cutting Megatron's patterns with the
// functions of tensor_parallel.hpp and tensor_parallel_vocab.hpp. What each
// layer may undergo is what its type declares (nn/tensor_cut.hpp), for
// loom's layers and a user's alike; what was done goes into a CutReport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/type_name.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/gelu.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/tensor_cut.hpp"
#include "loom/parallel/cut_report.hpp"
#include "loom/parallel/tensor_parallel.hpp"
#include "loom/parallel/tensor_parallel_vocab.hpp"

namespace loom::tp {

// Deprecated: the spelling before nn::TensorCut. Specialising it to true for
// a layer that declares no tensor_cut still makes it elementwise; declare
// `static constexpr nn::TensorCut tensor_cut = nn::TensorCut::elementwise;`
// in the layer instead.
template <class L>
inline constexpr bool keeps_features_sharded = false;

namespace detail {

// How a walker treats a field, from its type alone.
enum class Role : std::uint8_t {
    skip,        // a Param or configuration: not a layer
    sequence,    // std::vector / std::array of layers: its elements in order
    declared,    // a layer that declares its nn::TensorCut
    composite,   // an aggregate of layers without a forward of its own: a chain
    undeclared,  // computes itself, declares nothing
    opaque,      // neither a layer loom can run whole by fields nor reflect
};

template <class T>
constexpr Role role_of() {
    if constexpr (reflect::ParamField<T> || reflect::is_config<T>()) return Role::skip;
    else if constexpr (reflect::LayerSequence<T>) return Role::sequence;
    else if constexpr (nn::DeclaresTensorCut<T> || keeps_features_sharded<T>) return Role::declared;
    else if constexpr (nn::Leaf<T>) return Role::undeclared;
    else if constexpr (reflect::has_custom_fields<T> || reflect::pfr_reflectable<T>) return Role::composite;
    else return Role::opaque;
}

// The cut a declared layer names.
template <class T>
constexpr nn::TensorCut declared_cut() {
    if constexpr (nn::DeclaresTensorCut<T>) return T::tensor_cut;
    else return nn::TensorCut::elementwise;  // keeps_features_sharded<T>
}

// Where a walk is, for the report: the unit (named as nn::units_of names
// it: the model's top-level fields, each sequence opened into its elements)
// and the field indices inside it.
struct Where {
    std::string unit;
    std::string path;
    bool root = true;      // the model itself
    bool in_unit = false;  // the unit is decided (and named with its type)
};

// Params of a layer, 0 for one reflection cannot see into.
template <class T>
std::size_t params_of(const T& layer) {
    if constexpr (reflect::has_custom_fields<T> || reflect::pfr_reflectable<T>) return reflect::param_count(layer);
    else return 0;
}

// Records what the walkers do; a walk without a report records nothing.
class CutRecorder {
public:
    CutRecorder(CutReport* report, const std::vector<std::string>& field_names)
        : report_(report), field_names_(field_names) {}

    // The place of field `index` of the node at `where`.
    [[nodiscard]] Where field(const Where& where, std::size_t index) const {
        if (where.root)
            return {index < field_names_.size() ? field_names_[index] : std::to_string(index), {}, false, false};
        Where child = where;
        if (child.in_unit) child.path += (child.path.empty() ? "" : ".") + std::to_string(index);
        return child;
    }
    // The place of element `index` of the sequence at `where`.
    [[nodiscard]] static Where element(const Where& where, std::size_t index) {
        if (where.root) return {"model[" + std::to_string(index) + "]", {}, false, false};
        Where child = where;
        if (child.in_unit) child.path += (child.path.empty() ? "" : ".") + std::to_string(index);
        else child.unit += "[" + std::to_string(index) + "]";
        return child;
    }
    // The place of a node of type T that is not a sequence: the unit, if
    // it was still open, is this node.
    template <class T>
    [[nodiscard]] static Where at(const Where& where) {
        if (where.in_unit) return where;
        Where here = where;
        if (here.root) here.unit = "model";
        here.unit += " " + loom::short_type_name<T>();
        here.root = false;
        here.in_unit = true;
        return here;
    }

    // Returns the entry's index (for a later set), or 0 without a report.
    template <class T>
    std::size_t record(const T& layer, const Where& where, LayerAction action) {
        if (report_ == nullptr) return 0;
        const bool weights = declared_or_replicated<T>() != nn::TensorCut::features && params_of(layer) > 0;
        return report_->add({where.unit, where.path, loom::layer_name<T>(), action, weights});
    }
    void set(std::size_t index, LayerAction action) {
        if (report_ != nullptr) report_->set(index, action);
    }

private:
    template <class T>
    static constexpr nn::TensorCut declared_or_replicated() {
        if constexpr (role_of<T>() == Role::declared) return declared_cut<T>();
        else return nn::TensorCut::replicated;
    }

    CutReport* report_;
    const std::vector<std::string>& field_names_;
};

// An elementwise layer passes a slice of the features: Params of its own
// would be whole while it sees a slice, and their gradients partial.
template <class T>
void check_elementwise(const T& layer, std::string_view policy) {
    LOOM_CHECK(params_of(layer) == 0, policy, ": layer ", loom::layer_name<T>(true),
               " declares TensorCut::elementwise but holds ", params_of(layer), " Params; an elementwise "
               "layer sees a slice of the features, so declare it TensorCut::replicated (1D runs it whole) or "
               "split it into a parameter-free elementwise layer and a loom layer");
}

// One chain of layers (a composite's fields in order): a Linear, then only
// elementwise layers, then a Linear make a column -> row pair; a Linear then
// the loss make the vocabulary head; attention splits its heads, an embedding
// its vocabulary; anything else runs whole and ends a pending pair.
class ShardWalker {
public:
    ShardWalker(int rank, int degree, CutRecorder recorder) : rank_(rank), degree_(degree), recorder_(recorder) {}

    // A composite's fields form their own chain; a pair never crosses into
    // or out of it.
    template <class L>
    void chain(L& composite, const Where& where) {
        end_pair();
        reflect::for_each_field(composite, [&](auto& field, std::size_t i) { visit(field, recorder_.field(where, i)); });
        end_pair();
    }

    template <class F>
    void visit(F& field, const Where& where = {}) {
        using T = std::remove_cvref_t<F>;
        constexpr Role role = role_of<T>();
        if constexpr (role == Role::skip) {
            // not a layer
        } else if constexpr (role == Role::sequence) {
            end_pair();
            std::size_t i = 0;
            for (auto& element : field) visit(element, CutRecorder::element(where, i++));
        } else if constexpr (role == Role::composite) {
            chain(field, where.root ? where : CutRecorder::at<T>(where));  // the model's fields are its units
        } else if constexpr (role == Role::declared) {
            cut(field, CutRecorder::at<T>(where));
        } else {
            // A layer that computes itself in its own way and declares no cut:
            // its Linears may not run as a chain, so it runs whole on every
            // rank, inputs and all (its input is the output of a g: the same
            // on every rank).
            end_pair();
            (void)recorder_.record(field, CutRecorder::at<T>(where), LayerAction::undeclared);
        }
    }

    [[nodiscard]] int pairs() const noexcept { return pairs_; }
    [[nodiscard]] int attentions() const noexcept { return attentions_; }
    [[nodiscard]] int embeddings() const noexcept { return embeddings_; }
    [[nodiscard]] int vocab_heads() const noexcept { return vocab_heads_; }
    [[nodiscard]] int owned() const noexcept { return owned_; }

private:
    // The first Linear of a pair, until its partner comes (or not).
    struct Pending {
        void* layer = nullptr;
        void (*cut)(void*, nn::Split, int, int) = nullptr;
        nn::Linear* linear = nullptr;  // loom's Linear: it may also be the vocabulary head
        std::size_t entry = 0;
        std::vector<std::size_t> elementwise;  // report entries passed on the way
    };

    template <class T>
    void cut(T& field, const Where& where) {
        constexpr nn::TensorCut kind = declared_cut<T>();
        if constexpr (kind == nn::TensorCut::linear) {
            const std::size_t entry = recorder_.record(field, where, LayerAction::whole);
            if (pending_.layer != nullptr) {
                pending_.cut(pending_.layer, nn::Split::columns, rank_, degree_);
                shard(field, nn::Split::rows, rank_, degree_);
                recorder_.set(pending_.entry, LayerAction::column);
                for (const std::size_t e : pending_.elementwise) recorder_.set(e, LayerAction::on_shard);
                recorder_.set(entry, LayerAction::row);
                ++pairs_;
                pending_ = {};
            } else {
                pending_ = {&field, [](void* layer, nn::Split split, int rank, int degree) {
                                shard(*static_cast<T*>(layer), split, rank, degree);
                            }, nullptr, entry, {}};
                if constexpr (std::is_same_v<T, nn::Linear>) pending_.linear = &field;
            }
        } else if constexpr (kind == nn::TensorCut::elementwise) {
            check_elementwise(field, "Megatron 1D");
            // the pair, if any, goes on through it
            const std::size_t entry = recorder_.record(field, where, LayerAction::whole);
            if (pending_.layer != nullptr) pending_.elementwise.push_back(entry);
        } else if constexpr (kind == nn::TensorCut::vocabulary) {
            end_pair();
            shard(field, rank_, degree_);
            (void)recorder_.record(field, where, LayerAction::vocabulary);
            ++embeddings_;
        } else if constexpr (kind == nn::TensorCut::loss) {
            // A Linear straight into the loss is the vocabulary head: its
            // logits stay cut, the loss reduces across the group.
            const std::size_t entry = recorder_.record(field, where, LayerAction::whole);
            if (pending_.linear != nullptr) {
                shard_vocab_head(*pending_.linear, field, rank_, degree_);
                recorder_.set(pending_.entry, LayerAction::column);
                for (const std::size_t e : pending_.elementwise) recorder_.set(e, LayerAction::on_shard);
                recorder_.set(entry, LayerAction::vocabulary);
                ++vocab_heads_;
                pending_ = {};
            }
            end_pair();
        } else if constexpr (kind == nn::TensorCut::heads) {
            end_pair();
            shard(field, rank_, degree_);
            (void)recorder_.record(field, where, LayerAction::heads);
            ++attentions_;
        } else if constexpr (kind == nn::TensorCut::chain) {
            chain(field, where);
        } else if constexpr (kind == nn::TensorCut::own) {
            static_assert(nn::PlacesItsOwnParts<T>, "a layer that declares TensorCut::own needs a member "
                                                    "`void place_on_tensor_group(int rank, int degree)`");
            end_pair();
            field.place_on_tensor_group(rank_, degree_);
            (void)recorder_.record(field, where, LayerAction::own);
            ++owned_;
        } else {
            // replicated, features: whole on every rank, ending a pending pair
            end_pair();
            (void)recorder_.record(field, where, LayerAction::whole);
        }
    }

    // A pending Linear that found no partner stays whole, and so do the
    // elementwise layers after it (their report entries say so already).
    void end_pair() { pending_ = {}; }

    int rank_, degree_;
    CutRecorder recorder_;
    Pending pending_;
    int pairs_ = 0, attentions_ = 0, embeddings_ = 0, vocab_heads_ = 0, owned_ = 0;
};

}  // namespace detail

// What shard_model cut.
struct ShardSummary {
    int linear_pairs = 0;  // column -> row pairs (MLPs)
    int attentions = 0;    // attention layers with their heads split
    int embeddings = 0;    // token tables cut by vocabulary
    int vocab_heads = 0;   // Linear -> CrossEntropy ends cut by vocabulary
    int owned = 0;         // layers that placed their own parts (nn::TensorCut::own)
};

// Makes `model` tp rank `rank`'s shard of itself over `degree` ranks: every
// column -> (elementwise) -> row pair of Linears, every attention, every
// embedding and the Linear that feeds the loss, found by walking the model's
// own structure and each layer's declared nn::TensorCut, so a user block is
// cut the same way as the GPT. Layers outside those patterns (LayerNorm, a
// lone Linear, a layer that declares nothing) stay whole on every rank. Call
// before the model's Params are bound (the executor does). `report`, when
// given, receives what was done to each layer, its units named from
// `field_names` as nn::units_of names them.
template <class Model>
ShardSummary shard_model(Model& model, int rank, int degree, CutReport* report = nullptr,
                         const std::vector<std::string>& field_names = {}) {
    LOOM_CHECK(degree >= 1 && rank >= 0 && rank < degree, "tp::shard_model: rank ", rank, " of a tp degree ", degree);
    if (report != nullptr) *report = CutReport("TensorParallel", degree);
    detail::ShardWalker walker(rank, degree, detail::CutRecorder(report, field_names));
    walker.visit(model);
    return {walker.pairs(), walker.attentions(), walker.embeddings(), walker.vocab_heads(), walker.owned()};
}

}  // namespace loom::tp
