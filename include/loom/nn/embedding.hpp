// Embedding: token ids [B, T] (i32) -> token vectors + learned position
// vectors, [B, T, C]. The first layer of a language model: its input has no
// gradient, so backward_input returns an empty tensor.
#pragma once

#include <cstdint>

#include "loom/core/error.hpp"
#include "loom/core/param.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/embedding.hpp"
#include "loom/nn/context.hpp"

namespace loom::nn {

struct Embedding {
    Param token;     // [vocab, C]
    Param position;  // [max sequence, C]

    [[nodiscard]] static Embedding make(std::int64_t vocab, std::int64_t max_sequence, std::int64_t width,
                                        float std = 0.02f) {
        LOOM_CHECK(vocab >= 1 && max_sequence >= 1 && width >= 1, "Embedding: vocab ", vocab, ", sequence ",
                   max_sequence, ", width ", width, "; all must be at least 1");
        return Embedding{Param{Shape{vocab, width}, Init::normal(std)},
                         Param{Shape{max_sequence, width}, Init::normal(std)}};
    }

    [[nodiscard]] std::int64_t vocab() const { return token.shape.dim(0); }
    [[nodiscard]] std::int64_t max_sequence() const { return position.shape.dim(0); }
    [[nodiscard]] std::int64_t width() const { return token.shape.dim(1); }

    struct Saved {
        Tensor tokens, dy;
    };

    [[nodiscard]] Tensor forward(Context& ctx, const Tensor& tokens) {
        LOOM_CHECK(tokens.rank() == 2 && tokens.dtype() == DType::i32, "Embedding: tokens must be i32 [batch, sequence], got ",
                   tokens.dtype(), " ", tokens.shape());
        const std::int64_t B = tokens.dim(0), T = tokens.dim(1);
        LOOM_CHECK(T <= max_sequence(), "Embedding: sequence of ", T, " tokens is longer than the ", max_sequence(),
                   " positions the model has");
        ctx.saved<Saved>(this).tokens = tokens;
        Tensor y = ctx.alloc(Shape{B, T, width()});
        kernels::host::embedding_forward(tokens.data<std::int32_t>(), token.value.data<float>(),
                                         position.value.data<float>(), y.data<float>(), B, T, width(), vocab());
        return y;
    }

    [[nodiscard]] Tensor backward_input(Context& ctx, const Tensor& dy) {
        ctx.saved<Saved>(this).dy = dy;
        return Tensor();
    }

    void backward_weight(Context& ctx) {
        auto& saved = ctx.saved<Saved>(this);
        kernels::host::embedding_backward(saved.tokens.data<std::int32_t>(), saved.dy.data<float>(),
                                          token.grad.data<float>(), position.grad.data<float>(), saved.tokens.dim(0),
                                          saved.tokens.dim(1), width());
    }
};

}  // namespace loom::nn
