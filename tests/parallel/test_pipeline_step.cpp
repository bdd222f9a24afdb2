// A pipeline rank's whole step program (schedule/pipeline_step.hpp): every
// schedule lowered to the units it holds, with the data-parallel and ZeRO
// instructions of its groups, and what the pipelined verifier refuses; the
// shard layout with segments; the executor's stage bounds, micro-batch pool
// and pipeline construction; the unit profiler.
//
// Most cases use ten fake units (names and sizes only: the layout and the
// program generators read nothing else), one of them without parameters:
//   numel  520 130 0 260 70 400 90 33 180 64   (1747 in all)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/micro_batch_pool.hpp>
#include <loom/gpt/model.hpp>
#include <loom/nn/units.hpp>
#include <loom/parallel/pipeline.hpp>
#include <loom/parallel/shard_layout.hpp>
#include <loom/plan/profile.hpp>
#include <loom/schedule/pipeline.hpp>
#include <loom/schedule/pipeline_program.hpp>
#include <loom/schedule/pipeline_step.hpp>
#include <loom/schedule/program.hpp>
#include <loom/schedule/verify.hpp>

#include "support/message_of.hpp"

using loom::ScheduleKind;
using loom::parallel::Grouping;
using loom::parallel::ShardLayout;
using loom::schedule::Instruction;
using loom::schedule::Op;
using loom::schedule::Payload;
using loom::schedule::PipelineProgram;
using loom::schedule::Reduction;
using loom::schedule::StageBounds;
using loom::schedule::StepProgram;
using loom_test::message_of;

namespace {

const std::vector<std::int64_t> fake_numels{520, 130, 0, 260, 70, 400, 90, 33, 180, 64};
constexpr int fake_count = 10;
constexpr std::int64_t fake_total = 1747;
// 400 bytes = 100 floats: without segments, buckets {u0} {u1} {u3-u4} {u5} {u6-u7} {u8-u9} (u2 has none).
constexpr std::int64_t small_bucket = 400;

const std::vector<loom::nn::Unit>& fake_units() {
    static const std::vector<loom::nn::Unit> units = [] {
        std::vector<loom::nn::Unit> out;
        for (std::size_t k = 0; k < fake_numels.size(); ++k) {
            loom::nn::Unit u;
            std::ostringstream name;
            name << "u" << k << " Fake";
            u.name = name.str();
            u.numel = fake_numels[k];
            out.push_back(std::move(u));
        }
        return out;
    }();
    return units;
}

std::int64_t dense_start(int u) {
    std::int64_t at = 0;
    for (int k = 0; k < u; ++k) at += fake_numels[static_cast<std::size_t>(k)];
    return at;
}

int chunks_of(ScheduleKind kind) {
    return kind == ScheduleKind::interleaved || kind == ScheduleKind::zero_bubble_v ? 2 : 1;
}

constexpr ScheduleKind all_schedules[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                          ScheduleKind::zero_bubble_h1, ScheduleKind::zero_bubble_v};

// The layout the executor builds for a pipeline rank: this rank's chunks as
// segments; one group per chunk at ZeRO 2/3, buckets otherwise.
ShardLayout pipeline_layout(const std::vector<int>& chunk_of_unit, int dp, int zero_stage,
                            std::int64_t bucket = small_bucket) {
    return ShardLayout(fake_units(), dp, zero_stage >= 2 ? Grouping::per_segment : Grouping::buckets, bucket,
                       chunk_of_unit);
}

// One rank's lowering of a schedule, everything it was made from kept.
struct Lowered {
    PipelineProgram pipe;
    StageBounds bounds;
    int rank;
    int zero_stage;
    std::vector<int> chunk_of_unit;
    ShardLayout layout;
    StepProgram program;

