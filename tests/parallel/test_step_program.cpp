// The data-parallel / ZeRO step programs (schedule/data_parallel.hpp) on the
// units of a small GPT (no communication, no arithmetic): how instructions
// print, the programs of stages 0 and 3 instruction by instruction, the
// instructions each stage implies, and that every generated program verifies.
// The model: tests/support/small_gpt_units.hpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>

#include <loom/schedule/data_parallel.hpp>

#include "support/message_of.hpp"
#include "support/small_gpt_units.hpp"
#include "support/step_programs.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::parallel::Grouping;
using loom::parallel::ShardLayout;
using loom::schedule::Op;
using loom::schedule::Reduction;
using loom_test::message_of;

namespace {

using namespace loom_test;
using namespace loom_test::small_gpt;

}  // namespace

// --- the step programs ---------------------------------------------------------

TEST_CASE("instructions print as the verifier names them", "[parallel][program]") {
    CHECK(text_of({.op = Op::zero_grads}) == "zero_grads");
    CHECK(text_of({.op = Op::forward, .unit = 0, .micro_batch = 0}) == "forward u0 mb0");
    CHECK(text_of({.op = Op::backward, .unit = 5, .micro_batch = 1}) == "backward u5 mb1");
    CHECK(text_of({.op = Op::backward_input, .unit = 3, .micro_batch = 2}) == "backward_input u3 mb2");
    CHECK(text_of({.op = Op::backward_weight, .unit = 3, .micro_batch = 2}) == "backward_weight u3 mb2");
    CHECK(text_of({.op = Op::reduce_grads, .micro_batch = 1, .group = 2, .slot = 0, .reduction = Reduction::reduce_scatter}) ==
          "reduce_grads g2 slot 0 mb1 (reduce_scatter)");
    CHECK(text_of({.op = Op::reduce_grads, .micro_batch = 0, .group = 4, .reduction = Reduction::all_reduce}) ==
          "reduce_grads g4 mb0 (all_reduce)");
    CHECK(text_of({.op = Op::wait, .target = 17}) == "wait #17");
    // A wait prints its target alone, whatever else it carries.
    CHECK(text_of({.op = Op::wait, .unit = 3, .group = 1, .target = 4}) == "wait #4");
    CHECK(text_of({.op = Op::gather_params, .group = 1}) == "gather_params g1");
    CHECK(text_of({.op = Op::gather_params, .group = 3, .slot = 1}) == "gather_params g3 slot 1");
    CHECK(text_of({.op = Op::release_params, .group = 3, .slot = 1}) == "release_params g3 slot 1");
    CHECK(text_of({.op = Op::bind_grads, .group = 0, .slot = 0}) == "bind_grads g0 slot 0");
    CHECK(text_of({.op = Op::optimizer_step}) == "optimizer_step");
    CHECK(text_of({.op = Op::reduce_loss}) == "reduce_loss");
    CHECK(loom::schedule::is_async(Op::gather_params));
    CHECK(loom::schedule::is_async(Op::reduce_grads));
    CHECK_FALSE(loom::schedule::is_async(Op::wait));
    CHECK_FALSE(loom::schedule::is_async(Op::release_params));
    CHECK(loom::schedule::is_compute(Op::optimizer_step));
    CHECK_FALSE(loom::schedule::is_compute(Op::reduce_grads));
}

