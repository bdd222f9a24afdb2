// StrategySpec, the one value of a strategy: Strategy<...>::spec prints what
// the type prints, parse_strategy reads every family back, equal specs hash
// alike, and every rule's run-time sentence is the static_assert's.
#include <catch2/catch.hpp>

#include <functional>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <loom/exec/execution_plan.hpp>
#include <loom/parallel/optimus2d.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/parallel/strategy_text.hpp>
#include <loom/parallel/tensor_parallel.hpp>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using namespace loom;

template <class S>
std::string printed() {
    std::ostringstream out;
    out << S{};
    return out.str();
}

std::string message_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.message();
    }
    return "(no error)";
}

// A strategy written in the canonical order: its spec prints the type's
// own text, and that text reads back to the same spec.
template <class S>
void check_round_trip() {
    constexpr StrategySpec spec = S::spec;
    const std::string text = printed<S>();
    INFO(text);
    CHECK(spec.text() == text);
    CHECK(parse_strategy(text) == spec);
    CHECK(parse_strategy(text).text() == text);
    CHECK(exec::ExecutionPlan::of<S>() == spec);
}

}  // namespace

TEST_CASE("every strategy family prints as its type and reads back", "[parallel][strategy][spec]") {
    // Data parallelism, buckets, ZeRO.
    check_round_trip<Strategy<DataParallel<>>>();
    check_round_trip<Strategy<DataParallel<BucketBytes<4 << 20>>>>();
    check_round_trip<Strategy<DataParallel<BucketBytes<16 << 10>>, ZeroShard<3>>>();
    check_round_trip<Strategy<DataParallel<BucketBytes<1000>>>>();
    check_round_trip<Strategy<DataParallel<BucketBytes<(2 << 20) + 1>>>>();  // words would round: written in bytes
    check_round_trip<Strategy<DataParallel<BucketBytes<std::int64_t{3} << 30>>>>();
    check_round_trip<Strategy<DataParallel<>, ZeroShard<1>>>();
    check_round_trip<Strategy<DataParallel<>, ZeroShard<2>>>();
    // Every pipeline schedule.
    check_round_trip<Strategy<DataParallel<>, Pipeline<GPipe>>>();
    check_round_trip<Strategy<DataParallel<>, Pipeline<OneFOneB>, ZeroShard<1>>>();
    check_round_trip<Strategy<DataParallel<>, Pipeline<ZeroBubbleH1>>>();
    check_round_trip<Strategy<DataParallel<>, Pipeline<ZeroBubbleV>, ZeroShard<3>>>();
    check_round_trip<Strategy<DataParallel<>, Pipeline<Interleaved<3>>>>();
    // Tensor parallelism, 1D and 2D.
    check_round_trip<Strategy<DataParallel<>, Pipeline<OneFOneB>, TensorParallel, ZeroShard<1>>>();
    check_round_trip<Strategy<DataParallel<>, Optimus2D, ZeroShard<2>>>();
    // Sequence parallelism: every attention, both layouts.
    check_round_trip<Strategy<DataParallel<>, SequenceParallel<RingAttention>>>();
    check_round_trip<Strategy<DataParallel<>, SequenceParallel<Ulysses, Contiguous>>>();
    check_round_trip<Strategy<DataParallel<>, TensorParallel, SequenceParallel<UlyssesRing<2>>>>();
    check_round_trip<Strategy<DataParallel<>, SequenceParallel<UlyssesRing<4>, Contiguous>, ZeroShard<1>>>();
    // Every compressor, on every axis it may take.
    check_round_trip<Strategy<DataParallel<>, GradCompress<CastBf16>>>();
    check_round_trip<Strategy<DataParallel<>, GradCompress<CastFp16>>>();
    check_round_trip<Strategy<DataParallel<>, GradCompress<Int8Block<>>>>();
    check_round_trip<Strategy<DataParallel<>, GradCompress<Int8Block<64>>>>();
    check_round_trip<Strategy<DataParallel<>, GradCompress<TopK<0.01>>>>();
    check_round_trip<Strategy<DataParallel<>, GradCompress<TopK<0.0123456789>>>>();  // shortest exact digits
    check_round_trip<Strategy<DataParallel<>, ZeroShard<1>, GradCompress<PowerSGD<4>>>>();
    check_round_trip<Strategy<DataParallel<>, GradCompress<OneBit>>>();
    check_round_trip<Strategy<DataParallel<>, GradCompress<OneBitBlock<256>>>>();
    check_round_trip<Strategy<DataParallel<>, Pipeline<OneFOneB>, TensorParallel, ZeroShard<2>, GradCompress<TopK<0.01>>,
                              GradCompress<CastBf16, PpAxis>, GradCompress<CastFp16, TpAxis>>>();
    // Recomputation, alone and last after everything else.
    check_round_trip<Strategy<DataParallel<>, Recompute<Full>>>();
    check_round_trip<Strategy<DataParallel<>, Pipeline<OneFOneB>, Recompute<Selective>>>();
    check_round_trip<Strategy<DataParallel<>, Recompute<Budget<std::int64_t{64} << 20>>>>();
    check_round_trip<Strategy<DataParallel<>, Recompute<Budget<1000001>>>>();  // words would round: in bytes
    check_round_trip<Strategy<DataParallel<>, Pipeline<ZeroBubbleV>, TensorParallel, ZeroShard<3>,
                              GradCompress<CastBf16, PpAxis>, Recompute<Full>>>();
}

