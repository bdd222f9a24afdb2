// The CUDA 1-bit sign packer of kernels/cuda/quantize.cuh and the
// vocabulary-parallel cross-entropy pieces of kernels/cuda/cross_entropy.cuh
// against their host twins in kernels/host, on the same seeded inputs, and
// their argument errors against the host's, word for word. Tolerances (each
// stated again where it is checked):
//   pack_signs:   bit for bit: the sign words, and the scales (each block's
//                 mean |x|, which the device sums in double in the host's exact
//                 order), NaN scales included where a block's NaNs share one
//                 payload (the host keeps that payload; where they do not, the
//                 host's pick depends on its compiler, so both need only be
//                 NaN); residuals and unpacked values bit for bit, NaN only as
//                 NaN (x86 keeps a NaN operand's payload through arithmetic,
//                 the GPU returns its canonical NaN);
//   slice pieces: the row max and the target's logit bit for bit (a max is
//                 exact in any order, a logit is copied); the sums of
//                 exponentials relative 1e-5, plus 1e-30 for the terms below
//                 e^-87 that the host's fast_exp flushes to 0 (a CPU model of
//                 both orders, with expf 1 ulp off: <= 5e-7); the slice
//                 backward as the whole-row backward of
//                 test_kernels_quantize_norm.cu: 1e-5 of each value plus
//                 1e-6 * dloss / rows;
//   composition:  the pieces over the slices of 50257-wide rows, reduced here
//                 as a group would, against the whole-row device cross-entropy:
//                 logsumexp and the loss relative 1e-5 (floor 1); the slices'
//                 backward from the whole row's device logsumexp bit for bit
//                 with the whole-row device backward (the same kernel, element
//                 by element); from the composed logsumexp within what its
//                 difference from the whole row's moves p by.
#include <catch2/catch.hpp>

#include "../support/message_of.hpp"
#include "cross_entropy_batch.hpp"
#include "device_support.hpp"
#include "packer_checks.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/kernels/cuda/cross_entropy.cuh"
#include "loom/kernels/cuda/quantize.cuh"
#include "loom/kernels/host/cross_entropy.hpp"
#include "loom/kernels/host/quantize.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_test::bits_of;
using loom_test::compare_floats;
using loom_test::compare_within;
using loom_test::compare_words;
using loom_test::cross_entropy_batch;
using loom_test::CrossEntropyBatch;
using loom_test::DeviceArray;
using loom_test::from_bits;
using loom_test::hex;
using loom_test::message_of;
using loom_test::normal_values;
using loom_test::packer_of;
using loom_test::sign_inputs;
using loom_test::SignSpecial;
using loom_test::Stream;
using loom_test::uploads_done;

// --- pack_signs -----------------------------------------------------------

constexpr std::int64_t large_n = (1 << 20) + 3;

}  // namespace

