// The CUDA block kernels of ring and Ulysses attention
// (kernels/cuda/attention_blocks.cuh) against their host twins, on the same
// seeded inputs: one pair forward (out and lse), the merge of two blocks, and
// one pair's gradients added into nonzero dq, dk and dv. The device kernels
// sum each dot product in order and use expf, the host tiles through the BLAS
// and its own exp, so they agree to f32 rounding: 2e-5 relative (against
// max(|host|, 1)) for out and lse, 1e-4 for the gradients, which sum a row's
// products twice over. Both masks, q and k/v of different strides (ring
// attention's 3C and 2C), and Tq != Tk for the full mask. The bf16 forms
// against the host's bf16 emulation (kernels/host/attention_blocks_bf16.hpp),
// with the tolerances stated at their test. None of this has run on a GPU
// yet: it compiles, and skips with exit 77 without a device.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "../support/message_of.hpp"
#include "device_support.hpp"
#include "loom/kernels/cuda/attention_blocks.cuh"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/attention_blocks_bf16.hpp"

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using host::BlockMask;
using loom_test::compare_relative;
using loom_test::DeviceArray;
using loom_test::Stream;
using loom_test::uniform;
using loom_test::uploads_done;

struct BlockShape {
    std::int64_t B, Tq, Tk, H, D;
    BlockMask mask;
};
constexpr BlockShape block_shapes[] = {
    {2, 5, 5, 2, 8, BlockMask::causal}, {2, 5, 5, 2, 8, BlockMask::full}, {1, 7, 4, 3, 16, BlockMask::full},
    {3, 33, 33, 2, 64, BlockMask::causal}, {1, 20, 36, 1, 128, BlockMask::full},
    {1, 40, 150, 2, 32, BlockMask::full}};  // keys across the host's 128-key tiles

// One precision's block forward and backward, on each side (the merge has no products).
struct Kernels {
    decltype(&host::attention_block_forward) host_forward;
    decltype(&host::attention_block_backward) host_backward;
    decltype(&dev::attention_block_forward) device_forward;
    decltype(&dev::attention_block_backward) device_backward;
};
constexpr Kernels f32_kernels{host::attention_block_forward, host::attention_block_backward,
                              dev::attention_block_forward, dev::attention_block_backward};
constexpr Kernels bf16_kernels{host::attention_block_forward_bf16_inputs, host::attention_block_backward_bf16_inputs,
                               dev::attention_block_forward_bf16_inputs, dev::attention_block_backward_bf16_inputs};

// One shape's inputs: q (stride 3C), two key/value blocks (stride 2C), the
// output's gradient, and the nonzero dq and dk|dv the backward adds into.
struct Inputs {
    std::vector<float> q, kv, kv2, dout, dq, dkv;
    Inputs(const BlockShape& s, std::mt19937& rng) {
        const std::int64_t C = s.H * s.D;
        q = uniform(static_cast<std::size_t>(s.B * s.Tq * 3 * C), -1.0f, 1.0f, rng);
        kv = uniform(static_cast<std::size_t>(s.B * s.Tk * 2 * C), -1.0f, 1.0f, rng);
        kv2 = uniform(kv.size(), -1.0f, 1.0f, rng);
        dout = uniform(static_cast<std::size_t>(s.B * s.Tq * C), -1.0f, 1.0f, rng);
        dq = uniform(q.size(), -1.0f, 1.0f, rng);
        dkv = uniform(kv.size(), -1.0f, 1.0f, rng);
    }
};

// What each step leaves: the first block's out and lse, both merged, and the
// first block's gradients (from the merged out and lse) added into dq, dk|dv.
struct Results {
    std::vector<float> out, lse, merged_out, merged_lse, dq, dkv;
};

Results host_blocks(const Kernels& k, const BlockShape& s, const Inputs& in) {
    const auto [B, Tq, Tk, H, D, mask] = s;
    const std::int64_t C = H * D, ld_q = 3 * C, ld_kv = 2 * C;
    const std::size_t out_n = static_cast<std::size_t>(B * Tq * C), lse_n = static_cast<std::size_t>(B * H * Tq);
    Results r{std::vector<float>(out_n), std::vector<float>(lse_n), {}, {}, in.dq, in.dkv};
    std::vector<float> out2(out_n), lse2(lse_n);
    k.host_forward(in.q.data(), ld_q, in.kv.data(), in.kv.data() + C, ld_kv, r.out.data(), r.lse.data(), B, Tq, Tk, H,
                   D, mask);
    k.host_forward(in.q.data(), ld_q, in.kv2.data(), in.kv2.data() + C, ld_kv, out2.data(), lse2.data(), B, Tq, Tk, H,
                   D, mask);
    r.merged_out = r.out;
    r.merged_lse = r.lse;
    host::attention_merge(r.merged_out.data(), r.merged_lse.data(), out2.data(), lse2.data(), B, Tq, H, D);
    k.host_backward(in.q.data(), ld_q, in.kv.data(), in.kv.data() + C, ld_kv, r.merged_out.data(), in.dout.data(),
                    r.merged_lse.data(), r.dq.data(), r.dkv.data(), r.dkv.data() + C, B, Tq, Tk, H, D, mask);
    return r;
}