TEST_CASE("the data-parallel program of stage 0, instruction by instruction", "[parallel][program]") {
    // Groups g0 = {u0}, g1 = {u1}, g2 = {u2..u4}: each group's all-reduce
    // starts right after the backward of its first unit; all are waited for
    // before the optimizer.
    const auto layout = layout_for(0, 2);
    const auto program = loom::schedule::data_parallel_program(layout, unit_count, 0, 1);
    CHECK(printed(program) ==
          "step program (data parallel over 2 ranks, ZeRO stage 0, 1 micro-batch): 21 instructions\n"
          "  #0 zero_grads\n"
          "  #1 forward u0 mb0\n"
          "  #2 forward u1 mb0\n"
          "  #3 forward u2 mb0\n"
          "  #4 forward u3 mb0\n"
          "  #5 forward u4 mb0\n"
          "  #6 forward u5 mb0\n"
          "  #7 backward u5 mb0\n"
          "  #8 backward u4 mb0\n"
          "  #9 backward u3 mb0\n"
          "  #10 backward u2 mb0\n"
          "  #11 reduce_grads g2 mb0 (all_reduce)\n"
          "  #12 backward u1 mb0\n"
          "  #13 reduce_grads g1 mb0 (all_reduce)\n"
          "  #14 backward u0 mb0\n"
          "  #15 reduce_grads g0 mb0 (all_reduce)\n"
          "  #16 wait #11\n"
          "  #17 wait #13\n"
          "  #18 wait #15\n"
          "  #19 optimizer_step\n"
          "  #20 reduce_loss\n");
    CHECK(program.grad_slots == 0);
    CHECK(program.param_slots == 0);
}

TEST_CASE("the ZeRO-3 program, instruction by instruction", "[parallel][program]") {
    // One group per unit with parameters (g0..g4 = u0..u4). Forward: each
    // group is waited for, the next one's gather issued, then it computes and
    // is released, except the last (head), which backward starts with.
    // Backward: gather the previous group while this one computes into a
    // gradient slot, reduce-scatter the slot, release; a slot is rebound only
    // after the reduction of the group before last is waited for.
    const auto layout = layout_for(3, 2);
    const auto program = loom::schedule::data_parallel_program(layout, unit_count, 3, 1);
    CHECK(printed(program) ==
          "step program (data parallel over 2 ranks, ZeRO stage 3, 1 micro-batch): 57 instructions\n"
          "  #0 zero_grads\n"
          "  #1 gather_params g0 slot 0\n"
          "  #2 wait #1\n"
          "  #3 gather_params g1 slot 1\n"
          "  #4 forward u0 mb0\n"
          "  #5 release_params g0 slot 0\n"
          "  #6 wait #3\n"
          "  #7 gather_params g2 slot 0\n"
          "  #8 forward u1 mb0\n"
          "  #9 release_params g1 slot 1\n"
          "  #10 wait #7\n"
          "  #11 gather_params g3 slot 1\n"
          "  #12 forward u2 mb0\n"
          "  #13 release_params g2 slot 0\n"
          "  #14 wait #11\n"
          "  #15 gather_params g4 slot 0\n"
          "  #16 forward u3 mb0\n"
          "  #17 release_params g3 slot 1\n"
          "  #18 wait #15\n"
          "  #19 forward u4 mb0\n"
          "  #20 forward u5 mb0\n"
          "  #21 backward u5 mb0\n"
          "  #22 gather_params g3 slot 1\n"
          "  #23 bind_grads g4 slot 0 mb0\n"
          "  #24 backward u4 mb0\n"
          "  #25 reduce_grads g4 slot 0 mb0 (reduce_scatter)\n"
          "  #26 release_params g4 slot 0\n"
          "  #27 wait #22\n"
          "  #28 gather_params g2 slot 0\n"
          "  #29 bind_grads g3 slot 1 mb0\n"
          "  #30 backward u3 mb0\n"
          "  #31 reduce_grads g3 slot 1 mb0 (reduce_scatter)\n"
          "  #32 release_params g3 slot 1\n"
          "  #33 wait #28\n"
          "  #34 gather_params g1 slot 1\n"
          "  #35 wait #25\n"
          "  #36 bind_grads g2 slot 0 mb0\n"
          "  #37 backward u2 mb0\n"
          "  #38 reduce_grads g2 slot 0 mb0 (reduce_scatter)\n"
          "  #39 release_params g2 slot 0\n"
          "  #40 wait #34\n"
          "  #41 gather_params g0 slot 0\n"
          "  #42 wait #31\n"
          "  #43 bind_grads g1 slot 1 mb0\n"
          "  #44 backward u1 mb0\n"
          "  #45 reduce_grads g1 slot 1 mb0 (reduce_scatter)\n"
          "  #46 release_params g1 slot 1\n"
          "  #47 wait #41\n"
          "  #48 wait #38\n"
          "  #49 bind_grads g0 slot 0 mb0\n"
          "  #50 backward u0 mb0\n"
          "  #51 reduce_grads g0 slot 0 mb0 (reduce_scatter)\n"
          "  #52 release_params g0 slot 0\n"
          "  #53 wait #51\n"
          "  #54 wait #45\n"
          "  #55 optimizer_step\n"
          "  #56 reduce_loss\n");
    CHECK(program.grad_slots == 2);
    CHECK(program.param_slots == 2);
}