TEST_CASE("CUDA pack_signs/unpack_signs produce the host's words and values bit for bit", "[kernels][quantize]") {
    // Tolerance: none. Sign words and scales bit for bit, NaN scales included
    // (the host's payload) except the scale of a block holding NaNs of two
    // payloads, which need only be NaN on both sides; residuals and unpacked
    // values bit for bit, NaN as NaN.
    std::mt19937 rng(1201);
    // Odd sizes: partial sign words, partial blocks, partial lanes of 16.
    const std::int64_t sizes[] = {1, 7, 31, 33, 1000, 4099, large_n};
    for (const std::int64_t n : sizes) {
        // 65537 > 16 * 4096: each of the 16 threads of a group adds a long chain.
        for (const std::int64_t block : {1, 7, 64, 1024, 65537}) {
            INFO("n = " << n << ", block = " << block);
            std::vector<SignSpecial> specials;
            std::int64_t mixed = -1;
            const std::vector<float> x = sign_inputs(n, block, rng, specials, mixed);
            const auto packer =
                packer_of(host::pack_signs, dev::pack_signs, host::unpack_signs, dev::unpack_signs, n, block);
            const loom_test::Packed packed =
                pack_both(packer, x, static_cast<std::size_t>(dev::sign_words(n, block)));
            const std::vector<std::uint32_t>& host_words = packed.host_words;
            std::vector<std::uint32_t> device_words = packed.device_words;

            // The special blocks reached the values they were made for, on both sides.
            for (const SignSpecial& special : specials) {
                INFO("block " << special.block);
                CHECK(hex(host_words[special.block]) == hex(special.scale));
                CHECK(hex(device_words[special.block]) == hex(special.scale));
            }
            std::vector<std::uint32_t> reference = host_words;
            if (mixed >= 0) {
                CHECK(std::isnan(from_bits(host_words[mixed])));
                CHECK(std::isnan(from_bits(device_words[mixed])));
                reference[mixed] = device_words[mixed] = 0;  // compared as NaN just above
            }
            CHECK_NO_MISMATCHES("packed words", compare_words(device_words, reference));
            CHECK_NO_MISMATCHES("residual", compare_floats(packed.device_residual, packed.host_residual, true));

            // Without a residual too (the kernel's other branch), and again:
            // the same words every time.
            std::vector<std::uint32_t> again = packed.device_words_without_residual;
            if (mixed >= 0) again[mixed] = 0;
            CHECK_NO_MISMATCHES("packed words without residual", compare_words(again, reference));

            // Unpacking the host's words on both sides: overwrite, then
            // accumulate into values both sides start from.
            check_unpack_both(packer, host_words, host_words, x.size(), 0.75f, rng);
        }
    }
}

TEST_CASE("CUDA pack_signs runs on the caller's stream and refuses an empty block as the host does",
          "[kernels][quantize]") {
    std::mt19937 rng(1202);
    const std::int64_t n = 4099, block = 100;
    const std::vector<float> x = normal_values(n, rng);
    const auto words = static_cast<std::size_t>(dev::sign_words(n, block));
    check_on_stream(packer_of(host::pack_signs, dev::pack_signs, host::unpack_signs, dev::unpack_signs, n, block), x,
                    words, false);

    std::vector<std::uint32_t> host_words(words);
    DeviceArray<float> d_x(x), d_out(x.size());
    DeviceArray<std::uint32_t> d_words(words);

    // n = 0: nothing to do, nothing launched.
    CHECK_NOTHROW(dev::pack_signs(d_x.get(), 0, block, d_words.get()));
    CHECK_NOTHROW(dev::unpack_signs(d_words.get(), 0, block, d_out.get()));

    const std::string expected = message_of([&] { host::pack_signs(x.data(), n, 0, host_words.data()); });
    CHECK(expected == "pack_signs: a block of 0 values; it must hold at least 1");
    CHECK(message_of([&] { dev::pack_signs(d_x.get(), n, 0, d_words.get()); }) == expected);
    // The host's unpack_signs does not check (it divides by the block); the device's does.
    CHECK(message_of([&] { dev::unpack_signs(d_words.get(), n, 0, d_out.get()); }) ==
          "unpack_signs: a block of 0 values; it must hold at least 1");
}

// --- vocabulary-parallel cross-entropy --------------------------------------

namespace {

// Columns [start, start + V) of each row: the logits one rank holds.
std::vector<float> columns(const std::vector<float>& logits, std::int64_t rows, std::int64_t classes,
                           std::int64_t start, std::int64_t V) {
    std::vector<float> slice(static_cast<std::size_t>(rows * V));
    for (std::int64_t r = 0; r < rows; ++r)
        std::copy_n(logits.begin() + r * classes + start, V, slice.begin() + r * V);
    return slice;
}

// The slice edges [cuts[s], cuts[s + 1]) as target classes: each edge and
// its left neighbour, so targets fall first and last in slices.
std::vector<std::int32_t> edge_targets(const std::vector<std::int64_t>& cuts) {
    std::vector<std::int32_t> pinned;
    for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
        pinned.push_back(static_cast<std::int32_t>(cuts[s]));
        pinned.push_back(static_cast<std::int32_t>(cuts[s + 1] - 1));
    }
    return pinned;
}

}  // namespace

