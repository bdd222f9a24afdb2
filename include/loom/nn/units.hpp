// The units of a model: the pieces the step program schedules one by one.
// A model's top-level fields in declaration order, each sequence field
// (std::vector / std::array of layers) opened into its elements: for the
// reference GPT that is embed, blocks[0] .. blocks[L-1], ln_f, head, loss.
// A unit is the grain of everything the parallel policies do: a data-parallel
// bucket closes after a unit's backward, ZeRO-3 gathers a unit's parameters
// before it runs, a pipeline stage is a run of units. Units own nothing; they
// call the model's own layers through nn::forward / nn::backward_*.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/param.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/tensor.hpp"
#include "loom/core/type_name.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"

namespace loom::nn {

// Whether recomputing layer type L can save memory: its `static constexpr
// bool worth_recomputing`, true when it says nothing. A layer whose only
// activation is its output says false (recomputing it keeps the same bytes
// and costs a forward); Recompute<...> (parallel/recompute.hpp) reads it.
template <class L>
[[nodiscard]] constexpr bool worth_recomputing() {
    if constexpr (requires { L::worth_recomputing; }) return L::worth_recomputing;
    else return true;
}

struct Unit {
    std::string name;             // "blocks[2] Block": the field path, then the type
    std::vector<Param*> params;   // reflection order, the arena's order
    std::int64_t numel = 0;       // elements of all its Params
    bool worth_recomputing = true;  // nn::worth_recomputing<L>() of its layer
    std::function<Tensor(Context&, const Tensor&)> forward;
    std::function<Tensor(Context&, const Tensor&)> backward_input;
    std::function<void(Context&)> backward_weight;
};

namespace detail {

template <class L>
Unit make_unit(L& layer, std::string path) {
    Unit unit;
    unit.name = std::move(path) + " " + loom::short_type_name<L>();
    unit.worth_recomputing = worth_recomputing<L>();
    reflect::visit_params(layer, [&](Param& p, std::string_view) {
        unit.params.push_back(&p);
        unit.numel += p.numel();
    });
    unit.forward = [&layer](Context& ctx, const Tensor& x) { return forward(layer, ctx, x); };
    unit.backward_input = [&layer](Context& ctx, const Tensor& dy) { return backward_input(layer, ctx, dy); };
    unit.backward_weight = [&layer](Context& ctx) { backward_weight(layer, ctx); };
    return unit;
}

template <class F>
void add_units(F& field, const std::string& path, std::vector<Unit>& units) {
    if constexpr (Leaf<F>) {
        units.push_back(make_unit(field, path));
    } else if constexpr (reflect::LayerSequence<F>) {
        std::size_t i = 0;
        for (auto& element : field) units.push_back(make_unit(element, path + "[" + std::to_string(i++) + "]"));
    } else {
        units.push_back(make_unit(field, path));
    }
}

}  // namespace detail

// The units of `model` (which must outlive them and not move). `field_names`
// names the top-level fields for traces and messages ("embed", "blocks", ...);
// without them the fields are numbered.
template <class Model>
[[nodiscard]] std::vector<Unit> units_of(Model& model, const std::vector<std::string>& field_names = {}) {
    std::vector<Unit> units;
    if constexpr (Leaf<Model> || reflect::LayerSequence<Model>) {
        detail::add_units(model, "model", units);
    } else {
        std::size_t index = 0;
        std::apply([&](auto&... field) {
            ((detail::reject_loose_params<decltype(field)>(),
              [&] {
                  if constexpr (detail::runs_as_layer<decltype(field)>)
                      detail::add_units(field, index < field_names.size() ? field_names[index] : std::to_string(index),
                                        units);
                  ++index;
              }()),
             ...);
        }, detail::fields_of(model));
    }
    return units;
}

// Points the Params of units [first, last] (inclusive) at consecutive
// elements of `values` and of `grads`, in reflection order, on `device`: what
// the executor does when a schedule gathers, binds or releases a group of
// units. A null pointer unbinds, so a use outside the schedule fails loudly;
// `which` leaves the values or the gradients as they are.
enum class Bind : std::uint8_t { both, values, grads };
inline void bind_units(std::vector<Unit>& units, int first, int last, float* values, float* grads, Device device,
                       Bind which = Bind::both) {
    std::int64_t at = 0;
    for (int u = first; u <= last; ++u)
        for (Param* p : units[static_cast<std::size_t>(u)].params) {
            if (which != Bind::grads) p->value = values ? Tensor::of(values + at, p->shape, device) : Tensor{};
            if (which != Bind::values) p->grad = grads ? Tensor::of(grads + at, p->shape, device) : Tensor{};
            at += p->numel();
        }
}

}  // namespace loom::nn
