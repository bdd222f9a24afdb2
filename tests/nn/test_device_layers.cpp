// The layers on a device chosen at run time, without a GPU: the fenced test
// device (tests/support/fenced_device.hpp) stands in for CUDA, handing out
// pointers that crash if the host touches them and running the host kernels
// behind the kernel table. The GPT must then train through the device
// runtime and kernels/ops.hpp alone, and equal the host bit for bit; the
// SerialTrainer must equal the Executor's one-rank run bit for bit; the
// Executor's ZeRO stages and pipelines must equal the host's bit for bit; and a
// device without its backend, or mixed devices, must be refused by name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/device_ranks.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/exec/executor.hpp"
#include "loom/exec/serial_trainer.hpp"
#include "loom/exec/sharded_checkpoint.hpp"
#include "loom/exec/trace.hpp"
#include "loom/gpt/model.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/param_arena.hpp"
#include "io/temp_dir.hpp"
#include "support/device_training.hpp"
#include "support/fenced_comm.hpp"
#include "support/fenced_device.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::Tensor;
using loom_test::differing_bits;
namespace nn = loom::nn;

const loom::gpt::Config tiny{.layers = 2, .width = 32, .heads = 2, .seq = 16, .vocab = 64};
constexpr std::int64_t batch = 4;

// Step `step`'s batch of token ids and next-token targets, on the host.
loom_test::TokenBatch make_batch(std::uint64_t step) {
    return {batch, tiny.seq, tiny.vocab, static_cast<std::uint32_t>(21 + step)};
}

}  // namespace

TEST_CASE("the GPT runs on a device through the runtime and kernel table, bit for bit the host's", "[device][nn]") {
    loom_test::FencedDevice device;
    const loom_test::TokenBatch b = make_batch(0);
    const auto host = loom_test::forward_backward_on(loom::host_device, tiny, 7, b);
    const auto on_device = loom_test::forward_backward_on(loom::cuda_device(0), tiny, 7, b);
    CHECK(std::bit_cast<std::uint32_t>(on_device.loss) == std::bit_cast<std::uint32_t>(host.loss));
    CHECK(differing_bits(on_device.values, host.values) == 0);
    CHECK(differing_bits(on_device.grads, host.grads) == 0);
    // Every kernel the GPT needs went through the table (none ran on the
    // host behind its back: that would have crashed on a fenced pointer).
    for (const char* kernel : {"gemm", "gemm_bias", "add", "bias_grad", "gelu_forward", "gelu_backward",
                               "layernorm_forward", "layernorm_backward_input", "layernorm_backward_weight",
                               "embedding_forward", "embedding_backward", "attention_forward", "attention_backward",
                               "cross_entropy_forward", "cross_entropy_backward"}) {
        CAPTURE(kernel);
        CHECK(device.calls(kernel) > 0);
    }
}

TEST_CASE("SerialTrainer equals the Executor's one-rank run bit for bit, on the host and on a device", "[device][exec]") {
    loom_test::FencedDevice device;
    constexpr int steps = 3;
    const loom::optim::AdamWConfig adamw{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};

    std::vector<float> executor_losses, executor_values;
    loom::comm::ThreadWorld(1).run([&](loom::comm::ThreadComm& comm) {
        auto model = loom::gpt::make_model(tiny);
        loom::exec::Executor<loom::comm::ThreadComm> exec(model, comm, loom::exec::ExecutionPlan{},
                                                          {.micro_batches = 2, .adamw = adamw});
        exec.initialize(7);
        for (int s = 0; s < steps; ++s) {
            const loom_test::TokenBatch b = make_batch(static_cast<std::uint64_t>(s));
            executor_losses.push_back(exec.step(b.input_tensor(), b.target_tensor(), 1e-3f));
        }
        executor_values.resize(static_cast<std::size_t>(exec.parameter_count()));
        std::vector<float> m(executor_values.size()), v(executor_values.size());
        exec.gather_state(executor_values, m, v);
    });

    for (const loom::Device where : {loom::host_device, loom::cuda_device(0)}) {
        CAPTURE(where.kind);
        auto model = loom::gpt::make_model(tiny);
        loom::exec::SerialTrainer trainer(model, where, {.micro_batches = 2, .adamw = adamw});
        trainer.initialize(7);
        std::vector<float> losses;
        for (int s = 0; s < steps; ++s) {
            const loom_test::TokenBatch b = make_batch(static_cast<std::uint64_t>(s));
            losses.push_back(trainer.step(b.input_tensor(), b.target_tensor(), 1e-3f));
        }
        std::vector<float> values(static_cast<std::size_t>(trainer.parameter_count())), m(values.size()), v(values.size());
        trainer.gather_state(values, m, v);
        CHECK(trainer.optimizer_steps() == steps);
        CHECK(differing_bits(losses, executor_losses) == 0);
        CHECK(differing_bits(values, executor_values) == 0);
    }
    CHECK(device.calls("adamw_update") == steps);
}

