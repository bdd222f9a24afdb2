// The Kraken GPT (gpt/kraken.hpp) run forward with a KV cache, whole on one
// rank or over a tensor-parallel group of t ranks, each holding N / t of
// every layer's N sub-layers (kraken_serving_shard) and their keys and
// values only. Segments, packing and attention over the cache's pages are
// CachedGpt's (infer/cached_gpt.hpp, the same helpers of
// infer/cached_rows.hpp and infer/segment_attention.hpp); only the layer
// differs. It is an infer::StageEngine, so Batcher and generate() serve it,
// and so does the non-blocking pipeline (infer/pipelined_batcher.hpp): a
// stage holds a run of layers (kraken_stage_model), takes the stage
// before's state rows (the reduced stream h and this rank's local streams,
// [h | local_0 | ...] per token) and passes its own on.
//
// Kraken's overlap: per layer, one all-reduce of the rank's summed sub-layer
// outputs, issued asynchronously (AnyComm::all_reduce_async) as soon as the
// layer's MLPs are done. The next layer's attention reads only the rank's
// local streams (residual + own sub-layer output, before the sum), so it runs
// while the all-reduce is in flight; the rank waits for the sum only before
// that layer's MLPs, which read the reduced stream. On one rank the
// sub-layers run in turn and the sum is a local add.
//
// Every rank's logits are the same bits (the reduced stream is, and the head
// is replicated), so ranks given the same segments pick the same tokens.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/error.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/tensor.hpp"
#include "loom/gpt/kraken.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/cached_rows.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pipeline_stage.hpp"
#include "loom/infer/segment_attention.hpp"
#include "loom/infer/stage_engine.hpp"
#include "loom/kernels/ops.hpp"

