// Residual<Layers...>: y = x + chain(x), the layers run in order. Reflection
// sees the inner layers as its fields (0, 1, ...), so their Params are found
// like any others.
//   using AttentionBlock = nn::Residual<nn::LayerNorm, nn::CausalSelfAttention>;
#pragma once

#include <tuple>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/tensor_cut.hpp"

namespace loom::nn {

template <class... Layers>
struct Residual {
    // Its tensor-parallel cut (nn/tensor_cut.hpp): its fields in order, plus its input: walked inside.
    static constexpr TensorCut tensor_cut = TensorCut::chain;
    static_assert(sizeof...(Layers) >= 1, "Residual needs at least one layer");
    std::tuple<Layers...> layers;

    auto loom_fields() {
        return std::apply([](auto&... each) { return std::tie(each...); }, layers);
    }

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& x) {
        Tensor h = x;
        std::apply([&](auto&... each) { ((h = nn::forward(each, ctx, h)), ...); }, layers);
        LOOM_CHECK(h.shape() == x.shape(), "Residual: the inner layers turned shape ", x.shape(), " into ", h.shape(),
                   "; a skip connection needs them equal");
        Tensor y = ctx.alloc(x.shape());
        kernels::add(x, h, y);
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        Tensor g = dy;
        detail::for_each_reversed(layers, [&](auto& each) { g = nn::backward_input(each, ctx, g); });
        Tensor dx = ctx.alloc(dy.shape());
        kernels::add(dy, g, dx);
        return dx;
    }

    void backward_weight(Context& ctx) {
        detail::for_each_reversed(layers, [&](auto& each) { nn::backward_weight(each, ctx); });
    }
};

}  // namespace loom::nn