TEST_CASE("CUDA cross_entropy_slice_* match the host's slice pieces", "[kernels][cross_entropy]") {
    // Tolerances (see the file's comment): row max and target logit bit for
    // bit; sums within 1e-5 * |host| + 1e-30; dlogits, from the host's
    // whole-row logsumexp on both sides, within 1e-5 * |host| + 1e-6 *
    // |dloss / rows|.
    constexpr double rtol = 1e-5, flush_atol = 1e-30, target_atol = 1e-6;
    std::mt19937 rng(1203);
    struct Case {
        std::int64_t rows;
        std::vector<std::int64_t> cuts;  // slice s: columns [cuts[s], cuts[s + 1])
    };
    // A 50257-wide row in slices of 1, 999 (a warp's), 1025 (a block's) and
    // two large ones; 40000 rows of 3 classes (warp rows past the grid's cap);
    // 4100 rows of 2200 (block rows past it).
    const Case cases[] = {{12, {0, 1, 1000, 2025, 25000, 50257}}, {40000, {0, 1, 3}}, {4100, {0, 1100, 2200}}};
    for (const Case& c : cases) {
        const std::int64_t rows = c.rows, classes = c.cuts.back();
        const CrossEntropyBatch batch = cross_entropy_batch(rows, classes, rng, edge_targets(c.cuts));
        const float dloss = 0.7f;
        // The whole row's logsumexp, from the host: each slice's backward reads it.
        std::vector<float> lse(static_cast<std::size_t>(rows));
        (void)host::cross_entropy_forward(batch.logits.data(), batch.targets.data(), lse.data(), rows, classes);
        DeviceArray<float> d_lse(lse);
        DeviceArray<std::int32_t> d_targets(batch.targets);
        std::vector<float> global_max(static_cast<std::size_t>(rows), -INFINITY);
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t j = 0; j < classes; ++j)
                global_max[r] = std::max(global_max[r], batch.logits[r * classes + j]);
        DeviceArray<float> d_global_max(global_max);

        for (std::size_t s = 0; s + 1 < c.cuts.size(); ++s) {
            const std::int64_t start = c.cuts[s], V = c.cuts[s + 1] - start;
            INFO("rows = " << rows << ", classes = " << classes << ", slice [" << start << ", " << start + V << ")");
            const std::vector<float> logits = columns(batch.logits, rows, classes, start, V);
            const auto size = static_cast<std::size_t>(rows * V);

            std::vector<float> row_max(static_cast<std::size_t>(rows)), sums(static_cast<std::size_t>(2 * rows));
            std::vector<float> dlogits(size);
            host::cross_entropy_slice_max(logits.data(), batch.targets.data(), row_max.data(), rows, V, classes);
            host::cross_entropy_slice_sums(logits.data(), batch.targets.data(), global_max.data(), sums.data(), rows,
                                           V, start);
            host::cross_entropy_slice_backward(logits.data(), batch.targets.data(), lse.data(), dloss,
                                               dlogits.data(), rows, V, start, classes);

            DeviceArray<float> d_logits(logits), d_row_max(row_max.size()), d_sums(sums.size()), d_dlogits(size);
            d_row_max.fill_bytes(0xab);
            d_sums.fill_bytes(0xab);
            d_dlogits.fill_bytes(0xab);
            dev::cross_entropy_slice_max(d_logits.get(), d_targets.get(), d_row_max.get(), rows, V, classes);
            dev::cross_entropy_slice_sums(d_logits.get(), d_targets.get(), d_global_max.get(), d_sums.get(), rows, V,
                                          start);
            dev::cross_entropy_slice_backward(d_logits.get(), d_targets.get(), d_lse.get(), dloss, d_dlogits.get(),
                                              rows, V, start, classes);
            LOOM_CUDA_CHECK(cudaDeviceSynchronize());

            CHECK_NO_MISMATCHES("row max", compare_floats(d_row_max.to_host(), row_max, false));
            const std::vector<float> device_sums = d_sums.to_host();
            const std::vector<float> exp_sums(device_sums.begin(), device_sums.begin() + rows);
            const std::vector<float> host_exp_sums(sums.begin(), sums.begin() + rows);
            CHECK_NO_MISMATCHES("sums of exponentials", compare_within(exp_sums, host_exp_sums, [&](std::size_t r) {
                                    return rtol * std::fabs(static_cast<double>(host_exp_sums[r])) + flush_atol;
                                }));
            const std::vector<float> target_logits(device_sums.begin() + rows, device_sums.end());
            const std::vector<float> host_target_logits(sums.begin() + rows, sums.end());
            CHECK_NO_MISMATCHES("target logits", compare_floats(target_logits, host_target_logits, false));
            const double scale = std::fabs(static_cast<double>(dloss / static_cast<float>(rows)));
            CHECK_NO_MISMATCHES("dlogits", compare_within(d_dlogits.to_host(), dlogits, [&](std::size_t i) {
                                    return rtol * std::fabs(static_cast<double>(dlogits[i])) + target_atol * scale;
                                }));
        }
    }
}

