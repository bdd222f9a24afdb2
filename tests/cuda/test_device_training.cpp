// The GPT on a real GPU: the same layer types, arena and SerialTrainer as on
// the host, with the CUDA backend that cuda_backend.cu registers, compared
// with the host run on the same seed and batches. Host C++ (g++): only the
// backend's translation unit is nvcc's. Tolerances are relative to the
// norm of the host's array: 1e-4 for the loss and gradients after one step
// (f32 throughout; cuBLASLt and the blockwise attention sum in other orders),
// 1e-4 for the losses and parameters after 5 AdamW steps, and for the
// executor's dp 2 on one GPU (run_ranks_on, DeviceThreadWorld behind AnyComm)
// against dp 2 on the host. Skipped with the rest of the CUDA tests when no
// GPU is present.
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/device_ranks.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/exec/executor.hpp"
#include "loom/exec/serial_trainer.hpp"
#include "loom/gpt/model.hpp"
#include "loom/nn/compose.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/message_of.hpp"

namespace {

using loom::Tensor;
namespace nn = loom::nn;

const loom::gpt::Config config{.layers = 2, .width = 64, .heads = 4, .seq = 64, .vocab = 96};
constexpr std::int64_t batch = 4;

struct Batch {
    std::vector<std::int32_t> inputs, targets;
    [[nodiscard]] Tensor input_tensor() const { return Tensor::of(inputs.data(), {batch, config.seq}); }
    [[nodiscard]] Tensor target_tensor() const { return Tensor::of(targets.data(), {batch, config.seq}); }
};

Batch make_batch(std::uint32_t step) {
    Batch b;
    b.inputs.resize(static_cast<std::size_t>(batch * config.seq));
    b.targets.resize(b.inputs.size());
    std::mt19937 rng(100 + step);
    std::uniform_int_distribution<std::int32_t> id(0, static_cast<std::int32_t>(config.vocab) - 1);
    for (std::size_t i = 0; i < b.inputs.size(); ++i) {
        b.inputs[i] = id(rng);
        b.targets[i] = id(rng);
    }
    return b;
}

// ||a - b|| / ||b||.
double relative_difference(const std::vector<float>& a, std::span<const float> b) {
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < b.size(); ++i) {
        diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        norm += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(diff / norm);
}

}  // namespace

TEST_CASE("the CUDA backend is registered and describes device 0", "[device]") {
    REQUIRE(loom::find_device_runtime(loom::DeviceKind::cuda) != nullptr);
    CHECK_NOTHROW(loom::check_device_usable(loom::cuda_device(0)));
    CHECK(!loom::device_runtime(loom::cuda_device(0)).describe(0).empty());
}

TEST_CASE("DeviceBuffer and the tensor copies move bits to the GPU and back unchanged", "[device]") {
    const loom::DeviceBuffer buffer(loom::DType::f32, {1000}, loom::cuda_device(0));
    CHECK(loom::to_host<float>(buffer.tensor()) == std::vector<float>(1000, 0.0f));  // zero-filled
    std::vector<float> values(1000);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::ldexp(static_cast<float>(i) + 0.1f, -7);
    loom::copy_tensor(buffer.tensor(), Tensor::of(values.data(), {1000}));
    CHECK(loom::to_host<float>(buffer.tensor()) == values);
    loom::write_scalar(buffer.tensor(), 42.5f);
    CHECK(loom::read_scalar<float>(buffer.tensor()) == 42.5f);
}

TEST_CASE("the GPT's loss and gradients on the GPU are within 1e-4 of the host's", "[device]") {
    const Batch b = make_batch(0);
    auto host_model = loom::gpt::make_model(config);
    nn::ParamArena host_arena(host_model);
    host_arena.initialize(host_model, 7);
    nn::Context host_ctx;
    const float host_loss = nn::forward_backward(host_model, host_ctx, b.input_tensor(), b.target_tensor());

    auto device_model = loom::gpt::make_model(config);
    nn::ParamArena device_arena(device_model, loom::cuda_device(0));
    device_arena.initialize(device_model, 7);
    CHECK(loom::to_host<float>(device_arena.values_tensor()) ==
          std::vector<float>(host_arena.values().begin(), host_arena.values().end()));  // drawn on the host, bit for bit
    nn::Context device_ctx;
    device_ctx.set_device(loom::cuda_device(0));
    const float device_loss = nn::forward_backward(device_model, device_ctx, b.input_tensor(), b.target_tensor());
    CHECK(std::abs(device_loss - host_loss) <= 1e-4f * std::abs(host_loss));
    CHECK(relative_difference(loom::to_host<float>(device_arena.grads_tensor()), host_arena.grads()) < 1e-4);
}