    Lowered(PipelineProgram pipe_, StageBounds bounds_, int rank_, int dp, int zero)
        : pipe(std::move(pipe_)),
          bounds(std::move(bounds_)),
          rank(rank_),
          zero_stage(zero),
          chunk_of_unit(bounds.chunk_of_unit(pipe.rank_of_chunk, rank)),
          layout(pipeline_layout(chunk_of_unit, dp, zero)),
          program(loom::schedule::pipeline_step_program(pipe, rank, bounds, layout, zero)) {}
};

// The executor's default split: equal costs, balanced by plan::balance.
StageBounds balanced(int virtual_stages) {
    return loom::exec::stage_bounds(fake_count, virtual_stages, loom::exec::ExecutorOptions{});
}

Lowered lower(ScheduleKind kind, int p, int m, int rank, int dp, int zero) {
    auto pipe = loom::schedule::pipeline_program(kind, p, m, chunks_of(kind));
    auto bounds = balanced(pipe.virtual_stages());
    return Lowered(std::move(pipe), std::move(bounds), rank, dp, zero);
}

std::string verify_message(const StepProgram& program, const ShardLayout& layout, const std::vector<int>& chunk_of) {
    return message_of([&] { loom::schedule::verify(program, layout, chunk_of); });
}
std::string verify_message(const Lowered& l, const StepProgram& program) {
    return verify_message(program, l.layout, l.chunk_of_unit);
}

bool is_unit_compute(Op op) {
    return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight;
}

// Every fact the lowering promises that the verifier does not check by
// itself; the first one broken, described, or "" when all hold.
std::string structural_problem(const Lowered& l) {
    std::ostringstream why;
    const StepProgram& out = l.program;
    const StepProgram& source = l.pipe.ranks[static_cast<std::size_t>(l.rank)];
    const auto& groups = l.layout.groups();
    const int m = l.pipe.micro_batches;
    const auto held = [&](int u) { return l.chunk_of_unit[static_cast<std::size_t>(u)] >= 0; };

    if (!out.pipelined) return "the program is not marked pipelined";
    if (out.micro_batches != m) return "micro_batches differ from the schedule's";
    if (out.code.empty() || out.code.back().op != Op::reduce_loss) return "the program does not end with reduce_loss";
    if (out.count(Op::optimizer_step) != 1) return "the optimizer does not run exactly once";
    if (out.code.front().op != Op::zero_grads) return "the program does not start with zero_grads";

    // The compute: each schedule compute of chunk v expanded to v's units,
    // forwards first to last, backwards last to first, in the schedule's order.
    std::vector<Instruction> expected, seen;
    std::set<int> held_chunks;
    for (const Instruction& in : source.code) {
        if (!is_unit_compute(in.op)) continue;
        held_chunks.insert(in.chunk);
        const int lo = l.bounds.first(in.chunk), hi = l.bounds.end(in.chunk);
        if (in.op == Op::forward)
            for (int u = lo; u < hi; ++u) expected.push_back({.op = in.op, .unit = u, .micro_batch = in.micro_batch, .chunk = in.chunk});
        else
            for (int u = hi - 1; u >= lo; --u) expected.push_back({.op = in.op, .unit = u, .micro_batch = in.micro_batch, .chunk = in.chunk});
    }
    for (const Instruction& in : out.code)
        if (is_unit_compute(in.op)) seen.push_back(in);
    if (seen != expected) return "the unit compute is not the schedule's compute expanded to units";

    // Every held unit: one forward (and one backward, or one B and one W) per micro-batch; none elsewhere.
    std::map<std::tuple<Op, int, int>, int> runs;
    for (const Instruction& in : out.code)
        if (is_unit_compute(in.op)) ++runs[{in.op, in.unit, in.micro_batch}];
    for (int u = 0; u < fake_count; ++u)
        for (int mb = 0; mb < m; ++mb) {
            const int want = held(u) ? 1 : 0;
            const auto count = [&](Op op) {
                const auto it = runs.find({op, u, mb});
                return it == runs.end() ? 0 : it->second;
            };
            if (count(Op::forward) != want) {
                why << "u" << u << " mb" << mb << " runs forward " << count(Op::forward) << " times";
                return why.str();
            }
            const int backward = l.pipe.split_backward ? count(Op::backward_input) : count(Op::backward);
            const int weight = l.pipe.split_backward ? count(Op::backward_weight) : count(Op::backward);
            if (backward != want || weight != want) {
                why << "u" << u << " mb" << mb << " runs backward " << backward << "/" << weight << " times";
                return why.str();
            }
        }

    // Sends and recvs: the schedule's, in its order.
    std::vector<Instruction> p2p_source, p2p_out;
    for (const Instruction& in : source.code)
        if (in.op == Op::send || in.op == Op::recv) p2p_source.push_back(in);
    for (const Instruction& in : out.code)
        if (in.op == Op::send || in.op == Op::recv) p2p_out.push_back(in);
    if (p2p_out != p2p_source) return "sends and recvs are not the schedule's";
    if (out.count(Op::send) != source.count(Op::send)) return "the send count differs from the schedule's";

    // Waits: each names an earlier send, reduction or gather, and each of those is waited once.
    std::map<int, int> waited;
    for (int i = 0; i < static_cast<int>(out.code.size()); ++i) {
        const Instruction& in = out.code[static_cast<std::size_t>(i)];
        if (in.op != Op::wait) continue;
        if (in.target < 0 || in.target >= i) {
            why << "wait #" << i << " targets #" << in.target << ", not an earlier instruction";
            return why.str();
        }
        const Op target = out.code[static_cast<std::size_t>(in.target)].op;
        if (target != Op::send && target != Op::reduce_grads && target != Op::gather_params) {
            why << "wait #" << i << " targets a " << loom::schedule::name(target);
            return why.str();
        }
        ++waited[in.target];
    }
    for (int i = 0; i < static_cast<int>(out.code.size()); ++i)
        if (loom::schedule::is_async(out.code[static_cast<std::size_t>(i)].op) && waited[i] != 1) {
            why << "#" << i << " is waited " << waited[i] << " times";
            return why.str();
        }

    // Groups: reduced once a step; ZeRO 2/3 through a slot bound once, ZeRO 3 gathered and released once.
    // Slots: ZeRO 2 (gradients) and 3 (both): one per held chunk, at least per chunk with parameters.
    const int zero = l.zero_stage;
    const int chunks_held = static_cast<int>(held_chunks.size());
    int with_params = 0;
    for (int v : held_chunks) {
        std::int64_t n = 0;
        for (int u = l.bounds.first(v); u < l.bounds.end(v); ++u) n += fake_numels[static_cast<std::size_t>(u)];
        with_params += n > 0 ? 1 : 0;
    }
    const auto slots_fit = [&](int slots, bool used) {
        return used ? slots >= with_params && slots <= chunks_held : slots == 0;
    };
    if (!slots_fit(out.grad_slots, zero >= 2)) return "gradient slots are not one per held chunk (ZeRO 2/3)";
    if (!slots_fit(out.param_slots, zero == 3)) return "parameter slots are not one per held chunk (ZeRO 3)";
    for (const Instruction& in : out.code)
        if (in.slot >= (in.op == Op::gather_params || in.op == Op::release_params ? out.param_slots : out.grad_slots))
            return "an instruction names a slot the program does not have";
    int optimizer_at = 0;
    for (int i = 0; i < static_cast<int>(out.code.size()); ++i)
        if (out.code[static_cast<std::size_t>(i)].op == Op::optimizer_step) optimizer_at = i;
    for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
        int reduced = 0, bound = 0, gathered_slot = 0, released = 0, gathered_after = 0;
        for (int i = 0; i < static_cast<int>(out.code.size()); ++i) {
            const Instruction& in = out.code[static_cast<std::size_t>(i)];
            if (in.group != g) continue;
            if (in.op == Op::reduce_grads) {
                ++reduced;
                const Reduction want = zero == 0 ? Reduction::all_reduce : Reduction::reduce_scatter;
                if (in.reduction != want || (zero >= 2) != (in.slot >= 0)) {
                    why << "g" << g << " is reduced as " << in;
                    return why.str();
                }
            }
            if (in.op == Op::bind_grads) ++bound;
            if (in.op == Op::gather_params && in.slot >= 0) ++gathered_slot;
            if (in.op == Op::gather_params && in.slot < 0) gathered_after += i > optimizer_at ? 1 : 0;
            if (in.op == Op::release_params) ++released;
        }
        const bool updated_blocks = zero == 1 || zero == 2;
        if (reduced != 1 || bound != (zero >= 2 ? 1 : 0) || gathered_slot != (zero == 3 ? 1 : 0) ||
            released != (zero == 3 ? 1 : 0) || gathered_after != (updated_blocks ? 1 : 0)) {
            why << "g" << g << ": reduced " << reduced << ", bound " << bound << ", gathered into a slot "
                << gathered_slot << ", released " << released << ", gathered after the optimizer " << gathered_after;
            return why.str();
        }
    }
    // ZeRO 2/3: one group per held chunk with parameters, and nothing more.
    if (zero >= 2 && static_cast<int>(groups.size()) != with_params) return "not one group per held chunk with parameters";
    return "";
}

// --- editing programs ----------------------------------------------------------

// code[k] = program.code[order[k]]; each wait retargeted to where its
// instruction now sits (its first copy).
StepProgram reorder(const StepProgram& program, const std::vector<int>& order) {
    StepProgram out = program;
    out.code.clear();
    std::map<int, int> now_at;
    for (int k = 0; k < static_cast<int>(order.size()); ++k) {
        const int from = order[static_cast<std::size_t>(k)];
        out.code.push_back(program.code[static_cast<std::size_t>(from)]);
        now_at.emplace(from, k);
    }
    for (Instruction& in : out.code)
        if (in.op == Op::wait)
            if (const auto it = now_at.find(in.target); it != now_at.end()) in.target = it->second;
    return out;
}