TEST_CASE("a checkpoint's state loads on a device and training continues as on the host", "[device][exec]") {
    loom_test::FencedDevice device;
    const auto run = loom_test::resume_on(loom::cuda_device(0), tiny, 3, make_batch(0), make_batch(1));
    CHECK(differing_bits(run.loaded, run.saved) == 0);
    CHECK(std::bit_cast<std::uint32_t>(run.device_loss) == std::bit_cast<std::uint32_t>(run.host_loss));
    CHECK(differing_bits(run.device_values, run.host_values) == 0);
    CHECK(run.device_steps == 2);

    auto model = loom::gpt::make_model(tiny);
    loom::exec::SerialTrainer on_device(model, loom::cuda_device(0));
    const auto n = static_cast<std::size_t>(on_device.parameter_count());
    std::vector<float> m(n), v(n);
    CHECK(loom_test::message_of([&] { on_device.load_state(std::vector<float>(3), m, v, 0); }) ==
          "SerialTrainer::load_state: arrays of 3, " + std::to_string(n) + " and " + std::to_string(n) +
              " elements; the model has " + std::to_string(n) + " parameters");
}

TEST_CASE("device memory and kernels without their backend are refused, naming how to build it in", "[device][nn]") {
    // No backend registered for CUDA in this host-only test binary.
    auto model = loom::gpt::make_model(tiny);
    CHECK(loom_test::message_of([&] { nn::ParamArena arena(model, loom::cuda_device(0)); }) ==
          "memory on cuda:0 needs the cuda backend, which this program was built without: compile one .cu file "
          "that includes loom/cuda_backend.cuh and link loom::cuda");
    nn::Context ctx;
    CHECK(loom_test::message_of([&] { ctx.set_device(loom::cuda_device(1)); }).find("memory on cuda:1 needs the cuda backend") == 0);
    float x = 1.0f, y = 0.0f;
    const Tensor on_device(&x, loom::DType::f32, {1}, loom::cuda_device(0));
    CHECK(loom_test::message_of([&] { loom::kernels::gelu_forward(on_device, on_device); }) ==
          "tensors on cuda:0 need the cuda backend's kernels, which this program was built without: compile one .cu "
          "file that includes loom/cuda_backend.cuh and link loom::cuda");
    CHECK(loom_test::message_of([&] { loom::kernels::gelu_forward(on_device, Tensor::of(&y, {1})); }) ==
          "gelu_forward: operands on cuda:0 and host (Tensor(f32, [1], cuda:0) and Tensor(f32, [1], host)); every "
          "operand must be on one device");
}

TEST_CASE("a device that does not exist, mixed devices and host-only paths are refused by name", "[device][nn]") {
    loom_test::FencedDevice device;
    auto model = loom::gpt::make_model(tiny);
    CHECK(loom_test::message_of([&] { nn::ParamArena arena(model, loom::cuda_device(2)); }) ==
          "cuda:2 does not exist: the fenced test device has cuda:0 only");

    // Parameters on the device, activations on the host: the first kernel names both.
    nn::ParamArena arena(model, loom::cuda_device(0));
    arena.initialize(model, 1);
    nn::Context host_ctx;
    const loom_test::TokenBatch b = make_batch(0);
    CHECK(loom_test::message_of([&] { (void)nn::forward_backward(model, host_ctx, b.input_tensor(), b.target_tensor()); })
              .find("embedding_forward: operands on host and cuda:0") == 0);
    CHECK(loom_test::message_of([&] { (void)arena.values(); }) ==
          "ParamArena: the parameters live on cuda:0; read them on the host through a copy (copy_tensor of "
          "values_tensor())");

    // A layer cut over an Optimus 2D grid needs the grid in its context, on a device as on the host.
    auto norm = nn::LayerNorm::make(8);
    norm.gain.slice.full = loom::Shape{16};
    norm.gain.slice.cuts[0] = loom::ParamCut{0, 8, 2};
    nn::ParamArena norm_arena(norm, loom::cuda_device(0));
    nn::Context ctx;
    ctx.set_device(loom::cuda_device(0));
    const Tensor x = ctx.alloc({2, 8});
    CHECK(loom_test::message_of([&] { (void)norm.forward(ctx, x); }) ==
          "LayerNorm: cut for an Optimus 2D grid but the context has no grid; run it through an executor whose "
          "strategy has Optimus2D");
}

