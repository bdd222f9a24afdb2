// StageEngine: an engine that can be one stage of a pipeline
// (infer/pipelined_batcher.hpp, infer/pipeline_parallel_gpt.hpp): it holds a
// run of the model's attention layers (and, on stage 0, the embedding; on the
// last, the head), takes the stage before's hidden rows and gives the next
// stage its own. loom's GPT (CachedGpt) and a user's model (CachedModel) are
// both one, so the non-blocking pipeline serves either.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "loom/core/error.hpp"
#include "loom/infer/engine.hpp"

namespace loom::infer {

// Attention layers [first, first + count) of a model (a GPT's blocks), held by
// stage `stage` of `stages`; stage 0 embeds the tokens, the last forms the logits.
struct PipelineStage {
    int stage = 0, stages = 1;
    std::int64_t first = 0, count = 0;

    [[nodiscard]] bool embeds() const noexcept { return stage == 0; }
    [[nodiscard]] bool has_head() const noexcept { return stage == stages - 1; }
    [[nodiscard]] bool whole() const noexcept { return stages == 1; }
};

class StageEngine : public Engine {
public:
    using Engine::forward;

    // The layers this engine runs (all of them unless it is a pipeline stage).
    [[nodiscard]] virtual const PipelineStage& stage() const = 0;
    // Features per row between stages: what the stage before sends and this one passes on.
    [[nodiscard]] virtual std::int64_t hidden_width() const = 0;
    // A stage's part of forward(): on stage 0 the segments' tokens are
    // embedded (`hidden` empty), on the others `hidden` is the stage before's
    // output for the same segments ([tokens, hidden_width()], packed). The
    // last stage returns the logits as forward() does, the others the hidden
    // rows for the next stage, valid until the next call.
    virtual std::span<const float> forward_stage(std::span<const Segment> segments, std::span<const float> hidden,
                                                 Logits which) = 0;
    std::span<const float> forward_stage(std::span<const Segment> segments, std::span<const float> hidden) {
        return forward_stage(segments, hidden, Logits::last);
    }

protected:
    // forward() of an engine `who` that may be a stage: a whole model's forward_stage from its tokens.
    std::span<const float> forward_whole(const char* who, std::span<const Segment> segments, Logits which) {
        const PipelineStage& where = stage();
        LOOM_CHECK(where.whole(), who, ": forward on pipeline stage ", where.stage, " of ", where.stages,
                   "; a stage runs forward_stage with the hidden rows of the stage before");
        return forward_stage(segments, std::span<const float>{}, which);
    }

    // The refusal of `given` hidden values for `rows` tokens where the stage expects rows x hidden_width()
    // (none on stage 0, which embeds the tokens).
    void check_hidden(const char* who, std::size_t given, std::int64_t rows) const {
        const PipelineStage& where = stage();
        const std::int64_t width = hidden_width(), expected = where.embeds() ? 0 : rows * width;
        LOOM_CHECK(static_cast<std::int64_t>(given) == expected, who, ": pipeline stage ", where.stage, " of ",
                   where.stages, " was given ", given, " hidden values for ", rows, " tokens; give ",
                   where.embeds() ? std::string("none (stage 0 embeds the tokens)")
                                  : loom::detail::concat(rows, " x ", width, " = ", expected,
                                                         " (the stage before's output)"));
    }
};

}  // namespace loom::infer