TEST_CASE("a strategy's spec is what parse_strategy reads from its text, in any order", "[parallel][strategy][spec]") {
    using S = Strategy<ZeroShard<2>, GradCompress<CastBf16, PpAxis>, Pipeline<Interleaved<2>>, DataParallel<>>;
    CHECK(printed<S>() ==
          "Strategy<ZeroShard<2>, GradCompress<CastBf16, PpAxis>, Pipeline<Interleaved<2>>, DataParallel<bucket 2 MiB>>");
    CHECK(parse_strategy(printed<S>()) == S::spec);
    CHECK(S::spec.text() ==
          "Strategy<DataParallel<bucket 2 MiB>, Pipeline<Interleaved<2>>, ZeroShard<2>, GradCompress<CastBf16, PpAxis>>");
    // ZeroShard alone implies DataParallel with the default bucket; Strategy<> is plain data parallelism.
    CHECK(parse_strategy(printed<Strategy<ZeroShard<1>>>()) == Strategy<ZeroShard<1>>::spec);
    CHECK(parse_strategy(printed<Strategy<>>()) == Strategy<>::spec);
    CHECK(Strategy<>::spec == StrategySpec{});
    STATIC_REQUIRE(Strategy<DataParallel<>, ZeroShard<3>>::spec == StrategySpec{.zero_stage = 3});
}

TEST_CASE("parse_strategy reads the C++ spelling, loom:: prefixes and bare lists", "[parallel][strategy][spec]") {
    const StrategySpec spec = Strategy<DataParallel<>, Pipeline<OneFOneB>, TensorParallel, ZeroShard<1>>::spec;
    CHECK(parse_strategy("loom::Strategy<loom::DataParallel<>, loom::Pipeline<loom::OneFOneB>, loom::TensorParallel, "
                         "loom::ZeroShard<1>>") == spec);
    CHECK(parse_strategy("DataParallel<>, Pipeline<1F1B>, TensorParallel, ZeroShard<1>") == spec);
    CHECK(parse_strategy("  Pipeline < 1F1B > ,TensorParallel,ZeroShard<1>") == spec);
    CHECK(parse_strategy("Strategy<DataParallel, Pipeline, TensorParallel, ZeroShard<1>>") == spec);  // defaults
    CHECK(parse_strategy("DataParallel<BucketBytes<4194304>>") == Strategy<DataParallel<BucketBytes<4 << 20>>>::spec);
    CHECK(parse_strategy("Pipeline<ZeroBubbleH1>") == Strategy<Pipeline<ZeroBubbleH1>>::spec);
    CHECK(parse_strategy("Pipeline<ZeroBubbleV>") == Strategy<Pipeline<ZeroBubbleV>>::spec);
    CHECK(parse_strategy("SequenceParallel<Ulysses, Zigzag>") == Strategy<SequenceParallel<Ulysses>>::spec);
    CHECK(parse_strategy("SequenceParallel") == Strategy<SequenceParallel<>>::spec);
    CHECK(parse_strategy("GradCompress<OneBitBlock<64>, DpAxis>") == Strategy<GradCompress<OneBit>>::spec);
    CHECK(parse_strategy("Recompute<Budget<1048576>>") == Strategy<Recompute<Budget<1 << 20>>>::spec);
    CHECK(parse_strategy("loom::Recompute<loom::Full>") == Strategy<Recompute<Full>>::spec);
    CHECK(parse_strategy("Recompute<Selective>") == Strategy<Recompute<Selective>>::spec);
    CHECK(parse_strategy("") == StrategySpec{});
}

