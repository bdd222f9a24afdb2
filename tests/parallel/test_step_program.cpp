// The shard layout, the data-parallel / ZeRO step programs and their
// verifier, on the units of a small GPT (no communication, no arithmetic).
//
// The model (gpt::Config{layers 2, width 32, heads 2, seq 16, vocab 64}) has
// 6 units: embed (64*32 + 16*32 = 2560 parameters), blocks[0] and blocks[1]
// (12*32^2 + 13*32 = 12704 each), ln_f (64), head (32*64 = 2048, no bias) and
// loss (none): 30080 parameters.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <loom/gpt/model.hpp>
#include <loom/nn/units.hpp>
#include <loom/parallel/shard_layout.hpp>
#include <loom/schedule/data_parallel.hpp>
#include <loom/schedule/program.hpp>
#include <loom/schedule/verify.hpp>

#include "support/message_of.hpp"

using loom::parallel::Grouping;
using loom::parallel::ShardLayout;
using loom::schedule::Instruction;
using loom::schedule::Op;
using loom::schedule::Reduction;
using loom::schedule::StepProgram;
using loom_test::message_of;

namespace {

constexpr int unit_count = 6;
constexpr std::int64_t parameters = 30080;
constexpr std::int64_t small_bucket = 16 << 10;  // 4096 floats: groups {embed}, {blocks[0]}, {blocks[1], ln_f, head}

const std::vector<loom::nn::Unit>& units() {
    static const auto model = std::make_unique<loom::gpt::Model>(
        loom::gpt::make_model({.layers = 2, .width = 32, .heads = 2, .seq = 16, .vocab = 64}));
    static const auto list = loom::nn::units_of(*model, {"embed", "blocks", "ln_f", "head", "loss"});
    return list;
}

// What the layout of the executor is for a stage: buckets, or one group per unit at ZeRO-3.
ShardLayout layout_for(int stage, int ranks, std::int64_t bucket = small_bucket) {
    return ShardLayout(units(), ranks, stage == 3 ? Grouping::per_unit : Grouping::buckets, bucket);
}

std::string text_of(const Instruction& in) {
    std::ostringstream out;
    out << in;
    return out.str();
}

std::string listing(const StepProgram& program) {
    std::ostringstream out;
    out << program;
    return out.str();
}

// A program with its instructions rearranged: code[k] = old code[order[k]],
// every wait's target renumbered to where its instruction went (the first
// copy, if duplicated; left as it was if the instruction was dropped).
StepProgram rearranged(const StepProgram& program, const std::vector<int>& order) {
    StepProgram out = program;
    out.code.clear();
    std::map<int, int> moved_to;
    for (int k = 0; k < static_cast<int>(order.size()); ++k) {
        out.code.push_back(program.code[static_cast<std::size_t>(order[static_cast<std::size_t>(k)])]);
        moved_to.emplace(order[static_cast<std::size_t>(k)], k);
    }
    for (auto& in : out.code)
        if (in.op == Op::wait)
            if (const auto it = moved_to.find(in.target); it != moved_to.end()) in.target = it->second;
    return out;
}

std::vector<int> identity(const StepProgram& program) {
    std::vector<int> order(program.code.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    return order;
}

StepProgram without(const StepProgram& program, int index) {
    auto order = identity(program);
    order.erase(order.begin() + index);
    return rearranged(program, order);
}

// Instruction `from` placed just before the one now at `before`.
StepProgram moved(const StepProgram& program, int from, int before) {
    auto order = identity(program);
    order.erase(order.begin() + from);
    const auto at = std::find(order.begin(), order.end(), before);
    order.insert(at, from);
    return rearranged(program, order);
}

// A second copy of instruction `index` just before the one now at `before`.
StepProgram duplicated(const StepProgram& program, int index, int before) {
    auto order = identity(program);
    order.insert(order.begin() + before, index);
    return rearranged(program, order);
}

std::string verify_message(const StepProgram& program, const ShardLayout& layout) {
    return message_of([&] { loom::schedule::verify(program, layout, unit_count); });
}

std::string prefix(const StepProgram& program, int index) {
    return "step program (" + program.generator + ") is invalid at #" + std::to_string(index) + ": ";
}

int index_of(const StepProgram& program, const Instruction& in) {
    const auto it = std::find(program.code.begin(), program.code.end(), in);
    REQUIRE(it != program.code.end());
    return static_cast<int>(it - program.code.begin());
}

}  // namespace

// --- the units and the shard layout -----------------------------------------

TEST_CASE("the units of a GPT are its fields, blocks opened", "[parallel][layout]") {
    const auto& u = units();
    REQUIRE(u.size() == unit_count);
    const std::vector<std::string> names{"embed Embedding", "blocks[0] Block", "blocks[1] Block",
                                         "ln_f LayerNorm",  "head Linear",     "loss CrossEntropy"};
    const std::vector<std::int64_t> numels{2560, 12704, 12704, 64, 2048, 0};
    std::int64_t total = 0;
    for (std::size_t k = 0; k < u.size(); ++k) {
        CHECK(u[k].name == names[k]);
        CHECK(u[k].numel == numels[k]);
        total += u[k].numel;
    }
    CHECK(total == parameters);
    CHECK(loom::gpt::Config{.layers = 2, .width = 32, .heads = 2, .seq = 16, .vocab = 64}.parameters() == parameters);
}

TEST_CASE("bucket grouping closes groups from the last unit backwards", "[parallel][layout]") {
    // 16 KiB = 4096 floats: head + ln_f (2112) stay open until blocks[1] makes
    // 14816; blocks[0] (12704) closes alone; embed (2560) is what is left.
    const ShardLayout layout(units(), 3, Grouping::buckets, small_bucket);
    REQUIRE(layout.groups().size() == 3);
    struct Expected {
        int first, last;
        std::int64_t numel, dense_offset, offset, padded, block, shard_offset;
    };
    // Padded to multiples of 16 x 3 = 48: 2560 -> 2592, 12704 -> 12720, 14816 -> 14832.
    const std::vector<Expected> expected{{0, 0, 2560, 0, 0, 2592, 864, 0},
                                         {1, 1, 12704, 2560, 2592, 12720, 4240, 864},
                                         {2, 4, 14816, 15264, 15312, 14832, 4944, 5104}};
    for (int g = 0; g < 3; ++g) {
        INFO("group " << g);
        const auto& group = layout.group(g);
        const auto& e = expected[static_cast<std::size_t>(g)];
        CHECK(group.first_unit == e.first);
        CHECK(group.last_unit == e.last);
        CHECK(group.numel == e.numel);
        CHECK(group.dense_offset == e.dense_offset);
        CHECK(group.offset == e.offset);
        CHECK(group.padded == e.padded);
        CHECK(group.block == e.block);
        CHECK(group.shard_offset == e.shard_offset);
    }
    CHECK(layout.ranks() == 3);
    CHECK(layout.dense_size() == parameters);
    CHECK(layout.padded_size() == 2592 + 12720 + 14832);
    CHECK(layout.shard_size() == 864 + 4240 + 4944);
    CHECK(layout.shard_size() * 3 == layout.padded_size());
    CHECK(layout.largest_group() == 14832);
    const std::vector<int> group_of{0, 1, 2, 2, 2, -1};
    for (int u = 0; u < unit_count; ++u) CHECK(layout.group_of_unit(u) == group_of[static_cast<std::size_t>(u)]);
    CHECK(layout.block_offset(2, 0) == 15312);
    CHECK(layout.block_offset(2, 2) == 15312 + 2 * 4944);
    std::ostringstream out;
    out << layout;
    CHECK(out.str() == "ShardLayout(3 groups over 3 ranks, 30080 parameters, padded 30144, shard 10048)");

    // A bucket of 1 byte closes after every unit; one as large as the model makes one group.
    const ShardLayout tiny(units(), 2, Grouping::buckets, 1);
    CHECK(tiny.groups().size() == 5);
    const ShardLayout huge(units(), 2, Grouping::buckets, std::int64_t{1} << 30);
    REQUIRE(huge.groups().size() == 1);
    CHECK(huge.group(0).first_unit == 0);
    CHECK(huge.group(0).last_unit == 4);
    CHECK(huge.group(0).numel == parameters);
    CHECK(huge.group_of_unit(5) == -1);
}

TEST_CASE("per-unit grouping gives every unit with parameters its own group", "[parallel][layout]") {
    for (int ranks : {1, 2, 3, 4, 7}) {
        INFO(ranks << " ranks");
        const ShardLayout layout(units(), ranks, Grouping::per_unit, small_bucket);
        REQUIRE(layout.groups().size() == 5);
        std::int64_t dense = 0, padded = 0, shard = 0;
        for (int g = 0; g < 5; ++g) {
            INFO("group " << g);
            const auto& group = layout.group(g);
            CHECK(group.first_unit == g);
            CHECK(group.last_unit == g);
            CHECK(layout.group_of_unit(g) == g);
            CHECK(group.numel == units()[static_cast<std::size_t>(g)].numel);
            // Padded to the next multiple of 16 x ranks, and no further.
            const std::int64_t multiple = 16 * ranks;
            CHECK(group.padded % multiple == 0);
            CHECK(group.padded >= group.numel);
            CHECK(group.padded - group.numel < multiple);
            CHECK(group.block * ranks == group.padded);
            CHECK(group.block % 16 == 0);   // every block is 64-byte aligned ...
            CHECK(group.offset % 16 == 0);  // ... in a 64-byte aligned arena
            CHECK(group.dense_offset == dense);
            CHECK(group.offset == padded);
            CHECK(group.shard_offset == shard);
            for (int r = 0; r < ranks; ++r) CHECK(layout.block_offset(g, r) == group.offset + r * group.block);
            dense += group.numel;
            padded += group.padded;
            shard += group.block;
        }
        CHECK(layout.group_of_unit(5) == -1);  // the loss has no parameters
        CHECK(layout.dense_size() == parameters);
        CHECK(layout.padded_size() == padded);
        CHECK(layout.shard_size() == shard);
        CHECK(layout.shard_size() == layout.padded_size() / ranks);
        CHECK(layout.largest_group() == layout.group(1).padded);  // a block
    }
    // ln_f's 64 parameters over 3 ranks: padded to 96, blocks of 32.
    const ShardLayout three(units(), 3, Grouping::per_unit, 1);
    CHECK(three.group(3).padded == 96);
    CHECK(three.group(3).block == 32);
}

TEST_CASE("to_dense and from_dense round-trip and zero the padding", "[parallel][layout]") {
    for (auto grouping : {Grouping::buckets, Grouping::per_unit})
        for (int ranks : {1, 3, 4}) {
            INFO("ranks " << ranks << (grouping == Grouping::buckets ? " buckets" : " per unit"));
            const ShardLayout layout(units(), ranks, grouping, small_bucket);
            std::vector<float> dense(static_cast<std::size_t>(layout.dense_size()));
            for (std::size_t k = 0; k < dense.size(); ++k) dense[k] = static_cast<float>(k) + 0.5f;
            std::vector<float> padded(static_cast<std::size_t>(layout.padded_size()),
                                      std::numeric_limits<float>::quiet_NaN());
            layout.from_dense(dense, padded);
            std::int64_t padding = 0;
            for (const auto& g : layout.groups()) {
                for (std::int64_t k = 0; k < g.numel; ++k)
                    REQUIRE(padded[static_cast<std::size_t>(g.offset + k)] == dense[static_cast<std::size_t>(g.dense_offset + k)]);
                for (std::int64_t k = g.numel; k < g.padded; ++k) {
                    REQUIRE(padded[static_cast<std::size_t>(g.offset + k)] == 0.0f);
                    ++padding;
                }
            }
            CHECK(padding == layout.padded_size() - layout.dense_size());
            std::vector<float> back(dense.size(), -1.0f);
            layout.to_dense(padded, back);
            CHECK(back == dense);
            // to_dense leaves the padding alone: garbage there does not reach the dense copy.
            for (const auto& g : layout.groups())
                for (std::int64_t k = g.numel; k < g.padded; ++k) padded[static_cast<std::size_t>(g.offset + k)] = 1e30f;
            layout.to_dense(padded, back);
            CHECK(back == dense);
        }
}

TEST_CASE("the shard layout refuses bad inputs with a sentence", "[parallel][layout]") {
    CHECK(message_of([] { ShardLayout(units(), 0, Grouping::buckets, 1024); }) ==
          "ShardLayout: 0 ranks; there must be at least one");
    CHECK(message_of([] { ShardLayout(units(), -2, Grouping::per_unit, 1024); }) ==
          "ShardLayout: -2 ranks; there must be at least one");
    CHECK(message_of([] { ShardLayout(units(), 2, Grouping::buckets, 0); }) ==
          "ShardLayout: bucket size 0 bytes; it must be at least 1");
    const ShardLayout layout(units(), 3, Grouping::buckets, small_bucket);
    std::vector<float> padded(30144), dense(30080), short_dense(30079), short_padded(30080);
    CHECK(message_of([&] { layout.to_dense(padded, short_dense); }) ==
          "ShardLayout: arrays of 30144 (padded) and 30079 (dense) elements; this layout has 30144 and 30080");
    CHECK(message_of([&] { layout.from_dense(dense, short_padded); }) ==
          "ShardLayout: arrays of 30080 (padded) and 30080 (dense) elements; this layout has 30144 and 30080");
    CHECK(message_of([&] { layout.to_dense(padded, dense); }) == "(no error)");
    CHECK_THROWS_AS(layout.group(3), std::out_of_range);
    CHECK_THROWS_AS(layout.group_of_unit(6), std::out_of_range);

    // A model without parameters has no groups and nothing to pad.
    const ShardLayout empty(std::vector<loom::nn::Unit>(2), 4, Grouping::buckets, 1024);
    CHECK(empty.groups().empty());
    CHECK(empty.padded_size() == 0);
    CHECK(empty.group_of_unit(0) == -1);
    CHECK(empty.group_of_unit(1) == -1);
}

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
    CHECK(listing(program) ==
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
    CHECK(listing(program) ==
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

// --- the verifier rejects broken programs, naming the instruction -----------------

TEST_CASE("the verifier rejects a missing or repeated wait", "[parallel][verify]") {
    const auto layout0 = layout_for(0, 2);
    const auto stage0 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 1);
    REQUIRE(text_of(stage0.code[16]) == "wait #11");
    REQUIRE(text_of(stage0.code[19]) == "optimizer_step");

    // Deleting the wait for g2's all-reduce: the optimizer (now #18) runs before it finished.
    const auto no_wait = without(stage0, 16);
    CHECK(verify_message(no_wait, layout0) == prefix(no_wait, 18) + "optimizer_step runs before reduction #11 finished");

    // Waiting for it twice.
    const auto twice = duplicated(stage0, 16, 17);
    REQUIRE(text_of(twice.code[17]) == "wait #11");
    CHECK(verify_message(twice, layout0) == prefix(twice, 17) + "wait #11 waits for #11 a second time");

    // Waiting for something that is not asynchronous, or not issued yet.
    auto not_async = stage0;
    not_async.code[16].target = 0;
    CHECK(verify_message(not_async, layout0) ==
          prefix(not_async, 16) + "wait #0 waits for #0, which is not an earlier asynchronous instruction");
    auto too_early = moved(stage0, 16, 11);
    REQUIRE(text_of(too_early.code[11]) == "wait #12");
    CHECK(verify_message(too_early, layout0) ==
          prefix(too_early, 11) + "wait #12 waits for #12, which is not an earlier asynchronous instruction");

    // ZeRO-3: deleting the wait for g0's gather (#2), forward u0 (now #3) runs on parameters not there yet.
    const auto layout3 = layout_for(3, 2);
    const auto stage3 = loom::schedule::data_parallel_program(layout3, unit_count, 3, 1);
    REQUIRE(text_of(stage3.code[2]) == "wait #1");
    const auto no_gather_wait = without(stage3, 2);
    CHECK(verify_message(no_gather_wait, layout3) ==
          prefix(no_gather_wait, 3) + "forward u0 mb0 runs while group 0's parameters are not gathered and waited for");

    // ZeRO-1: deleting the last wait (for the all-gather of g2 after the optimizer).
    const auto layout1 = layout_for(1, 2);
    const auto stage1 = loom::schedule::data_parallel_program(layout1, unit_count, 1, 1);
    REQUIRE(stage1.code.size() == 27);
    REQUIRE(text_of(stage1.code[22]) == "gather_params g2");
    REQUIRE(text_of(stage1.code[25]) == "wait #22");
    const auto never_waited = without(stage1, 25);
    CHECK(verify_message(never_waited, layout1) ==
          prefix(never_waited, 26) + "instruction #22 (gather_params g2) is never waited for");
}

TEST_CASE("the verifier rejects a reduction or an optimizer step out of order", "[parallel][verify]") {
    const auto layout0 = layout_for(0, 2);
    const auto stage0 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 1);
    REQUIRE(text_of(stage0.code[10]) == "backward u2 mb0");
    REQUIRE(text_of(stage0.code[11]) == "reduce_grads g2 mb0 (all_reduce)");

    // g2 = {u2, u3, u4}: its reduction before the backward of u2.
    const auto early_reduce = moved(stage0, 11, 10);
    CHECK(verify_message(early_reduce, layout0) ==
          prefix(early_reduce, 10) + "reduce_grads g2 mb0 (all_reduce) reduces before the weight gradients of u2 exist");
    // ... or before the group's backward began at all.
    const auto very_early_reduce = moved(stage0, 11, 7);
    CHECK(verify_message(very_early_reduce, layout0) ==
          prefix(very_early_reduce, 7) +
              "reduce_grads g2 mb0 (all_reduce) reduces before the weight gradients of u2 exist");

    // ZeRO-3: g4's reduce-scatter (#25) before backward u4 (#24).
    const auto layout3 = layout_for(3, 2);
    const auto stage3 = loom::schedule::data_parallel_program(layout3, unit_count, 3, 1);
    REQUIRE(text_of(stage3.code[25]) == "reduce_grads g4 slot 0 mb0 (reduce_scatter)");
    const auto early_scatter = moved(stage3, 25, 24);
    CHECK(verify_message(early_scatter, layout3) ==
          prefix(early_scatter, 24) +
              "reduce_grads g4 slot 0 mb0 (reduce_scatter) reduces before the weight gradients of u4 exist");

    // The optimizer (#19) before the last wait (#18, for g0's all-reduce #15).
    const auto early_optimizer = moved(stage0, 19, 18);
    CHECK(verify_message(early_optimizer, layout0) ==
          prefix(early_optimizer, 18) + "optimizer_step runs before reduction #15 finished");
    // ... or twice.
    const auto two_steps = duplicated(stage0, 19, 20);
    CHECK(verify_message(two_steps, layout0) ==
          prefix(two_steps, 22) + "the optimizer runs 2 times; a step runs it once");
    // ... or not at all.
    const auto no_step = without(stage0, 19);
    CHECK(verify_message(no_step, layout0) == prefix(no_step, 20) + "the optimizer runs 0 times; a step runs it once");

    // ZeRO-1: gathering the (unsharded) updated blocks before the optimizer updated them.
    const auto layout1 = layout_for(1, 2);
    const auto stage1 = loom::schedule::data_parallel_program(layout1, unit_count, 1, 1);
    REQUIRE(text_of(stage1.code[19]) == "optimizer_step");
    REQUIRE(text_of(stage1.code[20]) == "gather_params g0");
    const auto early_gather = moved(stage1, 20, 19);
    CHECK(verify_message(early_gather, layout1) ==
          prefix(early_gather, 19) + "gather_params g0 gathers unsharded parameters before the optimizer updated them");

    // An arena reduction in an earlier micro-batch than the last.
    const auto stage0_mb4 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 4);
    auto early_mb = stage0_mb4;
    const int at = index_of(stage0_mb4, {.op = Op::reduce_grads, .micro_batch = 3, .group = 1,
                                         .reduction = Reduction::all_reduce});
    early_mb.code[static_cast<std::size_t>(at)].micro_batch = 2;
    CHECK(verify_message(early_mb, layout0) ==
          prefix(early_mb, at) +
              "reduce_grads g1 mb2 (all_reduce) reduces arena gradients before the last micro-batch has added its share");
}

