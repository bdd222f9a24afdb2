// The tensor-core attention of kernels/cuda/attention_bf16.cuh against its
// host emulation, kernels/host/attention_bf16.hpp, on the same seeded inputs
// (q, k, v and dout from N(0, 1)). Tolerances, per tensor:
//   out:         8e-3 of max |v| for any element, and 1e-4 of it on average.
//                Both sides round the same operands and shift P by multiples
//                of ln 2 (bf16_softmax_shift), so their key tiles (64 keys on
//                the device, up to 128 on the host) round P alike up to a
//                power of two; they differ in the order of the sums, which
//                can move a P across a bf16 midpoint, one bf16 step, at most
//                2^-7 of itself: out, with weights P / l <= 1 on rows of v,
//                then moves by at most 2^-7 max |v|.
//   lse:         1e-5 of max(1, max |lse|): f32 softmax sums on both sides.
//   dq, dk, dv:  8e-3 of max(max |part|, 0.1 max |dqkv|) for any element and
//                1e-4 of it on average, the device's backward run from the
//                host's out and lse (so both form the same D_i): it rounds
//                P = exp(S - lse) and dS at the same reference as the host,
//                so only an f32 difference that crosses a bf16 rounding
//                boundary (rare) moves a term by a bf16 step.
//   And the device must be at least 10 times closer, on average, to the
//   host's bf16 emulation than to the host's f32 kernel: a rounding missing
//   or misplaced on the device fails that.
// Determinism and the stream are checked bit for bit.
//
// Each check runs on both kernel families (kernels/bf16_attention_kernels.hpp):
// the wmma kernels (attention_bf16.cuh; these cases passed on an H200) and the
// mma.sync kernels (attention_mma.cuh; their cases, named "on mma.sync", have
// not yet run on a GPU). Without a device they skip with exit 77.
#include <catch2/catch.hpp>

#include "../support/attention_shape.hpp"
#include "../support/message_of.hpp"
#include "device_support.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/kernels/cuda/attention_bf16_inputs.cuh"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/attention_bf16.hpp"

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
using loom_test::compare_floats;
using loom_test::DeviceArray;
using loom_test::describe;
using loom_test::largest_magnitude;
using loom_test::qkv_part;
using loom_test::message_of;
using loom_test::normal_values;
using loom_test::Stream;
using loom_test::uploads_done;

using Shape = loom_test::AttentionShape;
using loom::kernels::Bf16AttentionKernels;

struct Results {
    std::vector<float> out, lse, dqkv;
};

template <class Forward, class Backward>
Results host_run(Forward forward, Backward backward, const std::vector<float>& qkv, const std::vector<float>& dout,
                 const Shape& s) {
    Results r{std::vector<float>(s.out_size()), std::vector<float>(s.lse_size()), std::vector<float>(s.qkv_size())};
    forward(qkv.data(), r.out.data(), r.lse.data(), s.B, s.T, s.H, s.D);
    backward(qkv.data(), r.out.data(), dout.data(), r.lse.data(), r.dqkv.data(), s.B, s.T, s.H, s.D);
    return r;
}

// The device's forward, then its backward: from `saved`'s out and lse when
// given (the host's, so that both backwards start from the same D_i and P,
// and the comparison isolates the backward), else from its own. Every output
// starts as NaN bytes, so each element must be written.
Results device_run(Bf16AttentionKernels kernels, const std::vector<float>& qkv_values,
                   const std::vector<float>& dout_values, const Shape& s, cudaStream_t stream = nullptr,
                   const Results* saved = nullptr, dev::StreamScratch* scratch = nullptr) {
    DeviceArray<float> qkv(qkv_values), dout(dout_values), out(s.out_size()), lse(s.lse_size()),
        dqkv(s.qkv_size());
    DeviceArray<float> saved_out(saved != nullptr ? saved->out : std::vector<float>(1)),
        saved_lse(saved != nullptr ? saved->lse : std::vector<float>(1));
    out.fill_bytes(0xff);
    lse.fill_bytes(0xff);
    dqkv.fill_bytes(0xff);
    if (stream != nullptr) uploads_done();
    dev::attention_forward_bf16_inputs(qkv.get(), out.get(), lse.get(), s.B, s.T, s.H, s.D, stream, kernels);
    const float* backward_out = saved != nullptr ? saved_out.get() : out.get();
    const float* backward_lse = saved != nullptr ? saved_lse.get() : lse.get();
    dev::attention_backward_bf16_inputs(qkv.get(), backward_out, dout.get(), backward_lse, dqkv.get(), s.B, s.T, s.H,
                                        s.D, stream, scratch, kernels);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    return {out.to_host(), lse.to_host(), dqkv.to_host()};
}

struct Difference {
    double max = 0.0, mean = 0.0;  // NaN anywhere: infinite
};

Difference difference(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    Difference d;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double e = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
        if (!std::isfinite(e)) return {INFINITY, INFINITY};
        d.max = std::max(d.max, e);
        d.mean += e;
    }
    d.mean /= static_cast<double>(std::max<std::size_t>(1, a.size()));
    return d;
}

// Within `bound` everywhere, within `bound` / 80 on average, and at least
// 10 times closer on average to the bf16 emulation than to the f32 kernel.
void check_tensor(const char* what, const std::vector<float>& device, const std::vector<float>& bf16,
                  const std::vector<float>& f32, double bound) {
    const Difference to_bf16 = difference(device, bf16), to_f32 = difference(device, f32);
    INFO(what << ": |device - host bf16| max " << to_bf16.max << " mean " << to_bf16.mean << "; |device - host f32| mean "
              << to_f32.mean << "; bound " << bound);
    CHECK(to_bf16.max <= bound);
    CHECK(to_bf16.mean <= bound / 80);
    CHECK(to_bf16.mean * 10 <= to_f32.mean);
}