namespace loom::infer {

// Rank `rank` of `degree`'s serving shard: every layer keeps sub-layers
// [rank N / degree, (rank + 1) N / degree) only. Bind it to a ParamArena,
// then load_kraken_shard.
[[nodiscard]] inline gpt::KrakenModel kraken_serving_shard(const gpt::KrakenConfig& config, int rank, int degree) {
    LOOM_CHECK(degree >= 1 && config.degree % degree == 0, "kraken_serving_shard: a tp group of ", degree,
               " ranks does not divide the ", config.degree, " sub-layers per layer; use a divisor of ", config.degree);
    LOOM_CHECK(rank >= 0 && rank < degree, "kraken_serving_shard: rank ", rank, " is not in [0, ", degree, ")");
    gpt::KrakenModel model = gpt::make_kraken(config);
    const std::int64_t per = config.degree / degree, first = rank * per;
    for (gpt::KrakenLayer& layer : model.layers)
        layer.subs = std::vector<gpt::KrakenSubLayer>(layer.subs.begin() + first, layer.subs.begin() + first + per);
    return model;
}

// Stage `where`'s part of rank `rank`'s serving shard: the stage's layers
// only, and the embeddings and the final LayerNorm and head only where the
// stage uses them (elsewhere Params of no elements, so the stage's arena
// holds its own weights). Bind it, then load_kraken_shard with `where`.
[[nodiscard]] inline gpt::KrakenModel kraken_stage_model(const gpt::KrakenConfig& config, const PipelineStage& where,
                                                         int rank = 0, int degree = 1) {
    gpt::KrakenModel model = kraken_serving_shard(config, rank, degree);
    LOOM_CHECK(where.count >= 1 && where.first >= 0 && where.first + where.count <= config.layers,
               "kraken_stage_model: layers [", where.first, ", ", where.first + where.count,
               ") are not in the model's ", config.layers,
               "; build the stage with pipeline_stage(config.gpt(), stage, stages)");
    model.layers = std::vector<gpt::KrakenLayer>(model.layers.begin() + where.first,
                                                 model.layers.begin() + where.first + where.count);
    const auto drop = [](auto& layer) {
        reflect::visit_params(layer, [](Param& p, std::string_view) { p = Param{Shape{0}}; });
    };
    if (!where.embeds()) drop(model.embed);
    if (!where.has_head()) {
        drop(model.ln_f);
        drop(model.head);
    }
    return model;
}

// Loads the whole model's values (its ParamArena's, serial order) into rank
// `rank`'s bound shard: the shared layers whole, its own sub-layers only;
// with `where`, a stage's shard (kraken_stage_model): its layers, and the
// embeddings and head where it holds them.
inline void load_kraken_shard(gpt::KrakenModel& shard, const gpt::KrakenConfig& config, int rank,
                              std::span<const float> whole, const PipelineStage& where = {}) {
    LOOM_CHECK(static_cast<std::int64_t>(whole.size()) == config.parameters(), "load_kraken_shard: ", whole.size(),
               " values given but the whole model has ", config.parameters(),
               "; give the whole model's values in serial order");
    const PipelineStage stage = where.count == 0 ? PipelineStage{0, 1, 0, config.layers} : where;
    LOOM_CHECK(static_cast<std::int64_t>(shard.layers.size()) == stage.count, "load_kraken_shard: the shard has ",
               shard.layers.size(), " layers but the stage holds ", stage.count,
               "; build it with kraken_stage_model for the same stage");
    const gpt::KrakenModel sizes = gpt::make_kraken(config);  // unbound: the whole model's shapes only
    std::int64_t offset = 0;
    const auto take = [&](auto& layer) {
        reflect::visit_params(layer, [&](Param& p, std::string_view path) {
            LOOM_CHECK(p.bound(), "load_kraken_shard: parameter ", path,
                       " is not bound; bind the shard to a ParamArena first");
            if (p.numel() > 0) std::copy_n(whole.data() + offset, p.numel(), p.value.data<float>());
            offset += p.numel();
        });
    };
    // A part another stage holds: its values in the whole model are passed over.
    const auto skip = [&](const auto& whole_layer) { offset += reflect::parameter_numel(whole_layer); };
    const auto per = static_cast<std::int64_t>(shard.layers.front().subs.size());
    const std::int64_t sub_numel = reflect::parameter_numel(sizes.layers.front().subs.front());
    if (stage.embeds())
        take(shard.embed);
    else
        skip(sizes.embed);
    for (std::int64_t l = 0; l < config.layers; ++l) {
        if (l < stage.first || l >= stage.first + stage.count) {
            skip(sizes.layers[static_cast<std::size_t>(l)]);
            continue;
        }
        offset += rank * per * sub_numel;
        for (gpt::KrakenSubLayer& sub : shard.layers[static_cast<std::size_t>(l - stage.first)].subs) take(sub);
        offset += (config.degree - (rank + 1) * per) * sub_numel;
    }
    if (stage.has_head()) {
        take(shard.ln_f);
        take(shard.head);
    } else {
        skip(sizes.ln_f);
        skip(sizes.head);
    }
}

// A rank's KV cache: one cache layer per (layer, sub-layer it holds), each
// of the sub-layer's heads / N heads (width C / N).
[[nodiscard]] inline KvCache kraken_cache(const gpt::KrakenConfig& config, int degree, std::int64_t slots,
                                          std::int64_t capacity, std::int64_t block_size = 16) {
    return {config.layers * (config.degree / degree), config.width / config.degree, slots, capacity, block_size};
}
// A pipeline stage's: its layers only.
[[nodiscard]] inline KvCache kraken_cache(const gpt::KrakenConfig& config, const PipelineStage& where, int degree,
                                          std::int64_t slots, std::int64_t capacity, std::int64_t block_size = 16) {
    return {where.count * (config.degree / degree), config.width / config.degree, slots, capacity, block_size};
}

class CachedKraken final : public StageEngine {
public:
    // The whole model (every sub-layer) on this rank.
    CachedKraken(gpt::KrakenModel& model, const gpt::KrakenConfig& config, KvCache& cache)
        : CachedKraken(model, config, cache, nullptr, whole_stage(config)) {}
    // Rank tp.rank()'s shard (kraken_serving_shard, bound and loaded); forward()
    // is collective over `tp`. `overlap` false waits for each all-reduce at
    // once (the baseline the overlap is measured against).
    CachedKraken(gpt::KrakenModel& shard, const gpt::KrakenConfig& config, KvCache& cache, comm::AnyComm& tp,
                 bool overlap = true)
        : CachedKraken(shard, config, cache, &tp, whole_stage(config)) {
        overlap_ = overlap;
    }
    // Pipeline-parallel: stage `where`'s model (kraken_stage_model, bound and
    // loaded with load_kraken_shard for the stage), `cache` for its layers
    // (kraken_cache with `where`); run it with forward_stage (through
    // generate_pipelined or a PipelinedBatcher). With `tp`, rank tp.rank()'s
    // shard of the stage (tp x pp).
    CachedKraken(gpt::KrakenModel& stage_model, const gpt::KrakenConfig& config, KvCache& cache,
                 const PipelineStage& where)
        : CachedKraken(stage_model, config, cache, nullptr, where) {}
    CachedKraken(gpt::KrakenModel& stage_shard, const gpt::KrakenConfig& config, KvCache& cache, comm::AnyComm& tp,
                 const PipelineStage& where, bool overlap = true)
        : CachedKraken(stage_shard, config, cache, &tp, where) {
        overlap_ = overlap;
    }

