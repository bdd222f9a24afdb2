// GliDe's draft (gpt/glide_draft.hpp) run forward with KV caches, as a draft
// for speculative decoding (infer/draft_engine.hpp). Its self-attention reads
// and appends to its own KvCache, as CachedGpt's does; its cross-attention
// reads the TARGET's KvCache: draft block i the rows of target layer
// L_target - L_draft + i, every position the target has cached for the
// request's slot (no mask: in a speculative round that is the target's cache
// up to the last verified token, the stale cache the training mask imitates).
// The target's cache is only read. Segments are chains of one slot each
// (the same slot in both caches), packed as CachedGpt packs them: the
// LayerNorms, Linears and GELUs run once over every segment's rows; attention
// is per segment. A slot the target has cached nothing for (a one-token
// prompt's first round) gets a zero cross-attention output, as training's
// first stale block does.
//
// The arithmetic is the training layers' at f32: the self-attention is
// CachedGpt's (infer/segment_attention.hpp: the FlashAttention block kernels,
// new tokens causal among themselves, then each cached block in full, merged
// by log-sum-exp; a decode step's few rows straight over the pages), the
// cross-attention nn::cross_attend_row over the target's rows gathered from
// its pages.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/gpt/glide_draft.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/cached_rows.hpp"
#include "loom/infer/draft_engine.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/segment_attention.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/cross_attention.hpp"

namespace loom::infer {

class CachedGlide final : public DraftEngine {
public:
    // `model` bound on the host, of `config`'s shape; `cache` its own (config's
    // layers and width); `target_cache` the target's (only read). Referenced, not copied.
    CachedGlide(gpt::GlideDraft& model, const gpt::Config& config, KvCache& cache, KvCache& target_cache)
        : model_(model), config_(config), cache_(cache), target_cache_(target_cache) {
        config.validate();
        LOOM_CHECK(static_cast<std::int64_t>(model.blocks.size()) == config.layers, "CachedGlide: the draft has ",
                   model.blocks.size(), " blocks but the config says ", config.layers, " layers");
        LOOM_CHECK(model.embed.token.bound() && model.head.weight.bound(),
                   "CachedGlide: the draft's parameters are not bound; give it a ParamArena (and load or "
                   "initialise it) first");
        LOOM_CHECK(model.head.weight.value.device().kind == DeviceKind::host,
                   "CachedGlide: the draft's parameters live on a device; this engine runs on the host");
        LOOM_CHECK(cache.layers() == config.layers && cache.width() == config.width, "CachedGlide: the draft's cache "
                   "is for ", cache.layers(), " layers of width ", cache.width(), " but the draft has ", config.layers,
                   " of width ", config.width);
        LOOM_CHECK(cache.capacity() <= config.seq, "CachedGlide: the draft's cache holds ", cache.capacity(),
                   " positions per slot but the draft has position embeddings for ", config.seq,
                   "; build the cache with capacity <= Config::seq");
        LOOM_CHECK(&cache != &target_cache, "CachedGlide: the draft's cache is the target's; give the draft its own");
        LOOM_CHECK(target_cache.layers() == model.target_layers &&
                       target_cache.width() == model.cross_attention(0).memory_width(),
                   "CachedGlide: the target's cache is for ", target_cache.layers(), " layers of width ",
                   target_cache.width(), " but the draft was made for a target of ", model.target_layers,
                   " layers of width ", model.cross_attention(0).memory_width());
        LOOM_CHECK(target_cache.slots() >= cache.slots(), "CachedGlide: the draft's cache has ", cache.slots(),
                   " slots but the target's only ", target_cache.slots(), "; a request has the same slot in both");
    }

    [[nodiscard]] const gpt::Config& config() const { return config_; }
    [[nodiscard]] std::int64_t vocab() const override { return config_.vocab; }
    [[nodiscard]] KvCache& cache() override { return cache_; }
    [[nodiscard]] const KvCache* reads() const override { return &target_cache_; }

