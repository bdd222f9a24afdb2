// plan::why_invalid(model, layout, ranks): each rule a layout keeps against
// the model and the ranks, refused in one sentence that names the wrong
// value and what would be valid; the planner's candidates and train_gpt's
// flags are checked by these same sentences.
#include <catch2/catch.hpp>

#include <string>

#include "loom/plan/gpt_description.hpp"
#include "loom/plan/layout_rules.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::plan::Layout;

namespace {

// GPT of `layers` blocks, 96 wide, `heads` heads, sequence `seq`, vocabulary `vocab`, batch `batch`.
std::string why(const Layout& l, std::int64_t heads = 4, std::int64_t seq = 32, std::int64_t vocab = 256,
                std::int64_t batch = 8, std::int64_t layers = 4) {
    return loom::plan::why_invalid(loom::plan::describe_gpt({layers, 96, heads, seq, vocab}, batch), l, l.ranks());
}

Layout tensor(int tp, bool grid = false) {
    Layout l;
    l.tp = tp;
    l.strategy.tensor_parallel = true;
    l.strategy.tensor_grid = grid;
    return l;
}

Layout sequence(int sp, loom::nn::SequenceAttention attention, int ulysses = 1, bool zigzag = true) {
    Layout l;
    l.sp = sp;
    l.strategy.sequence_parallel = true;
    l.strategy.sequence_attention = attention;
    l.strategy.sequence_ulysses = ulysses;
    l.strategy.sequence_zigzag = zigzag;
    return l;
}

Layout pipeline(int pp, loom::ScheduleKind schedule, int chunks, int micro_batches) {
    Layout l;
    l.pp = pp;
    l.micro_batches = micro_batches;
    l.strategy.pipelined = true;
    l.strategy.schedule = schedule;
    l.strategy.chunks = chunks;
    return l;
}

}  // namespace

TEST_CASE("layout rules: a valid layout has no reason", "[plan][layout]") {
    Layout l = tensor(2);
    l.dp = 2;
    CHECK(why(l).empty());
    CHECK(why(sequence(2, loom::nn::SequenceAttention::ulysses)).empty());
    CHECK(why(pipeline(2, loom::ScheduleKind::interleaved, 2, 2)).empty());
}

TEST_CASE("layout rules: the degrees and the ranks", "[plan][layout]") {
    Layout l;
    l.dp = 0;
    CHECK(why(l) == "the degrees dp 0, pp 1, tp 1, sp 1 must be 1 or more");
    l = tensor(2);
    l.dp = 2;
    CHECK(loom::plan::why_invalid(loom::plan::describe_gpt({4, 64, 4, 32, 256}, 8), l, 6) ==
          "dp 2 x tp 2 = 4 ranks, but there are 6; the degrees must multiply to 6");
}

TEST_CASE("layout rules: each degree above 1 and the policy that cuts along it", "[plan][layout]") {
    Layout l;
    l.tp = 2;
    CHECK(why(l) == "tp 2 needs TensorParallel or Optimus2D in the strategy; add it");
    l = {};
    l.strategy.pipelined = true;
    CHECK(why(l) == "the strategy names Pipeline<...> but pp is 1; use pp 2 or more");
    l = {};
    l.sp = 2;
    CHECK(why(l) == "sp 2 needs SequenceParallel<...> in the strategy; add it");
}

TEST_CASE("layout rules: the batch, the ZeRO stage and the dp compressor", "[plan][layout]") {
    Layout l;
    l.dp = 4;
    CHECK(why(l, 4, 32, 256, 10) ==
          "batch 10 does not split into dp 4 x 1 micro-batches of whole samples; use a batch that is a multiple of 4");
    l = {};
    l.strategy.zero_stage = 5;
    CHECK(why(l) == "ZeRO stage 5 is not 0, 1, 2 or 3");
    l = {};
    l.strategy.dp_compression = loom::parse_compression("bf16");
    CHECK(why(l) == "GradCompress<CastBf16> compresses the data-parallel gradient exchange, which one rank does not "
                    "have; use dp 2 or more");
}

TEST_CASE("layout rules: Megatron's heads and vocabulary", "[plan][layout]") {
    CHECK(why(tensor(4), 6) == "tp 4 does not divide the 6 attention heads; use 1, 2, 3 or 6");
    CHECK(why(tensor(2), 4, 32, 9) == "tp 2 does not divide the vocabulary of 9 tokens; use 1, 3 or 9");
}

