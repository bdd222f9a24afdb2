// The mma.sync attention kernels (kernels/cuda/attention_mma.cuh), their
// device code run on simulated warps (warp_simulator.hpp), against the host's
// bf16 emulation (kernels/host/attention_bf16.hpp): the shapes, seeds and
// tolerances of tests/cuda/test_kernels_attention_bf16.cu, and 1000 times
// closer to the emulation than to f32 where a GPU is asked for 10
// (support/attention_bf16_check.hpp says why), so that the kernels' indexing,
// masks, online softmax, rounding points and fragment bookkeeping are tested
// without a GPU; and every ldmatrix row where the hardware needs it. The
// launches are attention_mma.cuh's own, restated (forward; D_i; dK and dV;
// dQ), and every other shape runs on a grid of 3 blocks, so that the blocks'
// loops over several work items are exercised too.
#include <catch2/catch.hpp>

#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/attention_bf16.hpp"
#include "support/attention_bf16_check.hpp"
#include "support/attention_shape.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "simulated/warp_simulator.hpp"
// The kernels, extracted from their headers by extract_device_code.py at build time.
#include "device_code.inc"

namespace {

namespace mma = loom::kernels::cuda::attention_mma_detail;
namespace host = loom::kernels::host;
using loom_test::AttentionResults;
using Shape = loom_test::AttentionShape;

// The forward from qkv, the backward from `saved`'s out and lse (the host's,
// so that both backwards start from the same D_i and P), on grids of at most
// `grid` blocks, with the launchers' shared memory sizes; every output
// starts as NaN.
template <int Width>
AttentionResults simulate(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionResults& saved,
                          const Shape& s, std::int64_t grid) {
    AttentionResults r{std::vector<float>(s.out_size(), NAN), std::vector<float>(s.lse_size(), NAN),
                       std::vector<float>(s.qkv_size(), NAN)};
    const std::int64_t B = s.B, T = s.T, H = s.H;
    const int D = static_cast<int>(s.D);
    const loom::kernels::cuda::attention_detail::Items items{B * H, (T + mma::tile_rows - 1) / mma::tile_rows};
    const float scale = loom::kernels::attention_scale(s.D);
    const bool quads = D % 4 == 0;  // std::vector's data is 16-byte aligned
    const std::int64_t blocks = std::min(items.count(), grid);
    loom_sim::launch(blocks, mma::forward_shared_bytes<Width>, [&] {
        mma::forward_kernel<Width>(qkv.data(), r.out.data(), r.lse.data(), T, H, D, scale, items, quads);
    });
    std::vector<float> di(s.lse_size(), NAN);
    loom_sim::launch(std::min<std::int64_t>((B * H * T + 3) / 4, grid), 0, [&] {
        mma::row_dots_kernel<loom_sim::block_threads>(saved.out.data(), dout.data(), di.data(), B, T, H, D);
    });
    loom_sim::launch(blocks, mma::dkdv_shared_bytes<Width>, [&] {
        mma::backward_dkdv_kernel<Width>(qkv.data(), dout.data(), saved.lse.data(), di.data(), r.dqkv.data(), T, H, D,
                                         scale, items, quads);
    });
    loom_sim::launch(blocks, mma::dq_shared_bytes<Width>, [&] {
        mma::backward_dq_kernel<Width>(qkv.data(), dout.data(), saved.lse.data(), di.data(), r.dqkv.data(), T, H, D,
                                       scale, items, quads);
    });
    return r;
}

}  // namespace

TEST_CASE("mma.sync attention kernels, simulated on the CPU, match the host's bf16 emulation",
          "[kernels][attention][bf16][simulated]") {
    // The CUDA test's shapes, seeds and checks (support/attention_bf16_check.hpp).
    std::uint32_t seed = 1301;
    int index = 0;
    for (const Shape& s : loom_test::bf16_attention_shapes) {
        const std::int64_t grid = index++ % 2 == 0 ? std::int64_t{1} << 30 : 3;
        INFO(loom_test::describe(s) << ", grids of at most " << grid << " blocks");
        std::mt19937 rng(seed++);
        const auto normal_values = [&rng](std::size_t n) {  // as tests/cuda/device_support.hpp draws them
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<float> values(n);
            for (float& v : values) v = normal(rng);
            return values;
        };
        const std::vector<float> qkv = normal_values(s.qkv_size()), dout = normal_values(s.out_size());
        const AttentionResults want = loom_test::host_attention(host::attention_forward_bf16_inputs,
                                                                host::attention_backward_bf16_inputs, qkv, dout, s);
        const AttentionResults f32 =
            loom_test::host_attention(host::attention_forward, host::attention_backward, qkv, dout, s);
        const AttentionResults got = s.D <= 32   ? simulate<32>(qkv, dout, want, s, grid)
                                     : s.D <= 64 ? simulate<64>(qkv, dout, want, s, grid)
                                                 : simulate<128>(qkv, dout, want, s, grid);
        loom_test::check_bf16_attention(got, want, f32, qkv, s, /*closer=*/1000);
    }
    CHECK(loom_sim::bad_ldmatrix_rows == 0);
}

