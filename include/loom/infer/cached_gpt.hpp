// loom's GPT run forward with a KV cache: prefill (a prompt through the model
// once, its keys and values kept) and decode (one new token per sequence,
// attending over what the cache holds). Both are one routine, `forward`, over
// segments: a run of new tokens of one sequence slot, placed after the
// positions the slot already holds. Segments of several sequences are packed
// row after row with no padding, so the embeddings, LayerNorms, Linears and
// GELUs run once over the real tokens of every sequence together (EnergonAI's
// redundant-computation elimination); only attention is per sequence.
//
// The math is the model's own: its Params (no copy of a weight), the kernels
// its layers call (kernels/ops.hpp: layernorm_forward, gemm_bias, gelu_forward,
// add) at f32, and attention through the FlashAttention-2 block kernels that
// kernels::attention_forward itself runs (kernels/host/attention_blocks.hpp):
// the new tokens' causal attention among themselves (for a fresh prompt,
// exactly the training forward's tiles), then each cached block of the
// sequence (infer/kv_cache.hpp's pages) as a full block, folded in by
// log-sum-exp (ring attention's rule): equal to the whole causal attention
// to float rounding (infer/segment_attention.hpp, shared with CachedModel,
// infer/cached_model.hpp, which runs any model composed from loom's layers).
// Forwards of at most `few_rows()` tokens (decode steps, verifications) run their Linears as
// blocks of dot products (infer/few_rows_linear.hpp, through infer/cached_rows.hpp), not the packed GEMM.
// Logits are formed for the last position of each segment only: that is all
// generation reads, and the head is the widest product for small models.
// Logits::every forms them for every position instead: speculative decoding's
// verification (infer/speculative.hpp) reads one row per draft token.
// A segment may be a token tree (Segment::parents; CaPE's verification,
// infer/cape.hpp): each node at position start + its depth, attending to the
// cached prefix and its own ancestors only (infer/tree_attention.hpp); its
// rows are cached in node order, and KvCache::keep compacts them to the path
// accepted. A segment without parents is a chain and runs as before.
// Tensor-parallel serving: given a tp group, the model is this rank's shard
// (infer/tensor_parallel_shard.hpp) and the cache holds its heads only; each
// rank runs forward on the same segments, summing over the group after each
// block's attention projection and MLP (Megatron's g), and the logits come
// out whole and bit-identical on every rank (gathered), so the Batcher and
// generate() on each rank, given the same requests, pick the same tokens.
// Pipeline-parallel serving (infer/pipeline_parallel_gpt.hpp): given a
// PipelineStage, the model is that stage's (infer/pipeline_stage.hpp) and
// the cache holds its blocks only; forward_stage takes the hidden rows the
// stage before produced (or embeds the tokens on stage 0) and returns the
// hidden rows for the next stage (or the logits on the last). Given both, a
// stage's tp shard: each stage of the pipeline is a tp group.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/block_prefetcher.hpp"
#include "loom/infer/cached_rows.hpp"
#include "loom/infer/engine.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pipeline_stage.hpp"
#include "loom/infer/segment_attention.hpp"
#include "loom/infer/stage_engine.hpp"
#include "loom/infer/tensor_parallel_shard.hpp"
#include "loom/infer/tree_attention.hpp"
#include "loom/kernels/ops.hpp"

namespace loom::infer {

class CachedGpt final : public StageEngine {
public:
    // The model must have its Params bound on the host (a ParamArena) and be
    // whole (not a tensor-parallel shard); the cache must match its shape and
    // hold at most config.seq positions per slot (there are no position
    // embeddings beyond). Both are referenced, not copied.
    CachedGpt(gpt::Model& model, const gpt::Config& config, KvCache& cache)
        : CachedGpt(model, config, cache, nullptr, whole_stage(config)) {}

