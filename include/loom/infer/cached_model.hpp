// CachedModel<Model>: prefill and decode with a KV cache for any model a user
// composes from loom's layers (README, "Your own layer and strategy"), not only
// loom's GPT. It walks the model as nn::forward does (fields in declaration
// order, std::vector and std::array elements in order, nn::Residual's skip)
// and runs each layer on the packed rows of every segment, with no padding:
//
//   nn::Embedding            token row + position row, positions after each slot's cached ones
//   nn::LayerNorm, nn::Linear, nn::Gelu
//                            on every row at once (the Linears through the packed GEMM, or as
//                            dot products for a decode step's few rows: infer/cached_rows.hpp)
//   nn::CausalSelfAttention  per segment, over the slot's cached keys and values
//                            (infer/segment_attention.hpp); the k-th such layer in forward
//                            order is layer k of the cache
//   nn::Residual<...>        its layers, then the skip connection's sum
//   nn::CrossEntropy         skipped: generation reads the logits before the loss
//   a user's leaf layer      its own forward on the rows as [1, rows, features], if it says
//                            `static constexpr bool per_token = true;` (each output row depends
//                            only on the same position's input row)
//
// Any other layer that computes itself mixes positions in a way the cache
// cannot know, and is a compile error that says so. The model must start with
// an Embedding, end with features = its vocabulary and have its Params bound
// on the host; every attention layer must have the cache's width. loom's GPT
// run through CachedModel gives CachedGpt's logits bit for bit (the same
// kernels in the same order).
//
// Tensor-parallel serving: given a tp group, the model is this rank's cut by
// training's Megatron walker (tp::shard_model, before binding), so a user's
// model serves with the cuts it trains with: a column-cut Linear keeps its
// slice of the features, a row-cut one is summed over the group (then its
// bias added), an attention runs its rank's heads (the cache holds those
// only), a vocabulary-cut Embedding looks up its rows (zeros for others'
// tokens) and is summed before the positions are added, and a vocabulary-cut
// head's logits are all-gathered, so every rank holds the same bits and picks
// the same tokens. forward() is then collective over the group.
//
// Logits::last forms the head's rows for each segment's last position only
// when the model is an aggregate whose fields after the last attention layer
// act per token (as a GPT's final norm and head do): the rows are compacted
// after that field. Otherwise every row runs to the end and the last ones are
// picked. Activations live in a RowPool (infer/row_pool.hpp).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/error.hpp"
#include "loom/core/reflect.hpp"
#include "loom/core/tensor.hpp"
#include "loom/infer/cached_rows.hpp"
#include "loom/infer/engine.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/row_pool.hpp"
#include "loom/infer/segment_attention.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/attention.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/context.hpp"
#include "loom/nn/cross_entropy.hpp"
#include "loom/nn/embedding.hpp"
#include "loom/nn/gelu.hpp"
#include "loom/nn/layernorm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/residual.hpp"

namespace loom::infer {

// A user's layer that computes itself and may run on cached rows: each output
// row depends only on the input row at the same position.
template <class L>
concept PerTokenLayer = nn::Leaf<L> && requires {
    { L::per_token } -> std::convertible_to<bool>;
    requires L::per_token;
};

namespace cached_model_detail {

template <class T>
inline constexpr bool is_residual = false;
template <class... Ls>
inline constexpr bool is_residual<nn::Residual<Ls...>> = true;

}  // namespace cached_model_detail

template <class Model>
class CachedModel final : public Engine {
public:
    // `model` and `cache` are referenced, not copied; the cache has one layer
    // per CausalSelfAttention of the model, of its width, and at most the
    // Embedding's positions per slot.
    CachedModel(Model& model, KvCache& cache) : model_(model), cache_(cache) { survey(); }
    // Tensor-parallel: `shard` is rank tp.rank()'s cut of the model
    // (tp::shard_model(model, tp.rank(), tp.size()) before binding, then
    // initialised or loaded), `cache` holds its heads (each attention's
    // local_width()). `tp` must outlive the engine.
    CachedModel(Model& shard, KvCache& cache, comm::AnyComm& tp)
        : model_(shard), cache_(cache), tp_(&tp), degree_(tp.size()) {
        survey();
    }