namespace {

// A strategy on the fenced device against the same strategy on the host:
// losses, parameters and both moments equal bit for bit after 3 steps, and
// each of `kernels` went through the device's table.
void check_strategy_on_device(const loom::exec::ExecutionPlan& plan, loom_test::RankGrid grid,
                              std::initializer_list<const char*> kernels = {}, std::int64_t rows = batch) {
    loom_test::FencedDevice device;
    loom_test::FencedRanks ranks;
    const auto host = loom_test::train_strategy(loom::host_device, tiny, plan, grid, rows, 3, 21);
    const auto on_device = loom_test::train_strategy(loom::cuda_device(0), tiny, plan, grid, rows, 3, 21);
    REQUIRE(host.losses.size() == 3);
    CHECK(differing_bits(on_device.losses, host.losses) == 0);
    CHECK(differing_bits(on_device.values, host.values) == 0);
    CHECK(differing_bits(on_device.m, host.m) == 0);
    CHECK(differing_bits(on_device.v, host.v) == 0);
    CHECK(differing_bits(on_device.compression, host.compression) == 0);
    // Every rank's optimizer ran on the device, once or once per group, every step.
    CHECK(device.calls("adamw_update") >= grid.dp * grid.pp * grid.tp * 3);
    for (const char* kernel : kernels) {
        CAPTURE(kernel);
        CHECK(device.calls(kernel) > 0);
    }
}

template <class... Policies>
loom::exec::ExecutionPlan plan_of() {
    return loom::exec::ExecutionPlan::of<loom::Strategy<Policies...>>();
}

}  // namespace

TEST_CASE("the Executor's data parallelism on a device equals the host's bit for bit", "[device][exec]") {
    using loom::DataParallel, loom::ZeroShard;
    SECTION("ZeRO 0") { check_strategy_on_device(plan_of<DataParallel<>>(), {.dp = 2}); }
    SECTION("ZeroShard<1>") { check_strategy_on_device(plan_of<DataParallel<>, ZeroShard<1>>(), {.dp = 2}); }
    SECTION("ZeroShard<2>") { check_strategy_on_device(plan_of<DataParallel<>, ZeroShard<2>>(), {.dp = 2}); }
    SECTION("ZeroShard<3>") { check_strategy_on_device(plan_of<DataParallel<>, ZeroShard<3>>(), {.dp = 2}); }
}

TEST_CASE("the Executor's pipelines on a device equal the host's bit for bit", "[device][exec]") {
    using loom::DataParallel, loom::Pipeline, loom::ZeroShard;
    SECTION("GPipe, pp 2") { check_strategy_on_device(plan_of<DataParallel<>, Pipeline<loom::GPipe>>(), {.pp = 2}); }
    SECTION("1F1B, dp 2 x pp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, Pipeline<loom::OneFOneB>>(), {.dp = 2, .pp = 2});
    }
    SECTION("Interleaved<2>, pp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, Pipeline<loom::Interleaved<2>>>(), {.pp = 2});
    }
    SECTION("ZeroBubbleH1, pp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, Pipeline<loom::ZeroBubbleH1>>(), {.pp = 2});
    }
    SECTION("ZeroBubbleV, pp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, Pipeline<loom::ZeroBubbleV>>(), {.pp = 2});
    }
    SECTION("1F1B with its messages cast to bf16, pp 2") {
        check_strategy_on_device(
            plan_of<DataParallel<>, Pipeline<loom::OneFOneB>, loom::GradCompress<loom::CastBf16, loom::PpAxis>>(),
            {.pp = 2}, {"pack_cast", "unpack_cast"});
    }
    SECTION("1F1B with ZeroShard<2>, dp 2 x pp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, Pipeline<loom::OneFOneB>, ZeroShard<2>>(), {.dp = 2, .pp = 2});
    }
}

