// The f32 CUDA attention kernels on simulated warps (warp_simulator.hpp):
// the tiled causal kernels of kernels/cuda/attention.cuh (on
// attention_tiles.cuh, which the mma kernels share) and ring attention's
// block kernels (attention_blocks.cuh: forward, merge and backward, f32 and
// bf16 operands), against their host twins with the CUDA tests' shapes and
// tolerances (tests/cuda/test_kernels_attention.cu,
// test_kernels_attention_blocks.cu, whose comments derive them). The
// launches are the launchers' own, restated; the tiled kernels also run on a
// grid of 3 blocks, so that each block loops over several work items.
#include <catch2/catch.hpp>

#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/attention_blocks_bf16.hpp"
#include "support/attention_block_case.hpp"
#include "support/attention_shape.hpp"
#include "support/comparisons.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "simulated/warp_simulator.hpp"
// The kernels, extracted from their headers by extract_device_code.py at build time.
#include "device_code.inc"

namespace {

namespace dev = loom::kernels::cuda;
namespace tiles = loom::kernels::cuda::attention_detail;
namespace blocks = loom::kernels::cuda::block_detail;
namespace host = loom::kernels::host;
using host::BlockMask;
using loom_sim::Grid;
using loom_test::BlockInputs;
using loom_test::BlockResults;
using loom_test::BlockShape;
using loom_test::compare_within;
using loom_test::host_blocks;
using loom_test::largest_magnitude;
using loom_test::normal_values;
using loom_test::qkv_part;
using Shape = loom_test::AttentionShape;

std::vector<float> nans(std::size_t n) { return std::vector<float>(n, NAN); }

struct Results {
    std::vector<float> out, lse, dqkv;
};

// attention_forward's and attention_backward's launches (attention.cuh), on
// at most `grid` blocks; the backward from the kernel's own out and lse.
template <int Chunks>
Results tiled(const std::vector<float>& qkv, const std::vector<float>& dout, const Shape& s, std::int64_t grid) {
    Results r{nans(s.out_size()), nans(s.lse_size()), nans(s.qkv_size())};
    const tiles::Items items{s.B * s.H, (s.T + tiles::tile_rows - 1) / tiles::tile_rows};
    const auto capped = std::min<std::int64_t>(tiles::blocks_for_items(items.count()), grid);
    const Grid blocks_of{static_cast<unsigned>(capped), 1};
    const int D = static_cast<int>(s.D);
    const float scale = loom::kernels::attention_scale(s.D);
    loom_sim::launch(blocks_of, tiles::block_threads, tiles::shared_bytes<Chunks>(3), [&] {
        tiles::attention_forward_kernel<Chunks>(qkv.data(), r.out.data(), r.lse.data(), s.T, s.H, D, scale, items);
    });
    loom_sim::launch(blocks_of, tiles::block_threads, tiles::shared_bytes<Chunks>(4), [&] {
        tiles::attention_backward_dkdv_kernel<Chunks>(qkv.data(), r.out.data(), dout.data(), r.lse.data(),
                                                      r.dqkv.data(), s.T, s.H, D, scale, items);
    });
    loom_sim::launch(blocks_of, tiles::block_threads, tiles::shared_bytes<Chunks>(4), [&] {
        tiles::attention_backward_dq_kernel<Chunks>(qkv.data(), r.out.data(), dout.data(), r.lse.data(),
                                                    r.dqkv.data(), s.T, s.H, D, scale, items);
    });
    return r;
}

}  // namespace

TEST_CASE("the f32 CUDA attention kernels on simulated warps match the host kernel", "[simulated][attention]") {
    // The CUDA test's shapes and tolerances: out 1e-5 of max |out|; lse 1e-5
    // of max(1, max |lse|); dq, dk, dv 2e-5 of max(max |part|, 0.1 max |dqkv|).
    const Shape shapes[] = {{1, 1, 1, 1},    {1, 7, 1, 4},  {2, 33, 3, 16}, {2, 128, 4, 64}, {1, 257, 2, 32},
                            {1, 1024, 1, 64}, {2, 5, 1, 3},  {1, 45, 2, 33}, {2, 70, 2, 97},  {1, 96, 2, 128}};
    std::uint32_t seed = 1201;
    int index = 0;
    for (const Shape& s : shapes) {
        const std::int64_t grid = index++ % 2 == 0 ? tiles::max_blocks : 3;
        INFO(loom_test::describe(s) << ", grid of at most " << grid << " blocks");
        std::mt19937 rng(seed++);
        const std::vector<float> qkv = normal_values(s.qkv_size(), rng);
        const std::vector<float> dout = normal_values(s.out_size(), rng);
        Results want{std::vector<float>(s.out_size()), std::vector<float>(s.lse_size()),
                     std::vector<float>(s.qkv_size())};
        host::attention_forward(qkv.data(), want.out.data(), want.lse.data(), s.B, s.T, s.H, s.D);
        host::attention_backward(qkv.data(), want.out.data(), dout.data(), want.lse.data(), want.dqkv.data(), s.B,
                                 s.T, s.H, s.D);
        Results got;
        if (s.D <= 32)
            got = tiled<1>(qkv, dout, s, grid);
        else if (s.D <= 64)
            got = tiled<2>(qkv, dout, s, grid);
        else
            got = tiled<4>(qkv, dout, s, grid);

        const double out_tolerance = 1e-5 * largest_magnitude(want.out);
        CHECK_NO_MISMATCHES("out", compare_within(got.out, want.out, [&](std::size_t) { return out_tolerance; }));
        const double lse_tolerance = 1e-5 * std::max(1.0, largest_magnitude(want.lse));
        CHECK_NO_MISMATCHES("lse", compare_within(got.lse, want.lse, [&](std::size_t) { return lse_tolerance; }));
        const double whole = largest_magnitude(want.dqkv);
        const char* names[] = {"dq", "dk", "dv"};
        for (std::int64_t part = 0; part < 3; ++part) {
            const std::vector<float> want_part = qkv_part(want.dqkv, s, part);
            const double allowed = 2e-5 * std::max(largest_magnitude(want_part), 0.1 * whole);
            CHECK_NO_MISMATCHES(names[part], compare_within(qkv_part(got.dqkv, s, part), want_part,
                                                            [&](std::size_t) { return allowed; }));
        }
    }
}