TEST_CASE("CUDA cross_entropy_slice_max keeps the host's NaN rule", "[kernels][cross_entropy]") {
    // Bit for bit: NaN where a row's first value is NaN, else NaN passed over
    // (an all-NaN row is NaN); a -Inf row stays -Inf.
    const std::int64_t rows = 5, V = 1500, classes = 3000;
    std::mt19937 rng(1204);
    std::vector<float> logits = normal_values(static_cast<std::size_t>(rows * V), rng);
    logits[0 * V] = std::nanf("");
    logits[1 * V + 700] = std::nanf("");
    std::fill_n(logits.begin() + 2 * V, V, std::nanf(""));
    std::fill_n(logits.begin() + 3 * V, V, -INFINITY);
    logits[4 * V + 1499] = INFINITY;
    const std::vector<std::int32_t> targets(rows, 2999);
    for (const std::int64_t width : {V, std::int64_t{1000}}) {  // block rows and warp rows (the first 1000 columns)
        INFO("V = " << width);
        std::vector<float> slice = columns(logits, rows, V, 0, width);
        std::vector<float> row_max(rows);
        host::cross_entropy_slice_max(slice.data(), targets.data(), row_max.data(), rows, width, classes);
        CHECK(std::isnan(row_max[0]));
        CHECK(!std::isnan(row_max[1]));
        CHECK(std::isnan(row_max[2]));
        CHECK(row_max[3] == -INFINITY);
        DeviceArray<float> d_logits(slice), d_row_max(rows);
        DeviceArray<std::int32_t> d_targets(targets);
        dev::cross_entropy_slice_max(d_logits.get(), d_targets.get(), d_row_max.get(), rows, width, classes);
        CHECK_NO_MISMATCHES("row max", compare_floats(d_row_max.to_host(), row_max, true));
    }
}

