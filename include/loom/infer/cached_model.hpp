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
// Pipeline-parallel serving: model_stage(model, s, pp) says which units
// (nn::units_of's: the top-level fields, a sequence field's elements) stage s
// runs, so that its attention layers are an even share; drop_other_stages
// leaves the other units' Params without elements (before binding) and
// copy_stage_values fills the stage's from the whole model. Given a
// ModelStage, the engine is a StageEngine: forward_stage takes the stage
// before's hidden rows and gives the next stage its own (the last the
// logits), so generate_pipelined and PipelinedBatcher serve it as a GPT stage.
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
#include "loom/infer/stage_engine.hpp"
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

template <class Field, class F>
void unit_of_field(Field& field, F& f) {
    nn::detail::reject_loose_params<Field>();
    if constexpr (nn::detail::runs_as_layer<Field>) {
        if constexpr (reflect::LayerSequence<Field>)
            for (auto& element : field) f(element);
        else
            f(field);
    }
}

// f(unit) for each unit of `model` in forward order, as nn::units_of cuts it:
// its top-level fields, a sequence field's elements; a model that is itself a
// layer is one unit.
template <class Model, class F>
void for_each_unit(Model& model, F&& f) {
    if constexpr (nn::Leaf<Model> || reflect::LayerSequence<Model> || is_residual<Model>)
        f(model);
    else
        std::apply([&](auto&... field) { (unit_of_field(field, f), ...); }, nn::detail::fields_of(model));
}

template <class Unit>
[[nodiscard]] std::int64_t attention_layers_in(Unit& unit) {
    std::int64_t n = 0;
    reflect::visit_layers(unit, [&](auto& layer, std::string_view) {
        if constexpr (std::same_as<std::remove_cvref_t<decltype(layer)>, nn::CausalSelfAttention>) ++n;
    });
    return n;
}

// The stage of a pipeline of `stages` that holds attention layer `a` of `A`:
// stage s holds [s A / stages, (s + 1) A / stages).
[[nodiscard]] inline int stage_of_attention(std::int64_t a, std::int64_t A, int stages) {
    int s = 0;
    while ((s + 1) * A / stages <= a) ++s;
    return s;
}

// Each unit's stage: that of its (first) attention layer, or, without one,
// that of the unit before it (stage 0 before any attention layer). Refuses a
// unit whose attention layers two stages would split.
template <class Model>
[[nodiscard]] std::vector<int> unit_stages(Model& model, int stages) {
    std::vector<std::int64_t> attention;
    for_each_unit(model, [&](auto& unit) { attention.push_back(attention_layers_in(unit)); });
    std::int64_t A = 0;
    for (const std::int64_t n : attention) A += n;
    LOOM_CHECK(stages >= 1 && stages <= A, "model_stage: a pipeline of ", stages, " stages for a model of ", A,
               " attention layers; use 1..", A, " stages (each holds at least one)");
    std::vector<int> out;
    std::int64_t seen = 0;
    for (std::size_t u = 0; u < attention.size(); ++u) {
        if (attention[u] == 0) {
            out.push_back(seen == 0 ? 0 : stage_of_attention(seen - 1, A, stages));
            continue;
        }
        const int first = stage_of_attention(seen, A, stages);
        const int last = stage_of_attention(seen + attention[u] - 1, A, stages);
        LOOM_CHECK(first == last, "model_stage: unit ", u, " holds attention layers ", seen, "..",
                   seen + attention[u] - 1, ", which stages ", first, " and ", last, " of ", stages,
                   " would split; use a degree whose stage boundaries fall between units");
        out.push_back(first);
        seen += attention[u];
    }
    return out;
}

}  // namespace cached_model_detail

// Stage `stage` of a pipeline of `stages` over a user's model: which attention
// layers it holds (PipelineStage's first and count), and what every stage needs
// to know of the whole model (its vocabulary, and the width of the rows that
// pass between stages: the Embedding's).
struct ModelStage {
    PipelineStage where;
    std::int64_t vocab = 0, width = 0;
};

// Computed from the whole model (before drop_other_stages: the Embedding must
// still have its shape). The attention layers are split as evenly as they go;
// the degree is refused if it exceeds them or would split a unit.
template <class Model>
[[nodiscard]] ModelStage model_stage(Model& model, int stage, int stages) {
    const std::vector<int> units = cached_model_detail::unit_stages(model, stages);
    LOOM_CHECK(stage >= 0 && stage < stages, "model_stage: stage ", stage, " is not in a pipeline of ", stages,
               " stages; give a stage in [0, ", stages, ")");
    ModelStage out;
    out.where = {stage, stages, 0, 0};
    std::size_t u = 0;
    std::int64_t seen = 0;
    cached_model_detail::for_each_unit(model, [&](auto& unit) {
        const std::int64_t n = cached_model_detail::attention_layers_in(unit);
        if (units[u] < stage) out.where.first = seen + n;
        if (units[u] == stage) out.where.count += n;
        seen += n;
        ++u;
    });
    reflect::visit_layers(model, [&](auto& layer, std::string_view) {
        if constexpr (std::same_as<std::remove_cvref_t<decltype(layer)>, nn::Embedding>)
            if (out.width == 0) {
                out.vocab = layer.token.full_shape().dim(0);
                out.width = layer.width();
            }
    });
    LOOM_CHECK(out.width > 0, "model_stage: the model has no nn::Embedding; the cached forward starts from token ids");
    return out;
}

