// The CUDA kernels of kernels/cuda/{quantize,layernorm,cross_entropy}.cuh
// against their host twins in kernels/host, on the same seeded inputs, and
// their argument errors against the host's, word for word. Tolerances, per
// kernel (each stated again where it is checked):
//   casts, int8:   bit for bit (packed words, residuals, unpacked values), NaN
//                  only as NaN: x86 keeps a NaN operand's payload through
//                  arithmetic, the GPU returns its canonical NaN;
//   layernorm:     relative 1e-5 (floor 1: values are O(1)) for y, mean, rstd
//                  and dx (y also what the row's mean and rstd differences
//                  carry into it), which differ from the host only in summation order
//                  and FMA contraction (measured on a CPU model of the device's
//                  order: <= 7e-7); dgain and dshift, sums over rows of signed
//                  terms, within 1e-6 of the column's sum of |terms|, since a
//                  relative error means nothing where the terms cancel;
//   cross_entropy: logsumexp relative 1e-5 (floor 1) and the loss relative
//                  1e-5 (model: <= 1e-7 and 3e-8); dlogits, computed by both
//                  sides from the same logsumexp, within 1e-5 of each value
//                  plus 1e-6 * dloss / rows (expf vs the host's fast_exp: a few
//                  ulp of p, which p - 1 at the target does not shrink).
#include <catch2/catch.hpp>

#include "../support/message_of.hpp"
#include "cross_entropy_batch.hpp"
#include "device_support.hpp"
#include "packer_checks.hpp"
#include "support/layernorm_case.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/kernels/cuda/cross_entropy.cuh"
#include "loom/kernels/cuda/layernorm.cuh"
#include "loom/kernels/cuda/quantize.cuh"
#include "loom/kernels/host/cross_entropy.hpp"
#include "loom/kernels/host/layernorm.hpp"
#include "loom/kernels/host/quantize.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_test::cast_inputs;
using loom_test::compare_floats;
using loom_test::compare_relative;
using loom_test::compare_within;
using loom_test::compare_words;
using loom_test::cross_entropy_batch;
using loom_test::CrossEntropyBatch;
using loom_test::DeviceArray;
using loom_test::int8_inputs;
using loom_test::message_of;
using loom_test::normal_values;
using loom_test::packer_of;
using loom_test::Stream;
using loom_test::uploads_done;

// --- quantize -------------------------------------------------------------

constexpr std::int64_t large_n = (1 << 20) + 3;
// 1, 7, 129, 1000 and a large odd count: partial words, blocks and warps.
constexpr std::int64_t sizes[] = {1, 7, 129, 1000, large_n};

}  // namespace

TEST_CASE("CUDA pack_cast/unpack_cast produce the host's words and values bit for bit", "[kernels][quantize]") {
    // Tolerance: none. Words and residuals bit for bit; unpacked values bit
    // for bit, NaN as NaN (x86 keeps NaN payloads through arithmetic, the GPU
    // returns its canonical NaN).
    std::mt19937 rng(1101);
    for (const dev::Cast cast : {dev::Cast::bf16, dev::Cast::f16}) {
        for (const std::int64_t n : sizes) {
            INFO((cast == dev::Cast::bf16 ? "bf16" : "f16") << ", n = " << n);
            const std::vector<float> x = cast_inputs(n, rng);
            const auto packer = packer_of(std::bind_front(host::pack_cast, cast), std::bind_front(dev::pack_cast, cast),
                                          std::bind_front(host::unpack_cast, cast),
                                          std::bind_front(dev::unpack_cast, cast), n);
            const loom_test::Packed packed = pack_both(packer, x, static_cast<std::size_t>(dev::cast_words(n)));
            CHECK_NO_MISMATCHES("packed words", compare_words(packed.device_words, packed.host_words));
            CHECK_NO_MISMATCHES("residual", compare_floats(packed.device_residual, packed.host_residual, true));
            // Without a residual too (the kernel's other branch).
            CHECK_NO_MISMATCHES("packed words without residual",
                                compare_words(packed.device_words_without_residual, packed.host_words));

            // Unpacking the same words (each side its own): overwrite, then
            // accumulate into values both sides start from.
            check_unpack_both(packer, packed.host_words, packed.device_words_without_residual, x.size(), 0.75f, rng);
        }
    }
}