TEST_CASE("data-parallel programs have the instructions their stage implies", "[parallel][program]") {
    // U = 6 units, M micro-batches, G groups (3 buckets at stages 0-2, 5 units
    // with parameters at stage 3). Every program has one zero_grads, one
    // optimizer_step, one reduce_loss, and U x M forwards and backwards.
    //   stage 0: G all-reduces (last micro-batch only), G waits.
    //   stage 1: G reduce-scatters (last micro-batch only), then the optimizer
    //            and G all-gathers of the updated blocks; 2G waits.
    //   stage 2: a bind and a reduce-scatter per group per micro-batch (G x M
    //            each), G all-gathers after the optimizer; G x M + G waits.
    //   stage 3: G x M binds and reduce-scatters; each micro-batch gathers every
    //            group before its forward and all but the last again before its
    //            backward (the last stays gathered), (2G - 1) x M gathers, each
    //            released once and waited once: (2G - 1) x M + G x M waits.
    for (int ranks : {1, 2, 4})
        for (int stage : {0, 1, 2, 3})
            for (int M : {1, 4}) {
                INFO("ranks " << ranks << ", stage " << stage << ", " << M << " micro-batches");
                const auto layout = layout_for(stage, ranks);
                const std::int64_t G = stage == 3 ? 5 : 3;
                REQUIRE(static_cast<std::int64_t>(layout.groups().size()) == G);
                const auto program = loom::schedule::data_parallel_program(layout, unit_count, stage, M);
                std::map<Op, std::int64_t> expected{{Op::zero_grads, 1},       {Op::forward, unit_count * M},
                                                    {Op::backward, unit_count * M}, {Op::optimizer_step, 1},
                                                    {Op::reduce_loss, 1},      {Op::backward_input, 0},
                                                    {Op::backward_weight, 0}};
                switch (stage) {
                    case 0:
                        expected.insert({{Op::reduce_grads, G}, {Op::wait, G}, {Op::gather_params, 0},
                                         {Op::release_params, 0}, {Op::bind_grads, 0}});
                        break;
                    case 1:
                        expected.insert({{Op::reduce_grads, G}, {Op::wait, 2 * G}, {Op::gather_params, G},
                                         {Op::release_params, 0}, {Op::bind_grads, 0}});
                        break;
                    case 2:
                        expected.insert({{Op::reduce_grads, G * M}, {Op::wait, G * M + G}, {Op::gather_params, G},
                                         {Op::release_params, 0}, {Op::bind_grads, G * M}});
                        break;
                    default:
                        expected.insert({{Op::reduce_grads, G * M}, {Op::wait, (2 * G - 1) * M + G * M},
                                         {Op::gather_params, (2 * G - 1) * M}, {Op::release_params, (2 * G - 1) * M},
                                         {Op::bind_grads, G * M}});
                }
                std::int64_t total = 0;
                for (const auto& [op, n] : expected) {
                    INFO(loom::schedule::name(op));
                    CHECK(program.count(op) == n);
                    total += n;
                }
                CHECK(static_cast<std::int64_t>(program.code.size()) == total);
                // Stage 0, 1: 12M + 9, 12M + 15; stage 2: 21M + 9; stage 3: 54M + 3.
                const std::int64_t size_by_formula = stage == 0 ? 12 * M + 9
                                                   : stage == 1 ? 12 * M + 15
                                                   : stage == 2 ? 21 * M + 9
                                                                : 54 * M + 3;
                CHECK(static_cast<std::int64_t>(program.code.size()) == size_by_formula);

                // Every reduction says how it reduces.
                for (const auto& in : program.code)
                    if (in.op == Op::reduce_grads)
                        CHECK(in.reduction == (stage == 0 ? Reduction::all_reduce : Reduction::reduce_scatter));
                // Arena reductions (stages 0, 1) come in the last micro-batch only.
                if (stage < 2)
                    for (const auto& in : program.code)
                        if (in.op == Op::reduce_grads) CHECK(in.micro_batch == M - 1);
                CHECK(program.micro_batches == M);
                CHECK(program.grad_slots == (stage >= 2 ? 2 : 0));
                CHECK(program.param_slots == (stage == 3 ? 2 : 0));
                CHECK(program.generator == "data parallel over " + std::to_string(ranks) + " ranks, ZeRO stage " +
                                               std::to_string(stage) + ", " + std::to_string(M) +
                                               (M == 1 ? " micro-batch" : " micro-batches"));
            }
}

