// The fixture of the data-parallel step-program and shard-layout tests
// (tests/parallel/test_step_program*.cpp, test_shard_layout.cpp): the units of
// a small GPT (gpt::Config{layers 2, width 32, heads 2, seq 16, vocab 64}),
// 6 of them: embed (64*32 + 16*32 = 2560 parameters), blocks[0] and blocks[1]
// (12*32^2 + 13*32 = 12704 each), ln_f (64), head (32*64 = 2048, no bias) and
// loss (none): 30080 parameters. Test code only, all inline.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/gpt/model.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/schedule/program.hpp"
#include "loom/schedule/verify.hpp"
#include "support/message_of.hpp"

namespace loom_test::small_gpt {

inline constexpr int unit_count = 6;
inline constexpr std::int64_t parameters = 30080;
// 4096 floats: groups {embed}, {blocks[0]}, {blocks[1], ln_f, head}.
inline constexpr std::int64_t small_bucket = 16 << 10;

inline const std::vector<loom::nn::Unit>& units() {
    static const auto model = std::make_unique<loom::gpt::Model>(
        loom::gpt::make_model({.layers = 2, .width = 32, .heads = 2, .seq = 16, .vocab = 64}));
    static const auto list = loom::nn::units_of(*model, {"embed", "blocks", "ln_f", "head", "loss"});
    return list;
}

// What the layout of the executor is for a stage: buckets, or one group per unit at ZeRO-3.
inline loom::parallel::ShardLayout layout_for(int stage, int ranks, std::int64_t bucket = small_bucket) {
    using loom::parallel::Grouping;
    return loom::parallel::ShardLayout(units(), ranks, stage == 3 ? Grouping::per_unit : Grouping::buckets, bucket);
}

// The verifier's message for `program`, or "(no error)".
inline std::string verify_message(const loom::schedule::StepProgram& program,
                                  const loom::parallel::ShardLayout& layout) {
    return message_of([&] { loom::schedule::verify(program, layout, unit_count); });
}

}  // namespace loom_test::small_gpt
