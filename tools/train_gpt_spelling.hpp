// train_gpt's flag spellings that loom-plan shares: pipeline schedules
// (gpipe, 1f1b, interleaved, zb for ZB-H1, zbv for ZB-V), read by train_gpt
// --schedule and loom-plan --schedules / --evaluate, recomputation (none,
// full, budget:SIZE as in budget:64MiB), read by train_gpt --recompute and
// loom-plan --evaluate, and a planner's candidate as train_gpt flags. Spellings of the programs, so they live with
// them; the library's own grammar is parallel/strategy_text.hpp's.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include <loom/core/error.hpp>
#include <loom/parallel/data_parallel.hpp>
#include <loom/parallel/pipeline.hpp>
#include <loom/parallel/recompute.hpp>
#include <loom/plan/candidate.hpp>

[[nodiscard]] inline loom::ScheduleKind parse_schedule_flag(std::string_view text) {
    using loom::ScheduleKind;
    if (text == "gpipe") return ScheduleKind::gpipe;
    if (text == "1f1b") return ScheduleKind::one_f_one_b;
    if (text == "interleaved") return ScheduleKind::interleaved;
    if (text == "zb") return ScheduleKind::zero_bubble_h1;
    if (text == "zbv") return ScheduleKind::zero_bubble_v;
    LOOM_FAIL("unknown pipeline schedule \"", text, "\"; use gpipe, 1f1b, interleaved, zb (ZB-H1) or zbv (ZB-V)");
}

// parse_schedule_flag's inverse.
[[nodiscard]] constexpr std::string_view schedule_flag(loom::ScheduleKind kind) noexcept {
    switch (kind) {
        case loom::ScheduleKind::gpipe: return "gpipe";
        case loom::ScheduleKind::one_f_one_b: return "1f1b";
        case loom::ScheduleKind::interleaved: return "interleaved";
        case loom::ScheduleKind::zero_bubble_h1: return "zb";
        case loom::ScheduleKind::zero_bubble_v: return "zbv";
    }
    return "?";
}

// --recompute's words: none, full, selective, or budget:SIZE with SIZE a whole number
// of B, KiB, MiB or GiB (budget:64MiB, budget:1.5GiB, budget:1000B).
[[nodiscard]] inline loom::RecomputeSpec parse_recompute_flag(std::string_view text) {
    if (text == "none") return {};
    if (text == "full") return {loom::RecomputeMode::full, 0};
    if (text == "selective") return {loom::RecomputeMode::selective, 0};
    constexpr std::string_view prefix = "budget:";
    if (text.substr(0, prefix.size()) == prefix) {
        const std::string_view size = text.substr(prefix.size());
        const auto unit = size.find_first_not_of("0123456789.");
        if (unit != std::string_view::npos && unit > 0)
            if (const auto bytes = loom::parse_bucket_size(size.substr(0, unit), size.substr(unit)))
                return {loom::RecomputeMode::budget, *bytes};
    }
    LOOM_FAIL("unknown recomputation \"", text, "\"; use none, full, selective or budget:SIZE (budget:64MiB, budget:1.5GiB, budget:1000B)");
}

// parse_recompute_flag's inverse.
[[nodiscard]] inline std::string recompute_flag(const loom::RecomputeSpec& spec) {
    if (spec.mode == loom::RecomputeMode::full) return "full";
    if (spec.mode == loom::RecomputeMode::none) return "none";
    if (spec.mode == loom::RecomputeMode::selective) return "selective";
    std::string size = loom::bucket_size_text(spec.budget_bytes);
    size.erase(size.find(' '), 1);
    return "budget:" + size;
}

// The train_gpt flags of a candidate (the model's own flags aside): degrees
// and the piecewise strategy flags, words a script can split on spaces.
[[nodiscard]] inline std::string train_gpt_flags(const loom::plan::Candidate& c, std::int64_t batch) {
    std::ostringstream f;
    f << "--dp " << c.dp;
    if (c.pp > 1) {
        f << " --pp " << c.pp << " --schedule " << schedule_flag(c.schedule);
        if (c.schedule == loom::ScheduleKind::interleaved) f << " --chunks " << c.chunks;
    }
    if (c.tp > 1) f << " --tp " << c.tp << (c.tp_grid ? " --tp-mode 2d" : "");
    if (c.sp > 1) f << " --sp " << c.sp << (c.ulysses ? " --sp-mode ulysses" : "");
    f << " --micro-batches " << c.micro_batches << " --batch " << batch;
    if (c.zero > 0) f << " --zero " << c.zero;
    if (c.recompute.on()) f << " --recompute " << recompute_flag(c.recompute);
    if (c.pp > 1 && !c.partition.empty()) {
        f << " --partition ";
        for (std::size_t i = 0; i < c.partition.size(); ++i) f << (i ? "," : "") << c.partition[i];
    }
    return f.str();
}

// The same run with the strategy as one value: degrees, then --strategy
// with the spec's text in single quotes, ready to paste into a shell.
[[nodiscard]] inline std::string train_gpt_strategy_flags(const loom::plan::Candidate& c, std::int64_t batch) {
    std::ostringstream f;
    f << "--dp " << c.dp;
    if (c.pp > 1) f << " --pp " << c.pp;
    if (c.tp > 1) f << " --tp " << c.tp;
    if (c.sp > 1) f << " --sp " << c.sp;
    f << " --strategy '" << c.strategy() << "' --micro-batches " << c.micro_batches << " --batch " << batch;
    if (c.pp > 1 && !c.partition.empty()) {
        f << " --partition ";
        for (std::size_t i = 0; i < c.partition.size(); ++i) f << (i ? "," : "") << c.partition[i];
    }
    return f.str();
}