const Shape shapes[] = {{1, 7, 1, 4},    {2, 33, 3, 16}, {2, 128, 4, 64}, {1, 257, 2, 32}, {1, 1024, 1, 64},
                        {2, 5, 1, 3},    {1, 45, 2, 33}, {2, 70, 2, 97},  {1, 96, 2, 128}};

void check_matches_emulation(Bf16AttentionKernels kernels) {
    std::uint32_t seed = 1301;
    for (const Shape& s : shapes) {
        INFO(describe(s));
        std::mt19937 rng(seed++);
        const std::vector<float> qkv = normal_values(s.qkv_size(), rng), dout = normal_values(s.out_size(), rng);
        const Results want =
            host_run(host::attention_forward_bf16_inputs, host::attention_backward_bf16_inputs, qkv, dout, s);
        const Results f32 = host_run(host::attention_forward, host::attention_backward, qkv, dout, s);
        const Results got = device_run(kernels, qkv, dout, s, nullptr, &want);
        check_tensor("out", got.out, want.out, f32.out, 8e-3 * largest_magnitude(qkv_part(qkv, s, 2)));
        const Difference lse = difference(got.lse, want.lse);
        INFO("lse: max |device - host| " << lse.max);
        CHECK(lse.max <= 1e-5 * std::max(1.0, largest_magnitude(want.lse)));
        const double whole = largest_magnitude(want.dqkv);
        const char* names[] = {"dq", "dk", "dv"};
        for (std::int64_t part = 0; part < 3; ++part) {
            const std::vector<float> want_part = qkv_part(want.dqkv, s, part);
            check_tensor(names[part], qkv_part(got.dqkv, s, part), want_part, qkv_part(f32.dqkv, s, part),
                         8e-3 * std::max(largest_magnitude(want_part), 0.1 * whole));
        }
    }
}

void check_deterministic(Bf16AttentionKernels kernels) {
    const Shape s{2, 130, 3, 64};
    std::mt19937 rng(1311);
    const std::vector<float> qkv = normal_values(s.qkv_size(), rng), dout = normal_values(s.out_size(), rng);
    const Results first = device_run(kernels, qkv, dout, s);
    const Results again = device_run(kernels, qkv, dout, s);
    Stream stream(cudaStreamNonBlocking);
    dev::StreamScratch scratch;  // the backend's way: a scratch that outlives the call (used by mma's D_i)
    const Results streamed = device_run(kernels, qkv, dout, s, stream.get(), nullptr, &scratch);
    for (const Results* other : {&again, &streamed}) {
        CHECK_NO_MISMATCHES("out", compare_floats(other->out, first.out, false));
        CHECK_NO_MISMATCHES("lse", compare_floats(other->lse, first.lse, false));
        CHECK_NO_MISMATCHES("dqkv", compare_floats(other->dqkv, first.dqkv, false));
    }
}

void check_refusals(Bf16AttentionKernels kernels) {
    std::vector<float> buffer(3 * 4 * 2 * 2, 0.0f), lse(8, 0.0f);
    float* p = buffer.data();
    float* l = lse.data();
    CHECK(message_of([&] { dev::attention_forward_bf16_inputs(p, p, l, 1, 2, 2, 0, nullptr, kernels); }) ==
          message_of([&] { dev::attention_forward(p, p, l, 1, 2, 2, 0); }));
    CHECK(message_of([&] { dev::attention_forward_bf16_inputs(p, p, l, 1, 2, 1, 129, nullptr, kernels); }) ==
          message_of([&] { dev::attention_forward(p, p, l, 1, 2, 1, 129); }));
    CHECK(message_of([&] {
              dev::attention_backward_bf16_inputs(p, p, nullptr, l, p, 1, 2, 2, 2, nullptr, nullptr, kernels);
          }) ==
          "attention_backward: qkv, out, dout, lse and dqkv must all be non-null for B = 1, T = 2");
    CHECK(message_of([&] { dev::attention_backward_bf16_inputs(nullptr, nullptr, nullptr, nullptr, nullptr, 3, 0, 2,
                                                               2, nullptr, nullptr, kernels); }) == "(no error)");
}

}  // namespace

TEST_CASE("CUDA bf16 attention matches the host's bf16 emulation", "[kernels][attention][bf16]") {
    check_matches_emulation(Bf16AttentionKernels::wmma);
}

TEST_CASE("CUDA bf16 attention on mma.sync matches the host's bf16 emulation", "[kernels][attention][bf16]") {
    check_matches_emulation(Bf16AttentionKernels::mma);
}

TEST_CASE("CUDA bf16 attention is deterministic and runs on the caller's stream", "[kernels][attention][bf16]") {
    check_deterministic(Bf16AttentionKernels::wmma);
}

TEST_CASE("CUDA bf16 attention on mma.sync is deterministic and runs on the caller's stream",
          "[kernels][attention][bf16]") {
    check_deterministic(Bf16AttentionKernels::mma);
}

TEST_CASE("CUDA bf16 attention refuses what the f32 kernel refuses, with its words", "[kernels][attention][bf16]") {
    check_refusals(Bf16AttentionKernels::wmma);
}

TEST_CASE("CUDA bf16 attention on mma.sync refuses what the f32 kernel refuses, with its words",
          "[kernels][attention][bf16]") {
    check_refusals(Bf16AttentionKernels::mma);
}