    std::span<const float> forward(std::span<const Segment> segments) override {
        check_segments("CachedGlide", cache_, segments, config_.vocab, seen_, depths_);
        std::int64_t rows = 0;
        for (const Segment& s : segments) {
            LOOM_CHECK(s.parents.empty(), "CachedGlide: the segment of slot ", s.slot,
                       " is a tree; a draft runs chains of at least one token");
            rows += static_cast<std::int64_t>(s.tokens.size());
        }
        starts_.clear();
        for (const Segment& s : segments) {
            starts_.push_back(cache_.length(s.slot));
            cache_.reserve(s.slot, static_cast<std::int64_t>(s.tokens.size()));
        }
        resize(rows);
        embed(segments);
        for (std::size_t l = 0; l < model_.blocks.size(); ++l) block(l, segments, rows);
        // Each segment's last row through ln_f and the head.
        const std::int64_t C = config_.width, n = static_cast<std::int64_t>(segments.size());
        last_.resize(static_cast<std::size_t>(n * C));
        std::int64_t row = 0;
        for (std::int64_t i = 0; i < n; ++i) {
            row += static_cast<std::int64_t>(segments[static_cast<std::size_t>(i)].tokens.size());
            std::memcpy(last_.data() + i * C, x_.data() + (row - 1) * C, static_cast<std::size_t>(C) * sizeof(float));
        }
        normed_.resize(last_.size());
        layernorm(model_.ln_f, last_.data(), normed_.data(), n);
        logits_.resize(static_cast<std::size_t>(n * config_.vocab));
        linear(model_.head, normed_.data(), logits_.data(), n);
        return logits_;
    }

private:
    struct CrossScratch {  // a part's gathered target positions and score row
        std::vector<float> memory, scores;
    };

    void resize(std::int64_t rows) {
        const auto C = static_cast<std::size_t>(config_.width), r = static_cast<std::size_t>(rows);
        const auto M = static_cast<std::size_t>(target_cache_.width());
        x_.resize(r * C);
        normed_.resize(r * C);
        qkv_.resize(r * 3 * C);
        attended_.resize(r * std::max(C, M));
        query_.resize(r * M);
        branch_.resize(r * C);
        hidden_.resize(r * 4 * C);
        activated_.resize(r * 4 * C);
        mean_.resize(r);
        rstd_.resize(r);
        lse_.resize(r * static_cast<std::size_t>(model_.cross_attention(0).heads));  // cross_attend_row's
    }

    void embed(std::span<const Segment> segments) {
        embed_rows(model_.embed, segments, starts_, depths_, x_.data());
    }

    void block(std::size_t l, std::span<const Segment> segments, std::int64_t rows) {
        const std::int64_t C = config_.width;
        gpt::GlideBlock& b = model_.blocks[l];
        // Self-attention over the draft's own cache.
        auto& attention = std::get<1>(b.attn.layers);
        layernorm(std::get<0>(b.attn.layers), x_.data(), normed_.data(), rows);
        linear(attention.qkv, normed_.data(), qkv_.data(), rows);
        // CachedGpt's chain attention (infer/segment_attention.hpp); the K/V go to the draft's cache.
        attention_.run(cache_, static_cast<std::int64_t>(l), segments, starts_, qkv_.data(), 3 * C, config_.heads,
                           C / config_.heads, attended_.data(), nullptr);
        linear(attention.proj, attended_.data(), branch_.data(), rows);
        add_rows(x_.data(), branch_.data(), rows * C);
        // Cross-attention over the target's cache of its layer.
        nn::CrossAttention& cross = model_.cross_attention(l);
        layernorm(std::get<0>(b.cross.layers), x_.data(), normed_.data(), rows);
        linear(cross.query, normed_.data(), query_.data(), rows);
        cross_attend(cross, model_.target_layer(l), segments);
        linear(cross.proj, attended_.data(), branch_.data(), rows);
        add_rows(x_.data(), branch_.data(), rows * C);
        // MLP.
        layernorm(std::get<0>(b.mlp.layers), x_.data(), normed_.data(), rows);
        linear(std::get<1>(b.mlp.layers), normed_.data(), hidden_.data(), rows);
        kernels::gelu_forward(host(hidden_.data(), rows * 4 * C), host(activated_.data(), rows * 4 * C));
        linear(std::get<3>(b.mlp.layers), activated_.data(), branch_.data(), rows);
        add_rows(x_.data(), branch_.data(), rows * C);
    }