    // Tensor-parallel serving: `shard` is rank tp.rank()'s serving shard of
    // the model (infer::shard_for_serving, bound and loaded) and `cache` is
    // for its heads (width config.width / tp.size()). forward() is collective
    // over `tp`: every rank calls it with the same segments. `tp` is the
    // generic communicator (AnyComm::view of a ThreadComm, an Mpi, ...) and
    // must outlive the engine.
    CachedGpt(gpt::Model& shard, const gpt::Config& config, KvCache& cache, comm::AnyComm& tp)
        : CachedGpt(shard, config, cache, &tp, whole_stage(config)) {}

    // Pipeline-parallel serving: `stage_model` is stage `where`'s model
    // (make_stage_model, bound and loaded with load_stage_values) and `cache`
    // holds its where.count blocks. Run it with forward_stage.
    CachedGpt(gpt::Model& stage_model, const gpt::Config& config, KvCache& cache, const PipelineStage& where)
        : CachedGpt(stage_model, config, cache, nullptr, where) {}

    // Both: stage `where` of a pipeline whose every stage is a tp group.
    // `stage_shard` is tp rank tp.rank()'s serving shard of the stage's model
    // (make_stage_model, then shard_for_serving, bound and loaded with
    // load_stage_values) and `cache` holds its where.count blocks for its
    // heads (width config.width / tp.size()); forward_stage is collective over `tp`.
    CachedGpt(gpt::Model& stage_shard, const gpt::Config& config, KvCache& cache, comm::AnyComm& tp,
              const PipelineStage& where)
        : CachedGpt(stage_shard, config, cache, &tp, where) {}

    [[nodiscard]] const gpt::Config& config() const noexcept { return config_; }
    [[nodiscard]] KvCache& cache() noexcept override { return cache_; }
    [[nodiscard]] std::int64_t vocab() const noexcept override { return config_.vocab; }
    // The tp group's size (1: the whole model) and this rank's place in it.
    [[nodiscard]] int tp_degree() const noexcept { return degree_; }
    [[nodiscard]] int tp_rank() const noexcept { return rank_; }
    // The blocks this engine runs (all of them unless it is a pipeline stage).
    [[nodiscard]] const PipelineStage& stage() const noexcept override { return stage_; }
    [[nodiscard]] std::int64_t hidden_width() const noexcept override { return config_.width; }
    // What this engine has computed (this rank's share on a tp group).
    [[nodiscard]] const WorkCount& work() const noexcept { return work_; }
    void reset_work() noexcept { work_ = {}; }

    // Peer memory pooling (infer/pooled_gpt.hpp): the blocks come through
    // `prefetcher`, which stages the pooled ones a few blocks ahead; this
    // engine's model must be its PooledGpt's, and it must outlive the engine.
    void prefetch_blocks(BlockPrefetcher& prefetcher) {
        LOOM_CHECK(&prefetcher.pooled().model() == &model_, "CachedGpt: the prefetcher stages another model's "
                   "blocks; give it the PooledGpt whose model() this engine runs");
        prefetcher_ = &prefetcher;
    }

    // Runs the segments (each slot at most once, at least one token each),
    // appends their keys and values to the cache, and returns the logits of
    // each segment's last token: [segments.size(), vocab], row-major, valid
    // until the next call. With Logits::every, those of every token instead:
    // [total tokens, vocab], the segments' rows one after another.
    std::span<const float> forward(std::span<const Segment> segments, Logits which = Logits::last) override {
        return forward_whole("CachedGpt", segments, which);
    }