TEST_CASE("CUDA cross_entropy_slice_* composed over the slices of 50257-wide rows give the whole-row device "
          "cross_entropy",
          "[kernels][cross_entropy]") {
    // Tolerances (see the file's comment): logsumexp relative 1e-5 (floor 1)
    // and the loss relative 1e-5; the slices' backward from the whole row's
    // device logsumexp bit for bit; from the composed logsumexp within
    // |dloss / rows| * (p * (2 |lse difference| + 2e-6) + 1e-7), p in double.
    constexpr double rtol = 1e-5;
    std::mt19937 rng(1205);
    const std::int64_t rows = 16, classes = 50257;
    // Uneven slices (warp and block rows), and Megatron's even split of four.
    const std::vector<std::int64_t> splits[] = {{0, 1, 1000, 2025, 25000, 50257},
                                                {0, 12565, 25130, 37695, 50257}};
    Stream stream(cudaStreamNonBlocking);
    for (const std::vector<std::int64_t>& cuts : splits) {
        INFO("slices: " << cuts.size() - 1 << ", the second starting at " << cuts[1]);
        const CrossEntropyBatch batch = cross_entropy_batch(rows, classes, rng, edge_targets(cuts));
        const float dloss = 1.3f;
        const std::size_t slices = cuts.size() - 1;

        DeviceArray<float> d_all(batch.logits), d_lse(static_cast<std::size_t>(rows));
        DeviceArray<float> d_dlogits(batch.logits.size());
        DeviceArray<std::int32_t> d_targets(batch.targets);
        std::vector<std::unique_ptr<DeviceArray<float>>> d_slices;
        for (std::size_t s = 0; s < slices; ++s)
            d_slices.push_back(std::make_unique<DeviceArray<float>>(
                columns(batch.logits, rows, classes, cuts[s], cuts[s + 1] - cuts[s])));
        uploads_done();

        // The whole row, on the device.
        const float loss =
            dev::cross_entropy_forward(d_all.get(), d_targets.get(), d_lse.get(), rows, classes, stream.get());
        dev::cross_entropy_backward(d_all.get(), d_targets.get(), d_lse.get(), dloss, d_dlogits.get(), rows, classes,
                                    stream.get());
        const std::vector<float> lse = d_lse.to_host(), dlogits = d_dlogits.to_host();

        // The pieces, each slice a rank's, reduced here as the group would
        // (max, then sums, each over the slices in order).
        std::vector<float> group_max(static_cast<std::size_t>(rows), -INFINITY);
        for (std::size_t s = 0; s < slices; ++s) {
            DeviceArray<float> d_max(static_cast<std::size_t>(rows));
            dev::cross_entropy_slice_max(d_slices[s]->get(), d_targets.get(), d_max.get(), rows,
                                         cuts[s + 1] - cuts[s], classes, stream.get());
            const std::vector<float> slice_max = d_max.to_host();
            for (std::int64_t r = 0; r < rows; ++r) group_max[r] = std::max(group_max[r], slice_max[r]);
        }
        DeviceArray<float> d_group_max(group_max);
        uploads_done();
        std::vector<float> total(static_cast<std::size_t>(rows), 0.0f), target_logit(static_cast<std::size_t>(rows), 0.0f);
        std::vector<int> holders(static_cast<std::size_t>(rows), 0);
        for (std::size_t s = 0; s < slices; ++s) {
            const std::int64_t start = cuts[s], V = cuts[s + 1] - start;
            DeviceArray<float> d_sums(static_cast<std::size_t>(2 * rows));
            dev::cross_entropy_slice_sums(d_slices[s]->get(), d_targets.get(), d_group_max.get(), d_sums.get(), rows,
                                          V, start, stream.get());
            const std::vector<float> sums = d_sums.to_host();
            // Deterministic: a second run writes the same bits.
            dev::cross_entropy_slice_sums(d_slices[s]->get(), d_targets.get(), d_group_max.get(), d_sums.get(), rows,
                                          V, start, stream.get());
            CHECK_NO_MISMATCHES("sums, run twice", compare_floats(d_sums.to_host(), sums, false));
            for (std::int64_t r = 0; r < rows; ++r) {
                total[r] += sums[r];
                target_logit[r] += sums[rows + r];
                const std::int64_t t = batch.targets[r] - start;
                if (t >= 0 && t < V) ++holders[r];
                else CHECK(bits_of(sums[rows + r]) == 0u);  // outside the slice: +0
            }
        }
        std::vector<float> composed_lse(static_cast<std::size_t>(rows));
        double loss_sum = 0.0;
        for (std::int64_t r = 0; r < rows; ++r) {
            INFO("row " << r << ", target " << batch.targets[r]);
            CHECK(holders[r] == 1);
            CHECK(target_logit[r] == batch.logits[r * classes + batch.targets[r]]);
            composed_lse[r] = group_max[r] + std::log(total[r]);
            loss_sum += static_cast<double>(composed_lse[r]) - static_cast<double>(target_logit[r]);
        }
        const auto composed_loss = static_cast<float>(loss_sum / static_cast<double>(rows));
        CHECK(std::fabs(composed_loss - loss) <= rtol * std::max(1.0f, std::fabs(loss)));
        CHECK_NO_MISMATCHES("logsumexp", compare_within(composed_lse, lse, [&](std::size_t r) {
                                return rtol * std::max(1.0, std::fabs(static_cast<double>(lse[r])));
                            }));

        // The backward, slice by slice, reassembled into whole rows: from the
        // whole row's device logsumexp, then from the composed one.
        DeviceArray<float> d_composed_lse(composed_lse);
        uploads_done();
        for (const bool composed : {false, true}) {
            INFO("logsumexp: " << (composed ? "composed from the pieces" : "the whole row's"));
            std::vector<float> assembled(batch.logits.size());
            for (std::size_t s = 0; s < slices; ++s) {
                const std::int64_t start = cuts[s], V = cuts[s + 1] - start;
                DeviceArray<float> d_slice_dlogits(static_cast<std::size_t>(rows * V));
                d_slice_dlogits.fill_bytes(0xab);
                uploads_done();  // the memset is on the legacy stream
                dev::cross_entropy_slice_backward(d_slices[s]->get(), d_targets.get(),
                                                  composed ? d_composed_lse.get() : d_lse.get(), dloss,
                                                  d_slice_dlogits.get(), rows, V, start, classes, stream.get());
                const std::vector<float> part = d_slice_dlogits.to_host();
                for (std::int64_t r = 0; r < rows; ++r)
                    std::copy_n(part.begin() + r * V, V, assembled.begin() + r * classes + start);
            }
            if (!composed) {
                CHECK_NO_MISMATCHES("dlogits", compare_floats(assembled, dlogits, false));
                continue;
            }
            const double scale = std::fabs(static_cast<double>(dloss / static_cast<float>(rows)));
            CHECK_NO_MISMATCHES("dlogits", compare_within(assembled, dlogits, [&](std::size_t i) {
                                    const auto r = static_cast<std::int64_t>(i) / classes;
                                    const double shift = std::fabs(static_cast<double>(composed_lse[r]) -
                                                                   static_cast<double>(lse[r]));
                                    const double p = std::exp(static_cast<double>(batch.logits[i]) -
                                                              static_cast<double>(lse[r]));
                                    return scale * (p * (2.0 * shift + 2e-6) + 1e-7);
                                }));
        }
    }
}