    [[nodiscard]] const gpt::KrakenConfig& config() const noexcept { return config_; }
    [[nodiscard]] KvCache& cache() noexcept override { return cache_; }
    [[nodiscard]] std::int64_t vocab() const noexcept override { return config_.vocab; }
    [[nodiscard]] const PipelineStage& stage() const noexcept override { return stage_; }
    // A token's state between stages: the reduced stream and this rank's local streams.
    [[nodiscard]] std::int64_t hidden_width() const noexcept override { return (1 + subs_) * config_.width; }
    // Seconds this rank spent waiting for all-reduces (what the overlap did not hide).
    [[nodiscard]] double seconds_waiting() const noexcept { return waiting_; }

    // As CachedGpt::forward: runs the segments, caches their keys and values,
    // returns the logits of each segment's last token (or of every token).
    std::span<const float> forward(std::span<const Segment> segments, Logits which = Logits::last) override {
        return forward_whole("CachedKraken", segments, which);
    }

    using StageEngine::forward_stage;
    std::span<const float> forward_stage(std::span<const Segment> segments, std::span<const float> hidden,
                                         Logits which) override {
        check(segments);
        const std::int64_t C = config_.width;
        std::int64_t rows = 0;
        starts_.clear();
        for (const Segment& s : segments) {
            starts_.push_back(cache_.length(s.slot));
            rows += static_cast<std::int64_t>(s.tokens.size());
        }
        check_hidden("CachedKraken", hidden.size(), rows);
        for (const Segment& s : segments) cache_.reserve(s.slot, static_cast<std::int64_t>(s.tokens.size()));
        resize(rows);
        if (stage_.embeds()) {
            embed(segments);
            for (std::int64_t k = 0; k < subs_; ++k) std::copy_n(h_.data(), rows * C, local(k));
        } else {
            unpack_state(hidden, rows);
        }
        comm::Request pending;
        bool in_flight = false;
        for (std::int64_t l = 0; l < stage_.count; ++l) {
            // The attention of every sub-layer first: it reads the local streams
            // only, so the previous layer's all-reduce is still running.
            for (std::int64_t k = 0; k < subs_; ++k) attention(l, k, segments, rows);
            if (in_flight) finish_sum(pending, rows);
            in_flight = false;
            mlps(l, rows);
            if (tp_ == nullptr) {
                add_rows(h_.data(), partial_.data(), rows * C);
                continue;
            }
            const Tensor partial = host_rows(partial_.data(), rows * C);
            pending = tp_->all_reduce_async(partial, host_rows(reduced_.data(), rows * C), comm::ReduceOp::sum);
            in_flight = overlap_;
            if (!overlap_) finish_sum(pending, rows);
        }
        if (in_flight) finish_sum(pending, rows);
        if (!stage_.has_head()) return pack_state(rows);
        const std::int64_t n = which == Logits::every ? rows : static_cast<std::int64_t>(segments.size());
        last_.resize(static_cast<std::size_t>(n * C));
        if (which == Logits::every) {
            std::copy_n(h_.data(), rows * C, last_.data());
        } else {
            std::int64_t row = 0;
            for (std::int64_t i = 0; i < n; ++i) {
                row += static_cast<std::int64_t>(segments[static_cast<std::size_t>(i)].tokens.size());
                std::copy_n(h_.data() + (row - 1) * C, C, last_.data() + i * C);
            }
        }
        normed_.resize(std::max(normed_.size(), last_.size()));
        layernorm_rows(model_.ln_f, last_.data(), normed_.data(), n, mean_.data(), rstd_.data());
        logits_.resize(static_cast<std::size_t>(n * config_.vocab));
        const nn::Linear& head = model_.head;
        matmul_rows(normed_.data(), head.weight.value.data<float>(),
                    head.has_bias() ? head.bias.value.data<float>() : nullptr, logits_.data(), n, C, config_.vocab);
        return logits_;
    }