TEST_CASE("the Executor's Megatron tensor parallelism on a device equals the host's bit for bit", "[device][exec]") {
    using loom::DataParallel, loom::Pipeline, loom::TensorParallel, loom::ZeroShard;
    SECTION("tp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, TensorParallel>(), {.tp = 2},
                                 {"embedding_slice_lookup", "embedding_slice_backward", "cross_entropy_slice_max",
                                  "cross_entropy_slice_sums", "cross_entropy_slice_backward"});
    }
    SECTION("dp 2 x tp 2, ZeroShard<3>") {
        check_strategy_on_device(plan_of<DataParallel<>, TensorParallel, ZeroShard<3>>(), {.dp = 2, .tp = 2});
    }
    SECTION("tp 2 with its all-reduces cast to fp16") {
        check_strategy_on_device(plan_of<DataParallel<>, TensorParallel, loom::GradCompress<loom::CastFp16, loom::TpAxis>>(),
                                 {.tp = 2}, {"pack_cast", "unpack_cast"});
    }
    SECTION("pp 2 x tp 2, 1F1B") {
        check_strategy_on_device(plan_of<DataParallel<>, Pipeline<loom::OneFOneB>, TensorParallel>(), {.pp = 2, .tp = 2});
    }
}

TEST_CASE("the Executor's Optimus 2D tensor parallelism on a device equals the host's bit for bit", "[device][exec]") {
    using loom::DataParallel, loom::Optimus2D, loom::Pipeline, loom::ZeroShard;
    SECTION("a 2 x 2 grid") {
        check_strategy_on_device(plan_of<DataParallel<>, Optimus2D>(), {.tp = 4},
                                 {"layernorm_grid_row_sums", "layernorm_grid_centered_squares",
                                  "layernorm_grid_normalize", "layernorm_grid_backward_sums",
                                  "layernorm_grid_backward_apply", "embedding_slice_lookup",
                                  "cross_entropy_slice_backward", "bias_grad"});
    }
    SECTION("dp 2 x a 2 x 2 grid, ZeroShard<3>") {
        // 8 rows: each dp rank's micro-batch of 2 splits over the grid's 2 rows.
        check_strategy_on_device(plan_of<DataParallel<>, Optimus2D, ZeroShard<3>>(), {.dp = 2, .tp = 4}, {}, 8);
    }
    SECTION("pp 2 x a 2 x 2 grid, 1F1B") {
        check_strategy_on_device(plan_of<DataParallel<>, Pipeline<loom::OneFOneB>, Optimus2D>(), {.pp = 2, .tp = 4});
    }
}

TEST_CASE("the Executor at bf16 matrix products on a device equals the host's bit for bit", "[device][exec][bf16]") {
    using loom::DataParallel, loom::Optimus2D, loom::TensorParallel, loom::ZeroShard;
    using loom::kernels::MatmulPrecision;
    // `attention`: the kernels' names, "attention" (whole sequences) or
    // "attention_block" (ring and hybrid sequence parallelism).
    const auto check = [](const loom::exec::ExecutionPlan& plan, loom_test::RankGrid grid,
                          const std::string& attention = "attention") {
        loom_test::FencedDevice device;
        loom_test::FencedRanks ranks;
        const auto f32 = loom_test::train_strategy(loom::host_device, tiny, plan, grid, batch, 3, 21);
        const auto host =
            loom_test::train_strategy(loom::host_device, tiny, plan, grid, batch, 3, 21, MatmulPrecision::bf16);
        const auto on_device =
            loom_test::train_strategy(loom::cuda_device(0), tiny, plan, grid, batch, 3, 21, MatmulPrecision::bf16);
        REQUIRE(host.losses.size() == 3);
        CHECK(differing_bits(on_device.losses, host.losses) == 0);
        CHECK(differing_bits(on_device.values, host.values) == 0);
        CHECK(differing_bits(on_device.m, host.m) == 0);
        CHECK(differing_bits(on_device.v, host.v) == 0);
        CHECK(differing_bits(host.values, f32.values) > 0);  // the products were rounded
        // Every product of the model is a Linear's (or SUMMA's for one) or
        // attention's, all at bf16.
        CHECK(device.calls("gemm_bf16_inputs") > 0);
        CHECK(device.calls("gemm") == 0);
        CHECK(device.calls(attention + "_forward_bf16_inputs") > 0);
        CHECK(device.calls(attention + "_backward_bf16_inputs") > 0);
        CHECK(device.calls(attention + "_forward") == 0);
        CHECK(device.calls(attention + "_backward") == 0);
    };
    SECTION("dp 2, ZeroShard<1>") { check(plan_of<DataParallel<>, ZeroShard<1>>(), {.dp = 2}); }
    SECTION("tp 2") { check(plan_of<DataParallel<>, TensorParallel>(), {.tp = 2}); }
    SECTION("a 2 x 2 grid") { check(plan_of<DataParallel<>, Optimus2D>(), {.tp = 4}); }
    SECTION("Ulysses, sp 2") { check(plan_of<DataParallel<>, loom::SequenceParallel<loom::Ulysses>>(), {.sp = 2}); }
    SECTION("ring attention, sp 2") {
        check(plan_of<DataParallel<>, loom::SequenceParallel<>>(), {.sp = 2}, "attention_block");
    }
    SECTION("UlyssesRing<2>, sp 4") {
        check(plan_of<DataParallel<>, loom::SequenceParallel<loom::UlyssesRing<2>>>(), {.sp = 4}, "attention_block");
    }
}