TEST_CASE("equal strategies are equal values with equal hashes", "[parallel][strategy][spec]") {
    const std::vector<StrategySpec> distinct = {
        Strategy<>::spec,
        Strategy<ZeroShard<1>>::spec,
        Strategy<DataParallel<BucketBytes<4 << 20>>>::spec,
        Strategy<Pipeline<OneFOneB>>::spec,
        Strategy<Pipeline<Interleaved<2>>>::spec,
        Strategy<Pipeline<Interleaved<3>>>::spec,
        Strategy<TensorParallel>::spec,
        Strategy<Optimus2D>::spec,
        Strategy<SequenceParallel<Ulysses>>::spec,
        Strategy<SequenceParallel<Ulysses, Contiguous>>::spec,
        Strategy<GradCompress<TopK<0.01>>>::spec,
        Strategy<GradCompress<TopK<0.02>>>::spec,
        Strategy<GradCompress<CastBf16, PpAxis>>::spec,
        Strategy<GradCompress<CastBf16, TpAxis>>::spec,
        Strategy<Recompute<Full>>::spec,
        Strategy<Recompute<Selective>>::spec,
        Strategy<Recompute<Budget<1 << 20>>>::spec,
        Strategy<Recompute<Budget<2 << 20>>>::spec,
    };
    const std::unordered_set<StrategySpec> set(distinct.begin(), distinct.end());
    CHECK(set.size() == distinct.size());
    for (const StrategySpec& s : distinct) {
        const StrategySpec again = parse_strategy(s.text());
        CHECK(again == s);
        CHECK(std::hash<StrategySpec>{}(again) == std::hash<StrategySpec>{}(s));
        CHECK(set.count(again) == 1);
    }
    CHECK(distinct[1] != distinct[0]);
}

TEST_CASE("a broken rule reads the same at run time as at compile time", "[parallel][strategy][spec]") {
    // The sentences the static_asserts give (tests/compile_fail checks those), from the text.
    CHECK(message_of([] { (void)parse_strategy("DataParallel<>, DataParallel<>"); }) == LOOM_RULE_ONE_DATA_PARALLEL);
    CHECK(message_of([] { (void)parse_strategy("ZeroShard<1>, ZeroShard<2>"); }) == LOOM_RULE_ONE_ZERO_STAGE);
    CHECK(message_of([] { (void)parse_strategy("TensorParallel, Optimus2D"); }) == LOOM_RULE_ONE_TENSOR_POLICY);
    CHECK(message_of([] { (void)parse_strategy("SequenceParallel, SequenceParallel<Ulysses>"); }) ==
          LOOM_RULE_ONE_SEQUENCE_POLICY);
    CHECK(message_of([] { (void)parse_strategy("Pipeline<GPipe>, Pipeline<1F1B>"); }) == LOOM_RULE_ONE_PIPELINE);
    CHECK(message_of([] { (void)parse_strategy("GradCompress<CastBf16>, GradCompress<TopK<0.1>, DpAxis>"); }) ==
          LOOM_RULE_ONE_COMPRESSOR_PER_AXIS);
    CHECK(message_of([] { (void)parse_strategy("GradCompress<TopK<0.1>, PpAxis>"); }) == LOOM_RULE_ACTIVATION_CAST);
    CHECK(message_of([] { (void)parse_strategy("ZeroShard<4>"); }) == LOOM_RULE_ZERO_STAGE_RANGE);
    CHECK(message_of([] { (void)parse_strategy("Pipeline<Interleaved<1>>"); }) == LOOM_RULE_INTERLEAVED_CHUNKS);
    CHECK(message_of([] { (void)parse_strategy("SequenceParallel<UlyssesRing<1>>"); }) == LOOM_RULE_ULYSSES_GROUP);
    CHECK(message_of([] { (void)parse_strategy("DataParallel<BucketBytes<4>, bucket 2 MiB>"); }) ==
          LOOM_RULE_ONE_BUCKET_SIZE);
    CHECK(message_of([] { (void)parse_strategy("Recompute<Full>, Recompute<Budget 1 MiB>"); }) ==
          LOOM_RULE_ONE_RECOMPUTE);

    // A spec built field by field (from flags) is held to the same sentences.
    const auto validated = [](StrategySpec s) { return message_of([&] { s.validate(); }); };
    CHECK(validated(StrategySpec{.zero_stage = 4}) == LOOM_RULE_ZERO_STAGE_RANGE);
    CHECK(validated(StrategySpec{.bucket_bytes = 0}) == LOOM_RULE_BUCKET_BYTES);
    CHECK(validated(StrategySpec{.pipelined = true, .schedule = ScheduleKind::interleaved, .chunks = 1}) ==
          LOOM_RULE_INTERLEAVED_CHUNKS);
    CHECK(validated(StrategySpec{.pipelined = true, .schedule = ScheduleKind::zero_bubble_v, .chunks = 3}) ==
          LOOM_RULE_SCHEDULE_CHUNKS);
    CHECK(validated(StrategySpec{.sequence_parallel = true, .sequence_attention = nn::SequenceAttention::hybrid}) ==
          LOOM_RULE_ULYSSES_GROUP);
    CHECK(validated(StrategySpec{.tp_compression = Compression{CompressorKind::one_bit, 1.0, 0, 64}}) ==
          LOOM_RULE_ACTIVATION_CAST);
    CHECK(validated(StrategySpec{.dp_compression = Compression{CompressorKind::top_k, 2.0}}) ==
          "TopK: ratio 2 is outside (0, 1]; it is the fraction of each chunk sent, e.g. 0.01 for 1%");
    CHECK(validated(StrategySpec{.recompute = {RecomputeMode::budget, 0}}) == LOOM_RULE_RECOMPUTE_BUDGET);
    CHECK(validated(Strategy<DataParallel<>, Pipeline<ZeroBubbleV>>::spec) == "(no error)");
}