// Leaves the Params of every unit stage `where` does not run without elements,
// so that a ParamArena bound to the model afterwards holds the stage's weights
// only. Call before binding; fill the stage's with copy_stage_values.
template <class Model>
void drop_other_stages(Model& model, const ModelStage& where) {
    const std::vector<int> units = cached_model_detail::unit_stages(model, where.where.stages);
    std::size_t u = 0;
    cached_model_detail::for_each_unit(model, [&](auto& unit) {
        if (units[u++] != where.where.stage)
            reflect::visit_params(unit, [](Param& p, std::string_view) { p = Param{Shape{0}}; });
    });
}

// Copies into a bound stage model (drop_other_stages, then a ParamArena) the
// values of the Params it holds, from the whole model `whole` (bound, loaded).
template <class Model>
void copy_stage_values(Model& stage_model, Model& whole) {
    std::vector<Param*> mine, theirs;
    reflect::visit_params(stage_model, [&](Param& p, std::string_view) { mine.push_back(&p); });
    reflect::visit_params(whole, [&](Param& p, std::string_view) { theirs.push_back(&p); });
    LOOM_CHECK(mine.size() == theirs.size(), "copy_stage_values: the stage model has ", mine.size(),
               " Params but the whole model ", theirs.size(), "; give two models of one type");
    for (std::size_t i = 0; i < mine.size(); ++i) {
        if (mine[i]->numel() == 0) continue;
        LOOM_CHECK(mine[i]->bound() && theirs[i]->bound() && mine[i]->numel() == theirs[i]->numel(),
                   "copy_stage_values: Param ", i, " holds ", mine[i]->numel(), " values in the stage model and ",
                   theirs[i]->numel(), " in the whole one; bind both, and drop only other stages' Params");
        std::copy_n(theirs[i]->value.data<float>(), mine[i]->numel(), mine[i]->value.data<float>());
    }
}

template <class Model>
class CachedModel final : public StageEngine {
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
    // Pipeline-parallel: `stage_model` is the model with only stage
    // `where`'s Params (drop_other_stages, bound, copy_stage_values), `cache`
    // holds its where.where.count attention layers. Run it with forward_stage
    // (through generate_pipelined or a PipelinedBatcher).
    CachedModel(Model& stage_model, KvCache& cache, const ModelStage& where)
        : model_(stage_model), cache_(cache), stage_(where.where), vocab_(where.vocab), width_(where.width) {
        units_ = cached_model_detail::unit_stages(model_, stage_.stages);
        survey();
    }
    // Both (tp x pp): `stage_shard` is rank tp.rank()'s Megatron cut of the
    // model (tp::shard_model) with only stage `where`'s Params
    // (drop_other_stages, bound, copy_stage_values from the same rank's cut of
    // the whole model); `cache` holds its attention layers' heads on this
    // rank. forward_stage is collective over `tp`; the rows between stages
    // are whole on every tp rank.
    CachedModel(Model& stage_shard, KvCache& cache, const ModelStage& where, comm::AnyComm& tp)
        : model_(stage_shard), cache_(cache), tp_(&tp), degree_(tp.size()), stage_(where.where), vocab_(where.vocab),
          width_(where.width) {
        units_ = cached_model_detail::unit_stages(model_, stage_.stages);
        survey();
    }

    [[nodiscard]] KvCache& cache() noexcept override { return cache_; }
    // The whole vocabulary (a vocabulary-cut Embedding holds a slice of it).
    [[nodiscard]] std::int64_t vocab() const noexcept override { return vocab_; }
    [[nodiscard]] const PipelineStage& stage() const noexcept override { return stage_; }
    // The Embedding's width: the rows between stages.
    [[nodiscard]] std::int64_t hidden_width() const noexcept override { return width_; }
    // The model's attention layers (= the cache's layers).
    [[nodiscard]] std::int64_t attention_layers() const noexcept { return attention_count_; }
    [[nodiscard]] const WorkCount& work() const noexcept { return work_; }
    void reset_work() noexcept { work_ = {}; }

    std::span<const float> forward(std::span<const Segment> segments, Logits which = Logits::last) override {
        return forward_whole("CachedModel", segments, which);
    }

