// The executor's components for what a plan asks beyond the step program's
// order (parallel/gradient_exchange.hpp, parallel/plan_exchanges.hpp,
// parallel/sequence_sharder.hpp), tested on their own: the plan's gradient
// exchange (plain or compressed, its warm-up, its state), the casts of stage
// and tensor-parallel messages, and the sequence sharder's positions. The
// executor's training with them is tested in test_grad_compress.cpp and
// test_sequence_parallel_equivalence.cpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/nn/sequence_layout.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/parallel/compressed_gradient_exchange.hpp>
#include <loom/parallel/grad_compress.hpp>
#include <loom/parallel/gradient_exchange.hpp>
#include <loom/parallel/plan_exchanges.hpp>
#include <loom/parallel/sequence_sharder.hpp>
#include <loom/parallel/shard_layout.hpp>
#include <loom/parallel/strategy_spec.hpp>

#include "support/matrix_model.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::Compression;
using loom::StrategySpec;
using loom::parse_compression;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;

using loom_test::MatrixModel;  // one unit of 24 x 40 + 40 elements: a layout of one bucket

loom::parallel::ShardLayout layout_of(const std::vector<loom::nn::Unit>& units, int ranks) {
    return {units, ranks, loom::parallel::Grouping::buckets, 1 << 30};
}

// Bucket 0 of `layout` over `grad` (its padded elements): whole, or this rank's block.
loom::parallel::GradientBucket bucket_of(const loom::parallel::ShardLayout& layout, std::vector<float>& grad,
                                         bool all_reduce, int rank) {
    const auto& g = layout.group(0);
    loom::parallel::GradientBucket bucket;
    bucket.all_reduce = all_reduce;
    bucket.grad = loom::Tensor::of(grad.data(), {g.padded});
    bucket.out = all_reduce ? bucket.grad : loom::Tensor::of(grad.data() + rank * g.block, {g.block});
    return bucket;
}

// Rank r's gradient: values that differ by rank and element, zero in the padding.
std::vector<float> gradient_of(const loom::parallel::ShardLayout& layout, int rank) {
    std::vector<float> grad(static_cast<std::size_t>(layout.group(0).padded), 0.0f);
    std::mt19937 rng(static_cast<unsigned>(7 + rank));
    std::normal_distribution<float> normal;
    for (std::int64_t i = 0; i < layout.group(0).numel; ++i) grad[static_cast<std::size_t>(i)] = normal(rng);
    return grad;
}

}  // namespace

TEST_CASE("the plan's gradient exchange: plain without a dp compressor or a second rank, else compressed",
          "[exchange][compress][parallel]") {
    MatrixModel model;
    const auto units = model.units();
    ThreadWorld(2).run([&](ThreadComm& comm) {
        const auto layout = layout_of(units, 2);
        StrategySpec plan{};
        loom::optim::AdamWConfig adamw{};
        const auto plain = loom::parallel::gradient_exchange_for<ThreadComm>(plan, comm, layout, units, {}, adamw);
        CHECK(!plain->compression().on());
        CHECK(plain->state_size() == 0);
        CHECK(plain->state_bytes() == 0);

        plan.dp_compression = parse_compression("topk:0.1");
        const auto topk = loom::parallel::gradient_exchange_for<ThreadComm>(plan, comm, layout, units,
                                                                           {.warmup = 3}, adamw);
        CHECK(topk->compression() == plan.dp_compression);
        CHECK(topk->state_size() == layout.padded_size());  // its error feedback
        CHECK(topk->state_bytes() == 4 * layout.padded_size());
        // Error feedback with a warm-up freezes AdamW's variance when it starts...
        CHECK(adamw.freeze_variance_after == 3);
        // ... unless a step was chosen; a compressor without error feedback leaves it.
        loom::optim::AdamWConfig chosen{};
        chosen.freeze_variance_after = 5;
        (void)loom::parallel::gradient_exchange_for<ThreadComm>(plan, comm, layout, units, {.warmup = 3}, chosen);
        CHECK(chosen.freeze_variance_after == 5);
        loom::optim::AdamWConfig untouched{};
        plan.dp_compression = parse_compression("int8");
        (void)loom::parallel::gradient_exchange_for<ThreadComm>(plan, comm, layout, units, {.warmup = 3}, untouched);
        CHECK(untouched.freeze_variance_after == 0);

        CHECK(loom_test::message_of([&] {
                  (void)loom::parallel::gradient_exchange_for<ThreadComm>(plan, comm, layout, units, {.warmup = -1},
                                                                          adamw);
              }) == "Executor: compress_warmup = -1 steps; it must be 0 or more");
    });
    ThreadWorld(1).run([&](ThreadComm& comm) {
        StrategySpec plan{};
        plan.dp_compression = parse_compression("onebit");
        loom::optim::AdamWConfig adamw{};
        const auto alone =
            loom::parallel::gradient_exchange_for<ThreadComm>(plan, comm, layout_of(units, 1), units, {}, adamw);
        CHECK(!alone->compression().on());  // one rank exchanges nothing
    });
}