std::vector<int> in_order(const StepProgram& program) {
    std::vector<int> order(program.code.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    return order;
}

// Instruction `from` moved to just before the instruction (originally) at `before`.
StepProgram move_before(const StepProgram& program, int from, int before) {
    auto order = in_order(program);
    order.erase(order.begin() + from);
    order.insert(std::find(order.begin(), order.end(), before), from);
    return reorder(program, order);
}

// A copy of instruction `index` placed just before the instruction (originally) at `before`.
StepProgram copy_before(const StepProgram& program, int index, int before) {
    auto order = in_order(program);
    order.insert(std::find(order.begin(), order.end(), before), index);
    return reorder(program, order);
}

int index_of(const StepProgram& program, const Instruction& in) {
    const auto it = std::find(program.code.begin(), program.code.end(), in);
    REQUIRE(it != program.code.end());
    return static_cast<int>(it - program.code.begin());
}

// The first instruction that satisfies `pred`.
template <class Pred>
int index_where(const StepProgram& program, Pred pred) {
    const auto it = std::find_if(program.code.begin(), program.code.end(), pred);
    REQUIRE(it != program.code.end());
    return static_cast<int>(it - program.code.begin());
}

std::string text_of(const Instruction& in) {
    std::ostringstream out;
    out << in;
    return out.str();
}

std::string invalid_at(const StepProgram& program, int index) {
    return "step program (" + program.generator + ") is invalid at #" + std::to_string(index) + ": ";
}

Instruction unit_op(Op op, int unit, int mb, int chunk) {
    return {.op = op, .unit = unit, .micro_batch = mb, .chunk = chunk};
}
Instruction p2p(Op op, Payload payload, int peer, int mb, int chunk) {
    return {.op = op, .micro_batch = mb, .chunk = chunk, .peer = peer, .payload = payload};
}

}  // namespace

// --- 1. every schedule, lowered ---------------------------------------------------

TEST_CASE("pipeline_step_program: every schedule, p 1-4, m 1-8, ZeRO 0-3, dp 1-2 verifies and keeps its promises",
          "[parallel][pipeline][program]") {
    // Failures are collected, not asserted one by one: a few thousand programs.
    int programs = 0;
    std::vector<std::string> failures;
    for (ScheduleKind kind : all_schedules)
        for (int p = 1; p <= 4; ++p)
            for (int m : {1, 2, 3, 4, 8}) {
                if (kind == ScheduleKind::interleaved && m % p != 0) continue;
                const auto pipe = loom::schedule::pipeline_program(kind, p, m, chunks_of(kind));
                const auto bounds = balanced(pipe.virtual_stages());
                for (int zero = 0; zero <= 3; ++zero)
                    for (int dp : {1, 2})
                        for (int r = 0; r < p; ++r) {
                            ++programs;
                            std::ostringstream what;
                            what << loom::name(kind) << " p=" << p << " m=" << m << " ZeRO " << zero << " dp " << dp
                                 << " rank " << r << ": ";
                            try {
                                const Lowered l(pipe, bounds, r, dp, zero);
                                const std::string error = verify_message(l, l.program);
                                const std::string problem = structural_problem(l);
                                if (error != "(no error)" || !problem.empty()) {
                                    what << error << (problem.empty() ? "" : "; ") << problem;
                                    if (failures.empty()) what << "\n" << l.program;
                                    failures.push_back(what.str());
                                }
                            } catch (const loom::Error& e) {
                                failures.push_back(what.str() + "lowering threw: " + e.message());
                            }
                        }
            }
    std::string first_failures;
    for (std::size_t k = 0; k < std::min<std::size_t>(failures.size(), 6); ++k) first_failures += failures[k] + "\n";
    INFO(failures.size() << " of " << programs << " programs fail:\n" << first_failures);
    CHECK(failures.empty());
    CHECK(programs == 1776);  // 4 schedules x 5 m x 8 (ZeRO, dp) x 10 ranks, and Interleaved's 22 x 8
}

TEST_CASE("the sweep's structural check notices what the verifier does not", "[parallel][pipeline][program]") {
    // Rank 0 of 1F1B p=2 m=4 at ZeRO 2 over dp 2: valid as generated.
    const Lowered valid = lower(ScheduleKind::one_f_one_b, 2, 4, 0, 2, 2);
    REQUIRE(structural_problem(valid).empty());
    const auto edited = [&](const std::vector<int>& order) {
        Lowered l = valid;
        l.program = reorder(valid.program, order);
        return structural_problem(l);
    };
    const StepProgram& p = valid.program;
    SECTION("a missing bind_grads") {
        auto order = in_order(p);
        order.erase(order.begin() + index_where(p, [](const Instruction& in) { return in.op == Op::bind_grads; }));
        CHECK(edited(order) ==
              "g0: reduced 1, bound 0, gathered into a slot 0, released 0, gathered after the optimizer 1");
    }
    SECTION("two micro-batches' forwards swapped") {
        auto order = in_order(p);
        std::swap(order[static_cast<std::size_t>(index_of(p, unit_op(Op::forward, 0, 0, 0)))],
                  order[static_cast<std::size_t>(index_of(p, unit_op(Op::forward, 0, 1, 0)))]);
        CHECK(edited(order) == "the unit compute is not the schedule's compute expanded to units");
    }
    SECTION("a send dropped") {
        auto order = in_order(p);
        order.erase(order.begin() + index_of(p, p2p(Op::send, Payload::activation, 1, 2, 0)));
        CHECK(edited(order) == "sends and recvs are not the schedule's");
    }
    SECTION("a wait on a forward") {
        Lowered l = valid;
        const int wait = index_where(p, [](const Instruction& in) { return in.op == Op::wait; });
        l.program.code[static_cast<std::size_t>(wait)].target = index_of(p, unit_op(Op::forward, 0, 0, 0));
        CHECK(structural_problem(l) == "wait #" + std::to_string(wait) + " targets a forward");
    }
}