TEST_CASE("the verifier rejects misuse of parameter and gradient slots", "[parallel][verify]") {
    const auto layout3 = layout_for(3, 2);
    const auto stage3 = loom::schedule::data_parallel_program(layout3, unit_count, 3, 1);

    // Without the release of g0 (#5), the gather of g2 into slot 0 (now #6) overwrites it.
    REQUIRE(text_of(stage3.code[5]) == "release_params g0 slot 0");
    const auto no_release = without(stage3, 5);
    CHECK(verify_message(no_release, layout3) ==
          prefix(no_release, 6) + "gather_params g2 slot 0 overwrites slot 0 still holding group 0");

    // Releasing g1's slot while its gather is still pending: the wait (#6) after the release.
    REQUIRE(text_of(stage3.code[6]) == "wait #3");
    REQUIRE(text_of(stage3.code[9]) == "release_params g1 slot 1");
    const auto early_release = moved(stage3, 9, 6);
    CHECK(verify_message(early_release, layout3) ==
          prefix(early_release, 6) + "release_params g1 slot 1 releases a slot holding group 1 with its gather still pending");

    // A forward on a released group: release g0 (#5) before forward u0 (#4).
    const auto released_too_soon = moved(stage3, 5, 4);
    CHECK(verify_message(released_too_soon, layout3) ==
          prefix(released_too_soon, 5) +
              "forward u0 mb0 runs while group 0's parameters are not gathered and waited for");

    // Without bind_grads g4 (#23), backward u4 (now #23) has nowhere to put its gradients.
    REQUIRE(text_of(stage3.code[23]) == "bind_grads g4 slot 0 mb0");
    const auto unbound = without(stage3, 23);
    CHECK(verify_message(unbound, layout3) ==
          prefix(unbound, 23) + "backward u4 mb0 runs while group 4's gradients are not bound to a free slot");

    // Without the wait for g4's reduction (#35), slot 0 is rebound (now #35) while it reads the slot.
    REQUIRE(text_of(stage3.code[35]) == "wait #25");
    REQUIRE(text_of(stage3.code[36]) == "bind_grads g2 slot 0 mb0");
    const auto rebound = without(stage3, 35);
    CHECK(verify_message(rebound, layout3) ==
          prefix(rebound, 35) + "bind_grads g2 slot 0 mb0 rebinds slot 0 while its reduction #25 is still pending");

    // A slot the program does not have.
    auto bad_slot = stage3;
    bad_slot.code[1].slot = 2;
    CHECK(verify_message(bad_slot, layout3) ==
          prefix(bad_slot, 1) + "gather_params g0 slot 2 names parameter slot 2 but the program has 2");
    auto bad_group = stage3;
    bad_group.code[1].group = 5;
    CHECK(verify_message(bad_group, layout3) ==
          prefix(bad_group, 1) + "gather_params g5 slot 0 names group 5 but the layout has 5");
}