TEST_CASE("CUDA pack_int8/unpack_int8 produce the host's words and values bit for bit", "[kernels][quantize]") {
    // Tolerance: none, as for the casts. The words include the scales (the
    // host's quiet NaN 0x7fc00000 for blocks with NaN or Inf) and the zero
    // bytes that pad the last word; the device's words start as garbage.
    std::mt19937 rng(1102);
    for (const std::int64_t n : sizes) {
        // 2048 > 1024 takes the kernel's whole-thread-block path.
        for (const std::int64_t block : {1, 7, 64, 256, 2048}) {
            INFO("n = " << n << ", block = " << block);
            const std::vector<float> x = int8_inputs(n, block, rng);
            const std::int64_t blocks = (n + block - 1) / block;
            const auto packer =
                packer_of(host::pack_int8, dev::pack_int8, host::unpack_int8, dev::unpack_int8, n, block);
            const loom_test::Packed packed =
                pack_both(packer, x, static_cast<std::size_t>(dev::int8_words(n, block)));
            CHECK_NO_MISMATCHES("packed words", compare_words(packed.device_words, packed.host_words));
            CHECK_NO_MISMATCHES("residual", compare_floats(packed.device_residual, packed.host_residual, true));
            // The inputs did reach the non-finite blocks.
            if (blocks > 3)
                for (std::int64_t b = 1; b <= 3; ++b) CHECK(packed.device_words[b] == 0x7fc0'0000u);
            CHECK_NO_MISMATCHES("packed words without residual",
                                compare_words(packed.device_words_without_residual, packed.host_words));

            check_unpack_both(packer, packed.host_words, packed.device_words_without_residual, x.size(), 0.5f, rng);
        }
    }
}

TEST_CASE("CUDA quantisation runs on the caller's stream and refuses an empty block as the host does",
          "[kernels][quantize]") {
    std::mt19937 rng(1103);
    const std::int64_t n = 4099, block = 128;
    const std::vector<float> x = normal_values(n, rng);
    const auto words = static_cast<std::size_t>(dev::int8_words(n, block));
    check_on_stream(packer_of(host::pack_int8, dev::pack_int8, host::unpack_int8, dev::unpack_int8, n, block), x,
                    words, true);

    // A block of 0 is refused before anything is read or written.
    std::vector<std::uint32_t> host_words(words);
    DeviceArray<float> d_x(x);
    DeviceArray<std::uint32_t> d_words(words);
    const std::string expected = message_of([&] { host::pack_int8(x.data(), n, 0, host_words.data()); });
    CHECK(expected == "pack_int8: a block of 0 values; it must hold at least 1");
    CHECK(message_of([&] { dev::pack_int8(d_x.get(), n, 0, d_words.get()); }) == expected);
}

// --- layernorm ------------------------------------------------------------

TEST_CASE("CUDA layernorm matches the host layernorm", "[kernels][layernorm]") {
    // Tolerances (see the file's comment): y, mean, rstd, dx relative 1e-5
    // against max(|host|, 1); dgain, dshift within 1e-6 of the column's
    // |initial value| + sum over rows of |term|.
    constexpr double rtol = 1e-5, column_rtol = 1e-6;
    constexpr float eps = 1e-5f;
    std::mt19937 rng(1104);
    // Warp rows (C <= 1024) and block rows; 40000 rows pass the grid's cap and
    // loop; 40000 columns make the weight kernel's tiles loop.
    const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1},     {3, 7},       {64, 768}, {5, 1500},
                                                            {40000, 3}, {4100, 1025}, {3, 40000}};
    for (const auto& [rows, C] : shapes) {
        INFO("rows = " << rows << ", C = " << C);
        const auto size = static_cast<std::size_t>(rows * C);
        const loom_test::LayerNormCase lc(rows, C, eps, rng);
        const std::vector<float>& x = lc.x;
        const std::vector<float>& gain = lc.gain;
        const std::vector<float>& shift = lc.shift;
        const std::vector<float>& dy = lc.dy;
        const std::vector<float>& y = lc.y;
        const std::vector<float>& mean = lc.mean;
        const std::vector<float>& rstd = lc.rstd;

        DeviceArray<float> d_x(x), d_gain(gain), d_shift(shift), d_dy(dy), d_y(size);
        DeviceArray<float> d_mean(mean.size()), d_rstd(rstd.size()), d_dx(size);
        DeviceArray<float> d_dgain(lc.dgain0), d_dshift(lc.dshift0);
        dev::layernorm_forward(d_x.get(), d_gain.get(), d_shift.get(), d_y.get(), d_mean.get(), d_rstd.get(), rows,
                               C, eps);
        LOOM_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> device_mean = d_mean.to_host(), device_rstd = d_rstd.to_host();
        CHECK_NO_MISMATCHES("mean", compare_relative(device_mean, mean, rtol));
        CHECK_NO_MISMATCHES("rstd", compare_relative(device_rstd, rstd, rtol));
        // y = (x - mean) rstd gain + shift carries the row statistics'
        // differences (checked just above) times the row's conditioning:
        // with C = 3 a row's values can sit close together, rstd is large,
        // and a last-bit difference in the mean moves y by |gain| rstd ulp(mean)
        // (seen on an H200: 3e-5 on y = 0.87, rows = 40000, C = 3). So y is
        // allowed rtol plus exactly what the measured differences in mean and
        // rstd account for.
        CHECK_NO_MISMATCHES("y", compare_within(d_y.to_host(), y, [&](std::size_t i) {
            const auto r = static_cast<std::size_t>(static_cast<std::int64_t>(i) / C);
            const auto j = static_cast<std::size_t>(static_cast<std::int64_t>(i) % C);
            const double d_mean_r = std::fabs(static_cast<double>(device_mean[r]) - mean[r]);
            const double d_rstd_r = std::fabs(static_cast<double>(device_rstd[r]) - rstd[r]);
            const double centred = std::fabs(static_cast<double>(x[i]) - mean[r]);
            const double carried = std::fabs(gain[j]) * (d_mean_r * rstd[r] + centred * d_rstd_r);
            return rtol * std::max(1.0, std::fabs(static_cast<double>(y[i]))) + 1.01 * carried;
        }));

        // The backwards read the host's mean and rstd, so each kernel is
        // compared on identical inputs.
        DeviceArray<float> h_mean(mean), h_rstd(rstd);
        dev::layernorm_backward_input(d_dy.get(), d_x.get(), d_gain.get(), h_mean.get(), h_rstd.get(), d_dx.get(),
                                      rows, C);
        dev::layernorm_backward_weight(d_dy.get(), d_x.get(), h_mean.get(), h_rstd.get(), d_dgain.get(),
                                       d_dshift.get(), rows, C);
        LOOM_CUDA_CHECK(cudaDeviceSynchronize());
        CHECK_NO_MISMATCHES("dx", compare_relative(d_dx.to_host(), lc.dx, rtol));

        const loom_test::LayerNormCase::ColumnBounds bounds = lc.column_bounds(column_rtol);
        CHECK_NO_MISMATCHES("dgain", compare_within(d_dgain.to_host(), lc.dgain,
                                                    [&](std::size_t j) { return bounds.gain[j]; }));
        CHECK_NO_MISMATCHES("dshift", compare_within(d_dshift.to_host(), lc.dshift,
                                                     [&](std::size_t j) { return bounds.shift[j]; }));
    }
}

