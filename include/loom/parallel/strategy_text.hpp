// parse_strategy: a StrategySpec from the text a Strategy prints, the one
// grammar train_gpt --strategy, loom-plan and a user's configuration share,
// so that any strategy printed (by a run, by the planner) can be pasted back.
//
//   strategy   := [Strategy '<'] [policy {',' policy}] ['>']
//   policy     := DataParallel ['<' [bucket NUMBER B|KiB|MiB|GiB | BucketBytes<N>] '>']
//               | ZeroShard<1|2|3>
//               | Pipeline ['<' GPipe | 1F1B | OneFOneB | ZB-H1 | ZeroBubbleH1
//                              | ZB-V | ZeroBubbleV | Interleaved<V> '>']
//               | TensorParallel | Optimus2D
//               | SequenceParallel ['<' RingAttention | Ulysses | UlyssesRing<K> [',' Zigzag | Contiguous] '>']
//               | GradCompress '<' compressor [',' DpAxis | PpAxis | TpAxis] '>'
//               | Recompute '<' Full | Selective | Budget NUMBER B|KiB|MiB|GiB | Budget<N> '>'
//   compressor := CastBf16 | CastFp16 | Int8Block[<B>] | TopK<RATIO> | PowerSGD<RANK> | OneBit[<B>] | OneBitBlock[<B>]
//
// Every name may carry a `loom::` prefix, and white space is free, so
// Candidate's C++ spelling and the printed one both read. A policy may come
// in any order; the spec prints them in the canonical one.
#pragma once

#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include "loom/core/error.hpp"
#include "loom/parallel/strategy_rules.hpp"
#include "loom/parallel/strategy_spec.hpp"

namespace loom {

namespace detail {

// Words, '<', '>' and ','; a word drops its `loom::` prefixes.
class StrategyReader {
public:
    explicit StrategyReader(std::string_view text) : text_(text) {}

