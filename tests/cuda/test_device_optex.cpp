// OptEx's gradient oracle on a real GPU: exec::ModelGradient copies the point
// OptEx picked to cuda:0, runs the GPT's forward and backward there on the
// calling thread's stream, and copies the gradient back. Against the same on
// the host: the loss and gradient within 1e-4 (relative to the host's norm;
// cuBLASLt and the blockwise attention sum in other orders), and OptEx with
// 2 workers, each a rank thread with its own ModelGradient on the one GPU,
// within 1e-4 of the host run after 3 iterations (the runs of
// tests/support/optex_runs.hpp). The fenced-device twin of these tests
// (tests/nn/test_model_gradient.cpp) checks the same bit for bit where the
// kernels are the host's. Host C++ (g++): only the backend's
// translation unit is nvcc's. Skipped with the rest when no GPU is present.
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/core/device_runtime.hpp"
#include "loom/exec/model_gradient.hpp"
#include "loom/gpt/model.hpp"
#include "support/device_training.hpp"
#include "support/optex_runs.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::exec::ModelGradient;
using loom_test::relative_difference;

const loom::gpt::Config tiny{.layers = 2, .width = 64, .heads = 4, .seq = 32, .vocab = 96};

std::vector<float> start_point(std::int64_t n) { return loom_test::optex_runs::start_point(tiny, n); }

}  // namespace

TEST_CASE("ModelGradient on the GPU gives the host's loss and gradient within 1e-4", "[device][optex]") {
    auto host_model = loom::gpt::make_model(tiny), device_model = loom::gpt::make_model(tiny);
    ModelGradient<loom::gpt::Model> host(host_model, loom::host_device);
    ModelGradient<loom::gpt::Model> gpu(device_model, loom::cuda_device(0));
    REQUIRE(gpu.size() == host.size());
    const auto x = start_point(host.size());
    const loom_test::TokenBatch batch(4, tiny.seq, tiny.vocab, 3);
    std::vector<float> g_host(x.size()), g_gpu(x.size(), -1.0f);
    const float loss_host = host(x, batch.input_tensor(), batch.target_tensor(), g_host);
    const float loss_gpu = gpu(x, batch.input_tensor(), batch.target_tensor(), g_gpu);
    CHECK(std::abs(loss_gpu - loss_host) <= 1e-4f * std::abs(loss_host));
    CHECK(relative_difference(g_gpu, g_host) < 1e-4);
    std::vector<float> back(x.size());
    gpu.store(back);
    CHECK(back == x);  // the point went to the GPU and came back exactly
    // A second call starts from zero gradients, not from the first call's: the same bits again.
    std::vector<float> again(x.size());
    (void)gpu(x, batch.input_tensor(), batch.target_tensor(), again);
    CHECK(again == g_gpu);
}

TEST_CASE("OptEx with 2 workers computing gradients on one GPU follows the host run within 1e-4", "[device][optex]") {
    const auto on_host = loom_test::optex_runs::run(tiny, loom::host_device);
    const auto on_gpu = loom_test::optex_runs::run(tiny, loom::cuda_device(0));
    REQUIRE(on_gpu.size() == on_host.size());
    const std::span<const float> host_losses(on_host.end() - 3, on_host.end()), gpu_losses(on_gpu.end() - 3, on_gpu.end());
    for (std::size_t t = 0; t < 3; ++t) {
        CAPTURE(t);
        CHECK(std::abs(gpu_losses[t] - host_losses[t]) <= 1e-4f * std::abs(host_losses[t]));
    }
    const std::span<const float> host_params(on_host.begin(), on_host.end() - 3), gpu_params(on_gpu.begin(), on_gpu.end() - 3);
    CHECK(relative_difference(gpu_params, host_params) < 1e-4);
    const auto x0 = start_point(static_cast<std::int64_t>(host_params.size()));
    CHECK(relative_difference(host_params, x0) > 1e-4);  // it moved, by more than the tolerance
}

TEST_CASE("the CUDA runtime counts the devices cudaGetDeviceCount sees", "[device]") {
    int count = 0;
    REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
    CHECK(loom::device_runtime(loom::cuda_device(0)).device_count() == count);
}

}  // namespace LOOM_TEST_FILE