TEST_CASE("the plain exchange averages whole buckets or into each rank's block, and holds no state",
          "[exchange][parallel]") {
    MatrixModel model;
    const auto units = model.units();
    constexpr int ranks = 3;
    const auto layout = layout_of(units, ranks);
    std::vector<std::vector<float>> inputs, whole(ranks), blocks(ranks);
    for (int r = 0; r < ranks; ++r) inputs.push_back(gradient_of(layout, r));
    ThreadWorld(ranks).run([&](ThreadComm& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        loom::parallel::AveragingExchange<ThreadComm> exchange(comm);
        whole[r] = inputs[r];
        exchange.reduce_async(bucket_of(layout, whole[r], true, comm.rank()), {}).wait();
        blocks[r] = inputs[r];
        exchange.reduce_async(bucket_of(layout, blocks[r], false, comm.rank()), {}).wait();
        if (comm.rank() == 0) {
            const std::vector<float> state(3);
            CHECK(loom_test::message_of([&] { exchange.load_state(state); }) ==
                  "GradientExchange::load_state: 3 elements of compressor state for an executor without a dp "
                  "compressor");
            CHECK(loom_test::message_of([&] { exchange.load_state({}); }) == "(no error)");
        }
    });
    const auto& g = layout.group(0);
    for (std::int64_t i = 0; i < g.numel; ++i) {
        const auto at = static_cast<std::size_t>(i);
        const float mean = (inputs[0][at] + inputs[1][at] + inputs[2][at]) / 3.0f;
        CHECK(whole[0][at] == Approx(mean).margin(1e-6));
        CHECK(whole[1][at] == whole[0][at]);
        CHECK(whole[2][at] == whole[0][at]);
        const auto owner = static_cast<std::size_t>(i / g.block);
        CHECK(blocks[owner][at] == Approx(whole[0][at]).margin(1e-6));
    }
}

TEST_CASE("a compressed exchange averages plainly during its warm-up, compresses after it",
          "[exchange][compress][parallel]") {
    MatrixModel model;
    const auto units = model.units();
    constexpr int ranks = 2;
    const auto layout = layout_of(units, ranks);
    std::vector<std::vector<float>> plain(ranks), warm(ranks), compressed(ranks);
    ThreadWorld(ranks).run([&](ThreadComm& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        loom::parallel::CompressedGradientExchange<ThreadComm> exchange(
            comm, layout, units, parse_compression("onebit"), /*warmup=*/2, /*zero_stage=*/1, 0.9f, {},
            loom::host_device);
        loom::parallel::AveragingExchange<ThreadComm> reference(comm);
        plain[r] = warm[r] = compressed[r] = gradient_of(layout, comm.rank());
        reference.reduce_async(bucket_of(layout, plain[r], true, comm.rank()), {}).wait();
        loom::parallel::OptimizerArrays optimizer;
        optimizer.optimizer_steps = 1;  // still warming up
        exchange.reduce_async(bucket_of(layout, warm[r], true, comm.rank()), optimizer).wait();
        optimizer.optimizer_steps = 2;
        exchange.reduce_async(bucket_of(layout, compressed[r], true, comm.rank()), optimizer).wait();
        // ZeRO 1 keeps the momentum sharded, so one-bit does not mix it; at ZeRO 0 a policy between the
        // exchange and the optimizer step would read mixed gradients.
        exchange.check_readable_by("Clip");
        loom::parallel::CompressedGradientExchange<ThreadComm> at_zero0(
            comm, layout, units, parse_compression("onebit"), 0, 0, 0.9f, {}, loom::host_device);
        CHECK(loom_test::message_of([&] { at_zero0.check_readable_by("Clip"); }) ==
              "Executor: policy Clip would read gradients that " + at_zero0.compression().describe() +
                  " mixes into the momentum at ZeRO 0; use ZeroShard<1> or more");
    });
    CHECK(warm[0] == plain[0]);
    CHECK(warm[1] == plain[1]);
    CHECK(compressed[0] != plain[0]);     // signs and a scale, not the average
    CHECK(compressed[0] == compressed[1]);  // every rank decodes the same bits
}