namespace {

// block_forward's, attention_merge's and block_backward's launches
// (attention_blocks.cuh): one thread a row, no barriers, so thread after
// thread; the backward from the host's merged out and lse, as on a GPU.
template <bool Round>
BlockResults simulated_blocks(const BlockShape& s, const BlockInputs& in, const BlockResults& host_results) {
    const auto [B, Tq, Tk, H, D, mask] = s;
    const std::int64_t C = H * D, ld_q = 3 * C, ld_kv = 2 * C;
    const bool causal = mask == BlockMask::causal;
    const float scale = loom::kernels::attention_scale(D);
    const int threads = dev::threads_per_block;
    const auto grid = [](std::int64_t rows) { return Grid{dev::blocks_for(rows), 1}; };
    BlockResults r{nans(in.dout.size()), nans(static_cast<std::size_t>(B * H * Tq)), {}, {}, in.dq, in.dkv};
    std::vector<float> out2 = nans(r.out.size()), lse2 = nans(r.lse.size());
    loom_sim::launch_each(grid(B * H * Tq), threads, [&] {
        blocks::block_forward_kernel<Round>(in.q.data(), ld_q, in.kv.data(), in.kv.data() + C, ld_kv, r.out.data(),
                                            r.lse.data(), B, Tq, Tk, H, D, causal, scale);
    });
    loom_sim::launch_each(grid(B * H * Tq), threads, [&] {
        blocks::block_forward_kernel<Round>(in.q.data(), ld_q, in.kv2.data(), in.kv2.data() + C, ld_kv, out2.data(),
                                            lse2.data(), B, Tq, Tk, H, D, causal, scale);
    });
    r.merged_out = r.out;
    r.merged_lse = r.lse;
    loom_sim::launch_each(grid(B * Tq * H), threads, [&] {
        blocks::merge_kernel<float>(r.merged_out.data(), r.merged_lse.data(), out2.data(), lse2.data(), B, Tq, H, D);
    });
    const std::vector<float>& merged_out = host_results.merged_out;
    const std::vector<float>& merged_lse = host_results.merged_lse;
    loom_sim::launch_each(grid(B * H * Tq), threads, [&] {
        blocks::block_backward_dq_kernel<Round>(in.q.data(), ld_q, in.kv.data(), in.kv.data() + C, ld_kv,
                                                merged_out.data(), in.dout.data(), merged_lse.data(), r.dq.data(), B,
                                                Tq, Tk, H, D, causal, scale);
    });
    loom_sim::launch_each(grid(B * H * Tk), threads, [&] {
        blocks::block_backward_dkv_kernel<Round>(in.q.data(), ld_q, in.kv.data(), in.kv.data() + C, ld_kv,
                                                 merged_out.data(), in.dout.data(), merged_lse.data(), r.dkv.data(),
                                                 r.dkv.data() + C, B, Tq, Tk, H, D, causal, scale);
    });
    return r;
}

}  // namespace

TEST_CASE("ring attention's CUDA block kernels on simulated threads follow the host's", "[simulated][attention]") {
    // The CUDA test's shapes and tolerances, relative to max(|host|, 1): out
    // and lse 2e-5, the gradients 1e-4 (f32); with bf16 operands, lse 2e-5,
    // out and the gradients 8e-3 (a P or dS on the other side of a bf16
    // midpoint moves one term by a bf16 step), and at least 10 times closer
    // on average to the host's bf16 emulation than to its f32 kernels.
    std::mt19937 rng(2201);
    for (const BlockShape& s : loom_test::block_shapes) {
        CAPTURE(s.B, s.Tq, s.Tk, s.H, s.D, static_cast<int>(s.mask));
        const BlockInputs in(s, rng);
        {
            INFO("f32");
            const BlockResults want = host_blocks<false>(s, in);
            const BlockResults got = simulated_blocks<false>(s, in, want);
            loom_test::check_blocks_close(got, want, 2e-5, 1e-4);
        }
        {
            INFO("bf16 operands");
            const BlockResults want = host_blocks<true>(s, in);
            const BlockResults f32 = host_blocks<false>(s, in);
            const BlockResults got = simulated_blocks<true>(s, in, want);
            loom_test::check_blocks_close(got, want, 8e-3, 8e-3);
            loom_test::check_closer_to_bf16(got, want, f32);
        }
    }
}
