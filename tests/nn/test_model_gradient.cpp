// exec::ModelGradient, the gradient oracle OptEx runs on a device: on the
// fenced test device it gives the host's loss and gradient bit for bit at a
// host point, loads and stores the point exactly, and names a point of the
// wrong size; OptEx<AdamW> with 2 workers whose gradients come from the
// device equals the same run on the host bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loom/exec/model_gradient.hpp"
#include "loom/gpt/model.hpp"
#include "support/device_training.hpp"
#include "support/fenced_device.hpp"
#include "support/message_of.hpp"
#include "support/optex_runs.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::exec::ModelGradient;
using loom_test::differing_bits;

const loom::gpt::Config tiny{.layers = 2, .width = 32, .heads = 2, .seq = 16, .vocab = 64};

std::vector<float> start_point(std::int64_t n) { return loom_test::optex_runs::start_point(tiny, n); }

}  // namespace

TEST_CASE("ModelGradient on a device gives the host's loss and gradient bit for bit", "[device][optex]") {
    loom_test::FencedDevice device;
    auto host_model = loom::gpt::make_model(tiny), device_model = loom::gpt::make_model(tiny);
    ModelGradient<loom::gpt::Model> host(host_model, loom::host_device);
    ModelGradient<loom::gpt::Model> on_device(device_model, loom::cuda_device(0));
    REQUIRE(on_device.size() == host.size());
    const auto x = start_point(host.size());
    const loom_test::TokenBatch batch(4, tiny.seq, tiny.vocab, 3);
    std::vector<float> g_host(x.size()), g_device(x.size(), -1.0f);
    const float loss_host = host(x, batch.input_tensor(), batch.target_tensor(), g_host);
    const float loss_device = on_device(x, batch.input_tensor(), batch.target_tensor(), g_device);
    CHECK(differing_bits(std::span(&loss_device, 1), std::span(&loss_host, 1)) == 0);
    CHECK(differing_bits(g_device, g_host) == 0);
    CHECK(std::count(g_host.begin(), g_host.end(), 0.0f) < static_cast<std::ptrdiff_t>(g_host.size() / 2));
    CHECK(device.calls("gemm") > 0);  // the pass ran on the device
    std::vector<float> back(x.size());
    on_device.store(back);
    CHECK(back == x);
    // A second call starts from zero gradients, not from the first call's.
    std::vector<float> again(x.size());
    (void)on_device(x, batch.input_tensor(), batch.target_tensor(), again);
    CHECK(differing_bits(again, g_device) == 0);

    const std::span<const float> short_point(x.data(), x.size() - 1);
    const auto n = std::to_string(x.size());
    CHECK(loom_test::message_of([&] { (void)on_device(short_point, batch.input_tensor(), batch.target_tensor(), g_device); }) ==
          "ModelGradient: the point has " + std::to_string(x.size() - 1) + " elements but the model has " + n +
              " parameters");
    CHECK(loom_test::message_of([&] { on_device.store(std::span(back).first(3)); }) ==
          "ModelGradient: the output has 3 elements but the model has " + n + " parameters");
}

TEST_CASE("OptEx with 2 workers computing gradients on a device equals the host run bit for bit", "[device][optex]") {
    loom_test::FencedDevice device;
    const auto run = [](loom::Device where) { return loom_test::optex_runs::run(tiny, where); };
    const auto on_host = run(loom::host_device);
    const int gemms_before = device.calls("gemm");
    const auto on_device = run(loom::cuda_device(0));
    CHECK(device.calls("gemm") > gemms_before);
    CHECK(differing_bits(on_device, on_host) == 0);
    const std::vector<float> params(on_host.begin(), on_host.end() - 3);
    CHECK(params != start_point(static_cast<std::int64_t>(params.size())));  // it moved
}

}  // namespace LOOM_TEST_FILE