TEST_CASE("CUDA layernorm runs on the caller's stream, leaves rows = 0 alone and refuses what the host refuses",
          "[kernels][layernorm]") {
    std::mt19937 rng(1105);
    const std::int64_t rows = 33, C = 2000;
    const auto size = static_cast<std::size_t>(rows * C);
    const std::vector<float> x = normal_values(size, rng), gain = normal_values(C, rng), shift = normal_values(C, rng);
    std::vector<float> y(size), mean(rows), rstd(rows);
    host::layernorm_forward(x.data(), gain.data(), shift.data(), y.data(), mean.data(), rstd.data(), rows, C, 1e-5f);

    Stream stream(cudaStreamNonBlocking);
    DeviceArray<float> d_x(x), d_gain(gain), d_shift(shift), d_y(size), d_mean(rows), d_rstd(rows);
    uploads_done();
    dev::layernorm_forward(d_x.get(), d_gain.get(), d_shift.get(), d_y.get(), d_mean.get(), d_rstd.get(), rows, C,
                           1e-5f, stream.get());
    stream.synchronize();
    CHECK_NO_MISMATCHES("y", compare_relative(d_y.to_host(), y, 1e-5));

    // rows = 0: nothing to do, nothing launched, no error.
    CHECK_NOTHROW(dev::layernorm_forward(d_x.get(), d_gain.get(), d_shift.get(), d_y.get(), d_mean.get(),
                                         d_rstd.get(), 0, C, 1e-5f));

    const auto same_words = [](const std::function<void()>& on_host, const std::function<void()>& on_device) {
        const std::string expected = message_of(on_host);
        INFO("host: " << expected);
        CHECK(expected != "(no error)");
        CHECK(message_of(on_device) == expected);
    };
    float* h = y.data();
    float* d = d_y.get();
    same_words([&] { host::layernorm_forward(h, h, h, h, h, h, -1, C, 1e-5f); },
               [&] { dev::layernorm_forward(d, d, d, d, d, d, -1, C, 1e-5f); });
    same_words([&] { host::layernorm_forward(h, h, h, h, h, h, rows, 0, 1e-5f); },
               [&] { dev::layernorm_forward(d, d, d, d, d, d, rows, 0, 1e-5f); });
    same_words([&] { host::layernorm_forward(h, h, h, h, h, h, rows, C, -1.0f); },
               [&] { dev::layernorm_forward(d, d, d, d, d, d, rows, C, -1.0f); });
    same_words([&] { host::layernorm_backward_input(h, h, h, h, h, h, rows, 0); },
               [&] { dev::layernorm_backward_input(d, d, d, d, d, d, rows, 0); });
    same_words([&] { host::layernorm_backward_weight(h, h, h, h, h, h, -2, C); },
               [&] { dev::layernorm_backward_weight(d, d, d, d, d, d, -2, C); });
}