    std::span<const float> prefill(std::int64_t slot, std::span<const std::int32_t> prompt) {
        const Segment segment{slot, prompt};
        return forward(std::span(&segment, 1));
    }

private:
    [[nodiscard]] static PipelineStage whole_stage(const gpt::KrakenConfig& config) {
        return {0, 1, 0, config.layers};
    }

    CachedKraken(gpt::KrakenModel& model, const gpt::KrakenConfig& config, KvCache& cache, comm::AnyComm* tp,
                 const PipelineStage& where)
        : model_(model), config_(config), cache_(cache), tp_(tp), stage_(where) {
        config.validate();
        LOOM_CHECK(static_cast<std::int64_t>(model.layers.size()) == where.count && !model.layers.empty(),
                   "CachedKraken: the model has ", model.layers.size(), " layers but ",
                   where.whole() ? loom::detail::concat("the config says ", config.layers)
                                 : loom::detail::concat("pipeline stage ", where.stage, " of ", where.stages,
                                                        " holds ", where.count,
                                                        "; build it with kraken_stage_model for that stage"));
        LOOM_CHECK((!where.embeds() || model.embed.token.bound()) && (!where.has_head() || model.head.weight.bound()) &&
                       model.layers.front().subs.front().attention.ln.gain.bound(),
                   "CachedKraken: the model's parameters are not bound; give the model a ParamArena (and load or "
                   "initialise it) first");
        const int degree = tp == nullptr ? 1 : tp->size();
        subs_ = static_cast<std::int64_t>(model.layers.front().subs.size());
        LOOM_CHECK(subs_ * degree == config.degree, "CachedKraken: this rank holds ", subs_,
                   " sub-layers per layer but a tp group of ", degree, " needs ", config.degree / degree,
                   " of the ", config.degree, "; build it with kraken_serving_shard(config, rank, ", degree, ")");
        width_ = config.width / config.degree;
        heads_ = config.heads / config.degree;
        LOOM_CHECK(cache.layers() == where.count * subs_ && cache.width() == width_, "CachedKraken: the cache is for ",
                   cache.layers(), " layers of width ", cache.width(), " but this rank needs ", where.count * subs_,
                   " of width ", width_, "; build it with kraken_cache(config, ",
                   where.whole() ? "" : "where, ", degree, ", ...)");
        LOOM_CHECK(cache.capacity() <= config.seq, "CachedKraken: the cache holds ", cache.capacity(),
                   " positions per slot but the model has position embeddings for ", config.seq);
    }

    void check(std::span<const Segment> segments) {
        check_segments("CachedKraken", cache_, segments, config_.vocab, seen_, depths_);
    }

    void resize(std::int64_t rows) {
        const auto C = static_cast<std::size_t>(config_.width), r = static_cast<std::size_t>(rows);
        const auto local_width = static_cast<std::size_t>(width_), subs = static_cast<std::size_t>(subs_);
        h_.resize(r * C);
        locals_.resize(subs * r * C);
        attended_branch_.resize(subs * r * C);
        partial_.resize(r * C);
        reduced_.resize(r * C);
        normed_.resize(r * C);
        u_.resize(r * C);
        branch_.resize(r * C);
        qkv_.resize(r * 3 * local_width);
        attended_.resize(r * local_width);
        hidden_.resize(r * 4 * local_width);
        activated_.resize(r * 4 * local_width);
        mean_.resize(r);
        rstd_.resize(r);
        rows_ = rows;
    }

    [[nodiscard]] float* local(std::int64_t k) { return locals_.data() + k * rows_ * config_.width; }
    [[nodiscard]] float* attention_out(std::int64_t k) { return attended_branch_.data() + k * rows_ * config_.width; }

    void embed(std::span<const Segment> segments) {
        embed_rows(model_.embed, segments, starts_, depths_, h_.data());
    }

    // a_k = Attention_k(LN1_k(local_k)) into attention_out(k); keys and values to cache layer l * subs + k.
    void attention(std::int64_t l, std::int64_t k, std::span<const Segment> segments, std::int64_t rows) {
        gpt::KrakenSubLayer& sub = model_.layers[static_cast<std::size_t>(l)].subs[static_cast<std::size_t>(k)];
        layernorm_rows(sub.attention.ln, local(k), normed_.data(), rows, mean_.data(), rstd_.data());
        linear(sub.attention.attn.qkv, normed_.data(), qkv_.data(), rows);
        const std::int64_t W = width_, cache_layer = l * subs_ + k;
        attention_.run(cache_, cache_layer, segments, starts_, qkv_.data(), 3 * W, heads_, W / heads_,
                           attended_.data(), nullptr);
        linear(sub.attention.attn.proj, attended_.data(), attention_out(k), rows);
    }

