// The pipeline schedule generators (schedule/pipeline.hpp, zero_bubble.hpp),
// one schedule at a time, without a simulator: the exact programs of GPipe,
// 1F1B, Interleaved<2>, ZB-H1 and ZB-V for small cases, what they refuse,
// and how schedules and Pipeline<Schedule> print. The properties every
// schedule must have, over p 1..8 and m 1..32: test_pipeline_schedule_sweeps.cpp.
#include <catch2/catch.hpp>

#include <sstream>

#include <loom/parallel/pipeline.hpp>
#include <loom/parallel/policy.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/schedule/pipeline.hpp>
#include <loom/schedule/verify_pipeline.hpp>

#include "../../tools/train_gpt_spelling.hpp"  // train_gpt's schedule spellings
#include "support/message_of.hpp"
#include "support/step_programs.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::ScheduleKind;
using loom_test::message_of;
using loom_test::printed;

TEST_CASE("GPipe runs every forward, then every backward", "[parallel][pipeline]") {
    CHECK(printed(loom::schedule::gpipe(2, 3)) == R"(GPipe over 2 stages, 3 micro-batches, 1 chunk per rank (activations in flight <= 3)
rank 0: step program (GPipe, rank 0 of 2, 3 micro-batches): 17 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 forward c0 mb2
  #6 send activation to rank 1 c0 mb2
  #7 recv gradient from rank 1 c0 mb0
  #8 backward c0 mb0
  #9 recv gradient from rank 1 c0 mb1
  #10 backward c0 mb1
  #11 recv gradient from rank 1 c0 mb2
  #12 backward c0 mb2
  #13 wait #2
  #14 wait #4
  #15 wait #6
  #16 optimizer_step
rank 1: step program (GPipe, rank 1 of 2, 3 micro-batches): 17 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 recv activation from rank 0 c1 mb1
  #4 forward c1 mb1
  #5 recv activation from rank 0 c1 mb2
  #6 forward c1 mb2
  #7 backward c1 mb0
  #8 send gradient to rank 0 c1 mb0
  #9 backward c1 mb1
  #10 send gradient to rank 0 c1 mb1
  #11 backward c1 mb2
  #12 send gradient to rank 0 c1 mb2
  #13 wait #8
  #14 wait #10
  #15 wait #12
  #16 optimizer_step
)");
}

TEST_CASE("1F1B: warm-up forwards, then one forward and one backward, then the drain", "[parallel][pipeline]") {
    // Rank 0 runs p-1 = 1 warm-up forward; rank 1, the last, none.
    CHECK(printed(loom::schedule::one_f_one_b(2, 3)) == R"(1F1B over 2 stages, 3 micro-batches, 1 chunk per rank (activations in flight <= 2)
rank 0: step program (1F1B, rank 0 of 2, 3 micro-batches): 17 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 recv gradient from rank 1 c0 mb0
  #6 backward c0 mb0
  #7 forward c0 mb2
  #8 send activation to rank 1 c0 mb2
  #9 recv gradient from rank 1 c0 mb1
  #10 backward c0 mb1
  #11 recv gradient from rank 1 c0 mb2
  #12 backward c0 mb2
  #13 wait #2
  #14 wait #4
  #15 wait #8
  #16 optimizer_step
rank 1: step program (1F1B, rank 1 of 2, 3 micro-batches): 17 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 backward c1 mb0
  #4 send gradient to rank 0 c1 mb0
  #5 recv activation from rank 0 c1 mb1
  #6 forward c1 mb1
  #7 backward c1 mb1
  #8 send gradient to rank 0 c1 mb1
  #9 recv activation from rank 0 c1 mb2
  #10 forward c1 mb2
  #11 backward c1 mb2
  #12 send gradient to rank 0 c1 mb2
  #13 wait #4
  #14 wait #8
  #15 wait #12
  #16 optimizer_step
)");
}