// --- cross_entropy --------------------------------------------------------

TEST_CASE("CUDA cross_entropy matches the host cross_entropy", "[kernels][cross_entropy]") {
    // Tolerances (see the file's comment): logsumexp relative 1e-5 against
    // max(|host|, 1); the loss relative 1e-5; dlogits, from the same
    // logsumexp on both sides, within 1e-5 * |host| + 1e-6 * |dloss / rows|.
    constexpr double rtol = 1e-5, target_atol = 1e-6;
    std::mt19937 rng(1106);
    // Warp rows (V <= 1024) and block rows; 40000 and 4100 rows pass the
    // grid's cap for each and loop.
    const std::pair<std::int64_t, std::int64_t> shapes[] = {{1, 1},     {1, 2},       {5, 257},   {32, 50257},
                                                            {40000, 3}, {4100, 1100}, {7, 1000}};
    for (const auto& [rows, V] : shapes) {
        INFO("rows = " << rows << ", V = " << V);
        const CrossEntropyBatch batch = cross_entropy_batch(rows, V, rng);
        const auto size = static_cast<std::size_t>(rows * V);
        const float dloss = 0.7f;

        std::vector<float> lse(static_cast<std::size_t>(rows)), dlogits(size);
        const float loss = host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), rows, V);
        host::cross_entropy_backward(batch.logits.data(), batch.targets.data(), lse.data(), dloss, dlogits.data(),
                                     rows, V);

        DeviceArray<float> d_logits(batch.logits), d_lse(lse.size()), d_dlogits(size);
        DeviceArray<std::int32_t> d_targets(batch.targets);
        const float device_loss = dev::cross_entropy_forward(d_logits.get(), d_targets.get(), d_lse.get(), rows, V);
        CHECK(std::fabs(device_loss - loss) <= rtol * std::max(1.0f, std::fabs(loss)));
        CHECK_NO_MISMATCHES("logsumexp", compare_relative(d_lse.to_host(), lse, rtol));

        DeviceArray<float> h_lse(lse);
        dev::cross_entropy_backward(d_logits.get(), d_targets.get(), h_lse.get(), dloss, d_dlogits.get(), rows, V);
        const double scale = std::fabs(static_cast<double>(dloss / static_cast<float>(rows)));
        CHECK_NO_MISMATCHES("dlogits", compare_within(d_dlogits.to_host(), dlogits, [&](std::size_t i) {
                                return rtol * std::fabs(static_cast<double>(dlogits[i])) + target_atol * scale;
                            }));
    }
}

