// Gradient compression's CUDA kernels on simulated threads: the packers
// (kernels/cuda/quantize.cuh: bf16/f16 casts, int8 with a scale per block,
// signs with a mean |x| per block), and at the end PowerSGD's
// orthonormalisation (low_rank.cuh, within 1e-5). The packers run on simulated
// threads (warp_simulator.hpp), against the host's
// (kernels/host/quantize.hpp) bit for bit, as tests/cuda/
// test_kernels_quantize_norm.cu holds a GPU to them, on the CUDA tests'
// inputs (tests/support/packer_inputs.hpp): the words (scales,
// values, sign bits and the padding of the last word), the residuals and the
// unpacked values, overwritten and accumulated. One exception: a block
// holding NaNs of different payloads gets a NaN scale whose payload is the
// NaN the host's sum kept, and which that is depends on the order the host
// compiler gave each addition's operands (this file is built differently
// from the CUDA test's); so scales compare as NaN against NaN there. The
// launches are the launchers' own, restated; the words start as garbage.
#include <catch2/catch.hpp>

#include "loom/kernels/host/low_rank.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "support/comparisons.hpp"
#include "support/low_rank_check.hpp"
#include "support/packer_inputs.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "simulated/warp_simulator.hpp"
// The kernels, extracted from their headers by extract_device_code.py at build time.
#include "device_code.inc"

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_sim::Grid;
using loom_test::compare_floats;

constexpr int block_threads = dev::threads_per_block;
constexpr std::uint32_t garbage = 0xdead'beefu;

// What both sides leave: the words (packed with a residual), the residual,
// and the words packed without one.
struct Packed {
    std::vector<std::uint32_t> words, words_alone;
    std::vector<float> residual;
};

template <class Pack>
Packed packed(std::size_t word_count, std::size_t n, Pack pack) {
    Packed p{std::vector<std::uint32_t>(word_count, garbage), std::vector<std::uint32_t>(word_count, garbage),
             std::vector<float>(n, NAN)};
    pack(p.words.data(), p.residual.data());
    pack(p.words_alone.data(), static_cast<float*>(nullptr));
    return p;
}

// The host's and the simulated kernels' packing and unpacking of x compared:
// the words, the residual, and unpacking the host's words (overwriting, then
// accumulating with a weight into the same starting values).
// Words bit for bit, except that the first `scales` (f32 scales) may be
// NaN against NaN.
loom_test::Mismatches compare_packed(const std::vector<std::uint32_t>& got, const std::vector<std::uint32_t>& want,
                                     std::size_t scales) {
    loom_test::Mismatches bad;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const bool agree = i < scales ? loom_test::same_bits_or_both_nan(std::bit_cast<float>(got[i]),
                                                                           std::bit_cast<float>(want[i]))
                                      : got[i] == want[i];
        if (!agree)
            bad.add("word " + std::to_string(i) + ": simulated " + loom_test::hex(got[i]) + ", host " +
                    loom_test::hex(want[i]));
    }
    return bad;
}

template <class HostPack, class DevicePack, class HostUnpack, class DeviceUnpack>
void check_packer(const std::vector<float>& x, std::size_t word_count, std::size_t scales, HostPack host_pack,
                  DevicePack device_pack, HostUnpack host_unpack, DeviceUnpack device_unpack, std::mt19937& rng) {
    const Packed want = packed(word_count, x.size(), host_pack);
    const Packed got = packed(word_count, x.size(), device_pack);
    CHECK_NO_MISMATCHES("packed words", compare_packed(got.words, want.words, scales));
    CHECK_NO_MISMATCHES("packed words without a residual", compare_packed(got.words_alone, want.words, scales));
    CHECK_NO_MISMATCHES("residual", compare_floats(got.residual, want.residual, scales > 0));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> start(x.size());
    for (float& v : start) v = normal(rng);
    for (const bool add : {false, true}) {
        INFO((add ? "unpacking onto values" : "unpacking"));
        std::vector<float> host_out = start, device_out = start;
        host_unpack(want.words.data(), host_out.data(), 0.75f, add);
        device_unpack(want.words.data(), device_out.data(), 0.75f, add);
        CHECK_NO_MISMATCHES("unpacked", compare_floats(device_out, host_out, scales > 0));
    }
}

}  // namespace

