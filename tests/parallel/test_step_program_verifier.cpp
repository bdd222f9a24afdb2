// What the step-program verifier (schedule/verify.hpp) refuses in a
// data-parallel / ZeRO program, naming the instruction: a missing or repeated
// wait, a reduction or optimizer step out of order, misused parameter and
// gradient slots, missing, repeated or misplaced compute, and a group whose
// gradients are not reduced exactly once. Each case breaks a generated program.
#include <catch2/catch.hpp>

#include <vector>

#include <loom/schedule/data_parallel.hpp>

#include "support/message_of.hpp"
#include "support/small_gpt_units.hpp"
#include "support/step_programs.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::schedule::Instruction;
using loom::schedule::Op;
using loom::schedule::Reduction;
using loom_test::message_of;

namespace {

using namespace loom_test;
using namespace loom_test::small_gpt;

}  // namespace

// --- the verifier rejects broken programs, naming the instruction -----------------

TEST_CASE("the verifier rejects a missing or repeated wait", "[parallel][verify]") {
    const auto layout0 = layout_for(0, 2);
    const auto stage0 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 1);
    REQUIRE(text_of(stage0.code[16]) == "wait #11");
    REQUIRE(text_of(stage0.code[19]) == "optimizer_step");

    // Deleting the wait for g2's all-reduce: the optimizer (now #18) runs before it finished.
    const auto no_wait = without(stage0, 16);
    CHECK(verify_message(no_wait, layout0) == invalid_at(no_wait, 18) + "optimizer_step runs before reduction #11 finished");

    // Waiting for it twice.
    const auto twice = copied_before(stage0, 16, 17);
    REQUIRE(text_of(twice.code[17]) == "wait #11");
    CHECK(verify_message(twice, layout0) == invalid_at(twice, 17) + "wait #11 waits for #11 a second time");

    // Waiting for something that is not asynchronous, or not issued yet.
    auto not_async = stage0;
    not_async.code[16].target = 0;
    CHECK(verify_message(not_async, layout0) ==
          invalid_at(not_async, 16) + "wait #0 waits for #0, which is not an earlier asynchronous instruction");
    auto too_early = moved_before(stage0, 16, 11);
    REQUIRE(text_of(too_early.code[11]) == "wait #12");
    CHECK(verify_message(too_early, layout0) ==
          invalid_at(too_early, 11) + "wait #12 waits for #12, which is not an earlier asynchronous instruction");

    // ZeRO-3: deleting the wait for g0's gather (#2), forward u0 (now #3) runs on parameters not there yet.
    const auto layout3 = layout_for(3, 2);
    const auto stage3 = loom::schedule::data_parallel_program(layout3, unit_count, 3, 1);
    REQUIRE(text_of(stage3.code[2]) == "wait #1");
    const auto no_gather_wait = without(stage3, 2);
    CHECK(verify_message(no_gather_wait, layout3) ==
          invalid_at(no_gather_wait, 3) + "forward u0 mb0 runs while group 0's parameters are not gathered and waited for");

    // ZeRO-1: deleting the last wait (for the all-gather of g2 after the optimizer).
    const auto layout1 = layout_for(1, 2);
    const auto stage1 = loom::schedule::data_parallel_program(layout1, unit_count, 1, 1);
    REQUIRE(stage1.code.size() == 27);
    REQUIRE(text_of(stage1.code[22]) == "gather_params g2");
    REQUIRE(text_of(stage1.code[25]) == "wait #22");
    const auto never_waited = without(stage1, 25);
    CHECK(verify_message(never_waited, layout1) ==
          invalid_at(never_waited, 26) + "instruction #22 (gather_params g2) is never waited for");
}

