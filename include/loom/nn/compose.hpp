// How layers run: a leaf layer (any type with forward/backward_input/
// backward_weight members) runs itself; a std::vector or std::array of layers
// runs its elements in order; any other aggregate runs its fields in
// declaration order (Boost.PFR, or its loom_fields) — forward first to last,
// backward last to first. Parameters are never registered: reflection finds
// them, and the ParamArena binds them.
//
//   struct Mlp { nn::Linear up; nn::Gelu act; nn::Linear down; };   // a chain
//   Tensor y = nn::forward(mlp, ctx, x);
//   Tensor dx = nn::backward_input(mlp, ctx, dy);
//   nn::backward_weight(mlp, ctx);
#pragma once

#include <concepts>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include <boost/pfr/core.hpp>

#include "loom/core/reflect.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/context.hpp"

namespace loom::nn {

// A layer that computes itself. backward_weight is optional (layers without
// parameters need none).
template <class L>
concept Leaf = requires(L& layer, Context& ctx, const Tensor& t) {
    { layer.forward(ctx, t) } -> std::same_as<Tensor>;
    { layer.backward_input(ctx, t) } -> std::same_as<Tensor>;
};

namespace detail {

template <class L>
auto fields_of(L& layer) {
    if constexpr (reflect::detail::HasMemberFields<L>) {
        return layer.loom_fields();
    } else if constexpr (reflect::detail::HasFreeFields<L>) {
        using reflect::detail::loom_fields;
        return loom_fields(layer);
    } else {
        static_assert(reflect::pfr_reflectable<L>,
                      "loom cannot compose this layer type: it has no forward/backward_input members, and Boost.PFR "
                      "cannot enumerate its fields (make it an aggregate without base classes, constructors or "
                      "virtual functions, or give it `auto loom_fields() { return std::tie(...); }`)");
        return boost::pfr::structure_tie(layer);
    }
}

template <class F>
inline constexpr bool runs_as_layer = !reflect::ParamField<std::remove_cvref_t<F>> && !reflect::is_config<std::remove_cvref_t<F>>();

template <class F>
constexpr void reject_loose_params() {
    static_assert(!reflect::ParamField<std::remove_cvref_t<F>>,
                  "a layer that holds Params directly must compute itself: give it forward(ctx, x), "
                  "backward_input(ctx, dy) and backward_weight(ctx) members (a plain chain of layers needs none)");
}

template <class Tuple, class F>
void for_each_reversed(Tuple&& tuple, F&& f) {
    constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<Tuple>>;
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::get<n - 1 - I>(tuple)), ...); }(std::make_index_sequence<n>{});
}

}  // namespace detail

template <class L>
[[nodiscard]] Tensor forward(L& layer, Context& ctx, const Tensor& x) {
    if constexpr (Leaf<L>) {
        return layer.forward(ctx, x);
    } else if constexpr (reflect::LayerSequence<L>) {
        Tensor h = x;
        for (auto& element : layer) h = forward(element, ctx, h);
        return h;
    } else {
        Tensor h = x;
        std::apply([&](auto&... field) {
            ((detail::reject_loose_params<decltype(field)>(),
              [&] { if constexpr (detail::runs_as_layer<decltype(field)>) h = forward(field, ctx, h); }()),
             ...);
        }, detail::fields_of(layer));
        return h;
    }
}

template <class L>
[[nodiscard]] Tensor backward_input(L& layer, Context& ctx, const Tensor& dy) {
    if constexpr (Leaf<L>) {
        return layer.backward_input(ctx, dy);
    } else if constexpr (reflect::LayerSequence<L>) {
        Tensor g = dy;
        for (auto it = layer.rbegin(); it != layer.rend(); ++it) g = backward_input(*it, ctx, g);
        return g;
    } else {
        Tensor g = dy;
        detail::for_each_reversed(detail::fields_of(layer), [&](auto& field) {
            if constexpr (detail::runs_as_layer<decltype(field)>) g = backward_input(field, ctx, g);
        });
        return g;
    }
}

// Accumulates parameter gradients from what backward_input saved; may run
// later than backward_input (zero-bubble schedules), in any layer order.
template <class L>
void backward_weight(L& layer, Context& ctx) {
    if constexpr (Leaf<L>) {
        if constexpr (requires { layer.backward_weight(ctx); }) layer.backward_weight(ctx);
    } else if constexpr (reflect::LayerSequence<L>) {
        for (auto it = layer.rbegin(); it != layer.rend(); ++it) backward_weight(*it, ctx);
    } else {
        detail::for_each_reversed(detail::fields_of(layer), [&](auto& field) {
            if constexpr (detail::runs_as_layer<decltype(field)>) backward_weight(field, ctx);
        });
    }
}

// Both halves of the backward pass, for schedules that do not split them.
template <class L>
[[nodiscard]] Tensor backward(L& layer, Context& ctx, const Tensor& dy) {
    Tensor dx = backward_input(layer, ctx, dy);
    backward_weight(layer, ctx);
    return dx;
}

// One training micro-batch of a model whose last layer is a loss: forward to
// the loss, then the whole backward pass from `dloss` (1; 1/M for one of M
// micro-batches of a step). Gradients accumulate into the bound Params'
// grads; returns the loss.
template <class Model>
float forward_backward(Model& model, Context& ctx, const Tensor& inputs, const Tensor& targets, float dloss = 1.0f) {
    ctx.reset();
    // On a device context the host's batch is copied there first.
    ctx.set_targets(ctx.on_device(targets));
    (void)forward(model, ctx, ctx.on_device(inputs));
    (void)backward(model, ctx, Tensor::of(&dloss, {1}));
    return ctx.loss();
}

// The loss alone, no gradients.
template <class Model>
float evaluate(Model& model, Context& ctx, const Tensor& inputs, const Tensor& targets) {
    ctx.reset();
    ctx.set_targets(ctx.on_device(targets));
    (void)forward(model, ctx, ctx.on_device(inputs));
    return ctx.loss();
}

}  // namespace loom::nn
