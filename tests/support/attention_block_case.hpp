// Ring and Ulysses attention's block kernels as their tests exercise them,
// on a GPU (tests/cuda/test_kernels_attention_blocks.cu) and on simulated
// threads (tests/simulated/test_attention_f32_simulated.cpp): the shapes, the
// seeded inputs, the steps on the host (one pair forward, the merge of two
// key blocks, one pair's gradients added into nonzero dq and dk|dv) and the
// comparison of a kernel's results with the host's. CUDA-free.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/attention_blocks_bf16.hpp"
#include "support/comparisons.hpp"

namespace loom_test {

struct BlockShape {
    std::int64_t B, Tq, Tk, H, D;
    loom::kernels::host::BlockMask mask;
};

// Both masks, q and k|v of different strides (ring attention's 3C and 2C),
// Tq != Tk for the full mask, and keys across the host's 128-key tiles.
inline constexpr BlockShape block_shapes[] = {
    {2, 5, 5, 2, 8, loom::kernels::host::BlockMask::causal},  {2, 5, 5, 2, 8, loom::kernels::host::BlockMask::full},
    {1, 7, 4, 3, 16, loom::kernels::host::BlockMask::full},   {3, 33, 33, 2, 64, loom::kernels::host::BlockMask::causal},
    {1, 20, 36, 1, 128, loom::kernels::host::BlockMask::full}, {1, 40, 150, 2, 32, loom::kernels::host::BlockMask::full}};

// One shape's inputs, uniform in [-1, 1): q (stride 3C), two key/value blocks
// (stride 2C), the output's gradient, and the nonzero dq and dk|dv the
// backward adds into.
struct BlockInputs {
    std::vector<float> q, kv, kv2, dout, dq, dkv;
    BlockInputs(const BlockShape& s, std::mt19937& rng) {
        const std::int64_t C = s.H * s.D;
        q = uniform(static_cast<std::size_t>(s.B * s.Tq * 3 * C), -1.0f, 1.0f, rng);
        kv = uniform(static_cast<std::size_t>(s.B * s.Tk * 2 * C), -1.0f, 1.0f, rng);
        kv2 = uniform(kv.size(), -1.0f, 1.0f, rng);
        dout = uniform(static_cast<std::size_t>(s.B * s.Tq * C), -1.0f, 1.0f, rng);
        dq = uniform(q.size(), -1.0f, 1.0f, rng);
        dkv = uniform(kv.size(), -1.0f, 1.0f, rng);
    }
};

// What each step leaves: the first block's out and lse, both merged with the
// second block's, and the first block's gradients (from the merged out and
// lse) added into dq and dk|dv.
struct BlockResults {
    std::vector<float> out, lse, merged_out, merged_lse, dq, dkv;
};

// The steps on the host, with f32 products or (Round) bf16 ones.
template <bool Round>
BlockResults host_blocks(const BlockShape& s, const BlockInputs& in) {
    namespace host = loom::kernels::host;
    const auto [B, Tq, Tk, H, D, mask] = s;
    const std::int64_t C = H * D, ld_q = 3 * C, ld_kv = 2 * C;
    const auto forward = Round ? host::attention_block_forward_bf16_inputs : host::attention_block_forward;
    const auto backward = Round ? host::attention_block_backward_bf16_inputs : host::attention_block_backward;
    const std::size_t out_n = static_cast<std::size_t>(B * Tq * C), lse_n = static_cast<std::size_t>(B * H * Tq);
    BlockResults r{std::vector<float>(out_n), std::vector<float>(lse_n), {}, {}, in.dq, in.dkv};
    std::vector<float> out2(out_n), lse2(lse_n);
    forward(in.q.data(), ld_q, in.kv.data(), in.kv.data() + C, ld_kv, r.out.data(), r.lse.data(), B, Tq, Tk, H, D,
            mask);
    forward(in.q.data(), ld_q, in.kv2.data(), in.kv2.data() + C, ld_kv, out2.data(), lse2.data(), B, Tq, Tk, H, D,
            mask);
    r.merged_out = r.out;
    r.merged_lse = r.lse;
    host::attention_merge(r.merged_out.data(), r.merged_lse.data(), out2.data(), lse2.data(), B, Tq, H, D);
    backward(in.q.data(), ld_q, in.kv.data(), in.kv.data() + C, ld_kv, r.merged_out.data(), in.dout.data(),
             r.merged_lse.data(), r.dq.data(), r.dkv.data(), r.dkv.data() + C, B, Tq, Tk, H, D, mask);
    return r;
}

// Each result within its tolerance of the host's, relative to max(|host|, 1):
// `values` for out and the merged out, `gradients` for dq and dk|dv; lse,
// f32 sums on both sides at either precision, within 2e-5.
inline void check_blocks_close(const BlockResults& got, const BlockResults& want, double values, double gradients) {
    CHECK_NO_MISMATCHES("out", compare_relative(got.out, want.out, values));
    CHECK_NO_MISMATCHES("lse", compare_relative(got.lse, want.lse, 2e-5));
    CHECK_NO_MISMATCHES("merged out", compare_relative(got.merged_out, want.merged_out, values));
    CHECK_NO_MISMATCHES("merged lse", compare_relative(got.merged_lse, want.merged_lse, 2e-5));
    CHECK_NO_MISMATCHES("dq", compare_relative(got.dq, want.dq, gradients));
    CHECK_NO_MISMATCHES("dk and dv", compare_relative(got.dkv, want.dkv, gradients));
}

inline double mean_difference(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double total = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) total += std::fabs(static_cast<double>(a[i]) - b[i]);
    return total / static_cast<double>(std::max<std::size_t>(1, a.size()));
}

// A kernel with bf16 products (`got`) at least 10 times closer, on average,
// to the host's bf16 emulation (`bf16`) than to its f32 kernels (`f32`), in
// out, dq and dk|dv: a rounding missing or misplaced fails it.
inline void check_closer_to_bf16(const BlockResults& got, const BlockResults& bf16, const BlockResults& f32) {
    for (const auto member : {&BlockResults::out, &BlockResults::dq, &BlockResults::dkv}) {
        const double to_bf16 = mean_difference(got.*member, bf16.*member);
        const double to_f32 = mean_difference(got.*member, f32.*member);
        INFO("mean |kernel - host bf16| " << to_bf16 << ", mean |kernel - host f32| " << to_f32);
        CHECK(to_bf16 * 10 <= to_f32);
    }
}

}  // namespace loom_test
