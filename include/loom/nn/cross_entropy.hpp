// CrossEntropy: the loss layer. Takes logits [..., V] and the context's
// targets (one i32 per row), returns the mean negative log-likelihood as a
// one-element tensor (also in ctx.loss()). Fused log-softmax: only one
// log-sum-exp per row is kept for backward. Its backward_input takes dloss
// (a one-element tensor, 1 to start backpropagation) and returns dlogits.
#pragma once

#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/cross_entropy.hpp"
#include "loom/nn/context.hpp"

namespace loom::nn {

struct CrossEntropy {
    struct Saved {
        Tensor logits, logsumexp;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& logits) {
        const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
        const Tensor& targets = ctx.targets();
        LOOM_CHECK(targets.dtype() == DType::i32 && targets.numel() == rows, "CrossEntropy: ", rows,
                   " rows of logits need as many i32 targets; the context has ", targets.numel(), " x ",
                   targets.dtype(), " (call ctx.set_targets)");
        auto& saved = ctx.saved<Saved>(this);
        saved.logits = logits;
        saved.logsumexp = ctx.alloc(Shape{rows});
        const float loss = kernels::host::cross_entropy_forward(logits.data<float>(), targets.data<std::int32_t>(),
                                                                saved.logsumexp.data<float>(), rows, V);
        ctx.set_loss(loss);
        Tensor out = ctx.alloc(Shape{1});
        *out.data<float>() = loss;
        return out;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dloss) {
        auto& saved = ctx.saved<Saved>(this);
        const std::int64_t V = saved.logits.dim(-1), rows = saved.logits.numel() / V;
        Tensor dlogits = ctx.alloc(saved.logits.shape());
        kernels::host::cross_entropy_backward(saved.logits.data<float>(), ctx.targets().data<std::int32_t>(),
                                              saved.logsumexp.data<float>(), *dloss.data<float>(), dlogits.data<float>(),
                                              rows, V);
        return dlogits;
    }
};

}  // namespace loom::nn