TEST_CASE("Interleaved<2> visits chunks in groups of p micro-batches, as Megatron does", "[parallel][pipeline]") {
    // Rank 0: 2(p-1) + (v-1)p = 4 warm-up forwards (c0 mb0-1, c2 mb0-1), then
    // F B pairs, the backwards visiting the chunks in reverse; rank 1: 2.
    // Rank 1 passes c1 -> c2 back to rank 0 (the loop), rank 0 c2 -> c3.
    CHECK(printed(loom::schedule::interleaved(2, 4, 2)) == R"(Interleaved<2> over 2 stages, 4 micro-batches, 2 chunks per rank (activations in flight <= 5)
rank 0: step program (Interleaved<2>, rank 0 of 2, 4 micro-batches): 54 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 recv activation from rank 1 c2 mb0
  #6 forward c2 mb0
  #7 send activation to rank 1 c2 mb0
  #8 recv activation from rank 1 c2 mb1
  #9 forward c2 mb1
  #10 send activation to rank 1 c2 mb1
  #11 forward c0 mb2
  #12 send activation to rank 1 c0 mb2
  #13 recv gradient from rank 1 c2 mb0
  #14 backward c2 mb0
  #15 send gradient to rank 1 c2 mb0
  #16 forward c0 mb3
  #17 send activation to rank 1 c0 mb3
  #18 recv gradient from rank 1 c2 mb1
  #19 backward c2 mb1
  #20 send gradient to rank 1 c2 mb1
  #21 recv activation from rank 1 c2 mb2
  #22 forward c2 mb2
  #23 send activation to rank 1 c2 mb2
  #24 recv gradient from rank 1 c0 mb0
  #25 backward c0 mb0
  #26 recv activation from rank 1 c2 mb3
  #27 forward c2 mb3
  #28 send activation to rank 1 c2 mb3
  #29 recv gradient from rank 1 c0 mb1
  #30 backward c0 mb1
  #31 recv gradient from rank 1 c2 mb2
  #32 backward c2 mb2
  #33 send gradient to rank 1 c2 mb2
  #34 recv gradient from rank 1 c2 mb3
  #35 backward c2 mb3
  #36 send gradient to rank 1 c2 mb3
  #37 recv gradient from rank 1 c0 mb2
  #38 backward c0 mb2
  #39 recv gradient from rank 1 c0 mb3
  #40 backward c0 mb3
  #41 wait #2
  #42 wait #4
  #43 wait #7
  #44 wait #10
  #45 wait #12
  #46 wait #15
  #47 wait #17
  #48 wait #20
  #49 wait #23
  #50 wait #28
  #51 wait #33
  #52 wait #36
  #53 optimizer_step
rank 1: step program (Interleaved<2>, rank 1 of 2, 4 micro-batches): 54 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 send activation to rank 0 c1 mb0
  #4 recv activation from rank 0 c1 mb1
  #5 forward c1 mb1
  #6 send activation to rank 0 c1 mb1
  #7 recv activation from rank 0 c3 mb0
  #8 forward c3 mb0
  #9 backward c3 mb0
  #10 send gradient to rank 0 c3 mb0
  #11 recv activation from rank 0 c3 mb1
  #12 forward c3 mb1
  #13 backward c3 mb1
  #14 send gradient to rank 0 c3 mb1
  #15 recv activation from rank 0 c1 mb2
  #16 forward c1 mb2
  #17 send activation to rank 0 c1 mb2
  #18 recv gradient from rank 0 c1 mb0
  #19 backward c1 mb0
  #20 send gradient to rank 0 c1 mb0
  #21 recv activation from rank 0 c1 mb3
  #22 forward c1 mb3
  #23 send activation to rank 0 c1 mb3
  #24 recv gradient from rank 0 c1 mb1
  #25 backward c1 mb1
  #26 send gradient to rank 0 c1 mb1
  #27 recv activation from rank 0 c3 mb2
  #28 forward c3 mb2
  #29 backward c3 mb2
  #30 send gradient to rank 0 c3 mb2
  #31 recv activation from rank 0 c3 mb3
  #32 forward c3 mb3
  #33 backward c3 mb3
  #34 send gradient to rank 0 c3 mb3
  #35 recv gradient from rank 0 c1 mb2
  #36 backward c1 mb2
  #37 send gradient to rank 0 c1 mb2
  #38 recv gradient from rank 0 c1 mb3
  #39 backward c1 mb3
  #40 send gradient to rank 0 c1 mb3
  #41 wait #3
  #42 wait #6
  #43 wait #10
  #44 wait #14
  #45 wait #17
  #46 wait #20
  #47 wait #23
  #48 wait #26
  #49 wait #30
  #50 wait #34
  #51 wait #37
  #52 wait #40
  #53 optimizer_step
)");
}

