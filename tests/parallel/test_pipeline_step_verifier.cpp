// What the pipelined verifier (schedule/verify.hpp) refuses in a lowered
// pipeline rank's step program: p2p out of order, a reduction before every
// micro-batch's weight gradients, units and chunks the rank does not hold.
// Each case breaks a correct program and names the first bad instruction.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "support/fake_pipeline.hpp"
#include "support/message_of.hpp"
#include "support/step_programs.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::ScheduleKind;
using loom::schedule::Instruction;
using loom::schedule::Op;
using loom::schedule::Payload;
using loom::schedule::StepProgram;
using loom_test::message_of;

namespace {

using namespace loom_test;
using namespace loom_test::fake_pipeline;

}  // namespace

// --- what the pipelined verifier refuses ------------------------------------------

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
        const StepProgram bad = moved_before(p, recv, forward + 1);
        CHECK(verify_message(second, bad) ==
              invalid_at(bad, forward - 1) + "forward u5 c1 mb0 runs before forward u4 (or its recv)");
    }
    SECTION("an activation sent before the forward of the chunk's last unit") {
        const StepProgram& p = first.program;
        const int send = index_of(p, p2p(Op::send, Payload::activation, 1, 0, 0));
        const int forward = index_of(p, unit_op(Op::forward, 4, 0, 0));
        REQUIRE(send == forward + 1);
        const StepProgram bad = moved_before(p, send, forward);
        CHECK(verify_message(first, bad) ==
              invalid_at(bad, forward) + "send activation to rank 1 c0 mb0 sends before the forward that produces it");
    }
    SECTION("a gradient sent before the backward of the chunk's first unit") {
        const StepProgram& p = second.program;
        const int send = index_of(p, p2p(Op::send, Payload::gradient, 0, 0, 1));
        const int backward = index_of(p, unit_op(Op::backward, 5, 0, 1));
        REQUIRE(send == backward + 1);
        const StepProgram bad = moved_before(p, send, backward);
        CHECK(verify_message(second, bad) ==
              invalid_at(bad, backward) + "send gradient to rank 0 c1 mb0 sends before the backward that produces it");
    }
    SECTION("the same activation received twice") {
        const StepProgram& p = second.program;
        const int recv = index_of(p, p2p(Op::recv, Payload::activation, 0, 1, 1));
        const StepProgram bad = copied_before(p, recv, recv + 1);
        CHECK(verify_message(second, bad) == invalid_at(bad, recv + 1) + "recv activation from rank 0 c1 mb1 receives twice");
    }
    SECTION("a backward of the chunk's last unit before its gradient recv") {
        const StepProgram& p = first.program;
        const int recv = index_of(p, p2p(Op::recv, Payload::gradient, 1, 0, 0));
        const int backward = index_of(p, unit_op(Op::backward, 4, 0, 0));
        REQUIRE(recv == backward - 1);
        const StepProgram bad = moved_before(p, recv, backward + 1);
        CHECK(verify_message(first, bad) ==
              invalid_at(bad, backward - 1) + "backward u4 c0 mb0 runs before the backward of u5 (or its recv)");
    }
    SECTION("without the recv at all, the same message") {
        const StepProgram& p = first.program;
        const int recv = index_of(p, p2p(Op::recv, Payload::gradient, 1, 1, 0));
        auto order = in_order(p);
        order.erase(order.begin() + recv);
        const StepProgram bad = rearranged(p, order);
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
        const StepProgram bad = moved_before(p, reduce, w);
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
        const StepProgram bad = moved_before(p, reduce, backward);
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
        StepProgram bad = copied_before(p, reduce, optimizer);
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
        StepProgram bad = copied_before(p, forward, forward + 1);
        bad.code[static_cast<std::size_t>(forward) + 1] = unit_op(Op::forward, 6, 0, 1);
        CHECK(verify_message(l, bad) == invalid_at(bad, forward + 1) + "forward u6 c1 mb0 runs a unit this rank does not hold");
    }
    SECTION("a held unit named with another chunk") {
        StepProgram bad = p;
        bad.code[static_cast<std::size_t>(forward)].chunk = 1;
        CHECK(verify_message(l, bad) == invalid_at(bad, forward) + "forward u4 c1 mb0 names chunk 1 but u4 is in chunk 0");
    }
    SECTION("a recv for a chunk held elsewhere") {
        StepProgram bad = copied_before(p, forward, forward);
        bad.code[static_cast<std::size_t>(forward)] = p2p(Op::recv, Payload::activation, 1, 0, 1);
        CHECK(verify_message(l, bad) ==
              invalid_at(bad, forward) + "recv activation from rank 1 c1 mb0 names chunk 1, which this rank does not hold");
    }
}

}  // namespace LOOM_TEST_FILE