    // The next token without taking it; empty at the end.
    [[nodiscard]] std::string_view peek() {
        while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
        if (at_ == text_.size()) return {};
        if (is_mark(text_[at_])) return text_.substr(at_, 1);
        std::size_t end = at_;
        while (end < text_.size() && !is_mark(text_[end]) && !std::isspace(static_cast<unsigned char>(text_[end]))) ++end;
        std::string_view word = text_.substr(at_, end - at_);
        while (word.starts_with("loom::")) word.remove_prefix(6);
        return word;
    }
    std::string_view take() {
        const std::string_view token = peek();
        if (token.empty()) return token;
        if (is_mark(text_[at_])) ++at_;
        else
            while (at_ < text_.size() && !is_mark(text_[at_]) && !std::isspace(static_cast<unsigned char>(text_[at_])))
                ++at_;
        return token;
    }
    bool accept(char mark) {
        if (peek() != std::string_view(&mark, 1)) return false;
        take();
        return true;
    }
    void expect(char mark, std::string_view after) {
        if (!accept(mark)) fail(peek(), std::string("'") + mark + "' after " + std::string(after));
    }
    // "strategy "Strategy<Foo>": expected a policy (...), found "Foo"".
    [[noreturn]] void fail(std::string_view token, const std::string& expected) const {
        // Streamed piece by piece: GCC 12's -Wrestrict misreads `"\"" + std::string(token)` here.
        if (token.empty()) LOOM_FAIL("strategy \"", text_, "\": expected ", expected, ", found the end of the text");
        LOOM_FAIL("strategy \"", text_, "\": expected ", expected, ", found \"", token, "\"");
    }
    // A whole number in [low, high] between '<' and '>'.
    std::int64_t number_argument(std::string_view what, std::int64_t low, std::int64_t high) {
        expect('<', what);
        const std::string_view token = take();
        std::int64_t value = 0;
        const auto [end, error] = std::from_chars(token.data(), token.data() + token.size(), value);
        if (error != std::errc{} || end != token.data() + token.size() || value < low || value > high)
            fail(token, std::string(what) + "'s whole number in " + std::to_string(low) + ".." + std::to_string(high));
        expect('>', what);
        return value;
    }

private:
    static bool is_mark(char c) { return c == '<' || c == '>' || c == ','; }
    std::string_view text_;
    std::size_t at_ = 0;
};

inline void parse_data_parallel(StrategyReader& in, StrategySpec& spec) {
    if (!in.accept('<')) return;
    int sizes = 0;
    while (!in.accept('>')) {
        if (sizes > 0) in.expect(',', "a DataParallel option");
        const std::string_view word = in.take();
        if (word == "bucket") {
            const std::string_view number = in.take(), unit = in.take();
            const auto bytes = parse_bucket_size(number, unit);
            if (!bytes) in.fail(std::string(number) + " " + std::string(unit), "a bucket size in whole bytes (2 MiB, 512.0 KiB, 1000 B)");
            spec.bucket_bytes = *bytes;
        } else if (word == "BucketBytes") {
            spec.bucket_bytes = in.number_argument("BucketBytes", 1, std::int64_t{1} << 62);
        } else {
            in.fail(word, "a DataParallel option (bucket 2 MiB, BucketBytes<N>) or '>'");
        }
        LOOM_CHECK(++sizes == 1, LOOM_RULE_ONE_BUCKET_SIZE);
    }
}

inline void parse_pipeline(StrategyReader& in, StrategySpec& spec) {
    spec.pipelined = true;
    if (!in.accept('<')) return;
    const std::string_view word = in.take();
    if (word == "GPipe") spec.schedule = ScheduleKind::gpipe;
    else if (word == "1F1B" || word == "OneFOneB") spec.schedule = ScheduleKind::one_f_one_b;
    else if (word == "ZB-H1" || word == "ZeroBubbleH1") spec.schedule = ScheduleKind::zero_bubble_h1;
    else if (word == "ZB-V" || word == "ZeroBubbleV") spec.schedule = ScheduleKind::zero_bubble_v;
    else if (word == "Interleaved") spec.schedule = ScheduleKind::interleaved;
    else in.fail(word, "a pipeline schedule (GPipe, 1F1B, ZB-H1, ZB-V, Interleaved<V>)");
    spec.chunks = fixed_chunks(spec.schedule);
    if (spec.schedule == ScheduleKind::interleaved) {
        spec.chunks = static_cast<int>(in.number_argument("Interleaved", 0, 1 << 20));
        LOOM_CHECK(spec.chunks >= 2, LOOM_RULE_INTERLEAVED_CHUNKS);
    }
    in.expect('>', "the pipeline schedule");
}

inline void parse_sequence_parallel(StrategyReader& in, StrategySpec& spec) {
    spec.sequence_parallel = true;
    if (!in.accept('<')) return;
    const std::string_view word = in.take();
    if (word == "RingAttention") {
        spec.sequence_attention = nn::SequenceAttention::ring;
    } else if (word == "Ulysses") {
        spec.sequence_attention = nn::SequenceAttention::ulysses;
        spec.sequence_ulysses = 0;
    } else if (word == "UlyssesRing") {
        spec.sequence_attention = nn::SequenceAttention::hybrid;
        spec.sequence_ulysses = static_cast<int>(in.number_argument("UlyssesRing", 0, 1 << 20));
        LOOM_CHECK(spec.sequence_ulysses >= 2, LOOM_RULE_ULYSSES_GROUP);
    } else {
        in.fail(word, "a sequence attention (RingAttention, Ulysses, UlyssesRing<K>)");
    }
    if (in.accept(',')) {
        const std::string_view layout = in.take();
        if (layout != "Zigzag" && layout != "Contiguous") in.fail(layout, "a sequence layout (Zigzag, Contiguous)");
        spec.sequence_zigzag = layout == "Zigzag";
    }
    in.expect('>', "the sequence attention");
}

// GradCompress<...>; `given` counts the compressors of each axis (dp, pp, tp).
inline void parse_grad_compress(StrategyReader& in, StrategySpec& spec, int (&given)[3]) {
    in.expect('<', "GradCompress");
    const std::string_view word = in.take();
    Compression c;
    const auto block = [&](std::int64_t fallback) {
        return in.peek() == "<" ? in.number_argument(word, 1, 1 << 24) : fallback;
    };
    if (word == "CastBf16") c.kind = CompressorKind::bf16;
    else if (word == "CastFp16") c.kind = CompressorKind::fp16;
    else if (word == "Int8Block") c = {CompressorKind::int8, 1.0, 0, block(default_int8_block)};
    else if (word == "OneBit" || word == "OneBitBlock") c = {CompressorKind::one_bit, 1.0, 0, block(default_one_bit_block)};
    else if (word == "PowerSGD") c = {CompressorKind::power_sgd, 1.0, static_cast<int>(in.number_argument(word, 1, 1024))};
    else if (word == "TopK") {
        in.expect('<', word);
        const std::string_view ratio = in.take();
        c.kind = CompressorKind::top_k;
        const auto [end, error] = std::from_chars(ratio.data(), ratio.data() + ratio.size(), c.ratio);
        if (error != std::errc{} || end != ratio.data() + ratio.size()) in.fail(ratio, "TopK's ratio in (0, 1]");
        in.expect('>', "TopK's ratio");
    } else {
        in.fail(word, "a compressor (CastBf16, CastFp16, Int8Block<B>, TopK<RATIO>, PowerSGD<RANK>, OneBit)");
    }
    c.validate();
    int axis = 0;
    if (in.accept(',')) {
        const std::string_view name = in.take();
        if (name == "PpAxis") axis = 1;
        else if (name == "TpAxis") axis = 2;
        else if (name != "DpAxis") in.fail(name, "an axis (DpAxis, PpAxis, TpAxis)");
    }
    in.expect('>', "the compressor");
    LOOM_CHECK(axis == 0 || c.is_cast(), LOOM_RULE_ACTIVATION_CAST);
    LOOM_CHECK(++given[axis] == 1, LOOM_RULE_ONE_COMPRESSOR_PER_AXIS);
    (axis == 0 ? spec.dp_compression : axis == 1 ? spec.pp_compression : spec.tp_compression) = c;
}

inline void parse_recompute(StrategyReader& in, StrategySpec& spec) {
    in.expect('<', "Recompute");
    const std::string_view word = in.take();
    if (word == "Full") {
        spec.recompute = {RecomputeMode::full, 0};
    } else if (word == "Selective") {
        spec.recompute = {RecomputeMode::selective, 0};
    } else if (word == "Budget") {
        spec.recompute.mode = RecomputeMode::budget;
        if (in.peek() == "<") {
            spec.recompute.budget_bytes = in.number_argument("Budget", 1, std::int64_t{1} << 62);
        } else {
            const std::string_view number = in.take(), unit = in.take();
            const auto bytes = parse_bucket_size(number, unit);
            if (!bytes) in.fail(std::string(number) + " " + std::string(unit), "a budget in whole bytes (64 MiB, 1.5 GiB, 1000 B)");
            spec.recompute.budget_bytes = *bytes;
        }
    } else {
        in.fail(word, "what to recompute (Full, Selective, Budget 64 MiB, Budget<N>)");
    }
    in.expect('>', "what to recompute");
}

}  // namespace detail

// The spec a strategy's text names, checked by the rules of Strategy<...>
// (strategy_rules.hpp); a bad token is named in one line with what would fit.
[[nodiscard]] inline StrategySpec parse_strategy(std::string_view text) {
    detail::StrategyReader in(text);
    StrategySpec spec;
    const bool wrapped = in.peek() == "Strategy";
    if (wrapped) {
        in.take();
        in.expect('<', "Strategy");
    }
    int data_parallel = 0, zero = 0, pipeline = 0, tensor = 0, sequence = 0, recompute = 0, compressors[3] = {0, 0, 0};
    const auto end_of_list = [&] { return wrapped ? in.peek() == ">" : in.peek().empty(); };
    for (bool first = true; !end_of_list(); first = false) {
        if (!first) in.expect(',', "a policy");
        const std::string_view word = in.take();
        if (word == "DataParallel") {
            LOOM_CHECK(++data_parallel == 1, LOOM_RULE_ONE_DATA_PARALLEL);
            detail::parse_data_parallel(in, spec);
        } else if (word == "ZeroShard") {
            LOOM_CHECK(++zero == 1, LOOM_RULE_ONE_ZERO_STAGE);
            spec.zero_stage = static_cast<int>(in.number_argument("ZeroShard", 0, 1 << 20));
            LOOM_CHECK(spec.zero_stage >= 1 && spec.zero_stage <= 3, LOOM_RULE_ZERO_STAGE_RANGE);
        } else if (word == "Pipeline") {
            LOOM_CHECK(++pipeline == 1, LOOM_RULE_ONE_PIPELINE);
            detail::parse_pipeline(in, spec);
        } else if (word == "TensorParallel" || word == "Optimus2D") {
            LOOM_CHECK(++tensor == 1, LOOM_RULE_ONE_TENSOR_POLICY);
            spec.tensor_parallel = true;
            spec.tensor_grid = word == "Optimus2D";
        } else if (word == "SequenceParallel") {
            LOOM_CHECK(++sequence == 1, LOOM_RULE_ONE_SEQUENCE_POLICY);
            detail::parse_sequence_parallel(in, spec);
        } else if (word == "GradCompress") {
            detail::parse_grad_compress(in, spec, compressors);
        } else if (word == "Recompute") {
            LOOM_CHECK(++recompute == 1, LOOM_RULE_ONE_RECOMPUTE);
            detail::parse_recompute(in, spec);
        } else {
            in.fail(word, "a policy (DataParallel<...>, ZeroShard<1|2|3>, Pipeline<...>, TensorParallel, Optimus2D, "
                          "SequenceParallel<...>, GradCompress<...>, Recompute<...>)" +
                              std::string(wrapped ? " or '>'" : ""));
        }
    }
    if (wrapped) in.expect('>', "the last policy");
    if (!in.peek().empty()) in.fail(in.peek(), "the end of the text");
    spec.validate();
    return spec;
}

}  // namespace loom