TEST_CASE("CUDA cross_entropy runs on the caller's stream", "[kernels][cross_entropy]") {
    std::mt19937 rng(1107);
    const std::int64_t rows = 9, V = 3000;
    const CrossEntropyBatch batch = cross_entropy_batch(rows, V, rng);
    std::vector<float> lse(rows), dlogits(static_cast<std::size_t>(rows * V));
    const float loss = host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), rows, V);
    host::cross_entropy_backward(batch.logits.data(), batch.targets.data(), lse.data(), 1.0f, dlogits.data(), rows,
                                 V);

    Stream stream(cudaStreamNonBlocking);
    DeviceArray<float> d_logits(batch.logits), d_lse(lse.size()), d_dlogits(dlogits.size());
    DeviceArray<std::int32_t> d_targets(batch.targets);
    uploads_done();
    const float device_loss =
        dev::cross_entropy_forward(d_logits.get(), d_targets.get(), d_lse.get(), rows, V, stream.get());
    dev::cross_entropy_backward(d_logits.get(), d_targets.get(), d_lse.get(), 1.0f, d_dlogits.get(), rows, V,
                                stream.get());
    stream.synchronize();
    CHECK(std::fabs(device_loss - loss) <= 1e-5 * std::max(1.0f, std::fabs(loss)));
    CHECK_NO_MISMATCHES("logsumexp", compare_relative(d_lse.to_host(), lse, 1e-5));
    // Here the backward reads the device's own logsumexp, one ulp or so off
    // the host's, which moves p by that much of itself: an ulp of a
    // logsumexp near 100 (the shifted row) is 7.6e-6. Hence 2e-5 relative,
    // and 1e-5 * dloss / rows where p - 1 cancels.
    CHECK_NO_MISMATCHES("dlogits", compare_within(d_dlogits.to_host(), dlogits, [&](std::size_t i) {
                            return 2e-5 * std::fabs(static_cast<double>(dlogits[i])) + 1e-5 / rows;
                        }));
}

TEST_CASE("CUDA cross_entropy refuses a target outside [0, V) with the host's words and writes nothing",
          "[kernels][cross_entropy]") {
    std::mt19937 rng(1108);
    const std::int64_t rows = 6, V = 5;
    CrossEntropyBatch batch = cross_entropy_batch(rows, V, rng);
    std::vector<float> lse(rows), dlogits(static_cast<std::size_t>(rows * V));
    DeviceArray<float> d_logits(batch.logits), d_lse(lse.size()), d_dlogits(dlogits.size());

    // Two bad rows: both sides name the first. Then a negative target.
    for (const auto& [bad_rows, bad_target] :
         {std::pair{std::vector<std::int64_t>{2, 4}, std::int32_t{7}}, std::pair{std::vector<std::int64_t>{5}, -1}}) {
        std::vector<std::int32_t> targets = batch.targets;
        for (std::int64_t r : bad_rows) targets[r] = bad_target;
        INFO("first bad row " << bad_rows.front() << ", target " << bad_target);
        DeviceArray<std::int32_t> d_targets(targets);

        const std::string forward_words = message_of(
            [&] { (void)host::cross_entropy_forward(batch.logits.data(), targets.data(), lse.data(), rows, V); });
        CHECK(forward_words == "cross_entropy: target " + std::to_string(bad_target) + " at row " +
                                   std::to_string(bad_rows.front()) + " is outside the classes [0, 5)");
        d_lse.fill_bytes(0x7f);  // a sentinel the kernels must leave alone
        CHECK(message_of([&] {
                  (void)dev::cross_entropy_forward(d_logits.get(), d_targets.get(), d_lse.get(), rows, V);
              }) == forward_words);
        for (float v : d_lse.to_host()) CHECK(std::bit_cast<std::uint32_t>(v) == 0x7f7f'7f7fu);

        const std::string backward_words = message_of([&] {
            host::cross_entropy_backward(batch.logits.data(), targets.data(), lse.data(), 1.0f, dlogits.data(), rows,
                                         V);
        });
        CHECK(backward_words == forward_words);
        d_dlogits.fill_bytes(0x7f);
        CHECK(message_of([&] {
                  dev::cross_entropy_backward(d_logits.get(), d_targets.get(), d_lse.get(), 1.0f, d_dlogits.get(),
                                              rows, V);
              }) == backward_words);
        for (float v : d_dlogits.to_host()) CHECK(std::bit_cast<std::uint32_t>(v) == 0x7f7f'7f7fu);
    }

    // The size checks, before anything reaches the device.
    DeviceArray<std::int32_t> d_targets(batch.targets);
    using Sizes = std::pair<std::int64_t, std::int64_t>;
    for (const auto& [bad_rows, bad_V] : {Sizes{0, V}, Sizes{rows, 0}}) {
        const std::string expected = message_of([&] {
            (void)host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), bad_rows, bad_V);
        });
        INFO("host: " << expected);
        CHECK(expected != "(no error)");
        CHECK(message_of([&] {
                  (void)dev::cross_entropy_forward(d_logits.get(), d_targets.get(), d_lse.get(), bad_rows, bad_V);
              }) == expected);
        CHECK(message_of([&] {
                  dev::cross_entropy_backward(d_logits.get(), d_targets.get(), d_lse.get(), 1.0f, d_dlogits.get(),
                                              bad_rows, bad_V);
              }) == expected);
    }
}