TEST_CASE("ZB-H1: 1F1B with split backward; rank r holds back its first r weight gradients",
          "[parallel][pipeline]") {
    // Rank 1 (the last) sends each input gradient before any W; its held-back
    // W mb0 runs after the next pair, and W mb2 ends the step.
    CHECK(printed(loom::schedule::zero_bubble_h1(2, 3)) == R"(ZB-H1 over 2 stages, 3 micro-batches, 1 chunk per rank (activations in flight <= 2)
rank 0: step program (ZB-H1, rank 0 of 2, 3 micro-batches): 20 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 recv gradient from rank 1 c0 mb0
  #6 backward_input c0 mb0
  #7 backward_weight c0 mb0
  #8 forward c0 mb2
  #9 send activation to rank 1 c0 mb2
  #10 recv gradient from rank 1 c0 mb1
  #11 backward_input c0 mb1
  #12 backward_weight c0 mb1
  #13 recv gradient from rank 1 c0 mb2
  #14 backward_input c0 mb2
  #15 backward_weight c0 mb2
  #16 wait #2
  #17 wait #4
  #18 wait #9
  #19 optimizer_step
rank 1: step program (ZB-H1, rank 1 of 2, 3 micro-batches): 20 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 backward_input c1 mb0
  #4 send gradient to rank 0 c1 mb0
  #5 recv activation from rank 0 c1 mb1
  #6 forward c1 mb1
  #7 backward_input c1 mb1
  #8 send gradient to rank 0 c1 mb1
  #9 backward_weight c1 mb0
  #10 recv activation from rank 0 c1 mb2
  #11 forward c1 mb2
  #12 backward_input c1 mb2
  #13 send gradient to rank 0 c1 mb2
  #14 backward_weight c1 mb1
  #15 backward_weight c1 mb2
  #16 wait #4
  #17 wait #8
  #18 wait #13
  #19 optimizer_step
)");
}