TEST_CASE("pipeline_step_program: the ZeRO 3 program of a two-chunk rank, instruction by instruction",
          "[parallel][pipeline][program]") {
    // Interleaved<2>, p=2, m=2: 4 virtual stages over 10 units by the equal-cost
    // balance {1,3,3,3}; rank 1 holds chunks 1 (u1-u3) and 3 (u7-u9), one
    // group each (per_segment).
    const Lowered l = lower(ScheduleKind::interleaved, 2, 2, 1, 2, 3);
    REQUIRE(l.bounds.bounds == std::vector<int>{0, 1, 4, 7, 10});
    REQUIRE(l.layout.groups().size() == 2);
    CHECK(l.layout.group(0).first_unit == 1);
    CHECK(l.layout.group(0).last_unit == 3);
    CHECK(l.layout.group(1).first_unit == 7);
    CHECK(l.layout.group(1).last_unit == 9);
    const auto& code = l.program.code;
    REQUIRE(code.size() > 4);
    // zero_grads, then the first chunk's gather into slot 0.
    CHECK(text_of(code[0]) == "zero_grads");
    CHECK(text_of(code[1]) == "gather_params g0 slot 0");
    CHECK(text_of(code[2]) == "recv activation from rank 0 c1 mb0");
    CHECK(text_of(code[3]) == "wait #1");
    // While chunk 1 computes, chunk 3's gather is in flight.
    CHECK(text_of(code[4]) == "gather_params g1 slot 1");
    CHECK(text_of(code[5]) == "forward u1 c1 mb0");
    CHECK(l.program.count(Op::gather_params) == 2);
    CHECK(l.program.count(Op::release_params) == 2);
    CHECK(l.program.count(Op::bind_grads) == 2);
    CHECK(l.program.count(Op::reduce_grads) == 2);
    CHECK(verify_message(l, l.program) == "(no error)");
}

TEST_CASE("pipeline_step_program at ZeRO 3: a chunk without parameters does not stop the next chunk's gather",
          "[parallel][pipeline][program]") {
    // Interleaved<2>, p=2, m=2, partition {2, 1, 4, 3}: rank 1 holds chunk 1
    // (u2 alone: no parameters) and chunk 3 (u7-u9, group 0). Chunk 1 has
    // nothing to gather, but chunk 3 must still be gathered (once) and waited
    // for before its first forward.
    const auto pipe = loom::schedule::interleaved(2, 2, 2);
    const auto bounds = StageBounds::of_sizes({2, 1, 4, 3});
    for (int dp : {1, 2}) {
        INFO("dp " << dp);
        const Lowered l(pipe, bounds, 1, dp, 3);
        REQUIRE(l.layout.groups().size() == 1);
        REQUIRE(l.layout.group(0).first_unit == 7);
        INFO(l.program);
        CHECK(verify_message(l, l.program) == "(no error)");
        CHECK(structural_problem(l).empty());
        const StepProgram& p = l.program;
        const auto gather = std::find_if(p.code.begin(), p.code.end(), [](const Instruction& in) {
            return in.op == Op::gather_params && in.group == 0;
        });
        REQUIRE(gather != p.code.end());
        const int gathered = static_cast<int>(gather - p.code.begin());
        const int forward = index_of(p, unit_op(Op::forward, 7, 0, 3));
        bool waited = false;
        for (int i = gathered + 1; i < forward; ++i)
            waited = waited || p.code[static_cast<std::size_t>(i)] == Instruction{.op = Op::wait, .target = gathered};
        CHECK(waited);
    }
}

TEST_CASE("pipeline_step_program refuses a rank, ranges or ZeRO stage that do not fit", "[parallel][pipeline][program]") {
    const auto pipe = loom::schedule::one_f_one_b(2, 2);
    const auto bounds = balanced(2);
    const auto chunk_of = bounds.chunk_of_unit(pipe.rank_of_chunk, 0);
    const ShardLayout layout = pipeline_layout(chunk_of, 1, 0);
    CHECK(message_of([&] { (void)loom::schedule::pipeline_step_program(pipe, 2, bounds, layout, 0); }) ==
          "pipeline_step_program: rank 2 of a 2-stage pipeline");
    CHECK(message_of([&] { (void)loom::schedule::pipeline_step_program(pipe, 0, balanced(3), layout, 0); }) ==
          "pipeline_step_program: 3 unit ranges for 2 virtual stages");
    CHECK(message_of([&] { (void)loom::schedule::pipeline_step_program(pipe, 0, bounds, layout, 4); }) ==
          "pipeline_step_program: ZeRO stage 4 is not 0, 1, 2 or 3");
}

// --- 2. what the pipelined verifier refuses ------------------------------------------

TEST_CASE("the pipelined verifier rejects p2p out of order", "[parallel][pipeline][verify]") {
    // 1F1B, p=2, m=2, ZeRO 0, dp 1: units 0-4 on rank 0 (chunk 0), 5-9 on rank 1 (chunk 1).
    const Lowered first = lower(ScheduleKind::one_f_one_b, 2, 2, 0, 1, 0);
    const Lowered second = lower(ScheduleKind::one_f_one_b, 2, 2, 1, 1, 0);
    REQUIRE(first.bounds.bounds == std::vector<int>{0, 5, 10});
    REQUIRE(verify_message(first, first.program) == "(no error)");
    REQUIRE(verify_message(second, second.program) == "(no error)");

    SECTION("a forward of the chunk's first unit before its activation recv") {
        const StepProgram& p = second.program;
        const int recv = index_of(p, p2p(Op::recv, Payload::activation, 0, 0, 1));
        const int forward = index_of(p, unit_op(Op::forward, 5, 0, 1));
        REQUIRE(recv < forward);
        const StepProgram bad = move_before(p, recv, forward + 1);
        CHECK(verify_message(second, bad) ==
              invalid_at(bad, forward - 1) + "forward u5 c1 mb0 runs before forward u4 (or its recv)");
    }
    SECTION("an activation sent before the forward of the chunk's last unit") {
        const StepProgram& p = first.program;
        const int send = index_of(p, p2p(Op::send, Payload::activation, 1, 0, 0));
        const int forward = index_of(p, unit_op(Op::forward, 4, 0, 0));
        REQUIRE(send == forward + 1);
        const StepProgram bad = move_before(p, send, forward);
        CHECK(verify_message(first, bad) ==
              invalid_at(bad, forward) + "send activation to rank 1 c0 mb0 sends before the forward that produces it");
    }
    SECTION("a gradient sent before the backward of the chunk's first unit") {
        const StepProgram& p = second.program;
        const int send = index_of(p, p2p(Op::send, Payload::gradient, 0, 0, 1));
        const int backward = index_of(p, unit_op(Op::backward, 5, 0, 1));
        REQUIRE(send == backward + 1);
        const StepProgram bad = move_before(p, send, backward);
        CHECK(verify_message(second, bad) ==
              invalid_at(bad, backward) + "send gradient to rank 0 c1 mb0 sends before the backward that produces it");
    }
    SECTION("the same activation received twice") {
        const StepProgram& p = second.program;
        const int recv = index_of(p, p2p(Op::recv, Payload::activation, 0, 1, 1));
        const StepProgram bad = copy_before(p, recv, recv + 1);
        CHECK(verify_message(second, bad) == invalid_at(bad, recv + 1) + "recv activation from rank 0 c1 mb1 receives twice");
    }
    SECTION("a backward of the chunk's last unit before its gradient recv") {
        const StepProgram& p = first.program;
        const int recv = index_of(p, p2p(Op::recv, Payload::gradient, 1, 0, 0));
        const int backward = index_of(p, unit_op(Op::backward, 4, 0, 0));
        REQUIRE(recv == backward - 1);
        const StepProgram bad = move_before(p, recv, backward + 1);
        CHECK(verify_message(first, bad) ==
              invalid_at(bad, backward - 1) + "backward u4 c0 mb0 runs before the backward of u5 (or its recv)");
    }
    SECTION("without the recv at all, the same message") {
        const StepProgram& p = first.program;
        const int recv = index_of(p, p2p(Op::recv, Payload::gradient, 1, 1, 0));
        auto order = in_order(p);
        order.erase(order.begin() + recv);
        const StepProgram bad = reorder(p, order);
        const int backward = index_of(bad, unit_op(Op::backward, 4, 1, 0));
        CHECK(verify_message(first, bad) ==
              invalid_at(bad, backward) + "backward u4 c0 mb1 runs before the backward of u5 (or its recv)");
    }
}

