// A pipeline-parallel serving stage of loom's GPT: which contiguous run of
// blocks stage `stage` of `stages` holds (stage 0 also the embeddings, the
// last stage also the final LayerNorm and the head), the stage's model with
// only those weights, and its values copied from a whole checkpoint.
//
// The degree must divide the layers: every stage then holds the same number
// of blocks, so no stage is the pipeline's bottleneck by construction (an
// uneven partition would make the slowest stage set every group's pace).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "loom/core/error.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/stage_engine.hpp"
#include "loom/nn/param_arena.hpp"

namespace loom::infer {

namespace detail {

// "1, 2 or 4": the degrees that divide `layers`, for error messages.
[[nodiscard]] inline std::string pipeline_degrees_dividing(std::int64_t layers) {
    std::string list;
    std::int64_t last = 0;
    for (std::int64_t d = 1; d <= layers; ++d)
        if (layers % d == 0) last = d;
    for (std::int64_t d = 1; d <= layers; ++d) {
        if (layers % d != 0) continue;
        if (!list.empty()) list += d == last ? " or " : ", ";
        list += std::to_string(d);
    }
    return list;
}

}  // namespace detail

// Stage `stage` of a pipeline of `stages` over the config's blocks; a
// degree that does not divide the layers (or exceeds them) is named.
[[nodiscard]] inline PipelineStage pipeline_stage(const gpt::Config& config, int stage, int stages) {
    config.validate();
    LOOM_CHECK(stages >= 1 && stages <= config.layers && config.layers % stages == 0, "pipeline degree ", stages,
               stages > config.layers ? " exceeds the " : " does not divide the ", config.layers,
               " layers; use ", detail::pipeline_degrees_dividing(config.layers));
    LOOM_CHECK(stage >= 0 && stage < stages, "pipeline stage ", stage, " is not in a pipeline of ", stages,
               " stages; give a stage in [0, ", stages, ")");
    const std::int64_t count = config.layers / stages;
    return {stage, stages, stage * count, count};
}

// A pipeline stage's KV cache: `slots` sequences of `capacity` positions for
// its blocks only (KvCache's other arguments as there).
[[nodiscard]] inline KvCache pipeline_cache(const gpt::Config& config, const PipelineStage& where, std::int64_t slots,
                                            std::int64_t capacity, std::int64_t block_size = 16,
                                            std::int64_t blocks = 0) {
    return {where.count, config.width, slots, capacity, block_size, blocks};
}

// The model stage `where` holds: its blocks, and the embeddings and head only
// where it uses them (elsewhere they are Params of no elements, so a stage's
// arena holds its own weights and nothing more). Bind it (nn::ParamArena)
// and fill it with load_stage_values: its initialisation is not the whole
// model's (GPT-2's residual scale depends on the depth).
[[nodiscard]] inline gpt::Model make_stage_model(const gpt::Config& config, const PipelineStage& where) {
    gpt::Config stage_config = config;
    stage_config.layers = where.count;
    gpt::Model model = gpt::make_model(stage_config);
    const std::int64_t C = config.width;
    if (!where.embeds()) {
        model.embed.token = Param{Shape{0, C}};
        model.embed.position = Param{Shape{0, C}};
    }
    if (!where.has_head()) {
        model.ln_f.gain = Param{Shape{0}};
        model.ln_f.shift = Param{Shape{0}};
        model.head.weight = Param{Shape{0, C}};
    }
    return model;
}

// Fills a bound stage model from the whole model's values in serial order (a
// whole model's ParamArena::values(), or what gpt::load_checkpoint reads):
// the embeddings, each block and the tail (ln_f, head) are contiguous runs
// there, in the order a stage's arena holds them. The stage may also be a
// tensor-parallel serving shard (infer::shard_for_serving after
// make_stage_model): each element then comes from its place in the whole
// tensor (Param::full_index).
inline void load_stage_values(gpt::Model& stage_model, const gpt::Config& config, const PipelineStage& where,
                              std::span<const float> whole) {
    LOOM_CHECK(static_cast<std::int64_t>(whole.size()) == config.parameters(), "load_stage_values: ", whole.size(),
               " values given but the whole ", config, " has ", config.parameters(),
               "; give the whole model's values in serial order");
    LOOM_CHECK(static_cast<std::int64_t>(stage_model.blocks.size()) == where.count, "load_stage_values: the model has ",
               stage_model.blocks.size(), " blocks but stage ", where.stage, " holds ", where.count,
               "; build it with make_stage_model");
    const std::int64_t C = config.width;
    const std::int64_t embeddings = (config.vocab + config.seq) * C, block = 12 * C * C + 13 * C;
    std::int64_t stage_total = 0;  // of the whole tensors the stage's Params are (cuts of)
    reflect::visit_params(stage_model, [&](const Param& p, std::string_view path) {
        LOOM_CHECK(p.bound(), "load_stage_values: parameter ", path, " is not bound; bind the stage model first");
        stage_total += p.full_shape().numel();
    });
    const std::int64_t expected = (where.embeds() ? embeddings : 0) + where.count * block +
                                  (where.has_head() ? 2 * C + config.vocab * C : 0);
    LOOM_CHECK(stage_total == expected, "load_stage_values: the stage model holds ", stage_total,
               " values but stage ", where.stage, " of ", where.stages, " holds ", expected,
               "; build it with make_stage_model(config, pipeline_stage(config, ", where.stage, ", ", where.stages,
               "))");
    // Walked Param by Param: the first two are the embeddings, then each block's 12, then the tail's;
    // a Param the stage does not hold has no elements and copies nothing.
    constexpr std::int64_t params_per_block = 12;
    std::int64_t index = 0, from = 0;
    reflect::visit_params(stage_model, [&](Param& p, std::string_view) {
        if (index == 2) from = embeddings + where.first * block;
        if (index == 2 + params_per_block * where.count) from = embeddings + config.layers * block;
        float* local = p.numel() > 0 ? p.value.data<float>() : nullptr;
        if (!p.slice.sliced())
            std::copy_n(whole.data() + from, p.numel(), local);
        else
            for (std::int64_t k = 0; k < p.numel(); ++k)
                local[k] = whole[static_cast<std::size_t>(from + p.full_index(k))];
        from += p.full_shape().numel();
        ++index;
    });
}

}  // namespace loom::infer