TEST_CASE("ZB-V: two chunks per rank in a V, the turn on the last rank needs no message",
          "[parallel][pipeline]") {
    // Rank 1 holds virtual stages 1 and 2: forward c1 feeds forward c2 and
    // backward_input c2 feeds backward_input c1 with no send between them.
    CHECK(printed(loom::schedule::zero_bubble_v(2, 3)) == R"(ZB-V over 2 stages, 3 micro-batches, 2 chunks per rank (activations in flight <= 4)
rank 0: step program (ZB-V, rank 0 of 2, 3 micro-batches): 38 instructions
  #0 zero_grads
  #1 forward c0 mb0
  #2 send activation to rank 1 c0 mb0
  #3 forward c0 mb1
  #4 send activation to rank 1 c0 mb1
  #5 forward c0 mb2
  #6 send activation to rank 1 c0 mb2
  #7 recv activation from rank 1 c3 mb0
  #8 forward c3 mb0
  #9 backward_input c3 mb0
  #10 send gradient to rank 1 c3 mb0
  #11 backward_weight c3 mb0
  #12 recv activation from rank 1 c3 mb1
  #13 forward c3 mb1
  #14 backward_input c3 mb1
  #15 send gradient to rank 1 c3 mb1
  #16 backward_weight c3 mb1
  #17 recv gradient from rank 1 c0 mb0
  #18 backward_input c0 mb0
  #19 backward_weight c0 mb0
  #20 recv activation from rank 1 c3 mb2
  #21 forward c3 mb2
  #22 backward_input c3 mb2
  #23 send gradient to rank 1 c3 mb2
  #24 backward_weight c3 mb2
  #25 recv gradient from rank 1 c0 mb1
  #26 backward_input c0 mb1
  #27 backward_weight c0 mb1
  #28 recv gradient from rank 1 c0 mb2
  #29 backward_input c0 mb2
  #30 backward_weight c0 mb2
  #31 wait #2
  #32 wait #4
  #33 wait #6
  #34 wait #10
  #35 wait #15
  #36 wait #23
  #37 optimizer_step
rank 1: step program (ZB-V, rank 1 of 2, 3 micro-batches): 38 instructions
  #0 zero_grads
  #1 recv activation from rank 0 c1 mb0
  #2 forward c1 mb0
  #3 forward c2 mb0
  #4 send activation to rank 0 c2 mb0
  #5 recv activation from rank 0 c1 mb1
  #6 forward c1 mb1
  #7 forward c2 mb1
  #8 send activation to rank 0 c2 mb1
  #9 recv gradient from rank 0 c2 mb0
  #10 backward_input c2 mb0
  #11 backward_weight c2 mb0
  #12 recv activation from rank 0 c1 mb2
  #13 forward c1 mb2
  #14 backward_input c1 mb0
  #15 send gradient to rank 0 c1 mb0
  #16 backward_weight c1 mb0
  #17 forward c2 mb2
  #18 send activation to rank 0 c2 mb2
  #19 recv gradient from rank 0 c2 mb1
  #20 backward_input c2 mb1
  #21 backward_weight c2 mb1
  #22 backward_input c1 mb1
  #23 send gradient to rank 0 c1 mb1
  #24 recv gradient from rank 0 c2 mb2
  #25 backward_input c2 mb2
  #26 backward_input c1 mb2
  #27 send gradient to rank 0 c1 mb2
  #28 backward_weight c1 mb1
  #29 backward_weight c2 mb2
  #30 backward_weight c1 mb2
  #31 wait #4
  #32 wait #8
  #33 wait #15
  #34 wait #18
  #35 wait #23
  #36 wait #27
  #37 optimizer_step
)");
}

TEST_CASE("pipeline schedules refuse what they cannot schedule, in one line", "[parallel][pipeline]") {
    using namespace loom::schedule;
    CHECK(message_of([] { (void)gpipe(0, 3); }) == "GPipe: 0 stages; a pipeline needs at least 1");
    CHECK(message_of([] { (void)one_f_one_b(2, 0); }) == "1F1B: 0 micro-batches; a step needs at least 1");
    CHECK(message_of([] { (void)zero_bubble_h1(-1, 4); }) == "ZB-H1: -1 stages; a pipeline needs at least 1");
    CHECK(message_of([] { (void)interleaved(4, 6, 2); }) ==
          "Interleaved<2>: 6 micro-batches over 4 stages; interleaving needs a multiple of the stages (4, 8, ...)");
    CHECK(message_of([] { (void)interleaved(4, 2, 3); }) ==
          "Interleaved<3>: 2 micro-batches over 4 stages; interleaving needs a multiple of the stages (4, 8, ...)");
    CHECK(message_of([] { (void)interleaved(2, 4, 1); }) ==
          "Interleaved<1>: 1 chunk per rank; interleaving needs at least 2 (one chunk per rank is 1F1B)");
    CHECK(message_of([] { (void)interleaved(2, 0, 2); }) == "Interleaved<2>: 0 micro-batches; a step needs at least 1");
    // ZB-V writes its order for max(m, 2p-1) micro-batches and drops the missing ones: any m runs.
    CHECK(message_of([] { (void)zero_bubble_v(0, 6); }) == "ZB-V: 0 stages; a pipeline needs at least 1");
    CHECK(message_of([] { (void)zero_bubble_v(4, 0); }) == "ZB-V: 0 micro-batches; a step needs at least 1");
    CHECK(message_of([] { (void)zero_bubble_v(4, 1); }) == "(no error)");
    CHECK(message_of([] { (void)pipeline_program(ScheduleKind::gpipe, 2, 4, 2); }) ==
          "GPipe: 2 chunks per rank; GPipe runs exactly 1");
    CHECK(message_of([] { (void)pipeline_program(ScheduleKind::zero_bubble_v, 2, 4, 1); }) ==
          "ZB-V: 1 chunks per rank; ZB-V runs exactly 2");
    CHECK(message_of([] { (void)parse_schedule_flag("zb-h1"); }) ==
          "unknown pipeline schedule \"zb-h1\"; use gpipe, 1f1b, interleaved, zb (ZB-H1) or zbv (ZB-V)");
}