    [[nodiscard]] KvCache& cache() noexcept override { return cache_; }
    // The whole vocabulary (a vocabulary-cut Embedding holds a slice of it).
    [[nodiscard]] std::int64_t vocab() const noexcept override { return embedding_->token.full_shape().dim(0); }
    // The model's attention layers (= the cache's layers).
    [[nodiscard]] std::int64_t attention_layers() const noexcept { return attention_count_; }
    [[nodiscard]] const WorkCount& work() const noexcept { return work_; }
    void reset_work() noexcept { work_ = {}; }

    std::span<const float> forward(std::span<const Segment> segments, Logits which = Logits::last) override {
        check_segments("CachedModel", cache_, segments, vocab(), seen_, depths_);
        segments_ = segments;
        starts_.clear();
        rows_ = 0;
        for (const Segment& s : segments) {
            starts_.push_back(cache_.length(s.slot));
            rows_ += static_cast<std::int64_t>(s.tokens.size());
        }
        for (const Segment& s : segments) cache_.reserve(s.slot, static_cast<std::int64_t>(s.tokens.size()));
        try {
            run_model(which);
        } catch (...) {
            // Nothing kept from a forward that failed: each slot back to the positions it held.
            for (std::size_t i = 0; i < segments.size(); ++i) cache_.truncate(segments[i].slot, starts_[i]);
            throw;
        }
        if (which == Logits::every || compacted_)
            return {x_.data, static_cast<std::size_t>(x_.rows * x_.features)};
        const auto n = static_cast<std::int64_t>(segments.size()), V = vocab();
        last_.resize(static_cast<std::size_t>(n * V));
        std::int64_t row = 0;
        for (std::int64_t i = 0; i < n; ++i) {
            row += static_cast<std::int64_t>(segments[static_cast<std::size_t>(i)].tokens.size());
            std::memcpy(last_.data() + i * V, x_.data + (row - 1) * V, static_cast<std::size_t>(V) * sizeof(float));
        }
        return last_;
    }

private:
    // The walk over the model's layers, from the segments' tokens to their logits in x_.
    void run_model(Logits which) {
        context_.reset();
        pool_.release_all();  // none left held by a forward that failed
        attention_seen_ = 0;
        compacted_ = false;
        last_split_ = nn::Split::none;
        x_ = {};
        if constexpr (nn::Leaf<Model> || reflect::LayerSequence<Model> || cached_model_detail::is_residual<Model>) {
            run(model_);
        } else {
            // The top level's fields one by one, so that the rows can be compacted to each segment's last
            // position once no attention layer is left (what the head reads for Logits::last).
            std::apply([&](auto&... field) {
                ((run_field(field), compact_if_done(which)), ...);
            }, nn::detail::fields_of(model_));
        }
        if (degree_ > 1 && last_split_ == nn::Split::columns && x_.features * degree_ == vocab()) gather_features();
        LOOM_CHECK(x_.features == vocab(), "CachedModel: the model's last layer gives ", x_.features,
                   " features per token but its Embedding has a vocabulary of ", vocab(),
                   "; end the model with a head of ", vocab(), " outputs (the logits)");
    }