    // A pipeline stage's part of forward(): on stage 0 the segments' tokens
    // are embedded (`hidden` empty), on the others `hidden` is the stage
    // before's output for the same segments ([tokens, width], packed); its
    // blocks run and keep their keys and values. The last stage returns the
    // logits as forward() does, the others the hidden rows for the next
    // stage: [tokens, width], valid until the next call.
    using StageEngine::forward_stage;
    std::span<const float> forward_stage(std::span<const Segment> segments, std::span<const float> hidden,
                                         Logits which) override {
        check_segments("CachedGpt", cache_, segments, config_.vocab, seen_, depths_);
        const std::int64_t C = config_.width;
        std::int64_t rows = 0;
        starts_.clear();
        for (const Segment& s : segments) {
            starts_.push_back(cache_.length(s.slot));
            rows += static_cast<std::int64_t>(s.tokens.size());
        }
        check_hidden("CachedGpt", hidden.size(), rows);
        for (const Segment& s : segments) cache_.reserve(s.slot, static_cast<std::int64_t>(s.tokens.size()));
        resize(rows);
        if (stage_.embeds()) embed(segments);
        else std::copy(hidden.begin(), hidden.end(), x_.begin());
        for (std::int64_t l = 0; l < stage_.count; ++l) block(l, segments, rows);
        if (!stage_.has_head()) return std::span<const float>(x_.data(), static_cast<std::size_t>(rows * C));
        if (which == Logits::every) {
            layernorm(model_.ln_f, x_.data(), normed_.data(), rows);
            head(normed_.data(), rows);
            return logits_;
        }
        // The last row of each segment, through ln_f and the head.
        const auto n = static_cast<std::int64_t>(segments.size());
        last_.resize(static_cast<std::size_t>(n * C));
        std::int64_t row = 0;
        for (std::int64_t i = 0; i < n; ++i) {
            row += static_cast<std::int64_t>(segments[static_cast<std::size_t>(i)].tokens.size());
            std::memcpy(last_.data() + i * C, x_.data() + (row - 1) * C, static_cast<std::size_t>(C) * sizeof(float));
        }
        normed_.resize(last_.size());
        layernorm(model_.ln_f, last_.data(), normed_.data(), n);
        head(normed_.data(), n);
        return logits_;
    }

    // The prompt of one slot (which must be empty): the last position's logits.
    std::span<const float> prefill(std::int64_t slot, std::span<const std::int32_t> prompt) {
        LOOM_CHECK(cache_.length(slot) == 0, "CachedGpt: prefill of slot ", slot, " which already holds ",
                   cache_.length(slot), " positions; release it first");
        const Segment segment{slot, prompt};
        return forward(std::span(&segment, 1));
    }

    // One token for each of the slots: [slots.size(), vocab] logits.
    std::span<const float> decode(std::span<const std::int64_t> slots, std::span<const std::int32_t> tokens) {
        LOOM_CHECK(slots.size() == tokens.size(), "CachedGpt: decode of ", slots.size(), " slots with ", tokens.size(),
                   " tokens; give one token per slot");
        segments_.clear();
        for (std::size_t i = 0; i < slots.size(); ++i) segments_.push_back({slots[i], tokens.subspan(i, 1)});
        return forward(segments_);
    }

private:
    [[nodiscard]] static PipelineStage whole_stage(const gpt::Config& config) { return {0, 1, 0, config.layers}; }