TEST_CASE("the verifier rejects missing, repeated and misplaced compute", "[parallel][verify]") {
    const auto layout0 = layout_for(0, 2);
    const auto stage0 = loom::schedule::data_parallel_program(layout0, unit_count, 0, 1);
    REQUIRE(text_of(stage0.code[3]) == "forward u2 mb0");

    // Without forward u2, forward u3 (now #3) runs before it.
    const auto no_forward = without(stage0, 3);
    CHECK(verify_message(no_forward, layout0) == prefix(no_forward, 3) + "forward u3 mb0 runs before forward u2");
    // Without the last forward, backward starts before the forward pass ended.
    const auto no_last_forward = without(stage0, 6);
    CHECK(verify_message(no_last_forward, layout0) ==
          prefix(no_last_forward, 6) + "backward u5 mb0 runs before the forward pass ended");
    // A forward twice.
    const auto forward_twice = duplicated(stage0, 3, 4);
    CHECK(verify_message(forward_twice, layout0) == prefix(forward_twice, 4) + "forward u2 mb0 runs twice");
    // Without backward u3, backward u2 (now #9) runs before it.
    const auto no_backward = without(stage0, 9);
    CHECK(verify_message(no_backward, layout0) ==
          prefix(no_backward, 9) + "backward u2 mb0 runs before the backward of u3");
    // Without backward u0 (the last one): caught at the end.
    REQUIRE(text_of(stage0.code[14]) == "backward u0 mb0");
    REQUIRE(text_of(stage0.code[15]) == "reduce_grads g0 mb0 (all_reduce)");
    auto no_first_backward = without(stage0, 14);
    CHECK(verify_message(no_first_backward, layout0) ==
          prefix(no_first_backward, 14) + "reduce_grads g0 mb0 (all_reduce) reduces before the weight gradients of u0 exist");
    // Names out of range.
    auto bad_unit = stage0;
    bad_unit.code[1].unit = 9;
    CHECK(verify_message(bad_unit, layout0) == prefix(bad_unit, 1) + "forward u9 mb0 names unit 9 but the model has 6");
    auto bad_mb = stage0;
    bad_mb.code[1].micro_batch = 1;
    CHECK(verify_message(bad_mb, layout0) == prefix(bad_mb, 1) + "forward u0 mb1 names micro-batch 1 of 1");

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
          prefix(half, static_cast<int>(half.code.size())) +
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
        auto twice = duplicated(program, reduce, optimizer);  // a second reduce_grads g1 just before the optimizer ...
        twice.code.insert(twice.code.begin() + optimizer + 1, Instruction{.op = Op::wait, .target = optimizer});
        for (std::size_t k = static_cast<std::size_t>(optimizer) + 2; k < twice.code.size(); ++k)  // ... and its wait
            if (twice.code[k].op == Op::wait && twice.code[k].target > optimizer) ++twice.code[k].target;
        REQUIRE(twice.count(Op::reduce_grads) == program.count(Op::reduce_grads) + 1);
        CHECK_THAT(verify_message(twice, layout), Catch::Contains("reduced 2 times; expected 1"));
    }
}
