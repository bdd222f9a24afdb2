// The mma.sync attention kernels (kernels/cuda/attention_mma.cuh), their
// device code run on simulated warps (warp_simulator.hpp), against the host's
// bf16 emulation (kernels/host/attention_bf16.hpp): the shapes, seeds and
// tolerances of tests/cuda/test_kernels_attention_bf16.cu, so that the kernels'
// indexing, masks, online softmax and fragment bookkeeping are tested without
// a GPU. The launches are attention_mma.cuh's own, restated (forward; D_i;
// dK and dV; dQ), and every other shape runs on a grid of 3 blocks, so that
// the blocks' loops over several work items are exercised too.
#include <catch2/catch.hpp>

#include "support/attention_shape.hpp"
#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/attention_bf16.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "simulated/warp_simulator.hpp"
// The kernels, extracted from the header by extract_device_code.py at build time.
#include "attention_mma_device_code.inc"

namespace {

namespace mma = loom::kernels::cuda::attention_mma_detail;
namespace host = loom::kernels::host;
using loom_test::largest_magnitude;
using loom_test::qkv_part;
using Shape = loom_test::AttentionShape;

struct Results {
    std::vector<float> out, lse, dqkv;
};

// The forward from qkv, the backward from `saved`'s out and lse (the host's,
// so that both backwards start from the same D_i and P), on grids of at most
// `grid` blocks; every output starts as NaN.
template <int Width>
Results simulate(const std::vector<float>& qkv, const std::vector<float>& dout, const Results& saved, const Shape& s,
                 std::int64_t grid) {
    Results r{std::vector<float>(s.out_size(), NAN), std::vector<float>(s.lse_size(), NAN),
              std::vector<float>(s.qkv_size(), NAN)};
    const std::int64_t B = s.B, T = s.T, H = s.H;
    const int D = static_cast<int>(s.D);
    const loom::kernels::cuda::attention_detail::Items items{B * H, (T + mma::tile_rows - 1) / mma::tile_rows};
    const float scale = loom::kernels::attention_scale(s.D);
    const bool quads = D % 4 == 0;  // std::vector's data is 16-byte aligned
    const std::int64_t blocks = std::min(items.count(), grid);
    loom_sim::launch(blocks, 3 * mma::Tile<Width>::bytes, [&] {
        mma::forward_kernel<Width>(qkv.data(), r.out.data(), r.lse.data(), T, H, D, scale, items, quads);
    });
    std::vector<float> di(s.lse_size(), NAN);
    loom_sim::launch(std::min<std::int64_t>((B * H * T + 3) / 4, grid), 0, [&] {
        mma::row_dots_kernel<loom_sim::block_threads>(saved.out.data(), dout.data(), di.data(), B, T, H, D);
    });
    loom_sim::launch(blocks, 4 * mma::Tile<Width>::bytes + 2 * mma::tile_rows * sizeof(float), [&] {
        mma::backward_dkdv_kernel<Width>(qkv.data(), dout.data(), saved.lse.data(), di.data(), r.dqkv.data(), T, H, D,
                                         scale, items, quads);
    });
    loom_sim::launch(blocks, 4 * mma::Tile<Width>::bytes, [&] {
        mma::backward_dq_kernel<Width>(qkv.data(), dout.data(), saved.lse.data(), di.data(), r.dqkv.data(), T, H, D,
                                       scale, items, quads);
    });
    return r;
}

template <class Forward, class Backward>
Results host_run(Forward forward, Backward backward, const std::vector<float>& qkv, const std::vector<float>& dout,
                 const Shape& s) {
    Results r{std::vector<float>(s.out_size()), std::vector<float>(s.lse_size()), std::vector<float>(s.qkv_size())};
    forward(qkv.data(), r.out.data(), r.lse.data(), s.B, s.T, s.H, s.D);
    backward(qkv.data(), r.out.data(), dout.data(), r.lse.data(), r.dqkv.data(), s.B, s.T, s.H, s.D);
    return r;
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

// The CUDA test's check: within `bound` everywhere, bound / 80 on average,
// and 10 times closer on average to the bf16 emulation than to the f32 kernel.
void check_tensor(const char* what, const std::vector<float>& got, const std::vector<float>& bf16,
                  const std::vector<float>& f32, double bound) {
    const Difference to_bf16 = difference(got, bf16), to_f32 = difference(got, f32);
    INFO(what << ": |simulated - host bf16| max " << to_bf16.max << " mean " << to_bf16.mean
              << "; |simulated - host f32| mean " << to_f32.mean << "; bound " << bound);
    CHECK(to_bf16.max <= bound);
    CHECK(to_bf16.mean <= bound / 80);
    CHECK(to_bf16.mean * 10 <= to_f32.mean);
}

}  // namespace

TEST_CASE("mma.sync attention kernels, simulated on the CPU, match the host's bf16 emulation",
          "[kernels][attention][bf16][simulated]") {
    // The CUDA test's shapes and seeds; T = 1024 there is 512 here (the
    // simulation runs a block as 128 host threads): still 8 key tiles.
    const Shape shapes[] = {{1, 7, 1, 4}, {2, 33, 3, 16}, {2, 128, 4, 64}, {1, 257, 2, 32}, {1, 512, 1, 64},
                            {2, 5, 1, 3}, {1, 45, 2, 33}, {2, 70, 2, 97}, {1, 96, 2, 128}};
    std::uint32_t seed = 1301;
    int index = 0;
    for (const Shape& s : shapes) {
        const std::int64_t grid = index++ % 2 == 0 ? std::int64_t{1} << 30 : 3;
        INFO(loom_test::describe(s) << ", grids of at most " << grid << " blocks");
        std::mt19937 rng(seed++);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> qkv(s.qkv_size()), dout(s.out_size());
        for (float& v : qkv) v = normal(rng);
        for (float& v : dout) v = normal(rng);
        const Results want =
            host_run(host::attention_forward_bf16_inputs, host::attention_backward_bf16_inputs, qkv, dout, s);
        const Results f32 = host_run(host::attention_forward, host::attention_backward, qkv, dout, s);
        const Results got = s.D <= 32   ? simulate<32>(qkv, dout, want, s, grid)
                            : s.D <= 64 ? simulate<64>(qkv, dout, want, s, grid)
                                        : simulate<128>(qkv, dout, want, s, grid);
        check_tensor("out", got.out, want.out, f32.out, 8e-3 * largest_magnitude(qkv_part(qkv, s, 2)));
        const Difference lse = difference(got.lse, want.lse);
        INFO("lse: max |simulated - host| " << lse.max);
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
    loom_sim::launch(1, 0, [&] {
        if (threadIdx.x >= 32) return;  // one warp
        const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
        unsigned fa[4], fb[4], fbt[4];
        // A: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
        loom_sim::ldmatrix_x4<false>(fa, a.data() + (lane % 8 + (lane / 8) % 2 * 8) * 16 + lane / 16 * 8);
        // B stored [n][k]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15); lanes 16-31 repeat them.
        loom_sim::ldmatrix_x4<false>(fbt, bt.data() + (lane % 8) * 16 + (lane / 8) % 2 * 8);
        // B stored [k][n], transposed on the load: matrices (k 0-7), (k 8-15).
        loom_sim::ldmatrix_x4<true>(fb, b.data() + (lane % 8 + (lane / 8) % 2 * 8) * 8);
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
}