TEST_CASE("the pipelined verifier rejects a reduction before every micro-batch's weight gradients",
          "[parallel][pipeline][verify]") {
    SECTION("a slot group (ZeRO 2, ZB-H1: the last W it waited for)") {
        // Rank 0 of ZB-H1 p=2 m=2 at ZeRO 2 over dp 2: chunk 0 (u0-u4) is group 0 in slot 0.
        const Lowered l = lower(ScheduleKind::zero_bubble_h1, 2, 2, 0, 2, 2);
        REQUIRE(l.layout.groups().size() == 1);
        REQUIRE(l.layout.group(0).first_unit == 0);
        const StepProgram& p = l.program;
        const int reduce = index_where(p, [](const Instruction& in) { return in.op == Op::reduce_grads; });
        CHECK(text_of(p.code[static_cast<std::size_t>(reduce)]) == "reduce_grads g0 slot 0 mb1 (reduce_scatter)");
        // The reduction comes right after chunk 0's last W (mb1, unit 0) ...
        CHECK(p.code[static_cast<std::size_t>(reduce) - 1] == unit_op(Op::backward_weight, 0, 1, 0));
        // ... moved before that micro-batch's first W, u4's.
        const int w = index_of(p, unit_op(Op::backward_weight, 4, 1, 0));
        const StepProgram bad = move_before(p, reduce, w);
        CHECK(verify_message(l, bad) ==
              invalid_at(bad, w) +
                  "reduce_grads g0 slot 0 mb1 (reduce_scatter) reduces before the weight gradients of u0 of every "
                  "micro-batch exist");
    }
    SECTION("an arena bucket (ZeRO 0, 1F1B)") {
        // Rank 1 of 1F1B p=2 m=2, ZeRO 0 over dp 2: u5-u9 in buckets of 100 floats.
        const Lowered l = lower(ScheduleKind::one_f_one_b, 2, 2, 1, 2, 0);
        const StepProgram& p = l.program;
        const int g = l.layout.group_of_unit(9);
        REQUIRE(g >= 0);
        const int reduce = index_where(p, [&](const Instruction& in) { return in.op == Op::reduce_grads && in.group == g; });
        const int backward = index_of(p, unit_op(Op::backward, 9, 1, 1));
        REQUIRE(backward < reduce);
        const StepProgram bad = move_before(p, reduce, backward);
        const int first = l.layout.group(g).first_unit;
        CHECK(verify_message(l, bad) == invalid_at(bad, backward) + "reduce_grads g" + std::to_string(g) +
                                            " mb1 (all_reduce) reduces before the weight gradients of u" +
                                            std::to_string(first) + " of every micro-batch exist");
    }
    SECTION("a group reduced twice") {
        const Lowered l = lower(ScheduleKind::one_f_one_b, 2, 2, 1, 2, 1);
        const StepProgram& p = l.program;
        const int reduce = index_where(p, [](const Instruction& in) { return in.op == Op::reduce_grads; });
        const int group = p.code[static_cast<std::size_t>(reduce)].group;
        const int optimizer = index_where(p, [](const Instruction& in) { return in.op == Op::optimizer_step; });
        // A second copy with its own wait, both before the optimizer.
        StepProgram bad = copy_before(p, reduce, optimizer);
        const int copy = optimizer;
        bad.code.insert(bad.code.begin() + copy + 1, Instruction{.op = Op::wait, .target = copy});
        CHECK(verify_message(l, bad) == invalid_at(bad, copy + 2) + "optimizer_step runs after group " +
                                            std::to_string(group) +
                                            "'s gradients were reduced 2 times in the step; a pipeline reduces each group once");
    }
}

TEST_CASE("the pipelined verifier rejects units and chunks the rank does not hold", "[parallel][pipeline][verify]") {
    const Lowered l = lower(ScheduleKind::one_f_one_b, 2, 2, 0, 1, 0);
    const StepProgram& p = l.program;
    const int forward = index_of(p, unit_op(Op::forward, 4, 0, 0));
    SECTION("a forward of a unit of rank 1's chunk") {
        StepProgram bad = copy_before(p, forward, forward + 1);
        bad.code[static_cast<std::size_t>(forward) + 1] = unit_op(Op::forward, 6, 0, 1);
        CHECK(verify_message(l, bad) == invalid_at(bad, forward + 1) + "forward u6 c1 mb0 runs a unit this rank does not hold");
    }
    SECTION("a held unit named with another chunk") {
        StepProgram bad = p;
        bad.code[static_cast<std::size_t>(forward)].chunk = 1;
        CHECK(verify_message(l, bad) == invalid_at(bad, forward) + "forward u4 c1 mb0 names chunk 1 but u4 is in chunk 0");
    }
    SECTION("a recv for a chunk held elsewhere") {
        StepProgram bad = copy_before(p, forward, forward);
        bad.code[static_cast<std::size_t>(forward)] = p2p(Op::recv, Payload::activation, 1, 0, 1);
        CHECK(verify_message(l, bad) ==
              invalid_at(bad, forward) + "recv activation from rank 1 c1 mb0 names chunk 1, which this rank does not hold");
    }
}

// --- 3. the shard layout with segments --------------------------------------------