TEST_CASE("SerialTrainer on the GPU follows the host run for 5 AdamW steps within 1e-4", "[device]") {
    const loom::optim::AdamWConfig adamw{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
    auto host_model = loom::gpt::make_model(config);
    auto device_model = loom::gpt::make_model(config);
    loom::exec::SerialTrainer host(host_model, loom::host_device, {.micro_batches = 2, .adamw = adamw});
    loom::exec::SerialTrainer gpu(device_model, loom::cuda_device(0), {.micro_batches = 2, .adamw = adamw});
    host.initialize(11);
    gpu.initialize(11);
    for (std::uint32_t step = 0; step < 5; ++step) {
        CAPTURE(step);
        const Batch b = make_batch(step);
        const float host_loss = host.step(b.input_tensor(), b.target_tensor(), 1e-3f);
        const float gpu_loss = gpu.step(b.input_tensor(), b.target_tensor(), 1e-3f);
        CHECK(std::abs(gpu_loss - host_loss) <= 1e-4f * std::abs(host_loss));
    }
    const auto n = static_cast<std::size_t>(host.parameter_count());
    std::vector<float> host_values(n), gpu_values(n), m(n), v(n);
    host.gather_state(host_values, m, v);
    gpu.gather_state(gpu_values, m, v);
    CHECK(relative_difference(gpu_values, host_values) < 1e-4);
}

TEST_CASE("a host checkpoint's state continues on the GPU", "[device]") {
    const loom::optim::AdamWConfig adamw{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
    auto host_model = loom::gpt::make_model(config);
    loom::exec::SerialTrainer host(host_model, loom::host_device, {.adamw = adamw});
    host.initialize(5);
    const Batch first = make_batch(0), second = make_batch(1);
    (void)host.step(first.input_tensor(), first.target_tensor(), 1e-3f);
    const auto n = static_cast<std::size_t>(host.parameter_count());
    std::vector<float> values(n), m(n), v(n);
    host.gather_state(values, m, v);

    auto device_model = loom::gpt::make_model(config);
    loom::exec::SerialTrainer gpu(device_model, loom::cuda_device(0), {.adamw = adamw});
    gpu.load_state(values, m, v, host.optimizer_steps());
    std::vector<float> back(n), back_m(n), back_v(n);
    gpu.gather_state(back, back_m, back_v);
    CHECK(back == values);  // the round trip through the GPU is exact
    const float host_loss = host.step(second.input_tensor(), second.target_tensor(), 1e-3f);
    const float gpu_loss = gpu.step(second.input_tensor(), second.target_tensor(), 1e-3f);
    CHECK(std::abs(gpu_loss - host_loss) <= 1e-4f * std::abs(host_loss));
    CHECK(gpu.optimizer_steps() == 2);
}

TEST_CASE("a CUDA device index past the last is refused, naming how many there are", "[device]") {
    int count = 0;
    REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
    auto model = loom::gpt::make_model(config);
    const std::string message = loom_test::message_of([&] { nn::ParamArena arena(model, loom::cuda_device(count)); });
    CHECK(message.find("cuda:" + std::to_string(count) + " does not exist: this machine has " + std::to_string(count) +
                       " CUDA device") == 0);
}

TEST_CASE("the Executor's dp 2 on one GPU (run_ranks_on, AnyComm) follows the host's dp 2 within 1e-4", "[device]") {
    const loom::optim::AdamWConfig adamw{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0};
    const auto train = [&](loom::Device where, std::vector<float>& losses, std::vector<float>& values) {
        loom::comm::run_ranks_on(where, 2, [&](loom::comm::AnyComm& comm) {
            auto model = loom::gpt::make_model(config);
            loom::exec::Executor<loom::comm::AnyComm> exec(model, comm, loom::exec::ExecutionPlan{},
                                                           {.micro_batches = 2, .adamw = adamw, .device = where});
            exec.initialize(13);
            std::vector<float> mine;
            for (std::uint32_t step = 0; step < 4; ++step) {
                const Batch b = make_batch(step);
                const std::int64_t half = batch / 2, first = comm.rank() * half;
                mine.push_back(exec.step(b.input_tensor().slice(0, first, first + half),
                                         b.target_tensor().slice(0, first, first + half), 1e-3f));
            }
            std::vector<float> gathered(static_cast<std::size_t>(exec.parameter_count())), m(gathered.size()),
                v(gathered.size());
            exec.gather_state(gathered, m, v);
            if (comm.rank() == 0) {
                losses = mine;
                values = gathered;
            }
        });
    };
    std::vector<float> host_losses, host_values, gpu_losses, gpu_values;
    train(loom::host_device, host_losses, host_values);
    train(loom::cuda_device(0), gpu_losses, gpu_values);
    REQUIRE(gpu_losses.size() == host_losses.size());
    for (std::size_t i = 0; i < host_losses.size(); ++i) {
        CAPTURE(i);
        CHECK(std::abs(gpu_losses[i] - host_losses[i]) <= 1e-4f * std::abs(host_losses[i]));
    }
    CHECK(relative_difference(gpu_values, host_values) < 1e-4);
}
