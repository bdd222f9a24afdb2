// The tensor-core attention that --matmul bf16 runs on a GPU
// (kernels/cuda/attention_bf16_inputs.cuh: the mma.sync kernels of
// attention_mma.cuh) against its host emulation, kernels/host/attention_bf16.hpp,
// on the same seeded inputs (q, k, v and dout from N(0, 1)), with the
// tolerances of tests/support/attention_bf16_check.hpp (which says why they
// are what they are). Determinism and the stream are checked bit for bit.
// Passed on an H200 (run 5). Without a device they skip with exit 77.
//
// The cases keep their names ("on mma.sync") from when the wmma kernels,
// now dev/kernel_lab/attention_wmma.cuh, ran the same checks beside them:
// the run records in docs/cuda.md name them so. The lab's kernels are tested
// on simulated warps (tests/simulated/test_attention_bf16_simulated.cpp).
#include <catch2/catch.hpp>

#include "../support/attention_bf16_check.hpp"
#include "../support/attention_shape.hpp"
#include "../support/message_of.hpp"
#include "device_support.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/kernels/cuda/attention_bf16_inputs.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_test::AttentionResults;
using loom_test::compare_floats;
using loom_test::DeviceArray;
using loom_test::describe;
using loom_test::message_of;
using loom_test::normal_values;
using loom_test::Stream;
using loom_test::uploads_done;

using Shape = loom_test::AttentionShape;

// The device's forward, then its backward: from `saved`'s out and lse when
// given (the host's, so that both backwards start from the same D_i and P,
// and the comparison isolates the backward), else from its own. Every output
// starts as NaN bytes, so each element must be written.
AttentionResults device_run(const std::vector<float>& qkv_values, const std::vector<float>& dout_values, const Shape& s,
                            cudaStream_t stream = nullptr, const AttentionResults* saved = nullptr,
                            dev::StreamScratch* scratch = nullptr) {
    DeviceArray<float> qkv(qkv_values), dout(dout_values), out(s.out_size()), lse(s.lse_size()),
        dqkv(s.qkv_size());
    DeviceArray<float> saved_out(saved != nullptr ? saved->out : std::vector<float>(1)),
        saved_lse(saved != nullptr ? saved->lse : std::vector<float>(1));
    out.fill_bytes(0xff);
    lse.fill_bytes(0xff);
    dqkv.fill_bytes(0xff);
    if (stream != nullptr) uploads_done();
    dev::attention_forward_bf16_inputs(qkv.get(), out.get(), lse.get(), s.B, s.T, s.H, s.D, stream);
    const float* backward_out = saved != nullptr ? saved_out.get() : out.get();
    const float* backward_lse = saved != nullptr ? saved_lse.get() : lse.get();
    dev::attention_backward_bf16_inputs(qkv.get(), backward_out, dout.get(), backward_lse, dqkv.get(), s.B, s.T, s.H,
                                        s.D, stream, scratch);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    return {out.to_host(), lse.to_host(), dqkv.to_host()};
}

void check_matches_emulation() {
    std::uint32_t seed = 1301;
    for (const Shape& s : loom_test::bf16_attention_shapes) {
        INFO(describe(s));
        std::mt19937 rng(seed++);
        const std::vector<float> qkv = normal_values(s.qkv_size(), rng), dout = normal_values(s.out_size(), rng);
        const AttentionResults want = loom_test::host_attention(host::attention_forward_bf16_inputs,
                                                                host::attention_backward_bf16_inputs, qkv, dout, s);
        const AttentionResults f32 =
            loom_test::host_attention(host::attention_forward, host::attention_backward, qkv, dout, s);
        loom_test::check_bf16_attention(device_run(qkv, dout, s, nullptr, &want), want, f32, qkv, s);
    }
}

void check_deterministic() {
    const Shape s{2, 130, 3, 64};
    std::mt19937 rng(1311);
    const std::vector<float> qkv = normal_values(s.qkv_size(), rng), dout = normal_values(s.out_size(), rng);
    const AttentionResults first = device_run(qkv, dout, s);
    const AttentionResults again = device_run(qkv, dout, s);
    Stream stream(cudaStreamNonBlocking);
    dev::StreamScratch scratch;  // the backend's way: a scratch that outlives the call (it holds D_i)
    const AttentionResults streamed = device_run(qkv, dout, s, stream.get(), nullptr, &scratch);
    for (const AttentionResults* other : {&again, &streamed}) {
        CHECK_NO_MISMATCHES("out", compare_floats(other->out, first.out, false));
        CHECK_NO_MISMATCHES("lse", compare_floats(other->lse, first.lse, false));
        CHECK_NO_MISMATCHES("dqkv", compare_floats(other->dqkv, first.dqkv, false));
    }
}

void check_refusals() {
    std::vector<float> buffer(3 * 4 * 2 * 2, 0.0f), lse(8, 0.0f);
    float* p = buffer.data();
    float* l = lse.data();
    CHECK(message_of([&] { dev::attention_forward_bf16_inputs(p, p, l, 1, 2, 2, 0); }) ==
          message_of([&] { dev::attention_forward(p, p, l, 1, 2, 2, 0); }));
    CHECK(message_of([&] { dev::attention_forward_bf16_inputs(p, p, l, 1, 2, 1, 129); }) ==
          message_of([&] { dev::attention_forward(p, p, l, 1, 2, 1, 129); }));
    CHECK(message_of([&] { dev::attention_backward_bf16_inputs(p, p, nullptr, l, p, 1, 2, 2, 2); }) ==
          "attention_backward: qkv, out, dout, lse and dqkv must all be non-null for B = 1, T = 2");
    CHECK(message_of([&] {
              dev::attention_backward_bf16_inputs(nullptr, nullptr, nullptr, nullptr, nullptr, 3, 0, 2, 2);
          }) == "(no error)");
}

}  // namespace

TEST_CASE("CUDA bf16 attention on mma.sync matches the host's bf16 emulation", "[kernels][attention][bf16]") {
    check_matches_emulation();
}

TEST_CASE("CUDA bf16 attention on mma.sync is deterministic and runs on the caller's stream",
          "[kernels][attention][bf16]") {
    check_deterministic();
}

TEST_CASE("CUDA bf16 attention on mma.sync refuses what the f32 kernel refuses, with its words",
          "[kernels][attention][bf16]") {
    check_refusals();
}