TEST_CASE("ShardLayout with segments: groups stay inside a segment, offsets are global", "[parallel][layout][pipeline]") {
    for (ScheduleKind kind : all_schedules)
        for (int p = 1; p <= 4; ++p) {
            const auto pipe = loom::schedule::pipeline_program(kind, p, p, chunks_of(kind));
            const auto bounds = balanced(pipe.virtual_stages());
            for (int r = 0; r < p; ++r)
                for (Grouping grouping : {Grouping::buckets, Grouping::per_unit, Grouping::per_segment})
                    for (int dp : {1, 3}) {
                        INFO(loom::name(kind) << " p=" << p << " rank " << r << " grouping "
                                              << static_cast<int>(grouping) << " dp " << dp);
                        const auto segment = bounds.chunk_of_unit(pipe.rank_of_chunk, r);
                        const ShardLayout layout(fake_units(), dp, grouping, small_bucket, segment);
                        CHECK(layout.dense_size() == fake_total);
                        std::int64_t held = 0, padded = 0;
                        std::vector<int> covered(fake_count, -1);
                        for (int g = 0; g < static_cast<int>(layout.groups().size()); ++g) {
                            const auto& group = layout.group(g);
                            const int seg = segment[static_cast<std::size_t>(group.first_unit)];
                            CHECK(seg >= 0);
                            std::int64_t numel = 0;
                            for (int u = group.first_unit; u <= group.last_unit; ++u) {
                                CHECK(segment[static_cast<std::size_t>(u)] == seg);
                                numel += fake_numels[static_cast<std::size_t>(u)];
                                if (fake_numels[static_cast<std::size_t>(u)] > 0) {
                                    CHECK(layout.group_of_unit(u) == g);
                                    covered[static_cast<std::size_t>(u)] = g;
                                }
                            }
                            CHECK(group.numel == numel);
                            CHECK(group.dense_offset == dense_start(group.first_unit));
                            CHECK(fake_numels[static_cast<std::size_t>(group.first_unit)] > 0);
                            CHECK(fake_numels[static_cast<std::size_t>(group.last_unit)] > 0);
                            CHECK(group.offset == padded);
                            CHECK(group.padded % (16 * dp) == 0);
                            CHECK(group.padded >= group.numel);
                            CHECK(group.padded - group.numel < 16 * dp);
                            padded += group.padded;
                            held += numel;
                        }
                        CHECK(layout.padded_size() == padded);
                        // Every held unit with parameters is in a group; nothing else is.
                        std::int64_t held_expected = 0;
                        for (int u = 0; u < fake_count; ++u) {
                            const bool in_group = segment[static_cast<std::size_t>(u)] >= 0 &&
                                                  fake_numels[static_cast<std::size_t>(u)] > 0;
                            CHECK((covered[static_cast<std::size_t>(u)] >= 0) == in_group);
                            CHECK((layout.group_of_unit(u) >= 0) == in_group);
                            if (in_group) held_expected += fake_numels[static_cast<std::size_t>(u)];
                        }
                        CHECK(held == held_expected);
                        if (grouping == Grouping::per_segment) {
                            // One group per segment with parameters, from its first to its last such unit.
                            std::map<int, std::pair<int, int>> span;  // segment -> (first, last) unit with params
                            for (int u = 0; u < fake_count; ++u) {
                                const int s = segment[static_cast<std::size_t>(u)];
                                if (s < 0 || fake_numels[static_cast<std::size_t>(u)] == 0) continue;
                                auto [it, fresh] = span.emplace(s, std::pair{u, u});
                                if (!fresh) it->second.second = u;
                            }
                            REQUIRE(layout.groups().size() == span.size());
                            std::size_t g = 0;
                            for (const auto& [s, range] : span) {
                                CHECK(layout.group(static_cast<int>(g)).first_unit == range.first);
                                CHECK(layout.group(static_cast<int>(g)).last_unit == range.second);
                                ++g;
                            }
                        }
                    }
        }
}

TEST_CASE("ShardLayout with segments: a run of units held elsewhere ends a group", "[parallel][layout][pipeline]") {
    // Units 0, 1 and 7-9 in segment 0 (not a pipeline's shape, but the rule
    // is the gap): per_segment still makes two groups, and buckets as large as
    // the model too.
    const std::vector<int> segment{0, 0, -1, -1, -1, -1, -1, 0, 0, 0};
    for (Grouping grouping : {Grouping::per_segment, Grouping::buckets}) {
        const ShardLayout layout(fake_units(), 2, grouping, std::int64_t{1} << 30, segment);
        REQUIRE(layout.groups().size() == 2);
        CHECK(layout.group(0).first_unit == 0);
        CHECK(layout.group(0).last_unit == 1);
        CHECK(layout.group(0).numel == 650);
        CHECK(layout.group(1).first_unit == 7);
        CHECK(layout.group(1).last_unit == 9);
        CHECK(layout.group(1).numel == 277);
        CHECK(layout.group(1).dense_offset == 1470);
    }
    // A segment boundary ends a group even between two neighbours with parameters.
    const ShardLayout two(fake_units(), 1, Grouping::buckets, std::int64_t{1} << 30, {0, 0, 0, 0, 1, 1, 1, 1, 1, 1});
    REQUIRE(two.groups().size() == 2);
    CHECK(two.group(0).last_unit == 3);
    CHECK(two.group(1).first_unit == 4);
    // Without segments, the small bucket's groups (closed from the last unit backwards).
    const ShardLayout plain(fake_units(), 1, Grouping::buckets, small_bucket);
    std::vector<std::pair<int, int>> spans;
    for (const auto& g : plain.groups()) spans.emplace_back(g.first_unit, g.last_unit);
    CHECK(spans == std::vector<std::pair<int, int>>{{0, 0}, {1, 1}, {3, 4}, {5, 5}, {6, 7}, {8, 9}});
    // The wrong number of segment entries is refused.
    CHECK(message_of([] { (void)ShardLayout(fake_units(), 1, Grouping::buckets, 400, {0, 0}); }) ==
          "ShardLayout: 2 segment entries for 10 units");
}

TEST_CASE("ShardLayout with segments: to_dense and from_dense touch only held ranges", "[parallel][layout][pipeline]") {
    // Interleaved<2>, p=2: rank 1 holds chunks 1 (u1-u3) and 3 (u7-u9) of {1,3,3,3}.
    const auto pipe = loom::schedule::interleaved(2, 2, 2);
    const auto bounds = balanced(4);
    const auto segment = bounds.chunk_of_unit(pipe.rank_of_chunk, 1);
    REQUIRE(segment == std::vector<int>{-1, 1, 1, 1, -1, -1, -1, 3, 3, 3});
    for (Grouping grouping : {Grouping::buckets, Grouping::per_segment}) {
        const ShardLayout layout(fake_units(), 2, grouping, small_bucket, segment);
        const auto n = static_cast<std::size_t>(layout.dense_size());
        std::vector<float> dense(n);
        for (std::size_t k = 0; k < n; ++k) dense[k] = static_cast<float>(k);
        // Elements held elsewhere are NaN: from_dense must not read them.
        const auto held = [&](std::size_t k) {
            for (int u = 0; u < fake_count; ++u) {
                const auto lo = static_cast<std::size_t>(dense_start(u));
                if (k >= lo && k < lo + static_cast<std::size_t>(fake_numels[static_cast<std::size_t>(u)]))
                    return segment[static_cast<std::size_t>(u)] >= 0;
            }
            return false;
        };
        for (std::size_t k = 0; k < n; ++k)
            if (!held(k)) dense[k] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> padded(static_cast<std::size_t>(layout.padded_size()), -1.0f);
        layout.from_dense(dense, padded);
        for (float x : padded) CHECK_FALSE(std::isnan(x));
        // Padding zeroed.
        for (const auto& g : layout.groups())
            for (std::int64_t k = g.numel; k < g.padded; ++k) CHECK(padded[static_cast<std::size_t>(g.offset + k)] == 0.0f);
        std::vector<float> back(n, -7.0f);
        layout.to_dense(padded, back);
        int held_count = 0;
        for (std::size_t k = 0; k < n; ++k) {
            if (held(k)) {
                ++held_count;
                CHECK(back[k] == static_cast<float>(k));
            } else {
                CHECK(back[k] == -7.0f);  // untouched
            }
        }
        CHECK(held_count == 130 + 0 + 260 + 33 + 180 + 64);
    }
}