    CachedGpt(gpt::Model& model, const gpt::Config& config, KvCache& cache, comm::AnyComm* tp,
              const PipelineStage& where)
        : model_(model), config_(config), cache_(cache), tp_(tp), stage_(where) {
        config.validate();
        if (where.whole())
            LOOM_CHECK(static_cast<std::int64_t>(model.blocks.size()) == config.layers, "CachedGpt: the model has ",
                       model.blocks.size(), " blocks but the config says ", config.layers, " layers");
        else
            LOOM_CHECK(static_cast<std::int64_t>(model.blocks.size()) == where.count, "CachedGpt: the model has ",
                       model.blocks.size(), " blocks but pipeline stage ", where.stage, " of ", where.stages,
                       " holds ", where.count, " (blocks ", where.first, "..", where.first + where.count - 1,
                       "); build it with make_stage_model");
        LOOM_CHECK(!where.embeds() || model.embed.token.numel() > 0, "CachedGpt: pipeline stage 0 has no embeddings; "
                   "build it with make_stage_model(config, pipeline_stage(config, 0, ", where.stages, "))");
        LOOM_CHECK(!where.has_head() || model.head.weight.numel() > 0, "CachedGpt: pipeline stage ", where.stage,
                   " is the last but has no head; build it with make_stage_model(config, pipeline_stage(config, ",
                   where.stage, ", ", where.stages, "))");
        LOOM_CHECK(model.embed.token.bound() && model.head.weight.bound() && !model.blocks.empty() &&
                       std::get<1>(model.blocks.front().attn.layers).qkv.weight.bound(),
                   "CachedGpt: the model's parameters are not bound; give the model a ParamArena (and load or "
                   "initialise it) first");
        LOOM_CHECK(std::get<1>(model.blocks.front().attn.layers).qkv.weight.value.device().kind == DeviceKind::host,
                   "CachedGpt: the model's parameters live on a device; this engine runs on the host");
        if (tp != nullptr) {
            rank_ = tp->rank();
            degree_ = tp->size();
            check_serving_shard(model, config, rank_, degree_);
        } else {
            for (std::size_t l = 0; l < model.blocks.size(); ++l) {
                const auto& attention = std::get<1>(model.blocks[l].attn.layers);
                LOOM_CHECK(attention.local_heads() == config.heads && attention.width() == config.width,
                           "CachedGpt: block ", l, " is a tensor-parallel shard (", attention.local_heads(), " of ",
                           config.heads, " heads); give the engine its tp group, or run the whole model");
            }
        }
        heads_ = config.heads / degree_;
        width_ = config.width / degree_;
        LOOM_CHECK(cache.layers() == where.count && cache.width() == width_, "CachedGpt: the cache is for ",
                   cache.layers(), " layers of width ", cache.width(), " but the model has ", where.count,
                   where.whole() ? "" : loom::detail::concat(" (pipeline stage ", where.stage, " of ", where.stages, ")"),
                   " of width ", config.width,
                   degree_ > 1 ? loom::detail::concat(" (", width_, " on each of ", degree_, " tp ranks)") : "");
        LOOM_CHECK(cache.capacity() <= config.seq, "CachedGpt: the cache holds ", cache.capacity(),
                   " positions per slot but the model has position embeddings for ", config.seq,
                   "; build the cache with capacity <= Config::seq");
    }

    void resize(std::int64_t rows) {
        // This rank's heads (width_ = C / tp features of q, k, v and the attention output) and hidden features.
        const auto C = static_cast<std::size_t>(config_.width), r = static_cast<std::size_t>(rows);
        const auto local = static_cast<std::size_t>(width_);
        x_.resize(r * C);
        normed_.resize(r * C);
        qkv_.resize(r * 3 * local);
        attended_.resize(r * local);
        branch_.resize(r * C);
        hidden_.resize(r * 4 * local);
        activated_.resize(r * 4 * local);
        mean_.resize(r);
        rstd_.resize(r);
    }

    // x = token row + position row (Embedding's sum), positions after each slot's cached ones.
    void embed(std::span<const Segment> segments) {
        embed_rows(model_.embed, segments, starts_, depths_, x_.data());
    }

    void block(std::int64_t l, std::span<const Segment> segments, std::int64_t rows) {
        const std::int64_t C = config_.width, hidden = 4 * width_;
        gpt::Block& b =
            prefetcher_ != nullptr ? prefetcher_->acquire(l) : model_.blocks[static_cast<std::size_t>(l)];
        auto& attention = std::get<1>(b.attn.layers);
        work_.linear_rows += rows;
        layernorm(std::get<0>(b.attn.layers), x_.data(), normed_.data(), rows);
        linear(attention.qkv, normed_.data(), qkv_.data(), rows);
        // Keys and values to the cache, each segment's attention to attended_
        // (this rank's heads only: q, k and v of width_ = H * D features each).
        attention_.run(cache_, l, segments, starts_, qkv_.data(), 3 * width_, heads_, width_ / heads_,
                           attended_.data(), &work_);
        linear(attention.proj, attended_.data(), branch_.data(), rows);
        add_rows(x_.data(), branch_.data(), rows * C);
        layernorm(std::get<0>(b.mlp.layers), x_.data(), normed_.data(), rows);
        linear(std::get<1>(b.mlp.layers), normed_.data(), hidden_.data(), rows);
        kernels::gelu_forward(host(hidden_.data(), rows * hidden), host(activated_.data(), rows * hidden));
        linear(std::get<3>(b.mlp.layers), activated_.data(), branch_.data(), rows);
        add_rows(x_.data(), branch_.data(), rows * C);
        if (prefetcher_ != nullptr) prefetcher_->release(l);
    }