    // Each segment's rows of query_ attend over every position the target's
    // cache holds for its slot in target layer `layer`, gathered from its
    // pages; the sequences split between the GEMM threads (as
    // SegmentAttention's decode path), each part with scratch of its own.
    void cross_attend(const nn::CrossAttention& cross, std::int64_t layer, std::span<const Segment> segments) {
        const std::int64_t M = target_cache_.width();
        first_rows_.clear();
        std::int64_t row = 0, macs = 0;
        for (std::size_t i = 0; i < segments.size(); ++i) {
            first_rows_.push_back(row);
            const auto count = static_cast<std::int64_t>(segments[i].tokens.size());
            row += count;
            macs += 2 * count * target_cache_.length(segments[i].slot) * M;
        }
        for_each_sequence(cross_parts_, static_cast<std::int64_t>(segments.size()), macs,
                          [&](CrossScratch& scratch, std::int64_t k) {
                              const auto i = static_cast<std::size_t>(k);
                              cross_attend_one(cross, layer, segments[i].slot, starts_[i],
                                               static_cast<std::int64_t>(segments[i].tokens.size()), first_rows_[i],
                                               scratch);
                          });
    }

    // Rows [row, row + count) of query_ (slot `slot`'s positions from `start`)
    // over the slot's `layer` of the target's cache.
    void cross_attend_one(const nn::CrossAttention& cross, std::int64_t layer, std::int64_t slot, std::int64_t start,
                          std::int64_t count, std::int64_t row, CrossScratch& scratch) {
        const std::int64_t M = target_cache_.width(), length = target_cache_.length(slot);
        const std::int64_t size = target_cache_.block_size(), stride = target_cache_.row_stride();
        std::vector<float>& memory = scratch.memory;
        memory.resize(static_cast<std::size_t>(std::max<std::int64_t>(length, 1) * stride));
        const std::span<const std::int32_t> table = target_cache_.block_table(slot);
        for (std::int64_t b = 0; b * size < length; ++b) {
            const std::int64_t positions = std::min(size, length - b * size);
            std::memcpy(memory.data() + b * size * stride,
                        target_cache_.block_rows(layer, table[static_cast<std::size_t>(b)]),
                        static_cast<std::size_t>(positions * stride) * sizeof(float));
        }
        for (std::int64_t t = 0; t < count; ++t)
            nn::cross_attend_row(query_.data() + (row + t) * M, memory.data(), memory.data() + M, stride, length,
                                 cross.heads, cross.head_dim(), attended_.data() + (row + t) * M,
                                 lse_.data() + (row + t) * cross.heads, scratch.scores, cross.recency ? start + t : -1);
    }

    [[nodiscard]] static Tensor host(const float* data, std::int64_t n) { return host_rows(data, n); }

    void layernorm(const nn::LayerNorm& norm, const float* in, float* out, std::int64_t rows) {
        layernorm_rows(norm, in, out, rows, mean_.data(), rstd_.data());
    }

    // y = x W^T + b at f32 (nn::Linear's forward).
    static void linear(const nn::Linear& layer, const float* in, float* out, std::int64_t rows) {
        matmul_rows(in, layer.weight.value.data<float>(), layer.has_bias() ? layer.bias.value.data<float>() : nullptr,
                    out, rows, layer.in(), layer.out());
    }

    gpt::GlideDraft& model_;
    gpt::Config config_;
    KvCache& cache_;
    KvCache& target_cache_;  // read only
    std::vector<std::int64_t> starts_;
    std::vector<bool> seen_;
    std::vector<std::int64_t> depths_;  // check_segments' scratch
    SegmentAttention attention_;
    std::vector<float> x_, normed_, qkv_, attended_, query_, branch_, hidden_, activated_, mean_, rstd_, lse_, last_,
        logits_;
    std::vector<std::int64_t> first_rows_;  // cross_attend's: each segment's first row
    std::vector<CrossScratch> cross_parts_;  // one per part of cross_attend
};

}  // namespace loom::infer