TEST_CASE("CUDA cross_entropy_slice_* refuse what the host refuses, with its words, and write nothing",
          "[kernels][cross_entropy]") {
    std::mt19937 rng(1206);
    const std::int64_t rows = 6, V = 5, classes = 12, start = 5;
    const std::vector<float> logits = normal_values(static_cast<std::size_t>(rows * V), rng);
    std::vector<float> row_max(rows), lse(rows, 3.0f), dlogits(static_cast<std::size_t>(rows * V));
    DeviceArray<float> d_logits(logits), d_row_max(rows), d_lse(lse), d_dlogits(dlogits.size());

    // Two bad rows: both sides name the first. Then a negative target. A
    // target outside the slice but inside [0, classes) is no error (row 0).
    for (const auto& [bad_rows, bad_target] : {std::pair{std::vector<std::int64_t>{2, 4}, std::int32_t{12}},
                                               std::pair{std::vector<std::int64_t>{5}, std::int32_t{-1}}}) {
        std::vector<std::int32_t> targets = {0, 5, 6, 7, 11, 9};
        for (std::int64_t r : bad_rows) targets[r] = bad_target;
        INFO("first bad row " << bad_rows.front() << ", target " << bad_target);
        DeviceArray<std::int32_t> d_targets(targets);
        const std::string words = "cross_entropy: target " + std::to_string(bad_target) + " at row " +
                                  std::to_string(bad_rows.front()) + " is outside the classes [0, 12)";

        CHECK(message_of([&] {
                  host::cross_entropy_slice_max(logits.data(), targets.data(), row_max.data(), rows, V, classes);
              }) == words);
        d_row_max.fill_bytes(0x7f);  // a sentinel the kernels must leave alone
        CHECK(message_of([&] {
                  dev::cross_entropy_slice_max(d_logits.get(), d_targets.get(), d_row_max.get(), rows, V, classes);
              }) == words);
        for (float v : d_row_max.to_host()) CHECK(bits_of(v) == 0x7f7f'7f7fu);
        // The host checks the targets before V: so does the device.
        CHECK(message_of([&] {
                  dev::cross_entropy_slice_max(d_logits.get(), d_targets.get(), d_row_max.get(), rows, 0, classes);
              }) == words);

        CHECK(message_of([&] {
                  host::cross_entropy_slice_backward(logits.data(), targets.data(), lse.data(), 1.0f, dlogits.data(),
                                                     rows, V, start, classes);
              }) == words);
        d_dlogits.fill_bytes(0x7f);
        CHECK(message_of([&] {
                  dev::cross_entropy_slice_backward(d_logits.get(), d_targets.get(), d_lse.get(), 1.0f,
                                                    d_dlogits.get(), rows, V, start, classes);
              }) == words);
        for (float v : d_dlogits.to_host()) CHECK(bits_of(v) == 0x7f7f'7f7fu);
    }

    // The size checks, in the host's order.
    const std::vector<std::int32_t> targets = {0, 5, 6, 7, 11, 9};
    DeviceArray<std::int32_t> d_targets(targets);
    struct Sizes {
        std::int64_t rows, V, classes;
    };
    for (const Sizes& bad : {Sizes{0, V, classes}, Sizes{rows, V, 0}, Sizes{rows, 0, classes}, Sizes{rows, -3, classes}}) {
        INFO("rows = " << bad.rows << ", V = " << bad.V << ", classes = " << bad.classes);
        const std::string expected = message_of([&] {
            host::cross_entropy_slice_max(logits.data(), targets.data(), row_max.data(), bad.rows, bad.V,
                                          bad.classes);
        });
        INFO("host: " << expected);
        CHECK(expected != "(no error)");
        CHECK(message_of([&] {
                  dev::cross_entropy_slice_max(d_logits.get(), d_targets.get(), d_row_max.get(), bad.rows, bad.V,
                                               bad.classes);
              }) == expected);
        const std::string backward_expected = message_of([&] {
            host::cross_entropy_slice_backward(logits.data(), targets.data(), lse.data(), 1.0f, dlogits.data(),
                                               bad.rows, bad.V, start, bad.classes);
        });
        CHECK(message_of([&] {
                  dev::cross_entropy_slice_backward(d_logits.get(), d_targets.get(), d_lse.get(), 1.0f,
                                                    d_dlogits.get(), bad.rows, bad.V, start, bad.classes);
              }) == backward_expected);
    }
    // slice_sums checks nothing, on either side; rows = 0 writes nothing.
    CHECK_NOTHROW(dev::cross_entropy_slice_sums(d_logits.get(), d_targets.get(), d_row_max.get(), d_dlogits.get(), 0,
                                                V, start));
}
