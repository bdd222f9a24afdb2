// A pipeline rank's whole step program (schedule/pipeline_step.hpp): every
// schedule lowered to the units it holds, with the data-parallel and ZeRO
// instructions of its groups, checked against every promise the lowering
// makes, including those the pipelined verifier does not check by itself.
// The fake units and the lowering: tests/support/fake_pipeline.hpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/fake_pipeline.hpp"
#include "support/message_of.hpp"
#include "support/step_programs.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::ScheduleKind;
using loom::parallel::ShardLayout;
using loom::schedule::Instruction;
using loom::schedule::Op;
using loom::schedule::Payload;
using loom::schedule::Reduction;
using loom::schedule::StageBounds;
using loom::schedule::StepProgram;
using loom_test::message_of;

namespace {

using namespace loom_test;
using namespace loom_test::fake_pipeline;

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

}  // namespace

// --- every schedule, lowered ---------------------------------------------------

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
        l.program = rearranged(valid.program, order);
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

}  // namespace LOOM_TEST_FILE