TEST_CASE("the verifier rejects a reduction or an optimizer step out of order", "[parallel][verify]") {
    const auto layout0 = layout_for(0, 2);
    const auto stage0 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 1);
    REQUIRE(text_of(stage0.code[10]) == "backward u2 mb0");
    REQUIRE(text_of(stage0.code[11]) == "reduce_grads g2 mb0 (all_reduce)");

    // g2 = {u2, u3, u4}: its reduction before the backward of u2.
    const auto early_reduce = moved_before(stage0, 11, 10);
    CHECK(verify_message(early_reduce, layout0) ==
          invalid_at(early_reduce, 10) + "reduce_grads g2 mb0 (all_reduce) reduces before the weight gradients of u2 exist");
    // ... or before the group's backward began at all.
    const auto very_early_reduce = moved_before(stage0, 11, 7);
    CHECK(verify_message(very_early_reduce, layout0) ==
          invalid_at(very_early_reduce, 7) +
              "reduce_grads g2 mb0 (all_reduce) reduces before the weight gradients of u2 exist");

    // ZeRO-3: g4's reduce-scatter (#25) before backward u4 (#24).
    const auto layout3 = layout_for(3, 2);
    const auto stage3 = loom::schedule::data_parallel_program(layout3, unit_count, 3, 1);
    REQUIRE(text_of(stage3.code[25]) == "reduce_grads g4 slot 0 mb0 (reduce_scatter)");
    const auto early_scatter = moved_before(stage3, 25, 24);
    CHECK(verify_message(early_scatter, layout3) ==
          invalid_at(early_scatter, 24) +
              "reduce_grads g4 slot 0 mb0 (reduce_scatter) reduces before the weight gradients of u4 exist");

    // The optimizer (#19) before the last wait (#18, for g0's all-reduce #15).
    const auto early_optimizer = moved_before(stage0, 19, 18);
    CHECK(verify_message(early_optimizer, layout0) ==
          invalid_at(early_optimizer, 18) + "optimizer_step runs before reduction #15 finished");
    // ... or twice.
    const auto two_steps = copied_before(stage0, 19, 20);
    CHECK(verify_message(two_steps, layout0) ==
          invalid_at(two_steps, 22) + "the optimizer runs 2 times; a step runs it once");
    // ... or not at all.
    const auto no_step = without(stage0, 19);
    CHECK(verify_message(no_step, layout0) == invalid_at(no_step, 20) + "the optimizer runs 0 times; a step runs it once");

    // ZeRO-1: gathering the (unsharded) updated blocks before the optimizer updated them.
    const auto layout1 = layout_for(1, 2);
    const auto stage1 = loom::schedule::data_parallel_program(layout1, unit_count, 1, 1);
    REQUIRE(text_of(stage1.code[19]) == "optimizer_step");
    REQUIRE(text_of(stage1.code[20]) == "gather_params g0");
    const auto early_gather = moved_before(stage1, 20, 19);
    CHECK(verify_message(early_gather, layout1) ==
          invalid_at(early_gather, 19) + "gather_params g0 gathers unsharded parameters before the optimizer updated them");

    // An arena reduction in an earlier micro-batch than the last.
    const auto stage0_mb4 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 4);
    auto early_mb = stage0_mb4;
    const int at = index_of(stage0_mb4, {.op = Op::reduce_grads, .micro_batch = 3, .group = 1,
                                         .reduction = Reduction::all_reduce});
    early_mb.code[static_cast<std::size_t>(at)].micro_batch = 2;
    CHECK(verify_message(early_mb, layout0) ==
          invalid_at(early_mb, at) +
              "reduce_grads g1 mb2 (all_reduce) reduces arena gradients before the last micro-batch has added its share");
}