    // Checks the model once, in forward order: an Embedding first, every
    // layer whole (or, on a tp group, this rank's Megatron cut), attention
    // layers of the cache's width, every Param bound on the host.
    void survey() {
        std::string first;  // the path of the first layer that computes itself
        reflect::visit_layers(model_, [&](auto& layer, std::string_view path) {
            using L = std::remove_cvref_t<decltype(layer)>;
            if constexpr (std::same_as<L, nn::Embedding>) {
                LOOM_CHECK(embedding_ == nullptr, "CachedModel: a second Embedding at field path ", path,
                           "; the engine embeds the tokens once, at the model's first layer");
                LOOM_CHECK(first.empty(), "CachedModel: the model's first layer (field path ", first,
                           ") is not an nn::Embedding; the cached forward starts from token ids");
                check_cut(!layer.grid() && layer.vocab_parallel() == (degree_ > 1), "the Embedding", path);
                embedding_ = &layer;
            } else if constexpr (std::same_as<L, nn::CausalSelfAttention>) {
                check_cut(layer.local_heads() * degree_ == layer.heads && layer.input_width() == layer.width(),
                          "the attention", path);
                LOOM_CHECK(layer.local_width() == cache_.width(), "CachedModel: the attention at field path ", path,
                           degree_ > 1 ? " holds rows of width " : " has width ", layer.local_width(),
                           " but the cache holds rows of width ", cache_.width(),
                           "; build the cache with the attention layers' width",
                           degree_ > 1 ? " on this rank (local_width())" : "", " (every one must have it)");
                ++attention_count_;
            } else if constexpr (std::same_as<L, nn::Linear>) {
                check_cut(layer.split != nn::Split::grid && (degree_ > 1 || layer.split == nn::Split::none),
                          "the Linear", path);
            }
            if constexpr (nn::Leaf<L>)
                if (first.empty()) first = path.empty() ? std::string("(the model itself)") : std::string(path);
        });
        LOOM_CHECK(embedding_ != nullptr, "CachedModel: the model has no nn::Embedding; the cached forward starts "
                   "from token ids, so the model's first layer must be one");
        LOOM_CHECK(attention_count_ == cache_.layers(), "CachedModel: the model has ", attention_count_,
                   " CausalSelfAttention layers but the cache has ", cache_.layers(),
                   "; build the cache with one layer per attention layer");
        LOOM_CHECK(cache_.capacity() <= embedding_->max_sequence(), "CachedModel: the cache holds ",
                   cache_.capacity(), " positions per slot but the Embedding has positions for ",
                   embedding_->max_sequence(), "; build the cache with capacity <= ", embedding_->max_sequence());
        reflect::visit_params(model_, [&](const Param& p, std::string_view path) {
            LOOM_CHECK(p.bound(), "CachedModel: the Param at field path ", path, " is not bound; give the model a "
                       "ParamArena (and load or initialise it) first");
            LOOM_CHECK(p.numel() == 0 || p.value.device().kind == DeviceKind::host, "CachedModel: the Param at "
                       "field path ", path, " lives on a device; this engine runs on the host");
        });
    }

    // A layer cut other than this engine serves: a shard without its tp group, a cut
    // on a group, or Optimus 2D's grid blocks.
    void check_cut(bool fits, const char* what, std::string_view path) const {
        LOOM_CHECK(fits, "CachedModel: ", what, " at field path ", path,
                   degree_ > 1 ? loom::detail::concat(" is not rank ", tp_->rank(), "'s Megatron cut for a tp group of ",
                                                      degree_, "; cut the model with tp::shard_model(model, ",
                                                      tp_->rank(), ", ", degree_, ") before binding it")
                               : std::string(" is a tensor-parallel shard; give the engine its tp group, or serve "
                                             "the whole model"));
    }

    template <class F>
    void run_field(F& field) {
        nn::detail::reject_loose_params<F>();
        if constexpr (nn::detail::runs_as_layer<F>) run(field);
    }

    // After a top-level field: once every attention layer has run, only per-token layers are left,
    // so for Logits::last each segment's last row is all that needs to go on.
    void compact_if_done(Logits which) {
        if (which != Logits::last || compacted_ || x_.data == nullptr || attention_seen_ < attention_count_) return;
        std::int64_t row = 0;
        for (std::size_t i = 0; i < segments_.size(); ++i) {
            row += static_cast<std::int64_t>(segments_[i].tokens.size());
            if (row - 1 != static_cast<std::int64_t>(i))
                std::memmove(x_.data + static_cast<std::int64_t>(i) * x_.features, x_.data + (row - 1) * x_.features,
                             static_cast<std::size_t>(x_.features) * sizeof(float));
        }
        x_.rows = static_cast<std::int64_t>(segments_.size());
        compacted_ = true;
    }