    using StageEngine::forward_stage;
    std::span<const float> forward_stage(std::span<const Segment> segments, std::span<const float> hidden,
                                         Logits which) override {
        check_segments("CachedModel", cache_, segments, vocab(), seen_, depths_);
        segments_ = segments;
        starts_.clear();
        rows_ = 0;
        for (const Segment& s : segments) {
            starts_.push_back(cache_.length(s.slot));
            rows_ += static_cast<std::int64_t>(s.tokens.size());
        }
        check_hidden("CachedModel", hidden.size(), rows_);
        for (const Segment& s : segments) cache_.reserve(s.slot, static_cast<std::int64_t>(s.tokens.size()));
        try {
            run_model(which, hidden);
        } catch (...) {
            // Nothing kept from a forward that failed: each slot back to the positions it held.
            for (std::size_t i = 0; i < segments.size(); ++i) cache_.truncate(segments[i].slot, starts_[i]);
            throw;
        }
        if (which == Logits::every || compacted_ || !stage_.has_head())
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
    // The walk over the model's layers (a stage's units), from the segments' tokens (or the stage
    // before's rows) to their logits (or this stage's rows) in x_.
    void run_model(Logits which, std::span<const float> hidden) {
        context_.reset();
        pool_.release_all();  // none left held by a forward that failed
        attention_seen_ = 0;
        compacted_ = false;
        last_split_ = nn::Split::none;
        x_ = {};
        if (!stage_.embeds()) {
            x_ = pool_.take(rows_, width_, {});
            std::copy(hidden.begin(), hidden.end(), x_.data);
        }
        // Unit by unit, so that the rows can be compacted to each segment's last position once no
        // attention layer is left (what the head reads for Logits::last).
        std::size_t u = 0;
        cached_model_detail::for_each_unit(model_, [&](auto& unit) {
            if (in_stage(u++)) {
                run(unit);
                if (stage_.has_head()) compact_if_done(which);
            }
        });
        if (!stage_.has_head()) {
            LOOM_CHECK(x_.features == width_, "CachedModel: pipeline stage ", stage_.stage, " ends with ",
                       x_.features, " features per token but the rows between stages have the Embedding's ",
                       width_, "; a stage boundary must fall where the model's stream has that width");
            return;
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
        const auto check_layer = [&](auto& layer, std::string_view path) {
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
        };
        if (stage_.whole()) {
            reflect::visit_layers(model_, check_layer);
        } else {
            // A stage's units only: the others' Params have no elements. Their paths are within the unit.
            std::size_t u = 0;
            cached_model_detail::for_each_unit(model_, [&](auto& unit) {
                if (!in_stage(u++)) return;
                reflect::visit_layers(unit, check_layer);
                reflect::visit_params(unit, [&](const Param& p, std::string_view path) {
                    LOOM_CHECK(p.bound() && p.numel() > 0, "CachedModel: pipeline stage ", stage_.stage, " of ",
                               stage_.stages, " runs unit ", u - 1, " but its Param at path ", path,
                               p.bound() ? " has no elements; drop only other stages' Params (drop_other_stages)"
                                         : " is not bound; bind the stage model and copy_stage_values first");
                });
            });
        }
        LOOM_CHECK(embedding_ != nullptr || !stage_.embeds(), "CachedModel: the model has no nn::Embedding; the "
                   "cached forward starts from token ids, so the model's first layer must be one");
        LOOM_CHECK(attention_count_ == cache_.layers(), "CachedModel: the model",
                   stage_.whole() ? std::string()
                                  : loom::detail::concat("'s pipeline stage ", stage_.stage, " of ", stage_.stages),
                   " has ",
                   attention_count_, " CausalSelfAttention layers but the cache has ", cache_.layers(),
                   "; build the cache with one layer per attention layer");
        if (stage_.whole()) {  // what a stage is given, the whole model knows from its Embedding
            stage_.count = attention_count_;
            vocab_ = embedding_->token.full_shape().dim(0);
            width_ = embedding_->width();
        }
        LOOM_CHECK(attention_count_ == stage_.count, "CachedModel: pipeline stage ", stage_.stage, " of ",
                   stage_.stages, " runs ", attention_count_, " attention layers but its ModelStage says ",
                   stage_.count, "; build both from the same model and degree (model_stage)");
        if (embedding_ != nullptr)
            LOOM_CHECK(cache_.capacity() <= embedding_->max_sequence(), "CachedModel: the cache holds ",
                       cache_.capacity(), " positions per slot but the Embedding has positions for ",
                       embedding_->max_sequence(), "; build the cache with capacity <= ", embedding_->max_sequence());
        if (!stage_.whole()) return;
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
    PipelineStage stage_;               // the whole model unless a ModelStage was given
    std::int64_t vocab_ = 0, width_ = 0;  // the whole model's vocabulary; the rows between stages (the Embedding's)
    std::vector<int> units_;            // each unit's stage (empty: the whole model)

    [[nodiscard]] bool in_stage(std::size_t unit) const {
        return units_.empty() || units_[unit] == stage_.stage;
    }
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