// --- 4. the executor's stage bounds ----------------------------------------------------

TEST_CASE("exec::stage_bounds refuses a bad partition or costs in one line", "[parallel][pipeline][executor]") {
    using loom::exec::ExecutorOptions;
    using loom::exec::stage_bounds;
    CHECK(message_of([] { (void)stage_bounds(10, 4, ExecutorOptions{.partition = {3, 3, 4}}); }) ==
          "Executor: a partition of 3 stages for a pipeline of 4 virtual stages; give one count per virtual stage");
    CHECK(message_of([] { (void)stage_bounds(10, 4, ExecutorOptions{.partition = {4, 0, 3, 3}}); }) ==
          "Executor: a stage of 0 units in the partition; every stage needs at least 1");
    CHECK(message_of([] { (void)stage_bounds(10, 4, ExecutorOptions{.partition = {3, 3, 3, 3}}); }) ==
          "Executor: the partition covers 12 units but the model has 10; the counts must sum to 10");
    CHECK(message_of([] { (void)stage_bounds(10, 4, ExecutorOptions{.unit_costs = std::vector<double>(9, 1.0)}); }) ==
          "Executor: 9 unit costs for 10 units; give one per unit");
    // More virtual stages than units: plan::balance's message (in its words: layers).
    CHECK(message_of([] { (void)stage_bounds(3, 4, ExecutorOptions{}); }) ==
          "partition: 4 stages but the model has 3 layers; every stage needs at least one layer, so use at most 3 stages");
    // A given partition is used as it is.
    CHECK(stage_bounds(10, 4, ExecutorOptions{.partition = {4, 1, 3, 2}}).bounds == std::vector<int>{0, 4, 5, 8, 10});
}

TEST_CASE("exec::stage_bounds balances equal costs min-max, ties to the smaller first stages",
          "[parallel][pipeline][executor]") {
    using loom::exec::ExecutorOptions;
    using loom::exec::stage_bounds;
    // Ten equal units over four stages: no split beats a slowest stage of 3,
    // and plan::balance breaks ties towards "earlier, smaller first stages":
    // for stage 0 it tries 1 unit first, and 1 unit leaves 9 for 3 stages at
    // 3 each, which is optimal, so {1, 3, 3, 3} (not {3, 3, 2, 2}).
    const StageBounds four = stage_bounds(10, 4, ExecutorOptions{});
    CHECK(four.bounds == std::vector<int>{0, 1, 4, 7, 10});
    CHECK(four.stages() == 4);
    CHECK(four.units() == 10);
    // The same rule at 8 virtual stages (4 ranks x 2 chunks): six of one, two of two.
    CHECK(stage_bounds(10, 8, ExecutorOptions{}).bounds == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 8, 10});
    // Costs move the cuts: a heavy first unit gets a stage of its own and the rest split.
    std::vector<double> costs(10, 1.0);
    costs[0] = 5.0;
    CHECK(stage_bounds(10, 3, ExecutorOptions{.unit_costs = costs}).bounds == std::vector<int>{0, 1, 5, 10});
    // The chunk map of a V: rank 0 holds virtual stages 0 and 3 of {1, 3, 3, 3}.
    CHECK(four.chunk_of_unit({0, 1, 1, 0}, 0) == std::vector<int>{0, -1, -1, -1, -1, -1, -1, 3, 3, 3});
    CHECK(four.chunk_of_unit({0, 1, 1, 0}, 1) == std::vector<int>{-1, 1, 1, 1, 2, 2, 2, -1, -1, -1});
}

// --- 5. the micro-batch pool ---------------------------------------------------------

TEST_CASE("MicroBatchPool reuses closed contexts: it grows to the peak in flight", "[parallel][pipeline][executor]") {
    loom::exec::MicroBatchPool pool;
    pool.start_step(1, 8);
    // 1F1B on the first of 3 stages: 3 warm-up forwards, then F B pairs, then the drain.
    int open = 0, peak = 0;
    const auto f = [&](int mb) {
        (void)pool.open(0, mb);
        peak = std::max(peak, ++open);
    };
    const auto b = [&](int mb) {
        pool.close(0, mb);
        --open;
    };
    f(0);
    f(1);
    f(2);
    for (int i = 0; i < 5; ++i) {
        b(i);
        f(i + 3);
    }
    for (int i = 5; i < 8; ++i) b(i);
    CHECK(peak == 3);
    CHECK(pool.contexts() == 3);
    // Another step of the same shape allocates nothing.
    pool.start_step(1, 8);
    for (int mb = 0; mb < 3; ++mb) f(mb);
    for (int mb = 0; mb < 3; ++mb) b(mb);
    CHECK(pool.contexts() == 3);
    // GPipe-like: all open at once.
    pool.start_step(2, 4);
    for (int v = 0; v < 2; ++v)
        for (int mb = 0; mb < 4; ++mb) (void)pool.open(v, mb);
    CHECK(pool.contexts() == 8);
}