TEST_CASE("the Executor's sequence parallelism on a device equals the host's bit for bit", "[device][exec]") {
    using loom::DataParallel, loom::SequenceParallel, loom::TensorParallel;
    SECTION("ring attention, zigzag, sp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, SequenceParallel<>>(), {.sp = 2},
                                 {"attention_block_forward", "attention_merge", "attention_block_backward",
                                  "copy_rows"});
    }
    SECTION("ring attention, contiguous, dp 2 x sp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, SequenceParallel<loom::RingAttention, loom::Contiguous>>(),
                                 {.dp = 2, .sp = 2});
    }
    SECTION("Ulysses, sp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, SequenceParallel<loom::Ulysses>>(), {.sp = 2},
                                 {"attention_forward", "attention_backward", "copy_rows"});
    }
    SECTION("UlyssesRing<2>, sp 4") {
        check_strategy_on_device(plan_of<DataParallel<>, SequenceParallel<loom::UlyssesRing<2>>>(), {.sp = 4});
    }
    SECTION("ring attention with tp 2, tp 2 x sp 2") {
        check_strategy_on_device(plan_of<DataParallel<>, TensorParallel, SequenceParallel<>>(), {.tp = 2, .sp = 2});
    }
}

TEST_CASE("the Executor's trace on a device waits for the device around each span and is gathered through it",
          "[device][exec]") {
    loom_test::FencedDevice device;
    loom_test::FencedRanks ranks;
    const auto path = std::filesystem::temp_directory_path() / "loom_device_trace_test.json";
    std::filesystem::remove(path);
    std::vector<std::size_t> events(2);
    loom::comm::run_ranks_on(loom::cuda_device(0), 2, [&](loom::comm::AnyComm& comm) {
        auto model = loom::gpt::make_model(tiny);
        loom::exec::Executor<loom::comm::AnyComm> exec(
            model, comm, loom::exec::ExecutionPlan{},
            {.micro_batches = 2, .trace = true, .device = loom::cuda_device(0)});
        exec.initialize(9);
        const auto b = make_batch(0);
        const std::int64_t half = batch / 2, first = comm.rank() * half;
        (void)exec.step(b.input_tensor().slice(0, first, first + half), b.target_tensor().slice(0, first, first + half),
                        1e-3f);
        // Every rank records the same spans; a "wait" span is recorded only
        // when a wait took 5 us or more, which is the machine's timing, not
        // the program's, so it is not counted.
        const auto& all = exec.trace().events();
        events[static_cast<std::size_t>(comm.rank())] = static_cast<std::size_t>(
            std::count_if(all.begin(), all.end(), [](const auto& e) { return e.category != "wait"; }));
        // The fenced communicator refuses host memory: the text must go through the device.
        loom::exec::write_trace(comm, exec.trace(), path, loom::cuda_device(0));
    });
    CHECK(events[0] > 0);
    CHECK(events[1] == events[0]);
    CHECK(device.calls("synchronize") > 0);
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(text.find("optimizer step") != std::string::npos);
    CHECK(text.find("\"pid\":1") != std::string::npos);  // rank 1's events reached rank 0
    std::filesystem::remove(path);
}