TEST_CASE("layout rules: Optimus's square grid and what its side cuts", "[plan][layout]") {
    CHECK(why(tensor(6, true)) == "a 2D tensor grid of 6 ranks is not a square; use 4 or 9 (q x q)");
    CHECK(why(tensor(9, true), 2) ==
          "the 2D grid's side 3 (tp 9) does not divide the 2 attention heads; use a 2D tp of 1 or 4");
    CHECK(why(tensor(4, true), 4, 32, 9) ==
          "the 2D grid's side 2 (tp 4) does not divide the 9 tokens of the vocabulary; use a 2D tp of 1, 9 or 81");
    CHECK(why(tensor(4, true), 4, 32, 256, 3) ==
          "the 2D grid's side 2 (tp 4) does not divide the 3 samples of each rank's micro-batch (batch / (dp x "
          "micro-batches)); use a 2D tp of 1 or 9");
}

TEST_CASE("layout rules: sequence parallelism's chunks, heads and ring", "[plan][layout]") {
    using loom::nn::SequenceAttention;
    CHECK(why(sequence(3, SequenceAttention::ring), 4, 8) ==
          "sp 3 does not cut the sequence of 8 tokens into 6 equal chunks (the zigzag layout, 2 per rank); use a "
          "sequence that is a multiple of 6");
    CHECK(why(sequence(3, SequenceAttention::ring, 1, false), 4, 8) ==
          "sp 3 does not cut the sequence of 8 tokens into 3 equal chunks; use a sequence that is a multiple of 3");
    CHECK(why(sequence(4, SequenceAttention::ulysses, 0), 2) ==
          "Ulysses over sp 4 does not divide the 2 attention heads; use sp 1 or 2, or RingAttention");
    CHECK(why(sequence(2, SequenceAttention::hybrid, 2)) ==
          "UlyssesRing<2> does not leave a ring of 2 or more in sp 2; use an sp that is a multiple of 4 (or Ulysses "
          "for a group of all sp ranks)");
    CHECK(why(sequence(8, SequenceAttention::hybrid, 4), 2) ==
          "UlyssesRing<4> does not divide the 2 attention heads; use a group size dividing 2");
    loom::plan::ModelDescription unknown = loom::plan::describe_gpt({4, 96, 4, 32, 256}, 8);
    unknown.sequence = 0;  // a hand-written description that does not say
    CHECK(loom::plan::why_invalid(unknown, sequence(2, SequenceAttention::ring), 2) ==
          "sequence parallelism needs the model's sequence length");
    Layout l = sequence(2, SequenceAttention::ring);
    l.tp = 4;
    l.strategy.tensor_parallel = l.strategy.tensor_grid = true;
    CHECK(why(l) == "sequence parallelism does not combine with a 2D tensor grid; cut tp in 1D (TensorParallel) with it");
}

TEST_CASE("layout rules: a pipeline's stages, partition and schedule", "[plan][layout]") {
    using loom::ScheduleKind;
    CHECK(why(pipeline(2, ScheduleKind::one_f_one_b, 1, 1), 4, 32, 256, 8, 1) ==
          "pp 2 = 2 stages but the model has 1 layer; every stage needs at least one layer: use pp <= 1 or more layers");
    CHECK(why(pipeline(2, ScheduleKind::interleaved, 3, 2), 4, 32, 256, 8, 4) ==
          "pp 2 x 3 chunks = 6 stages but the model has 4 layers; every stage needs at least one layer: use pp <= 1, "
          "fewer chunks or more layers");
    Layout l = pipeline(2, ScheduleKind::one_f_one_b, 1, 1);
    l.partition = {2, 1};
    CHECK(why(l) == "a partition of 2 stages summing to 3 layers for pp 2 = 2 stages; give 2 counts of 1 or more "
                    "summing to 4");
    CHECK(why(pipeline(2, ScheduleKind::interleaved, 2, 1)) ==
          "Interleaved<2>: 1 micro-batches over 2 stages; interleaving needs a multiple of the stages (2, 4, ...)");
}

}  // namespace LOOM_TEST_FILE
