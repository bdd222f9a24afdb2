// The CUDA block kernels of ring and Ulysses attention
// (kernels/cuda/attention_blocks.cuh) against their host twins, on the same
// seeded inputs: one pair forward (out and lse), the merge of two blocks, and
// one pair's gradients added into nonzero dq, dk and dv. The device kernels
// sum each dot product in order and use expf, the host tiles through the BLAS
// and its own exp, so they agree to f32 rounding: 2e-5 relative (against
// max(|host|, 1)) for out and lse, 1e-4 for the gradients, which sum a row's
// products twice over. Both masks, q and k/v of different strides (ring
// attention's 3C and 2C), and Tq != Tk for the full mask.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

#include "../support/message_of.hpp"
#include "device_support.hpp"
#include "loom/kernels/cuda/attention_blocks.cuh"
#include "loom/kernels/host/attention_blocks.hpp"

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
    {3, 33, 33, 2, 64, BlockMask::causal}, {1, 20, 36, 1, 128, BlockMask::full}};

}  // namespace

TEST_CASE("cuda::attention_block_forward, merge and backward follow the host's", "[kernels][attention]") {
    Stream stream(cudaStreamNonBlocking);
    std::mt19937 rng(2201);
    for (const auto [B, Tq, Tk, H, D, mask] : block_shapes) {
        CAPTURE(B, Tq, Tk, H, D, static_cast<int>(mask));
        const std::int64_t C = H * D, ld_q = 3 * C, ld_kv = 2 * C;
        const auto q = uniform(static_cast<std::size_t>(B * Tq * ld_q), -1.0f, 1.0f, rng);
        const auto kv = uniform(static_cast<std::size_t>(B * Tk * ld_kv), -1.0f, 1.0f, rng);
        const auto kv2 = uniform(kv.size(), -1.0f, 1.0f, rng);
        const std::size_t out_n = static_cast<std::size_t>(B * Tq * C), lse_n = static_cast<std::size_t>(B * H * Tq);

        // Forward of two key blocks, then the second merged into the first.
        std::vector<float> out(out_n), lse(lse_n), out2(out_n), lse2(lse_n);
        host::attention_block_forward(q.data(), ld_q, kv.data(), kv.data() + C, ld_kv, out.data(), lse.data(), B, Tq,
                                      Tk, H, D, mask);
        host::attention_block_forward(q.data(), ld_q, kv2.data(), kv2.data() + C, ld_kv, out2.data(), lse2.data(), B,
                                      Tq, Tk, H, D, mask);
        DeviceArray<float> d_q(q), d_kv(kv), d_kv2(kv2), d_out(out_n), d_lse(lse_n), d_out2(out_n), d_lse2(lse_n);
        uploads_done();
        dev::attention_block_forward(d_q.get(), ld_q, d_kv.get(), d_kv.get() + C, ld_kv, d_out.get(), d_lse.get(), B,
                                     Tq, Tk, H, D, mask, stream.get());
        dev::attention_block_forward(d_q.get(), ld_q, d_kv2.get(), d_kv2.get() + C, ld_kv, d_out2.get(), d_lse2.get(),
                                     B, Tq, Tk, H, D, mask, stream.get());
        CHECK_NO_MISMATCHES("out", compare_relative(d_out.to_host(), out, 2e-5));
        CHECK_NO_MISMATCHES("lse", compare_relative(d_lse.to_host(), lse, 2e-5));

        host::attention_merge(out.data(), lse.data(), out2.data(), lse2.data(), B, Tq, H, D);
        dev::attention_merge(d_out.get(), d_lse.get(), d_out2.get(), d_lse2.get(), B, Tq, H, D, stream.get());
        CHECK_NO_MISMATCHES("merged out", compare_relative(d_out.to_host(), out, 2e-5));
        CHECK_NO_MISMATCHES("merged lse", compare_relative(d_lse.to_host(), lse, 2e-5));

        // The first block's gradients against the merged out and lse, added to nonzero arrays.
        const auto dout = uniform(out_n, -1.0f, 1.0f, rng);
        auto dq = uniform(q.size(), -1.0f, 1.0f, rng);
        auto dkv = uniform(kv.size(), -1.0f, 1.0f, rng);
        DeviceArray<float> d_dout(dout), d_dq(dq), d_dkv(dkv), d_merged_out(out), d_merged_lse(lse);
        uploads_done();
        host::attention_block_backward(q.data(), ld_q, kv.data(), kv.data() + C, ld_kv, out.data(), dout.data(),
                                       lse.data(), dq.data(), dkv.data(), dkv.data() + C, B, Tq, Tk, H, D, mask);
        dev::attention_block_backward(d_q.get(), ld_q, d_kv.get(), d_kv.get() + C, ld_kv, d_merged_out.get(),
                                      d_dout.get(), d_merged_lse.get(), d_dq.get(), d_dkv.get(), d_dkv.get() + C, B, Tq,
                                      Tk, H, D, mask, stream.get());
        CHECK_NO_MISMATCHES("dq", compare_relative(d_dq.to_host(), dq, 1e-4));
        CHECK_NO_MISMATCHES("dk and dv", compare_relative(d_dkv.to_host(), dkv, 1e-4));
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