TEST_CASE("the Executor on a device takes its batch in host memory, naming where it was", "[device][exec]") {
    loom_test::FencedDevice device;
    std::string message;
    loom::comm::ThreadWorld(1).run([&](loom::comm::ThreadComm& comm) {
        auto model = loom::gpt::make_model(tiny);
        loom::exec::Executor<loom::comm::ThreadComm> exec(model, comm, loom::exec::ExecutionPlan{},
                                                          {.device = loom::cuda_device(0)});
        exec.initialize(9);
        const loom::DeviceBuffer tokens(loom::DType::i32, loom::Shape{batch, tiny.seq}, loom::cuda_device(0));
        message = loom_test::message_of([&] { (void)exec.step(tokens.tensor(), tokens.tensor(), 1e-3f); });
    });
    CHECK(message == "Executor::step: the batch is on cuda:0 and cuda:0; pass it in host memory (each micro-batch is "
                     "copied to cuda:0)");
}

TEST_CASE("the Executor's gradient compression on a device equals the host's bit for bit", "[device][exec]") {
    using loom::DataParallel, loom::GradCompress, loom::ZeroShard;
    // Each compressor's exchange shapes: all-reduce at ZeRO 0, reduce-scatter
    // into the shard at ZeRO 1, slot reductions at ZeRO 2; the compressor's
    // state (error feedback, PowerSGD's Qs) must equal the host's too.
    SECTION("CastBf16, ZeRO 0") {
        check_strategy_on_device(plan_of<DataParallel<>, GradCompress<loom::CastBf16>>(), {.dp = 2},
                                 {"pack_chunk", "unpack_chunk"});
    }
    SECTION("Int8Block<16>, ZeroShard<2>") {
        check_strategy_on_device(plan_of<DataParallel<>, GradCompress<loom::Int8Block<16>>, ZeroShard<2>>(), {.dp = 2},
                                 {"pack_chunk", "unpack_chunk"});
    }
    SECTION("TopK<0.1>, ZeRO 0") {
        check_strategy_on_device(plan_of<DataParallel<>, GradCompress<loom::TopK<0.1>>>(), {.dp = 2},
                                 {"pack_chunk", "unpack_chunk", "accumulate"});
    }
    SECTION("TopK<0.1>, ZeroShard<1>") {
        check_strategy_on_device(plan_of<DataParallel<>, GradCompress<loom::TopK<0.1>>, ZeroShard<1>>(), {.dp = 2},
                                 {"pack_chunk", "unpack_chunk"});
    }
    SECTION("PowerSGD<2>, ZeRO 0") {
        check_strategy_on_device(plan_of<DataParallel<>, GradCompress<loom::PowerSGD<2>>>(), {.dp = 2},
                                 {"gemm", "orthonormalize_columns", "subtract"});
    }
    SECTION("PowerSGD<2>, ZeroShard<1>") {
        check_strategy_on_device(plan_of<DataParallel<>, GradCompress<loom::PowerSGD<2>>, ZeroShard<1>>(), {.dp = 2},
                                 {"orthonormalize_columns", "subtract"});
    }
    SECTION("OneBit, ZeRO 0 (momentum exchanged)") {
        check_strategy_on_device(plan_of<DataParallel<>, GradCompress<loom::OneBit>>(), {.dp = 2},
                                 {"pack_chunk", "unpack_chunk", "mix_momentum", "unmix_momentum"});
    }
    SECTION("OneBit, ZeroShard<3>") {
        check_strategy_on_device(plan_of<DataParallel<>, GradCompress<loom::OneBit>, ZeroShard<3>>(), {.dp = 2},
                                 {"pack_chunk", "unpack_chunk"});
    }
    SECTION("Int8Block<16> on dp 2 x pp 2, 1F1B") {
        check_strategy_on_device(plan_of<DataParallel<>, loom::Pipeline<loom::OneFOneB>, GradCompress<loom::Int8Block<16>>>(),
                                 {.dp = 2, .pp = 2}, {"pack_chunk", "unpack_chunk"});
    }
}