TEST_CASE("the verifier rejects misuse of parameter and gradient slots", "[parallel][verify]") {
    const auto layout3 = layout_for(3, 2);
    const auto stage3 = loom::schedule::data_parallel_program(layout3, unit_count, 3, 1);

    // Without the release of g0 (#5), the gather of g2 into slot 0 (now #6) overwrites it.
    REQUIRE(text_of(stage3.code[5]) == "release_params g0 slot 0");
    const auto no_release = without(stage3, 5);
    CHECK(verify_message(no_release, layout3) ==
          invalid_at(no_release, 6) + "gather_params g2 slot 0 overwrites slot 0 still holding group 0");

    // Releasing g1's slot while its gather is still pending: the wait (#6) after the release.
    REQUIRE(text_of(stage3.code[6]) == "wait #3");
    REQUIRE(text_of(stage3.code[9]) == "release_params g1 slot 1");
    const auto early_release = moved_before(stage3, 9, 6);
    CHECK(verify_message(early_release, layout3) ==
          invalid_at(early_release, 6) + "release_params g1 slot 1 releases a slot holding group 1 with its gather still pending");

    // A forward on a released group: release g0 (#5) before forward u0 (#4).
    const auto released_too_soon = moved_before(stage3, 5, 4);
    CHECK(verify_message(released_too_soon, layout3) ==
          invalid_at(released_too_soon, 5) +
              "forward u0 mb0 runs while group 0's parameters are not gathered and waited for");

    // Without bind_grads g4 (#23), backward u4 (now #23) has nowhere to put its gradients.
    REQUIRE(text_of(stage3.code[23]) == "bind_grads g4 slot 0 mb0");
    const auto unbound = without(stage3, 23);
    CHECK(verify_message(unbound, layout3) ==
          invalid_at(unbound, 23) + "backward u4 mb0 runs while group 4's gradients are not bound to a free slot");

    // Without the wait for g4's reduction (#35), slot 0 is rebound (now #35) while it reads the slot.
    REQUIRE(text_of(stage3.code[35]) == "wait #25");
    REQUIRE(text_of(stage3.code[36]) == "bind_grads g2 slot 0 mb0");
    const auto rebound = without(stage3, 35);
    CHECK(verify_message(rebound, layout3) ==
          invalid_at(rebound, 35) + "bind_grads g2 slot 0 mb0 rebinds slot 0 while its reduction #25 is still pending");

    // A slot the program does not have.
    auto bad_slot = stage3;
    bad_slot.code[1].slot = 2;
    CHECK(verify_message(bad_slot, layout3) ==
          invalid_at(bad_slot, 1) + "gather_params g0 slot 2 names parameter slot 2 but the program has 2");
    auto bad_group = stage3;
    bad_group.code[1].group = 5;
    CHECK(verify_message(bad_group, layout3) ==
          invalid_at(bad_group, 1) + "gather_params g5 slot 0 names group 5 but the layout has 5");
}

TEST_CASE("the verifier rejects missing, repeated and misplaced compute", "[parallel][verify]") {
    const auto layout0 = layout_for(0, 2);
    const auto stage0 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 1);
    REQUIRE(text_of(stage0.code[3]) == "forward u2 mb0");

    // Without forward u2, forward u3 (now #3) runs before it.
    const auto no_forward = without(stage0, 3);
    CHECK(verify_message(no_forward, layout0) == invalid_at(no_forward, 3) + "forward u3 mb0 runs before forward u2");
    // Without the last forward, backward starts before the forward pass ended.
    const auto no_last_forward = without(stage0, 6);
    CHECK(verify_message(no_last_forward, layout0) ==
          invalid_at(no_last_forward, 6) + "backward u5 mb0 runs before the forward pass ended");
    // A forward twice.
    const auto forward_twice = copied_before(stage0, 3, 4);
    CHECK(verify_message(forward_twice, layout0) == invalid_at(forward_twice, 4) + "forward u2 mb0 runs twice");
    // Without backward u3, backward u2 (now #9) runs before it.
    const auto no_backward = without(stage0, 9);
    CHECK(verify_message(no_backward, layout0) ==
          invalid_at(no_backward, 9) + "backward u2 mb0 runs before the backward of u3");
    // Without backward u0 (the last one): caught at the end.
    REQUIRE(text_of(stage0.code[14]) == "backward u0 mb0");
    REQUIRE(text_of(stage0.code[15]) == "reduce_grads g0 mb0 (all_reduce)");
    auto no_first_backward = without(stage0, 14);
    CHECK(verify_message(no_first_backward, layout0) ==
          invalid_at(no_first_backward, 14) + "reduce_grads g0 mb0 (all_reduce) reduces before the weight gradients of u0 exist");
    // Names out of range.
    auto bad_unit = stage0;
    bad_unit.code[1].unit = 9;
    CHECK(verify_message(bad_unit, layout0) == invalid_at(bad_unit, 1) + "forward u9 mb0 names unit 9 but the model has 6");
    auto bad_mb = stage0;
    bad_mb.code[1].micro_batch = 1;
    CHECK(verify_message(bad_mb, layout0) == invalid_at(bad_mb, 1) + "forward u0 mb1 names micro-batch 1 of 1");

    // A micro-batch never run: a program of 2 micro-batches that only runs one.
    const auto mb2 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 2);
    std::vector<int> order;
    for (int k = 0; k < static_cast<int>(mb2.code.size()); ++k) {
        const auto& in = mb2.code[static_cast<std::size_t>(k)];
        const bool compute_of_mb0 = (in.op == Op::forward || in.op == Op::backward) && in.micro_batch == 0;
        if (!compute_of_mb0) order.push_back(k);
    }
    const auto half = rearranged(mb2, order);
    CHECK(verify_message(half, layout0) ==
          invalid_at(half, static_cast<int>(half.code.size())) +
              "unit 0 of micro-batch 0 ran forward 0 times and backward 0/0 times; each must run once");
}

