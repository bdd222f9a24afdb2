// Sequence parallelism trains the GPT to the serial run's losses and
// parameters (the tolerances of data parallelism): ring attention over sp 2,
// 4 and 8 rank threads in the zigzag and contiguous layouts, with dp 2 and
// ZeRO, with tensor parallelism (1D) and under a pipeline. Each sp rank holds
// some positions of every sequence; gradients are reduced over dp x sp.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "parallel/equivalence_on_threads.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom_test::EquivalenceCase;

namespace {

constexpr int sp_layers = 4, sp_heads = 4;

const loom_test::SerialRun& serial() {
    static const auto run = loom_test::serial_run(3, sp_layers, sp_heads);
    return run;
}

void check_equivalence(const EquivalenceCase& c) { loom_test::check_equivalence_on_threads(c, serial()); }

}  // namespace

TEST_CASE("ring attention sequence parallelism equals serial on rank threads", "[parallel][sp]") {
    for (int sp : {2, 4, 8})  // the equivalence model's 16 positions: 2 per zigzag chunk at sp 4, 1 at sp 8
        for (bool zigzag : {true, false}) {
            const EquivalenceCase c{.dp = 1, .micro_batches = 2, .steps = 3, .layers = sp_layers, .heads = sp_heads,
                                    .sp = sp, .zigzag = zigzag};
            DYNAMIC_SECTION(c) { check_equivalence(c); }
        }
}

TEST_CASE("Ulysses sequence parallelism equals serial on rank threads", "[parallel][sp]") {
    for (int sp : {2, 4})  // the 4 heads split over 2 and 4 ranks
        for (bool zigzag : {true, false}) {
            const EquivalenceCase c{.dp = 1, .micro_batches = 2, .steps = 3, .layers = sp_layers, .heads = sp_heads,
                                    .sp = sp, .sp_attention = loom::nn::SequenceAttention::ulysses, .zigzag = zigzag};
            DYNAMIC_SECTION(c) { check_equivalence(c); }
        }
    const EquivalenceCase c{.dp = 2, .stage = 2, .micro_batches = 2, .steps = 3, .layers = sp_layers, .tp = 2,
                            .heads = sp_heads, .sp = 2, .sp_attention = loom::nn::SequenceAttention::ulysses};
    DYNAMIC_SECTION(c) { check_equivalence(c); }
}

TEST_CASE("hybrid (Ulysses groups on a ring) sequence parallelism equals serial on rank threads", "[parallel][sp]") {
    for (bool zigzag : {true, false}) {  // sp 4 = Ulysses 2 x ring 2; 16 positions: pieces of 2 (zigzag) or 4
        const EquivalenceCase c{.dp = 1, .micro_batches = 2, .steps = 3, .layers = sp_layers, .heads = sp_heads,
                                .sp = 4, .sp_attention = loom::nn::SequenceAttention::hybrid, .zigzag = zigzag,
                                .ulysses = 2};
        DYNAMIC_SECTION(c) { check_equivalence(c); }
    }
    const EquivalenceCase c{.dp = 2, .stage = 1, .micro_batches = 2, .steps = 3, .layers = sp_layers,
                            .heads = sp_heads, .sp = 4, .sp_attention = loom::nn::SequenceAttention::hybrid,
                            .ulysses = 2};
    DYNAMIC_SECTION(c) { check_equivalence(c); }
}

TEST_CASE("sequence parallelism with dp 2 and ZeRO, with tp 2, and under a pipeline, equals serial",
          "[parallel][sp]") {
    for (int stage : {0, 1, 3}) {
        const EquivalenceCase c{.dp = 2, .stage = stage, .micro_batches = 2, .steps = 3, .layers = sp_layers,
                                .heads = sp_heads, .sp = 2};
        DYNAMIC_SECTION(c) { check_equivalence(c); }
    }
    {
        const EquivalenceCase c{.dp = 2, .micro_batches = 2, .steps = 3, .layers = sp_layers, .tp = 2,
                                .heads = sp_heads, .sp = 2};
        DYNAMIC_SECTION(c) { check_equivalence(c); }
    }
    for (auto schedule : {loom::ScheduleKind::one_f_one_b, loom::ScheduleKind::zero_bubble_v}) {
        const EquivalenceCase c{.dp = 1, .micro_batches = 4, .steps = 3, .pp = 2, .schedule = schedule,
                                .layers = sp_layers, .tp = 2, .heads = sp_heads, .sp = 2};
        DYNAMIC_SECTION(c) { check_equivalence(c); }
    }
}

TEST_CASE("the executor refuses an sp axis whose ranks are not in the gradient group, on every rank",
          "[parallel][sp]") {
    std::vector<std::string> messages(2);
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::Mesh<loom::comm::ThreadComm> mesh(comm, {{"dp", 1}, {"sp", 2}});
        auto model = loom::gpt::make_model(loom_test::equivalence_model(2, 2));
        loom::exec::ExecutionPlan plan;
        plan.sequence_parallel = true;
        messages[static_cast<std::size_t>(comm.rank())] = loom_test::message_of([&] {
            // dp alone, not dp x sp: the sp ranks would never average their gradients.
            loom::exec::Executor<loom::comm::ThreadComm> exec(model, mesh.axis("dp"), nullptr, nullptr,
                                                              &mesh.axis("sp"), plan, {});
        });
    });
    for (const auto& m : messages)
        CHECK(m == "Executor: a gradient axis of 1 ranks cannot hold the 2 sp ranks; pass the dp x sp group as dp "
                   "(mesh.combined({\"dp\", \"sp\"}), which Executor::make does)");
}

}  // namespace LOOM_TEST_FILE
