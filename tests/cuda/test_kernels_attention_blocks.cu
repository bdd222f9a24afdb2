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

#include <cstddef>
#include <cstdint>
#include <random>

#include "../support/attention_block_case.hpp"
#include "../support/message_of.hpp"
#include "device_support.hpp"
#include "loom/kernels/cuda/attention_blocks.cuh"
#include "loom/kernels/host/attention_blocks.hpp"

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using host::BlockMask;
using loom_test::DeviceArray;
using loom_test::Stream;
using loom_test::uploads_done;
using loom_test::block_shapes;
using loom_test::BlockInputs;
using loom_test::BlockResults;
using loom_test::BlockShape;
using loom_test::host_blocks;

// One precision's block forward and backward on the device (the merge has no products).
struct Kernels {
    decltype(&dev::attention_block_forward) forward;
    decltype(&dev::attention_block_backward) backward;
};
constexpr Kernels f32_kernels{dev::attention_block_forward, dev::attention_block_backward};
constexpr Kernels bf16_kernels{dev::attention_block_forward_bf16_inputs, dev::attention_block_backward_bf16_inputs};

// The steps of host_blocks on the device; its backward reads the host's
// merged out and lse (`host_results`), so that both backwards start from the
// same D_i and P.
BlockResults device_blocks(const Kernels& k, const BlockShape& s, const BlockInputs& in,
                           const BlockResults& host_results, cudaStream_t stream) {
    const auto [B, Tq, Tk, H, D, mask] = s;
    const std::int64_t C = H * D, ld_q = 3 * C, ld_kv = 2 * C;
    const std::size_t out_n = static_cast<std::size_t>(B * Tq * C), lse_n = static_cast<std::size_t>(B * H * Tq);
    DeviceArray<float> q(in.q), kv(in.kv), kv2(in.kv2), out(out_n), lse(lse_n), out2(out_n), lse2(lse_n);
    DeviceArray<float> dout(in.dout), dq(in.dq), dkv(in.dkv), merged_out(host_results.merged_out),
        merged_lse(host_results.merged_lse);
    uploads_done();
    BlockResults r;
    k.forward(q.get(), ld_q, kv.get(), kv.get() + C, ld_kv, out.get(), lse.get(), B, Tq, Tk, H, D, mask, stream);
    k.forward(q.get(), ld_q, kv2.get(), kv2.get() + C, ld_kv, out2.get(), lse2.get(), B, Tq, Tk, H, D, mask, stream);
    r.out = out.to_host();
    r.lse = lse.to_host();
    dev::attention_merge(out.get(), lse.get(), out2.get(), lse2.get(), B, Tq, H, D, stream);
    r.merged_out = out.to_host();
    r.merged_lse = lse.to_host();
    k.backward(q.get(), ld_q, kv.get(), kv.get() + C, ld_kv, merged_out.get(), dout.get(), merged_lse.get(), dq.get(),
               dkv.get(), dkv.get() + C, B, Tq, Tk, H, D, mask, stream);
    r.dq = dq.to_host();
    r.dkv = dkv.to_host();
    return r;
}

}  // namespace

TEST_CASE("cuda::attention_block_forward, merge and backward follow the host's", "[kernels][attention]") {
    Stream stream(cudaStreamNonBlocking);
    std::mt19937 rng(2201);
    for (const BlockShape& s : block_shapes) {
        CAPTURE(s.B, s.Tq, s.Tk, s.H, s.D, static_cast<int>(s.mask));
        const BlockInputs in(s, rng);
        const BlockResults want = host_blocks<false>(s, in);
        const BlockResults got = device_blocks(f32_kernels, s, in, want, stream.get());
        loom_test::check_blocks_close(got, want, 2e-5, 1e-4);
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
        const BlockInputs in(s, rng);
        const BlockResults want = host_blocks<true>(s, in);
        const BlockResults f32 = host_blocks<false>(s, in);
        const BlockResults got = device_blocks(bf16_kernels, s, in, want, stream.get());
        loom_test::check_blocks_close(got, want, 8e-3, 8e-3);
        loom_test::check_closer_to_bf16(got, want, f32);
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