TEST_CASE("every generated program passes the verifier", "[parallel][program]") {
    int verified = 0;
    for (int ranks : {1, 2, 3, 4, 8})
        for (std::int64_t bucket : {std::int64_t{1}, small_bucket, std::int64_t{2} << 20})
            for (int stage : {0, 1, 2, 3})
                for (int M : {1, 2, 3, 4}) {
                    INFO("ranks " << ranks << ", bucket " << bucket << ", stage " << stage << ", " << M
                                  << " micro-batches");
                    const auto layout = layout_for(stage, ranks, bucket);
                    const auto program = loom::schedule::data_parallel_program(layout, unit_count, stage, M);
                    CHECK(verify_message(program, layout) == "(no error)");
                    ++verified;
                }
    CHECK(verified == 5 * 3 * 4 * 4);
    // Stages 0-2 also over one-group-per-unit layouts, and ZeRO-3 over buckets.
    for (int stage : {0, 1, 2, 3})
        for (auto grouping : {Grouping::buckets, Grouping::per_unit}) {
            const ShardLayout layout(units(), 2, grouping, small_bucket);
            const auto program = loom::schedule::data_parallel_program(layout, unit_count, stage, 2);
            INFO("stage " << stage << "\n" << program);
            CHECK(verify_message(program, layout) == "(no error)");
        }
}

TEST_CASE("data_parallel_program refuses bad arguments", "[parallel][program]") {
    const auto layout = layout_for(0, 2);
    CHECK(message_of([&] { (void)loom::schedule::data_parallel_program(layout, unit_count, 4, 1); }) ==
          "data_parallel_program: ZeRO stage 4 is not 0, 1, 2 or 3");
    CHECK(message_of([&] { (void)loom::schedule::data_parallel_program(layout, unit_count, -1, 1); }) ==
          "data_parallel_program: ZeRO stage -1 is not 0, 1, 2 or 3");
    CHECK(message_of([&] { (void)loom::schedule::data_parallel_program(layout, unit_count, 0, 0); }) ==
          "data_parallel_program: 0 micro-batches; there must be at least 1");
    CHECK(message_of([&] { (void)loom::schedule::data_parallel_program(layout, 0, 0, 1); }) ==
          "data_parallel_program: a model with 0 units has nothing to run");
}

}  // namespace LOOM_TEST_FILE
