// A user's model for the inference tests, on every transport (rank threads in
// tests/infer, processes in tests/mpi): post-LN blocks in a std::array, a
// per-token layer of the user's own (softsign), three attention layers,
// with or without its loss; random weights scaled up so that greedy choices
// are clear-cut, whole or as a tp rank's Megatron cut of the same values.
// Test code only.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/tensor.hpp"
#include "loom/infer/cached_model.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pipeline_parallel_gpt.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/layernorm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/nn/residual.hpp"
#include "loom/nn/tensor_cut.hpp"
#include "loom/parallel/tensor_parallel_model.hpp"
#include "support/scaled_gpt.hpp"

namespace loom_test::user_model {

namespace nn = loom::nn;
using loom::Tensor;
using loom::infer::Request;

// The user's own layer: softsign, y = x / (1 + |x|), row by row. It says it acts per token.
// Under Megatron 1D it runs on a column-cut Linear's slice of the features (elementwise).
struct Softsign {
    static constexpr bool per_token = true;
    static constexpr nn::TensorCut tensor_cut = nn::TensorCut::elementwise;
    struct Saved {
        Tensor x;
    };
    [[nodiscard]] Tensor forward(nn::Context& ctx, const Tensor& x) {
        ctx.saved<Saved>(this).x = x;
        Tensor y = ctx.alloc(x.shape());
        const float* in = x.data<float>();
        float* out = y.data<float>();
        for (std::int64_t i = 0; i < x.numel(); ++i) out[i] = in[i] / (1.0f + std::abs(in[i]));
        return y;
    }
    [[nodiscard]] Tensor backward_input(nn::Context& ctx, const Tensor& dy) {
        const Tensor& x = ctx.saved<Saved>(this).x;
        Tensor dx = ctx.alloc(dy.shape());
        for (std::int64_t i = 0; i < dy.numel(); ++i) {
            const float d = 1.0f + std::abs(x.data<float>()[i]);
            dx.data<float>()[i] = dy.data<float>()[i] / (d * d);
        }
        return dx;
    }
};

struct PostNormBlock {
    nn::Residual<nn::CausalSelfAttention> attention;  // post-LN: the norm comes after the sum
    nn::LayerNorm norm1;
    nn::Residual<nn::Linear, Softsign, nn::Linear> mlp;
    nn::LayerNorm norm2;
};

struct UserLm {
    nn::Embedding embed;
    std::array<PostNormBlock, 2> blocks;
    nn::Residual<nn::LayerNorm, nn::CausalSelfAttention> last;  // a third attention, pre-LN
    nn::LayerNorm norm;
    nn::Linear head;
};

inline constexpr std::int64_t V = 40, T = 28, C = 24, heads = 4;

inline PostNormBlock post_norm_block() {
    return {{{nn::CausalSelfAttention::make(C, heads)}},
            nn::LayerNorm::make(C),
            {{nn::Linear::make(C, 2 * C), Softsign{}, nn::Linear::make(2 * C, C)}},
            nn::LayerNorm::make(C)};
}

// The same with its loss, as it trains: under Megatron 1D the head before the loss is cut by vocabulary.
struct UserLmWithLoss {
    nn::Embedding embed;
    std::array<PostNormBlock, 2> blocks;
    nn::Residual<nn::LayerNorm, nn::CausalSelfAttention> last;
    nn::LayerNorm norm;
    nn::Linear head;
    nn::CrossEntropy loss;
};

template <class Lm>
Lm make_user_lm() {
    Lm model{};
    model.embed = nn::Embedding::make(V, T, C);
    model.blocks = {post_norm_block(), post_norm_block()};
    model.last = {{nn::LayerNorm::make(C), nn::CausalSelfAttention::make(C, heads)}};
    model.norm = nn::LayerNorm::make(C);
    model.head = nn::Linear::make(C, V);
    return model;
}

// Random weights scaled up (as support/scaled_gpt.hpp does), so greedy choices are clear-cut;
// with a tp rank, its Megatron cut (tp::shard_model) of the same values.
template <class Lm = UserLm>
struct ScaledUserLm {
    Lm model;
    nn::ParamArena arena;
    explicit ScaledUserLm(std::uint64_t seed, int rank = 0, int degree = 1)
        : model(cut(rank, degree)), arena(model) {
        arena.initialize(model, seed);
        for (float& v : arena.values()) v *= 6.0f;
    }
    static Lm cut(int rank, int degree) {
        Lm lm = make_user_lm<Lm>();
        if (degree > 1) (void)loom::tp::shard_model(lm, rank, degree);
        return lm;
    }
};


inline Request request(std::vector<std::int32_t> prompt, std::int64_t new_tokens, bool greedy) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = new_tokens;
    r.sampling.greedy = greedy;
    return r;
}