TEST_CASE("gradient compression's CUDA packers on simulated threads produce the host's words and values bit for bit",
          "[simulated][quantize]") {
    std::mt19937 rng(2801);
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{129}, std::int64_t{1000},
                                 std::int64_t{5003}}) {
        for (const dev::Cast cast : {dev::Cast::bf16, dev::Cast::f16}) {
            INFO((cast == dev::Cast::bf16 ? "bf16" : "f16") << ", n = " << n);
            const std::vector<float> x = loom_test::cast_inputs(n, rng);
            const bool bf16 = cast == dev::Cast::bf16;
            check_packer(
                x, static_cast<std::size_t>(host::cast_words(n)), 0,
                [&](std::uint32_t* words, float* residual) { host::pack_cast(cast, x.data(), n, words, residual); },
                [&](std::uint32_t* words, float* residual) {
                    loom_sim::launch_each(Grid{dev::blocks_for(host::cast_words(n)), 1}, block_threads, [&] {
                        if (bf16)
                            dev::detail::pack_cast_kernel<dev::Cast::bf16>(x.data(), n, words, residual);
                        else
                            dev::detail::pack_cast_kernel<dev::Cast::f16>(x.data(), n, words, residual);
                    });
                },
                [&](const std::uint32_t* words, float* out, float weight, bool add) {
                    host::unpack_cast(cast, words, n, out, weight, add);
                },
                [&](const std::uint32_t* words, float* out, float weight, bool add) {
                    loom_sim::launch_each(Grid{dev::blocks_for(n), 1}, block_threads, [&] {
                        if (bf16)
                            dev::detail::unpack_cast_kernel<dev::Cast::bf16>(words, n, out, weight, add);
                        else
                            dev::detail::unpack_cast_kernel<dev::Cast::f16>(words, n, out, weight, add);
                    });
                },
                rng);
        }
        // 2048 > 1024: int8's whole-thread-block groups; 16 and 7: sign
        // scales' half-warps end on different blocks.
        for (const std::int64_t block : {std::int64_t{1}, std::int64_t{7}, std::int64_t{64}, std::int64_t{2048}}) {
            INFO("n = " << n << ", block = " << block);
            const std::int64_t blocks = (n + block - 1) / block;
            const auto unpack_with = [&](auto kernel) {
                return [&, kernel](const std::uint32_t* words, float* out, float weight, bool add) {
                    loom_sim::launch_each(Grid{dev::blocks_for(n), 1}, block_threads,
                                          [&] { kernel(words, out, weight, add); });
                };
            };
            {
                INFO("int8");
                const std::vector<float> x = loom_test::int8_inputs(n, block, rng);
                check_packer(
                    x, static_cast<std::size_t>(host::int8_words(n, block)), static_cast<std::size_t>(blocks),
                    [&](std::uint32_t* words, float* residual) {
                        host::pack_int8(x.data(), n, block, words, residual);
                    },
                    [&](std::uint32_t* words, float* residual) {
                        if (block <= 1024)
                            loom_sim::launch(Grid{dev::blocks_for(blocks * 32), 1}, block_threads, 0, [&] {
                                dev::detail::pack_int8_kernel<32>(x.data(), n, block, words, residual);
                            });
                        else
                            loom_sim::launch(Grid{dev::blocks_for(blocks * block_threads), 1}, block_threads, 0, [&] {
                                dev::detail::pack_int8_kernel<block_threads>(x.data(), n, block, words, residual);
                            });
                    },
                    [&](const std::uint32_t* words, float* out, float weight, bool add) {
                        host::unpack_int8(words, n, block, out, weight, add);
                    },
                    unpack_with([&](const std::uint32_t* words, float* out, float weight, bool add) {
                        if (add)
                            dev::detail::unpack_int8_kernel<true>(words, n, block, out, weight);
                        else
                            dev::detail::unpack_int8_kernel<false>(words, n, block, out, weight);
                    }),
                    rng);
            }
            {
                INFO("signs");
                std::vector<loom_test::SignSpecial> specials;
                std::int64_t mixed_nan_block = -1;
                const std::vector<float> x = loom_test::sign_inputs(n, block, rng, specials, mixed_nan_block);
                check_packer(
                    x, static_cast<std::size_t>(host::sign_words(n, block)), static_cast<std::size_t>(blocks),
                    [&](std::uint32_t* words, float* residual) {
                        host::pack_signs(x.data(), n, block, words, residual);
                    },
                    [&](std::uint32_t* words, float* residual) {
                        loom_sim::launch(Grid{dev::blocks_for((n + 31) / 32 * 32), 1}, block_threads, 0, [&] {
                            dev::detail::pack_sign_bits_kernel<float>(x.data(), n, words + blocks);
                        });
                        loom_sim::launch(Grid{dev::blocks_for(blocks * dev::detail::sign_lanes), 1}, block_threads, 0,
                                         [&] {
                                             dev::detail::pack_sign_scales_kernel<dev::detail::sign_lanes>(
                                                 x.data(), n, block, words, residual);
                                         });
                    },
                    [&](const std::uint32_t* words, float* out, float weight, bool add) {
                        host::unpack_signs(words, n, block, out, weight, add);
                    },
                    unpack_with([&](const std::uint32_t* words, float* out, float weight, bool add) {
                        if (add)
                            dev::detail::unpack_signs_kernel<true>(words, n, block, out, weight);
                        else
                            dev::detail::unpack_signs_kernel<false>(words, n, block, out, weight);
                    }),
                    rng);
            }
        }
    }
}

TEST_CASE("PowerSGD's CUDA orthonormalisation on simulated threads follows the host's within 1e-5",
          "[simulated][quantize]") {
    // The CUDA test's cases and tolerance: the columns within 1e-5 relative
    // of the host's Gram-Schmidt (block-wide sums in double, in another
    // order), orthonormal to 1e-5 while there are at most as many columns as
    // rows (the rest come out zero). One block of 256 threads, as launched.
    struct Case {
        std::int64_t rows, cols;
        bool dependent;  // column 1 a multiple of column 0: replaced by a unit vector
    };
    std::mt19937 rng(2802);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    for (const Case c : {Case{1, 1, false}, Case{7, 2, false}, Case{768, 4, false}, Case{3072, 4, true},
                         Case{5, 5, false}, Case{3, 4, false}}) {
        INFO(c.rows << " x " << c.cols << (c.dependent ? ", dependent" : ""));
        std::vector<float> p(static_cast<std::size_t>(c.rows * c.cols));
        for (float& v : p) v = unit(rng);
        if (c.dependent)
            for (std::int64_t r = 0; r < c.rows; ++r) p[r * c.cols + 1] = 2.0f * p[r * c.cols];
        std::vector<float> got = p;
        host::orthonormalize_columns(p.data(), c.rows, c.cols);
        loom_sim::launch(Grid{}, dev::detail::orthonormalize_threads, 0, [&] {
            dev::detail::orthonormalize_columns_kernel<float>(got.data(), c.rows, c.cols,
                                                              host::dependent_column_ratio);
        });
        CHECK_NO_MISMATCHES("columns", loom_test::compare_relative(got, p, 1e-5));
        loom_test::check_orthonormal_columns(got, c.rows, c.cols);
    }
}