// The same steps on the device; its backward reads the host's merged out and
// lse (`host`), so that both backwards start from the same D_i and P.
Results device_blocks(const Kernels& k, const BlockShape& s, const Inputs& in, const Results& host_results,
                      cudaStream_t stream) {
    const auto [B, Tq, Tk, H, D, mask] = s;
    const std::int64_t C = H * D, ld_q = 3 * C, ld_kv = 2 * C;
    const std::size_t out_n = static_cast<std::size_t>(B * Tq * C), lse_n = static_cast<std::size_t>(B * H * Tq);
    DeviceArray<float> q(in.q), kv(in.kv), kv2(in.kv2), out(out_n), lse(lse_n), out2(out_n), lse2(lse_n);
    DeviceArray<float> dout(in.dout), dq(in.dq), dkv(in.dkv), merged_out(host_results.merged_out),
        merged_lse(host_results.merged_lse);
    uploads_done();
    Results r;
    k.device_forward(q.get(), ld_q, kv.get(), kv.get() + C, ld_kv, out.get(), lse.get(), B, Tq, Tk, H, D, mask, stream);
    k.device_forward(q.get(), ld_q, kv2.get(), kv2.get() + C, ld_kv, out2.get(), lse2.get(), B, Tq, Tk, H, D, mask,
                     stream);
    r.out = out.to_host();
    r.lse = lse.to_host();
    dev::attention_merge(out.get(), lse.get(), out2.get(), lse2.get(), B, Tq, H, D, stream);
    r.merged_out = out.to_host();
    r.merged_lse = lse.to_host();
    k.device_backward(q.get(), ld_q, kv.get(), kv.get() + C, ld_kv, merged_out.get(), dout.get(), merged_lse.get(),
                      dq.get(), dkv.get(), dkv.get() + C, B, Tq, Tk, H, D, mask, stream);
    r.dq = dq.to_host();
    r.dkv = dkv.to_host();
    return r;
}

// Each result within its tolerance of the host's, relative to max(|host|, 1):
// `values` for out and the merged out, `gradients` for dq and dk|dv; lse,
// f32 sums on both sides at either precision, within 2e-5.
void check_close(const Results& got, const Results& want, double values, double gradients) {
    CHECK_NO_MISMATCHES("out", compare_relative(got.out, want.out, values));
    CHECK_NO_MISMATCHES("lse", compare_relative(got.lse, want.lse, 2e-5));
    CHECK_NO_MISMATCHES("merged out", compare_relative(got.merged_out, want.merged_out, values));
    CHECK_NO_MISMATCHES("merged lse", compare_relative(got.merged_lse, want.merged_lse, 2e-5));
    CHECK_NO_MISMATCHES("dq", compare_relative(got.dq, want.dq, gradients));
    CHECK_NO_MISMATCHES("dk and dv", compare_relative(got.dkv, want.dkv, gradients));
}

double mean_difference(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double total = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) total += std::fabs(static_cast<double>(a[i]) - b[i]);
    return total / static_cast<double>(std::max<std::size_t>(1, a.size()));
}

}  // namespace

TEST_CASE("cuda::attention_block_forward, merge and backward follow the host's", "[kernels][attention]") {
    Stream stream(cudaStreamNonBlocking);
    std::mt19937 rng(2201);
    for (const BlockShape& s : block_shapes) {
        CAPTURE(s.B, s.Tq, s.Tk, s.H, s.D, static_cast<int>(s.mask));
        const Inputs in(s, rng);
        const Results want = host_blocks(f32_kernels, s, in);
        const Results got = device_blocks(f32_kernels, s, in, want, stream.get());
        check_close(got, want, 2e-5, 1e-4);
    }
}

TEST_CASE("cuda bf16 block attention follows the host's bf16 emulation", "[kernels][attention][bf16]") {
    // Both round the same operands and shift P by multiples of ln 2
    // (bf16_softmax_shift), so they differ by the order of the sums (and expf
    // against the host's exp), except where that moves a P or dS across a
    // bf16 midpoint: one bf16 step of one term, at most 2^-7 of it, so within
    // 8e-3 (relative to max(|host|, 1), for inputs in [-1, 1]).
    // The lse is f32 on both sides (2e-5). And the device must be at least 10
    // times closer, on average, to the bf16 emulation than to the f32 kernels:
    // a rounding missing or misplaced on the device fails that.
    Stream stream(cudaStreamNonBlocking);
    std::mt19937 rng(2203);
    for (const BlockShape& s : block_shapes) {
        CAPTURE(s.B, s.Tq, s.Tk, s.H, s.D, static_cast<int>(s.mask));
        const Inputs in(s, rng);
        const Results want = host_blocks(bf16_kernels, s, in);
        const Results f32 = host_blocks(f32_kernels, s, in);
        const Results got = device_blocks(bf16_kernels, s, in, want, stream.get());
        check_close(got, want, 8e-3, 8e-3);
        for (const auto member : {&Results::out, &Results::dq, &Results::dkv}) {
            const double to_bf16 = mean_difference(got.*member, want.*member);
            const double to_f32 = mean_difference(got.*member, f32.*member);
            INFO("mean |device - host bf16| " << to_bf16 << ", mean |device - host f32| " << to_f32);
            CHECK(to_bf16 * 10 <= to_f32);
        }
    }
}

TEST_CASE("cuda::attention block kernels refuse what the host refuses, and heads past 128", "[kernels][attention]") {
    DeviceArray<float> buffer(std::size_t{4096});
    uploads_done();
    float* p = buffer.get();
    CHECK(loom_test::message_of([&] {
              dev::attention_block_forward(p, 8, p, p, 8, p, p, 1, 4, 3, 1, 8, BlockMask::causal);
          }) == "attention_block_forward: BlockMask::causal needs Tq == Tk (the same positions), got Tq = 4, Tk = 3; "
                "use BlockMask::full for a key block before the queries");
    CHECK(loom_test::message_of([&] {
              dev::attention_block_backward(p, 256, p, p, 256, p, p, p, p, p, p, 1, 2, 2, 1, 256, BlockMask::full);
          }) == "attention_block_backward on the device: head size D = 256 is more than the 128 it supports; use D "
                "<= 128 or the host kernel");
}