TEST_CASE("MicroBatchPool refuses what a correct schedule never does, in one line", "[parallel][pipeline][executor]") {
    loom::exec::MicroBatchPool pool;
    pool.start_step(2, 4);
    (void)pool.open(1, 2);
    CHECK(message_of([&] { (void)pool.open(1, 2); }) == "Executor: chunk 1 micro-batch 2 started twice in one step");
    CHECK(message_of([&] { (void)pool.inbox(Payload::activation, 1, 3); }) ==
          "Executor: chunk 1 micro-batch 3 needs its activation, which has not arrived");
    CHECK(message_of([&] { (void)pool.inbox(Payload::gradient, 0, 0); }) ==
          "Executor: chunk 0 micro-batch 0 needs its gradient, which has not arrived");
    CHECK(message_of([&] { (void)pool.outbox(Payload::activation, 0, 1); }) ==
          "Executor: chunk 0 micro-batch 1 has no activation to send yet");
    CHECK(message_of([&] { (void)pool.context(0, 2); }) ==
          "Executor: chunk 0 micro-batch 2 computes before its forward opened it");
    CHECK(message_of([&] { (void)pool.open(2, 0); }) == "Executor: chunk 2 micro-batch 0 is outside the step's 2 chunk(s) x 4 micro-batch(es)");
    // Closed, it can open again; a put inbox entry is found (and a new step forgets it).
    pool.close(1, 2);
    CHECK(message_of([&] { (void)pool.open(1, 2); }) == "(no error)");
    float x = 1.5f;
    pool.put_inbox(Payload::activation, 1, 3, loom::Tensor::of(&x, {1}));
    CHECK(pool.inbox(Payload::activation, 1, 3).raw() == &x);
    CHECK(message_of([&] { (void)pool.inbox(Payload::gradient, 1, 3); }) ==
          "Executor: chunk 1 micro-batch 3 needs its gradient, which has not arrived");
    pool.start_step(2, 4);
    CHECK(message_of([&] { (void)pool.inbox(Payload::activation, 1, 3); }) ==
          "Executor: chunk 1 micro-batch 3 needs its activation, which has not arrived");
    CHECK(message_of([&] { (void)pool.open(1, 2); }) == "(no error)");
}

// --- 6. the executor on rank threads ------------------------------------------------

namespace {

const loom::gpt::Config tiny_gpt{.layers = 2, .width = 16, .heads = 2, .seq = 8, .vocab = 32};

struct PipelineRun {
    std::int64_t activations = 0;
    float loss = 0;
    bool holds_first = false;
    std::string error;
};

// One step of `kind` over pp 2 (dp 1) with 4 micro-batches of one row each.
std::vector<PipelineRun> run_pipeline(ScheduleKind kind) {
    using loom::comm::ThreadComm;
    std::vector<PipelineRun> runs(2);
    loom::comm::ThreadWorld(2).run([&](ThreadComm& world) {
        auto& mine = runs[static_cast<std::size_t>(world.rank())];
        loom::comm::Mesh<ThreadComm> mesh(world, {{"dp", 1}, {"pp", 2}});
        auto model = loom::gpt::make_model(tiny_gpt);
        const loom::exec::ExecutionPlan plan{.zero_stage = 0, .pipelined = true, .schedule = kind, .chunks = 1};
        mine.error = message_of([&] {
            loom::exec::Executor<ThreadComm> exec(model, mesh.axis("dp"), &mesh.axis("pp"), plan,
                                                  {.micro_batches = 4});
            exec.initialize(3);
            std::vector<std::int32_t> inputs, targets;
            for (int k = 0; k < 4 * tiny_gpt.seq; ++k) {
                inputs.push_back(static_cast<std::int32_t>(k * 7 % tiny_gpt.vocab));
                targets.push_back(static_cast<std::int32_t>(k * 5 % tiny_gpt.vocab));
            }
            mine.loss = exec.step(loom::Tensor::of(inputs.data(), {4, tiny_gpt.seq}),
                                  loom::Tensor::of(targets.data(), {4, tiny_gpt.seq}), 1e-3f);
            mine.activations = exec.memory_report().activations;
            mine.holds_first = exec.holds_unit(0);
        });
    });
    return runs;
}

}  // namespace

TEST_CASE("a 1F1B step on two pipeline ranks holds no more activations than its bound", "[parallel][pipeline][executor]") {
    // The pool's contexts are not exposed; but every context of a rank peaks
    // at the same bytes (one micro-batch of the same chunk), so activations
    // are (contexts) x (one context's peak). GPipe opens all m = 4 on each
    // rank; 1F1B opens min(p - r, m): 2 on rank 0, 1 on rank 1.
    const auto one_f_one_b = run_pipeline(ScheduleKind::one_f_one_b);
    const auto gpipe = run_pipeline(ScheduleKind::gpipe);
    for (int r = 0; r < 2; ++r) {
        INFO("rank " << r);
        const auto& a = one_f_one_b[static_cast<std::size_t>(r)];
        const auto& g = gpipe[static_cast<std::size_t>(r)];
        REQUIRE(a.error == "(no error)");
        REQUIRE(g.error == "(no error)");
        CHECK(a.holds_first == (r == 0));
        CHECK(a.activations > 0);
        CHECK(std::isfinite(a.loss));
        CHECK(a.loss == one_f_one_b[0].loss);  // every stage returns the step's loss
        const std::int64_t contexts_1f1b = std::min(2 - r, 4);
        CHECK(a.activations * 4 == g.activations * contexts_1f1b);
        CHECK(g.activations % 4 == 0);
    }
}

TEST_CASE("an Executor with a pp axis of 2 and no Pipeline<...> is refused", "[parallel][pipeline][executor]") {
    using loom::comm::ThreadComm;
    std::vector<std::string> seen(2);
    loom::comm::ThreadWorld(2).run([&](ThreadComm& world) {
        loom::comm::Mesh<ThreadComm> mesh(world, {{"dp", 1}, {"pp", 2}});
        auto model = loom::gpt::make_model(tiny_gpt);
        seen[static_cast<std::size_t>(world.rank())] = message_of([&] {
            loom::exec::Executor<ThreadComm> exec(model, mesh.axis("dp"), &mesh.axis("pp"), loom::exec::ExecutionPlan{},
                                                  {});
        });
    });
    for (const auto& message : seen)
        CHECK(message ==
              "Executor: a pipeline axis of 2 ranks for a strategy without Pipeline<...>; add Pipeline<Schedule> or "
              "use a pp axis of 1");
}

// --- 7. the unit profiler -----------------------------------------------------------

TEST_CASE("plan::profile_units times every unit of a tiny GPT", "[parallel][pipeline][partition]") {
    auto probe = loom::gpt::make_model(tiny_gpt);
    std::vector<std::int32_t> inputs, targets;
    for (int k = 0; k < 2 * tiny_gpt.seq; ++k) {
        inputs.push_back(static_cast<std::int32_t>(k * 3 % tiny_gpt.vocab));
        targets.push_back(static_cast<std::int32_t>((k * 3 + 1) % tiny_gpt.vocab));
    }
    const auto seconds = loom::plan::profile_units(probe, 5, loom::Tensor::of(inputs.data(), {2, tiny_gpt.seq}),
                                                   loom::Tensor::of(targets.data(), {2, tiny_gpt.seq}));
    REQUIRE(seconds.size() == loom::nn::units_of(probe).size());
    CHECK(seconds.size() == 6);
    for (double s : seconds) {
        CHECK(s > 0.0);
        CHECK(s < 1.0);
    }
    CHECK(message_of([&] {
              (void)loom::plan::profile_units(probe, 5, loom::Tensor::of(inputs.data(), {2, tiny_gpt.seq}),
                                              loom::Tensor::of(targets.data(), {2, tiny_gpt.seq}), 0);
          }) == "profile_units: 0 repeats; give at least 1");
}