    // Per sub-layer: m_k = Mlp_k(LN2_k(h + a_k)), o_k = a_k + m_k, local_k = h + o_k;
    // partial_ = sum of this rank's o_k (the all-reduce's input).
    void mlps(std::int64_t l, std::int64_t rows) {
        const std::int64_t C = config_.width, n = rows * C, hidden = 4 * width_;
        std::fill_n(partial_.data(), n, 0.0f);
        for (std::int64_t k = 0; k < subs_; ++k) {
            gpt::KrakenMlp& mlp = model_.layers[static_cast<std::size_t>(l)].subs[static_cast<std::size_t>(k)].mlp;
            float* a = attention_out(k);
            kernels::add(host_rows(h_.data(), n), host_rows(a, n), host_rows(u_.data(), n));
            layernorm_rows(mlp.ln, u_.data(), normed_.data(), rows, mean_.data(), rstd_.data());
            linear(mlp.fc, normed_.data(), hidden_.data(), rows);
            kernels::gelu_forward(host_rows(hidden_.data(), rows * hidden), host_rows(activated_.data(), rows * hidden));
            linear(mlp.proj, activated_.data(), branch_.data(), rows);
            add_rows(a, branch_.data(), n);  // o_k, in place of a_k
            kernels::add(host_rows(h_.data(), n), host_rows(a, n), host_rows(local(k), n));
            add_rows(partial_.data(), a, n);
        }
    }

    // The stage before's state rows [h | local_0 | ...] per token into h_ and the local streams.
    void unpack_state(std::span<const float> hidden, std::int64_t rows) {
        const std::int64_t C = config_.width, width = hidden_width();
        for (std::int64_t r = 0; r < rows; ++r) {
            const float* row = hidden.data() + r * width;
            std::copy_n(row, C, h_.data() + r * C);
            for (std::int64_t k = 0; k < subs_; ++k) std::copy_n(row + (1 + k) * C, C, local(k) + r * C);
        }
    }

    // This stage's state rows for the next stage, as unpack_state reads them.
    std::span<const float> pack_state(std::int64_t rows) {
        const std::int64_t C = config_.width, width = hidden_width();
        state_.resize(static_cast<std::size_t>(rows * width));
        for (std::int64_t r = 0; r < rows; ++r) {
            float* row = state_.data() + r * width;
            std::copy_n(h_.data() + r * C, C, row);
            for (std::int64_t k = 0; k < subs_; ++k) std::copy_n(local(k) + r * C, C, row + (1 + k) * C);
        }
        return state_;
    }

    // The previous layer's sum has arrived: h += it.
    void finish_sum(comm::Request& pending, std::int64_t rows) {
        const auto began = std::chrono::steady_clock::now();
        pending.wait();
        waiting_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
        add_rows(h_.data(), reduced_.data(), rows * config_.width);
    }

    static void linear(const nn::Linear& layer, const float* in, float* out, std::int64_t rows) {
        matmul_rows(in, layer.weight.value.data<float>(), layer.has_bias() ? layer.bias.value.data<float>() : nullptr,
                    out, rows, layer.in(), layer.out());
    }

    gpt::KrakenModel& model_;
    gpt::KrakenConfig config_;
    KvCache& cache_;
    comm::AnyComm* tp_ = nullptr;  // null: every sub-layer here, no communication
    bool overlap_ = true;
    PipelineStage stage_;  // the layers this engine holds: all of them but on a pipeline stage
    std::int64_t subs_ = 0, width_ = 0, heads_ = 0, rows_ = 0;  // per rank: sub-layers; per sub-layer: width, heads
    double waiting_ = 0;
    std::vector<std::int64_t> starts_;
    std::vector<bool> seen_;
    std::vector<std::int64_t> depths_;  // check_segments' scratch
    SegmentAttention attention_;
    std::vector<float> h_, locals_, attended_branch_, partial_, reduced_, normed_, u_, branch_, qkv_, attended_,
        hidden_, activated_, mean_, rstd_, last_, logits_, state_;
};

}  // namespace loom::infer