    // nn::forward's walk, on x_.
    template <class L>
    void run(L& layer) {
        if constexpr (std::same_as<L, nn::Embedding>) {
            embed(layer);
        } else if constexpr (std::same_as<L, nn::CrossEntropy>) {
            // The loss: generation reads the logits that enter it.
        } else if constexpr (cached_model_detail::is_residual<L>) {
            require_rows("an nn::Residual");
            const Rows skip = x_;
            pool_.hold(skip);
            std::apply([&](auto&... each) { (run(each), ...); }, layer.layers);
            pool_.release(skip);
            LOOM_CHECK(x_.features == skip.features && x_.rows == skip.rows, "CachedModel: an nn::Residual's layers "
                       "turned ", skip.features, " features per token into ", x_.features,
                       "; a skip connection needs them equal");
            add_rows(x_.data, skip.data, x_.rows * x_.features);
        } else if constexpr (std::same_as<L, nn::LayerNorm>) {
            require_rows("an nn::LayerNorm", layer.features());
            const Rows out = take(x_.features, {x_.buffer});
            mean_.resize(static_cast<std::size_t>(x_.rows));
            rstd_.resize(mean_.size());
            layernorm_rows(layer, x_.data, out.data, x_.rows, mean_.data(), rstd_.data());
            x_ = out;
        } else if constexpr (std::same_as<L, nn::Linear>) {
            x_ = linear(layer, x_, {});
        } else if constexpr (std::same_as<L, nn::Gelu>) {
            require_rows("an nn::Gelu");
            const Rows out = take(x_.features, {x_.buffer});
            const std::int64_t n = x_.rows * x_.features;
            kernels::gelu_forward(host_rows(x_.data, n), host_rows(out.data, n));
            x_ = out;
        } else if constexpr (std::same_as<L, nn::CausalSelfAttention>) {
            attend(layer);
        } else if constexpr (nn::Leaf<L>) {
            static_assert(PerTokenLayer<L>,
                          "CachedModel: this layer computes itself, and the cache cannot know how it mixes "
                          "positions. If each output row depends only on the same position's input row, give it "
                          "`static constexpr bool per_token = true;`; a layer that mixes positions (attention of "
                          "its own) cannot run on cached rows");
            require_rows("a per-token layer");
            const Tensor y = layer.forward(context_, Tensor::of(x_.data, Shape{1, x_.rows, x_.features}));
            LOOM_CHECK(y.rank() == 3 && y.dim(0) == 1 && y.dim(1) == x_.rows, "CachedModel: a per-token layer "
                       "turned rows of shape [1, ", x_.rows, ", ", x_.features, "] into ", y.shape(),
                       "; it must keep [1, rows, features]");
            const Rows out = take(y.dim(2), {x_.buffer});
            std::memcpy(out.data, y.data<float>(), static_cast<std::size_t>(y.numel()) * sizeof(float));
            x_ = out;
        } else if constexpr (reflect::LayerSequence<L>) {
            for (auto& element : layer) run(element);
        } else {
            std::apply([&](auto&... field) { (run_field(field), ...); }, nn::detail::fields_of(layer));
        }
    }

    void require_rows(const char* what, std::int64_t features = -1) const {
        LOOM_CHECK(x_.data != nullptr, "CachedModel: ", what, " runs before the model's Embedding; the cached "
                   "forward starts from token ids");
        LOOM_CHECK(features < 0 || features == x_.features, "CachedModel: ", what, " of ", features,
                   " features is given rows of ", x_.features);
    }

    // x_ = token row + position row (nn::Embedding's sum), positions after each slot's cached ones.
    // A vocabulary cut holds rows [first, first + vocab()) of the token table: its
    // own tokens' rows, zeros for the others', summed over the group (each row then
    // the one rank's bits), and only then the positions added.
    void embed(const nn::Embedding& layer) {
        const std::int64_t C = layer.width();
        const Rows out = pool_.take(rows_, C, {});
        const float* token = layer.token.value.data<float>();
        const float* position = layer.position.value.data<float>();
        const bool cut = layer.vocab_parallel();
        const std::int64_t first = cut ? layer.token.slice.start() : 0, held = layer.vocab();
        if (cut) {
            std::int64_t row = 0;
            for (const Segment& s : segments_)
                for (const std::int32_t id : s.tokens) {
                    float* y = out.data + (row++) * C;
                    const std::int64_t local = id - first;
                    if (local >= 0 && local < held) std::copy_n(token + local * C, C, y);
                    else std::fill_n(y, C, 0.0f);
                }
            const Tensor rows = host_rows(out.data, rows_ * C);
            tp_->all_reduce(rows, rows, comm::ReduceOp::sum);
        }
        std::int64_t row = 0;
        for (std::size_t i = 0; i < segments_.size(); ++i) {
            const Segment& s = segments_[i];
            if (!s.parents.empty()) tree_depths(s.parents, depths_);
            for (std::size_t t = 0; t < s.tokens.size(); ++t, ++row) {
                const float* a = cut ? out.data + row * C : token + static_cast<std::int64_t>(s.tokens[t]) * C;
                const std::int64_t offset = s.parents.empty() ? static_cast<std::int64_t>(t) : depths_[t];
                const float* b = position + (starts_[i] + offset) * C;
                float* y = out.data + row * C;
                for (std::int64_t c = 0; c < C; ++c) y[c] = a[c] + b[c];
            }
        }
        x_ = out;
    }