TEST_CASE("schedule names, tags and Pipeline<Schedule> print themselves", "[parallel][pipeline]") {
    CHECK(parse_schedule_flag("gpipe") == ScheduleKind::gpipe);
    CHECK(parse_schedule_flag("1f1b") == ScheduleKind::one_f_one_b);
    CHECK(parse_schedule_flag("interleaved") == ScheduleKind::interleaved);
    CHECK(parse_schedule_flag("zb") == ScheduleKind::zero_bubble_h1);
    CHECK(parse_schedule_flag("zbv") == ScheduleKind::zero_bubble_v);
    for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                      ScheduleKind::zero_bubble_h1, ScheduleKind::zero_bubble_v})
        CHECK(parse_schedule_flag(schedule_flag(kind)) == kind);

    STATIC_REQUIRE(loom::Policy<loom::Pipeline<loom::OneFOneB>>);
    STATIC_REQUIRE(loom::Pipeline<>::kind == loom::PolicyKind::pipeline);
    STATIC_REQUIRE(loom::Pipeline<loom::Interleaved<3>>::chunks == 3);
    STATIC_REQUIRE(loom::Pipeline<loom::ZeroBubbleV>::schedule_kind == ScheduleKind::zero_bubble_v);
    CHECK(loom::describe<loom::Pipeline<loom::GPipe>>() == "Pipeline<GPipe>");
    CHECK(loom::describe<loom::Pipeline<loom::OneFOneB>>() == "Pipeline<1F1B>");
    CHECK(loom::describe<loom::Pipeline<loom::Interleaved<2>>>() == "Pipeline<Interleaved<2>>");
    CHECK(loom::describe<loom::Pipeline<loom::ZeroBubbleH1>>() == "Pipeline<ZB-H1>");
    CHECK(loom::describe<loom::Pipeline<loom::ZeroBubbleV>>() == "Pipeline<ZB-V>");
    std::ostringstream strategy;
    strategy << loom::Strategy<loom::DataParallel<>, loom::Pipeline<loom::Interleaved<4>>>{};
    CHECK(strategy.str() == "Strategy<DataParallel<bucket 2 MiB>, Pipeline<Interleaved<4>>>");

    // The factory from a tag gives the generator's program.
    using T = loom::Interleaved<2>;
    CHECK(printed(loom::schedule::pipeline_program(T::kind, 4, 8, T::chunks)) ==
          printed(loom::schedule::interleaved(4, 8, 2)));
    CHECK(loom::schedule::pipeline_program(ScheduleKind::zero_bubble_v, 2, 4, 2).schedule == "ZB-V");
    CHECK(loom::schedule::pipeline_program(ScheduleKind::zero_bubble_h1, 2, 4).schedule == "ZB-H1");
    CHECK(loom::schedule::pipeline_program(ScheduleKind::gpipe, 2, 4).schedule == "GPipe");
    CHECK(loom::schedule::pipeline_program(ScheduleKind::one_f_one_b, 2, 4).schedule == "1F1B");
}

}  // namespace LOOM_TEST_FILE
