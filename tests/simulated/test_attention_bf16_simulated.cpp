// The bf16 attention kernels' device code on simulated warps
// (warp_simulator.hpp): the mma.sync kernels (kernels/cuda/attention_mma.cuh,
// what --matmul bf16 runs on a GPU) and the kernel lab's wmma kernels
// (dev/kernel_lab/attention_wmma.cuh: not shipped, the reference that
// bench/gpu/kernels.cu times the mma kernels against, and tested only here),
// against the host's bf16 emulation
// (kernels/host/attention_bf16.hpp) with the shapes, seeds and tolerances of
// tests/cuda/test_kernels_attention_bf16.cu, and 1000 times closer to the
// emulation than to f32 where a GPU is asked for 10
// (support/attention_bf16_check.hpp says why), so that the kernels'
// indexing, masks, online softmax, rounding points and fragment bookkeeping
// are tested without a GPU; and every ldmatrix row and wmma access where the
// hardware needs it. The launches are the launchers' own, restated, and
// every other shape runs on a grid of 3 blocks, so that the blocks' loops
// over several work items are exercised too.
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
namespace wmma_kernels = loom::kernels::cuda::attention_bf16_detail;
namespace host = loom::kernels::host;
using loom_test::AttentionResults;
using Shape = loom_test::AttentionShape;

// The forward from qkv, the backward from `saved`'s out and lse (the host's,
// so that both backwards start from the same D_i and P), on grids of at most
// `grid` blocks, with the launchers' shared memory sizes; every output
// starts as NaN.
template <int Width>
AttentionResults simulate_mma(const std::vector<float>& qkv, const std::vector<float>& dout,
                              const AttentionResults& saved, const Shape& s, std::int64_t grid) {
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

// wmma: the forward from qkv; dK and dV, then dQ (each forms D_i from out
// and dout itself) from `saved`'s out and lse.
template <int Width>
AttentionResults simulate_wmma(const std::vector<float>& qkv, const std::vector<float>& dout,
                               const AttentionResults& saved, const Shape& s, std::int64_t grid) {
    AttentionResults r{std::vector<float>(s.out_size(), NAN), std::vector<float>(s.lse_size(), NAN),
                       std::vector<float>(s.qkv_size(), NAN)};
    const std::int64_t T = s.T, H = s.H;
    const int D = static_cast<int>(s.D);
    const wmma_kernels::Items items{s.B * H, (T + wmma_kernels::tile_rows - 1) / wmma_kernels::tile_rows};
    const float scale = loom::kernels::attention_scale(s.D);
    const std::int64_t blocks = std::min(items.count(), grid);
    loom_sim::launch(blocks, wmma_kernels::ForwardRegions<Width>::bytes, [&] {
        wmma_kernels::forward_kernel<Width>(qkv.data(), r.out.data(), r.lse.data(), T, H, D, scale, items);
    });
    constexpr std::size_t backward_bytes = wmma_kernels::BackwardRegions<Width>::bytes;
    loom_sim::launch(blocks, backward_bytes, [&] {
        wmma_kernels::backward_dkdv_kernel<Width>(qkv.data(), saved.out.data(), dout.data(), saved.lse.data(),
                                                  r.dqkv.data(), T, H, D, scale, items);
    });
    loom_sim::launch(blocks, backward_bytes, [&] {
        wmma_kernels::backward_dq_kernel<Width>(qkv.data(), saved.out.data(), dout.data(), saved.lse.data(),
                                                r.dqkv.data(), T, H, D, scale, items);
    });
    return r;
}

// For each of the CUDA test's shapes and seeds: the kernels' results from
// simulate(qkv, dout, the host's bf16 results, shape, grid), checked
// against the host's bf16 emulation and f32 kernels.
template <class Simulate>
void check_against_the_emulation(Simulate simulate) {
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
        const AttentionResults got = s.D <= 32   ? simulate.template operator()<32>(qkv, dout, want, s, grid)
                                     : s.D <= 64 ? simulate.template operator()<64>(qkv, dout, want, s, grid)
                                                 : simulate.template operator()<128>(qkv, dout, want, s, grid);
        loom_test::check_bf16_attention(got, want, f32, qkv, s, /*closer=*/1000);
    }
}

}  // namespace

TEST_CASE("mma.sync attention kernels, simulated on the CPU, match the host's bf16 emulation",
          "[kernels][attention][bf16][simulated]") {
    check_against_the_emulation([]<int Width>(const std::vector<float>& qkv, const std::vector<float>& dout,
                                              const AttentionResults& saved, const Shape& s, std::int64_t grid) {
        return simulate_mma<Width>(qkv, dout, saved, s, grid);
    });
    CHECK(loom_sim::bad_ldmatrix_rows == 0);
}

TEST_CASE("wmma attention kernels, simulated on the CPU, match the host's bf16 emulation",
          "[kernels][attention][bf16][simulated]") {
    check_against_the_emulation([]<int Width>(const std::vector<float>& qkv, const std::vector<float>& dout,
                                              const AttentionResults& saved, const Shape& s, std::int64_t grid) {
        return simulate_wmma<Width>(qkv, dout, saved, s, grid);
    });
    CHECK(loom_sim::bad_wmma_accesses == 0);
}