    // x_'s features are this rank's run of a vocabulary-cut head's logits (rank q
    // holds columns [q F, (q + 1) F)): all-gathered into whole rows on every rank.
    void gather_features() {
        const std::int64_t F = x_.features, n = x_.rows * F;
        const Rows whole = take(F * degree_, {x_.buffer});
        gathered_.resize(static_cast<std::size_t>(n * degree_));
        tp_->all_gather(Tensor::of(x_.data, Shape{n}), Tensor::of(gathered_.data(), Shape{n * degree_}));
        for (int q = 0; q < degree_; ++q)
            for (std::int64_t r = 0; r < x_.rows; ++r)
                std::copy_n(gathered_.data() + q * n + r * F, F, whole.data + r * F * degree_ + q * F);
        x_ = whole;
    }

    // y = x W^T + b over every row (nn::Linear's forward at f32).
    [[nodiscard]] Rows linear(const nn::Linear& layer, const Rows& in, std::initializer_list<int> also_avoid) {
        require_rows("an nn::Linear");
        LOOM_CHECK(in.features == layer.in(), "CachedModel: an nn::Linear of ", layer.in(), " features is given rows of ",
                   in.features);
        std::vector<int>& avoid = avoid_;
        avoid.assign(also_avoid);
        avoid.push_back(in.buffer);
        const Rows out = pool_.take(in.rows, layer.out(), avoid);
        work_.linear_flops += 2 * in.rows * layer.in() * layer.out();
        last_split_ = layer.split;
        const float* bias = layer.has_bias() ? layer.bias.value.data<float>() : nullptr;
        if (layer.split != nn::Split::rows) {
            matmul_rows(in.data, layer.weight.value.data<float>(), bias, out.data, in.rows, layer.in(), layer.out());
            return out;
        }
        // A row cut's products are partial sums: summed over the group, then the (whole) bias added once.
        matmul_rows(in.data, layer.weight.value.data<float>(), nullptr, out.data, in.rows, layer.in(), layer.out());
        const Tensor y = host_rows(out.data, in.rows * layer.out());
        tp_->all_reduce(y, y, comm::ReduceOp::sum);
        if (bias != nullptr) kernels::add_bias(y, layer.bias.value, in.rows, layer.out());
        return out;
    }

    // qkv, each segment's attention over its slot's cache, the output projection.
    void attend(const nn::CausalSelfAttention& layer) {
        require_rows("an nn::CausalSelfAttention", layer.width());
        LOOM_CHECK(!compacted_, "CachedModel: internal: attention after the rows were compacted");
        // This rank's heads: all of them, or heads / tp of a cut attention.
        const std::int64_t C = layer.local_width(), H = layer.local_heads(), l = attention_seen_++;
        work_.linear_rows += x_.rows;
        const Rows qkv = linear(layer.qkv, x_, {});
        const Rows attended = take(C, {qkv.buffer, x_.buffer});
        attention_.run(cache_, l, segments_, starts_, qkv.data, 3 * C, H, C / H, attended.data, &work_);
        x_ = linear(layer.proj, attended, {qkv.buffer});
    }

    // A buffer of x_'s rows, none of `avoid`.
    [[nodiscard]] Rows take(std::int64_t features, std::initializer_list<int> avoid) {
        return pool_.take(x_.rows, features, avoid);
    }

    Model& model_;
    KvCache& cache_;
    comm::AnyComm* tp_ = nullptr;  // null: the whole model
    int degree_ = 1;
    const nn::Embedding* embedding_ = nullptr;
    std::int64_t attention_count_ = 0;
    WorkCount work_;
    SegmentAttention attention_;
    nn::Context context_;  // the per-token user layers' forward

    // One forward's state.
    std::span<const Segment> segments_;
    std::vector<std::int64_t> starts_;
    std::int64_t rows_ = 0, attention_seen_ = 0;
    bool compacted_ = false;
    nn::Split last_split_ = nn::Split::none;  // of the last Linear run: a vocabulary-cut head's logits need gathering
    Rows x_;

    // Scratch kept between calls, so that a decode step allocates nothing once warm.
    RowPool pool_;
    std::vector<int> avoid_;
    std::vector<bool> seen_;
    std::vector<std::int64_t> depths_;
    std::vector<float> mean_, rstd_, last_, gathered_;
};

}  // namespace loom::infer