// Greedy and sampled requests of mixed lengths, for 2 slots.
inline std::vector<loom::infer::Request> mixed_requests() {
    std::vector<loom::infer::Request> requests;
    for (std::int32_t i = 0; i < 5; ++i)
        requests.push_back(request(prompt_of(3 + 3 * i, static_cast<std::int32_t>(V), i), 9 - i, i % 2 == 0));
    return requests;
}

// mixed_requests() on the whole model (its loss skipped), 2 slots.
inline std::vector<loom::infer::Completion> serve_whole(ScaledUserLm<UserLmWithLoss>& whole) {
    loom::infer::KvCache cache(3, C, 2, T, 4);
    loom::infer::CachedModel<UserLmWithLoss> engine(whole.model, cache);
    return loom::infer::generate(engine, mixed_requests());
}

// mixed_requests() on this rank's cut of the model with loss (seed 12), tp = tp.size().
inline std::vector<loom::infer::Completion> serve_on(loom::comm::AnyComm& tp) {
    ScaledUserLm<UserLmWithLoss> shard(12, tp.rank(), tp.size());
    loom::infer::KvCache cache(3, C / tp.size(), 2, T, 4);
    loom::infer::CachedModel<UserLmWithLoss> engine(shard.model, cache, tp);
    return loom::infer::generate(engine, mixed_requests());
}

// mixed_requests() on this rank's tp cut (tp::shard_model) of its pipeline stage of the model with
// loss (seed 12), pp = pp.size() and tp = tp.size(); `max_batch` slots.
inline std::vector<loom::infer::Completion> serve_pipelined_tp_on(loom::comm::AnyComm& pp, loom::comm::AnyComm& tp,
                                                                  std::int64_t max_batch = 2) {
    ScaledUserLm<UserLmWithLoss> shard(12, tp.rank(), tp.size());
    const loom::infer::ModelStage where = loom::infer::model_stage(shard.model, pp.rank(), pp.size());
    auto stage = ScaledUserLm<UserLmWithLoss>::cut(tp.rank(), tp.size());
    loom::infer::drop_other_stages(stage, where);
    nn::ParamArena arena(stage);
    loom::infer::copy_stage_values(stage, shard.model);
    loom::infer::KvCache cache(where.where.count, C / tp.size(), max_batch, T, 4);
    loom::infer::CachedModel<UserLmWithLoss> engine(stage, cache, where, tp);
    return loom::infer::generate_pipelined(engine, pp, mixed_requests());
}

// mixed_requests() on this rank's stage of the model with loss (seed 12), pp = pp.size(): the stage's
// Params only (drop_other_stages), copied from the whole model; `max_batch` slots.
inline std::vector<loom::infer::Completion> serve_pipelined_on(loom::comm::AnyComm& pp, std::int64_t max_batch = 2,
                                                               const loom::infer::PipelineOptions& options = {}) {
    ScaledUserLm<UserLmWithLoss> whole(12);
    const loom::infer::ModelStage where = loom::infer::model_stage(whole.model, pp.rank(), pp.size());
    auto stage = make_user_lm<UserLmWithLoss>();
    loom::infer::drop_other_stages(stage, where);
    nn::ParamArena arena(stage);
    loom::infer::copy_stage_values(stage, whole.model);
    loom::infer::KvCache cache(where.where.count, C, max_batch, T, 4);
    loom::infer::CachedModel<UserLmWithLoss> engine(stage, cache, where);
    return loom::infer::generate_pipelined(engine, pp, mixed_requests(), options);
}

}  // namespace loom_test::user_model