TEST_CASE("the warp simulator's mma.m16n8k16 multiplies fragments loaded by ldmatrix as the PTX ISA lays them out",
          "[simulated]") {
    // A 16 x 16 A and a 16 x 8 B, stored row-major in "shared memory" (B also
    // stored transposed), loaded the way every kernel does, multiplied once:
    // each lane's four results must be the matching entries of A B. This
    // checks the simulator itself against a product written out plainly.
    std::vector<__nv_bfloat16> a(16 * 16), b(16 * 8), bt(8 * 16);
    auto value = [](int i) { return static_cast<float>(i % 7 - 3) * 0.5f; };
    for (int i = 0; i < 16 * 16; ++i) a[i] = __float2bfloat16_rn(value(i));
    for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 8; ++n) {
            b[k * 8 + n] = __float2bfloat16_rn(value(3 * k + 5 * n + 1));
            bt[n * 16 + k] = b[k * 8 + n];
        }
    std::vector<float> from_rows(16 * 8, NAN), from_columns(16 * 8, NAN);
    const long bad_before = loom_sim::bad_ldmatrix_rows;
    long bad_misaligned = 0;
    loom_sim::launch(1, 1024, [&] {
        if (threadIdx.x >= 32) return;  // one warp
        auto* shared = reinterpret_cast<__nv_bfloat16*>(loom_sim::block_shared());
        const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
        if (lane == 0) {  // A at byte 0, B stored [n][k] at 512, B stored [k][n] at 768
            std::copy(a.begin(), a.end(), shared);
            std::copy(bt.begin(), bt.end(), shared + 256);
            std::copy(b.begin(), b.end(), shared + 384);
        }
        loom_sim::warp_barrier();
        unsigned fa[4], fb[4], fbt[4];
        // A: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
        loom_sim::ldmatrix_x4<false>(fa, shared + (lane % 8 + (lane / 8) % 2 * 8) * 16 + lane / 16 * 8);
        // B stored [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15); lanes 16-31 repeat them.
        loom_sim::ldmatrix_x4<false>(fbt, shared + 256 + (lane % 8) * 16 + (lane / 8) % 2 * 8);
        // B stored [k][n], transposed on the load: matrices (k 0-7), (k 8-15).
        loom_sim::ldmatrix_x4<true>(fb, shared + 384 + (lane % 8 + (lane / 8) % 2 * 8) * 8);
        // And the guard: rows 2 bytes off their 16-byte pieces are counted, one per lane.
        const long good = loom_sim::bad_ldmatrix_rows;
        loom_sim::warp_barrier();  // every lane has read it before any adds to it
        unsigned ignored[4];
        loom_sim::ldmatrix_x4<false>(ignored, shared + 1 + lane * 8);
        if (lane == 0) bad_misaligned = loom_sim::bad_ldmatrix_rows - good;
        loom_sim::warp_barrier();
        if (lane == 0) loom_sim::bad_ldmatrix_rows = good;
        float c1[4] = {0, 0, 0, 0}, c2[4] = {0, 0, 0, 0};
        loom_sim::mma_m16n8k16(c1, fa, fbt[0], fbt[1]);
        loom_sim::mma_m16n8k16(c2, fa, fb[0], fb[1]);
        for (int e = 0; e < 4; ++e) {
            from_rows[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = c1[e];
            from_columns[(g + 8 * (e / 2)) * 8 + 2 * t + e % 2] = c2[e];
        }
    });
    for (int m = 0; m < 16; ++m)
        for (int n = 0; n < 8; ++n) {
            float want = 0.0f;
            for (int k = 0; k < 16; ++k)
                want += loom::detail::bf16_bits_to_float(a[m * 16 + k].bits) *
                        loom::detail::bf16_bits_to_float(b[k * 8 + n].bits);
            INFO("C[" << m << "][" << n << "]");
            CHECK(from_rows[m * 8 + n] == want);
            CHECK(from_columns[m * 8 + n] == want);
        }
    CHECK(bad_misaligned == 32);
    CHECK(loom_sim::bad_ldmatrix_rows == bad_before);
}