TEST_CASE("a bad token is named in one line with what would fit", "[parallel][strategy][spec]") {
    const auto error = [](const char* text) { return message_of([&] { (void)parse_strategy(text); }); };
    CHECK(error("Strategy<DataParallel<>, Foo>") ==
          "strategy \"Strategy<DataParallel<>, Foo>\": expected a policy (DataParallel<...>, ZeroShard<1|2|3>, "
          "Pipeline<...>, TensorParallel, Optimus2D, SequenceParallel<...>, GradCompress<...>, Recompute<...>) or '>', found \"Foo\"");
    CHECK(error("Pipeline<OneFTwoB>") ==
          "strategy \"Pipeline<OneFTwoB>\": expected a pipeline schedule (GPipe, 1F1B, ZB-H1, ZB-V, Interleaved<V>), "
          "found \"OneFTwoB\"");
    CHECK(error("ZeroShard<x>") == "strategy \"ZeroShard<x>\": expected ZeroShard's whole number in 0..1048576, found \"x\"");
    CHECK(error("Strategy<DataParallel<>") ==
          "strategy \"Strategy<DataParallel<>\": expected ',' after a policy, found the end of the text");
    CHECK(error("DataParallel<> ZeroShard<1>") ==
          "strategy \"DataParallel<> ZeroShard<1>\": expected ',' after a policy, found \"ZeroShard\"");
    CHECK(error("Strategy<TensorParallel> extra") ==
          "strategy \"Strategy<TensorParallel> extra\": expected the end of the text, found \"extra\"");
    CHECK(error("DataParallel<bucket 1.1 KiB>") ==
          "strategy \"DataParallel<bucket 1.1 KiB>\": expected a bucket size in whole bytes (2 MiB, 512.0 KiB, 1000 B), "
          "found \"1.1 KiB\"");
    CHECK(error("DataParallel<size 4>") ==
          "strategy \"DataParallel<size 4>\": expected a DataParallel option (bucket 2 MiB, BucketBytes<N>) or '>', "
          "found \"size\"");
    CHECK(error("SequenceParallel<Ring>") ==
          "strategy \"SequenceParallel<Ring>\": expected a sequence attention (RingAttention, Ulysses, UlyssesRing<K>), "
          "found \"Ring\"");
    CHECK(error("SequenceParallel<Ulysses, Striped>") ==
          "strategy \"SequenceParallel<Ulysses, Striped>\": expected a sequence layout (Zigzag, Contiguous), found "
          "\"Striped\"");
    CHECK(error("GradCompress<Gzip>") ==
          "strategy \"GradCompress<Gzip>\": expected a compressor (CastBf16, CastFp16, Int8Block<B>, TopK<RATIO>, "
          "PowerSGD<RANK>, OneBit), found \"Gzip\"");
    CHECK(error("GradCompress<CastBf16, SpAxis>") ==
          "strategy \"GradCompress<CastBf16, SpAxis>\": expected an axis (DpAxis, PpAxis, TpAxis), found \"SpAxis\"");
    CHECK(error("GradCompress<TopK<lots>>") ==
          "strategy \"GradCompress<TopK<lots>>\": expected TopK's ratio in (0, 1], found \"lots\"");
    CHECK(error("Recompute<Half>") ==
          "strategy \"Recompute<Half>\": expected what to recompute (Full, Selective, Budget 64 MiB, Budget<N>), found \"Half\"");
    CHECK(error("Recompute<Budget lots MiB>") ==
          "strategy \"Recompute<Budget lots MiB>\": expected a budget in whole bytes (64 MiB, 1.5 GiB, 1000 B), found "
          "\"lots MiB\"");
    CHECK(error("Recompute<Budget<0>>") ==
          "strategy \"Recompute<Budget<0>>\": expected Budget's whole number in 1..4611686018427387904, found \"0\"");
    CHECK(error("GradCompress<TopK<0>>") ==
          "TopK: ratio 0 is outside (0, 1]; it is the fraction of each chunk sent, e.g. 0.01 for 1%");
}

}  // namespace LOOM_TEST_FILE