// Every group's gradients are reduced exactly once (in the last micro-batch
// at stages 0/1; once per micro-batch at stages 2/3): a program that never
// reduces a group, or reduces an arena group twice, would train silently wrong.
TEST_CASE("the verifier rejects a group whose gradients are not reduced exactly once", "[parallel][verify]") {
    for (int stage : {0, 1, 2, 3}) {
        INFO("stage " << stage);
        const auto layout = layout_for(stage, 2);
        const auto program = loom::schedule::data_parallel_program(layout, unit_count, stage, 2);
        // Without g1's reductions (and the waits for them).
        std::vector<int> order;
        for (int k = 0; k < static_cast<int>(program.code.size()); ++k) {
            const auto& in = program.code[static_cast<std::size_t>(k)];
            const bool reduces_g1 = in.op == Op::reduce_grads && in.group == 1;
            const bool waits_for_g1 = in.op == Op::wait &&
                                      program.code[static_cast<std::size_t>(in.target)].op == Op::reduce_grads &&
                                      program.code[static_cast<std::size_t>(in.target)].group == 1;
            if (!reduces_g1 && !waits_for_g1) order.push_back(k);
        }
        const auto unreduced = rearranged(program, order);
        REQUIRE(unreduced.code.size() < program.code.size());
        CHECK_THAT(verify_message(unreduced, layout), Catch::Contains("group 1's gradients of micro-batch"));
    }
    for (int stage : {0, 1}) {
        INFO("stage " << stage << ", g1 reduced twice");
        const auto layout = layout_for(stage, 2);
        const auto program = loom::schedule::data_parallel_program(layout, unit_count, stage, 1);
        const int reduce = index_of(program, {.op = Op::reduce_grads, .micro_batch = 0, .group = 1,
                                              .reduction = stage == 0 ? Reduction::all_reduce : Reduction::reduce_scatter});
        const int optimizer = index_of(program, {.op = Op::optimizer_step});
        auto twice = copied_before(program, reduce, optimizer);  // a second reduce_grads g1 just before the optimizer ...
        twice.code.insert(twice.code.begin() + optimizer + 1, Instruction{.op = Op::wait, .target = optimizer});
        for (std::size_t k = static_cast<std::size_t>(optimizer) + 2; k < twice.code.size(); ++k)  // ... and its wait
            if (twice.code[k].op == Op::wait && twice.code[k].target > optimizer) ++twice.code[k].target;
        REQUIRE(twice.count(Op::reduce_grads) == program.count(Op::reduce_grads) + 1);
        CHECK_THAT(verify_message(twice, layout), Catch::Contains("reduced 2 times; expected 1"));
    }
}

}  // namespace LOOM_TEST_FILE