    [[nodiscard]] static Tensor host(const float* data, std::int64_t n) { return host_rows(data, n); }

    void layernorm(const nn::LayerNorm& norm, const float* in, float* out, std::int64_t rows) {
        layernorm_rows(norm, in, out, rows, mean_.data(), rstd_.data());
    }

    // y = x W^T + b: what nn::Linear's forward runs at f32. A row-cut shard's
    // products are partial sums: summed over the tp group, then the (whole)
    // bias added once, as nn::Linear's g does.
    void linear(const nn::Linear& layer, const float* in, float* out, std::int64_t rows) {
        work_.linear_flops += 2 * rows * layer.in() * layer.out();
        const float* bias = layer.has_bias() ? layer.bias.value.data<float>() : nullptr;
        if (layer.split != nn::Split::rows || degree_ == 1) {
            matmul_rows(in, layer.weight.value.data<float>(), bias, out, rows, layer.in(), layer.out());
            return;
        }
        matmul_rows(in, layer.weight.value.data<float>(), nullptr, out, rows, layer.in(), layer.out());
        const Tensor y = host(out, rows * layer.out());
        tp_->all_reduce(y, y, comm::ReduceOp::sum);
        if (bias != nullptr) kernels::add_bias(y, layer.bias.value, rows, layer.out());
    }


    // logits_ = in [rows, C] through the head. On a tp group each rank forms
    // its run of vocabulary rows (infer/tensor_parallel_shard.hpp says why)
    // and the runs are all-gathered: every rank holds the same bits.
    void head(const float* in, std::int64_t rows) {
        const std::int64_t C = config_.width, V = config_.vocab;
        logits_.resize(static_cast<std::size_t>(rows * V));
        if (degree_ == 1) {
            linear(model_.head, in, logits_.data(), rows);
            return;
        }
        const VocabRows mine = vocab_rows(V, rank_, degree_);
        const std::int64_t block = rows * mine.per_rank;  // each rank's send, padded to the longest run
        run_.assign(static_cast<std::size_t>(block), 0.0f);
        work_.linear_flops += 2 * rows * C * mine.count;
        if (mine.count > 0)
            matmul_rows(in, model_.head.weight.value.data<float>() + mine.first * C,
                        model_.head.has_bias() ? model_.head.bias.value.data<float>() + mine.first : nullptr,
                        run_.data(), rows, C, mine.count);
        gathered_.resize(static_cast<std::size_t>(block * degree_));
        tp_->all_gather(Tensor::of(run_.data(), Shape{block}), Tensor::of(gathered_.data(), Shape{block * degree_}));
        for (int q = 0; q < degree_; ++q) {
            const VocabRows theirs = vocab_rows(V, q, degree_);
            const float* from = gathered_.data() + q * block;
            for (std::int64_t r = 0; r < rows; ++r)
                std::copy_n(from + r * theirs.count, theirs.count, logits_.data() + r * V + theirs.first);
        }
    }

    gpt::Model& model_;
    gpt::Config config_;
    KvCache& cache_;
    comm::AnyComm* tp_ = nullptr;            // null: the whole model
    BlockPrefetcher* prefetcher_ = nullptr;  // null: every block where the model's Params point
    PipelineStage stage_;                    // the blocks this engine holds: all of them but on a pipeline stage
    int rank_ = 0, degree_ = 1;
    std::int64_t heads_ = 0, width_ = 0;  // this rank's heads and their features (all of them at tp 1)
    std::vector<float> run_, gathered_;   // the head's vocabulary runs on a tp group
    WorkCount work_;
    std::vector<std::int64_t> starts_;
    std::vector<bool> seen_;  // check()'s slots, kept so that a decode step allocates nothing
    std::vector<Segment> segments_;
    std::vector<std::int64_t> depths_;  // a tree segment's (scratch)
    SegmentAttention attention_;
    std::vector<float> x_, normed_, qkv_, attended_, branch_, hidden_, activated_, mean_, rstd_, last_, logits_;
};

}  // namespace loom::infer