TEST_CASE("the casts of stage and tensor-parallel messages come from the plan, and need their axis",
          "[exchange][compress][parallel]") {
    StrategySpec plan{};
    auto casts = loom::parallel::message_casts(plan);
    CHECK(!casts.stage);
    CHECK(!casts.tensor);
    plan.pipelined = true;
    plan.tensor_parallel = true;
    plan.pp_compression = parse_compression("bf16");
    plan.tp_compression = parse_compression("fp16");
    casts = loom::parallel::message_casts(plan);
    CHECK(casts.stage == loom::kernels::host::Cast::bf16);
    CHECK(casts.tensor == loom::kernels::host::Cast::f16);

    plan.pp_compression = parse_compression("topk:0.1");
    CHECK(loom_test::message_of([&] { (void)loom::parallel::message_casts(plan); }) ==
          "Executor: " + plan.pp_compression.describe() +
              " on the pp or tp axis; activations take CastBf16 or CastFp16");
    plan.pp_compression = parse_compression("bf16");
    plan.pipelined = false;
    CHECK(loom_test::message_of([&] { (void)loom::parallel::message_casts(plan); }) ==
          "Executor: GradCompress<CastBf16, PpAxis> casts what pipeline stages send; add Pipeline<Schedule>");
    plan.pipelined = true;
    plan.tensor_grid = true;
    CHECK(loom_test::message_of([&] { (void)loom::parallel::message_casts(plan); }) ==
          "Executor: GradCompress<CastFp16, TpAxis> casts Megatron's all-reduces; add TensorParallel (1D)");
}

TEST_CASE("the sequence sharder keeps each sp rank's positions of every row, in its layout's order",
          "[exchange][sp][parallel]") {
    constexpr std::int64_t rows = 3, T = 16;
    std::vector<std::int32_t> inputs(rows * T), targets(rows * T);
    for (std::int64_t i = 0; i < rows * T; ++i) {
        inputs[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
        targets[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(1000 + i);
    }
    for (const bool zigzag : {true, false})
        for (const int ulysses : {1, 2})
            for (int rank = 0; rank < 4; ++rank) {
                const loom::nn::SequenceLayout layout{.ranks = 4, .rank = rank, .zigzag = zigzag, .ulysses = ulysses};
                loom::parallel::SequenceSharder sharder;
                loom::Tensor in = loom::Tensor::of(inputs.data(), {rows, T});
                loom::Tensor tg = loom::Tensor::of(targets.data(), {rows, T});
                sharder.keep_local_positions(layout, in, tg);
                const std::int64_t local = layout.local_tokens(T);
                INFO(layout << ", rank " << rank);
                REQUIRE(in.shape() == loom::Shape{rows, local});
                REQUIRE(tg.shape() == loom::Shape{rows, local});
                for (std::int64_t row = 0; row < rows; ++row)
                    for (std::int64_t t = 0; t < local; ++t) {
                        const std::int64_t position = layout.position(t, T);
                        CHECK(in.data<std::int32_t>()[row * local + t] == row * T + position);
                        CHECK(tg.data<std::int32_t>()[row * local + t] == 1000 + row * T + position);
                    }
            }
}

}  // namespace LOOM_TEST_FILE