TEST_CASE("a dp compressor's state saved on a device loads back there and on the host", "[device][exec]") {
    loom_test::FencedDevice device;
    loom_test::FencedRanks ranks;
    const auto plan = plan_of<loom::DataParallel<>, loom::GradCompress<loom::TopK<0.1>>>();
    std::vector<std::vector<float>> saved(2), reloaded(2);
    loom::comm::run_ranks_on(loom::cuda_device(0), 2, [&](loom::comm::AnyComm& comm) {
        auto model = loom::gpt::make_model(tiny);
        loom::exec::Executor<loom::comm::AnyComm> exec(model, comm, plan, {.micro_batches = 2, .device = loom::cuda_device(0)});
        exec.initialize(9);
        const auto b = make_batch(0);
        const std::int64_t share = batch / 2, first = comm.rank() * share;
        (void)exec.step(b.input_tensor().slice(0, first, first + share), b.target_tensor().slice(0, first, first + share),
                        1e-3f);
        auto& mine = saved[static_cast<std::size_t>(comm.rank())];
        mine.resize(static_cast<std::size_t>(exec.gradient_exchange().state_size()));
        exec.gradient_exchange().save_state(mine);
        exec.initialize(9);  // zeroes the compressor's state
        std::vector<float> zeroed(mine.size());
        exec.gradient_exchange().save_state(zeroed);
        CHECK(std::all_of(zeroed.begin(), zeroed.end(), [](float x) { return x == 0.0f; }));
        exec.gradient_exchange().load_state(mine);
        auto& back = reloaded[static_cast<std::size_t>(comm.rank())];
        back.resize(mine.size());
        exec.gradient_exchange().save_state(back);
    });
    for (int r = 0; r < 2; ++r) {
        CAPTURE(r);
        REQUIRE(!saved[static_cast<std::size_t>(r)].empty());
        // Error feedback holds what top-k did not send: most of it is not zero.
        CHECK(std::count(saved[static_cast<std::size_t>(r)].begin(), saved[static_cast<std::size_t>(r)].end(), 0.0f) <
              static_cast<std::ptrdiff_t>(saved[static_cast<std::size_t>(r)].size() / 2));
        CHECK(differing_bits(reloaded[static_cast<std::size_t>(r)], saved[static_cast<std::size_t>(r)]) == 0);
    }
}

TEST_CASE("a sharded checkpoint saved from a device loads on the host and on the device, bit for bit", "[device][exec][checkpoint]") {
    loom_test::FencedDevice device;
    loom_test::FencedRanks ranks;
    const loom_test::TempDir dir;
    const auto run = [&](loom::Device where, const loom::exec::ExecutionPlan& plan, int steps, bool load) {
        std::vector<float> whole;
        loom::comm::run_ranks_on(where, 2, [&](loom::comm::AnyComm& comm) {
            auto model = loom::gpt::make_model(tiny);
            loom::exec::Executor<loom::comm::AnyComm> exec(model, comm, plan, {.micro_batches = 2, .device = where});
            exec.initialize(9);
            if (load) (void)loom::exec::load_sharded(exec, dir.path());
            const std::int64_t share = batch / 2, first = comm.rank() * share;
            for (int s = 0; s < steps; ++s) {
                const auto b = make_batch(static_cast<std::uint64_t>(s));
                (void)exec.step(b.input_tensor().slice(0, first, first + share),
                                b.target_tensor().slice(0, first, first + share), 1e-3f);
            }
            if (!load) loom::exec::save_sharded(exec, comm, dir.path());
            const auto n = static_cast<std::size_t>(exec.parameter_count());
            std::vector<float> values(n), m(n), v(n);
            exec.gather_state(values, m, v);
            if (comm.rank() == 0) {
                whole = values;
                whole.insert(whole.end(), m.begin(), m.end());
                whole.insert(whole.end(), v.begin(), v.end());
            }
        });
        return whole;
    };
    const auto zero1 = plan_of<loom::DataParallel<>, loom::ZeroShard<1>>();
    const auto zero3 = plan_of<loom::DataParallel<>, loom::ZeroShard<3>>();
    for (const auto& plan : {zero1, zero3}) {
        CAPTURE(plan.zero_stage);
        const std::vector<float> saved = run(loom::cuda_device(0), plan, 2, /*load=*/false);
        REQUIRE(!saved.empty());
        CHECK(differing_bits(run(loom::host_device, zero3, 0, /*load=*/true), saved) == 0);
        CHECK(differing_bits(run(loom::cuda_device(0), zero1, 0, /*load=*/true), saved) == 0);
    }
}

}  // namespace LOOM_TEST_FILE
