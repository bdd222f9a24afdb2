// The CUDA kernels data-parallel compression runs on a device beyond the
// quantisers themselves (tested in test_kernels_quantize_norm.cu and
// test_kernels_signs_vocab.cu): the chunk dispatch of kernels/cuda/
// chunk_encoding.cuh for every encoding, PowerSGD's subtract and
// orthonormalisation (low_rank.cuh), and 1-bit Adam's momentum mixes
// (elementwise.cuh), each against its host twin. Tolerances: the chunk words
// and the elementwise kernels bit for bit; the orthonormalisation within 1e-5
// of the host's columns (its double sums run in another order) and
// orthonormal to 1e-5.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "device_support.hpp"
#include "loom/kernels/chunk_encoding.hpp"
#include "loom/kernels/cuda/chunk_encoding.cuh"
#include "loom/kernels/cuda/elementwise.cuh"
#include "loom/kernels/cuda/low_rank.cuh"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/low_rank.hpp"
#include "support/low_rank_check.hpp"

namespace {

namespace device = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom::kernels::ChunkEncoding;
using loom::kernels::ChunkKind;
using loom_test::compare_floats;
using loom_test::compare_words;
using loom_test::DeviceArray;
using loom_test::uniform;

constexpr std::int64_t sizes[] = {1, 7, 1000, 4097, (std::int64_t{1} << 18) + 3};

const ChunkEncoding encodings[] = {{ChunkKind::bf16},       {ChunkKind::f16},          {ChunkKind::int8, 128},
                                   {ChunkKind::int8, 7},    {ChunkKind::signs, 64},    {ChunkKind::signs, 1000},
                                   {ChunkKind::top_k, 0, 0.01}, {ChunkKind::top_k, 0, 0.5}};

}  // namespace

TEST_CASE("cuda::pack_chunk and unpack_chunk give the host's words, residuals and values for every encoding",
          "[kernels][compress]") {
    device::TopKScratch scratch;
    std::vector<std::int32_t> host_scratch;
    for (const ChunkEncoding& e : encodings) {
        for (const std::int64_t n : sizes) {
            INFO(e << ", n = " << n);
            const auto count = static_cast<std::size_t>(n);
            const std::vector<float> x = uniform(count, -3.0f, 3.0f, 501u + static_cast<std::uint32_t>(n));
            const auto words = static_cast<std::size_t>(e.words(n));
            std::vector<std::uint32_t> host_words(words);
            std::vector<float> host_residual(count);
            host::pack_chunk(e, x.data(), n, host_words.data(), host_residual.data(), host_scratch);

            DeviceArray<float> d_x(x), d_residual(count);
            DeviceArray<std::uint32_t> d_words(words);
            d_words.fill_bytes(0xab);
            device::pack_chunk(e, d_x.get(), n, d_words.get(), d_residual.get(), scratch);
            CHECK_NO_MISMATCHES("words", compare_words(d_words.to_host(), host_words));
            CHECK_NO_MISMATCHES("residual", compare_floats(d_residual.to_host(), host_residual, true));

            // Overwrite, then add onto values both sides start from.
            for (const bool add : {false, true}) {
                INFO("add = " << add);
                std::vector<float> out = uniform(count, -1.0f, 1.0f, 77u);
                DeviceArray<float> d_out(out);
                if (!add) d_out.fill_bytes(0xcd);  // garbage the unpack must overwrite
                host::unpack_chunk(e, host_words.data(), n, out.data(), 0.5f, add);
                device::unpack_chunk(e, d_words.get(), n, d_out.get(), 0.5f, add);
                CHECK_NO_MISMATCHES("unpacked", compare_floats(d_out.to_host(), out, true));
            }
        }
    }
}

TEST_CASE("cuda::subtract, mix_momentum and unmix_momentum equal the host's bit for bit", "[kernels][compress]") {
    for (const std::int64_t n : sizes) {
        CAPTURE(n);
        const auto count = static_cast<std::size_t>(n);
        const std::vector<float> g = uniform(count, -2.0f, 2.0f, 31u + static_cast<std::uint32_t>(n));
        const std::vector<float> m = uniform(count, -0.5f, 0.5f, 32u + static_cast<std::uint32_t>(n));
        DeviceArray<float> d_g(g), d_m(m), d_mixed(g), d_unmixed(g);

        std::vector<float> difference = g;
        host::subtract(difference.data(), m.data(), n);
        device::subtract(d_g.get(), d_m.get(), n);
        CHECK_NO_MISMATCHES("subtract", compare_floats(d_g.to_host(), difference, false));

        std::vector<float> mixed = g;
        host::mix_momentum(mixed.data(), m.data(), n, 0.9f);
        device::mix_momentum(d_mixed.get(), d_m.get(), n, 0.9f);
        CHECK_NO_MISMATCHES("mix_momentum", compare_floats(d_mixed.to_host(), mixed, false));

        std::vector<float> unmixed = g;
        host::unmix_momentum(unmixed.data(), m.data(), n, 0.9f);
        device::unmix_momentum(d_unmixed.get(), d_m.get(), n, 0.9f);
        CHECK_NO_MISMATCHES("unmix_momentum", compare_floats(d_unmixed.to_host(), unmixed, false));
    }
}

TEST_CASE("cuda::orthonormalize_columns follows the host's Gram-Schmidt within 1e-5, dependent columns included",
          "[kernels][compress]") {
    struct Case {
        std::int64_t rows, cols;
        bool dependent;  // column 1 a multiple of column 0: replaced by a unit vector
    };
    for (const Case c : {Case{1, 1, false}, Case{7, 2, false}, Case{768, 4, false}, Case{3072, 4, true},
                         Case{5, 5, false}, Case{3, 4, false}}) {
        INFO(c.rows << " x " << c.cols << (c.dependent ? ", dependent" : ""));
        const auto count = static_cast<std::size_t>(c.rows * c.cols);
        std::vector<float> p = uniform(count, -1.0f, 1.0f, 900u + static_cast<std::uint32_t>(c.rows));
        if (c.dependent)
            for (std::int64_t r = 0; r < c.rows; ++r) p[r * c.cols + 1] = 2.0f * p[r * c.cols];
        DeviceArray<float> d_p(p);
        host::orthonormalize_columns(p.data(), c.rows, c.cols);
        device::orthonormalize_columns(d_p.get(), c.rows, c.cols);
        const std::vector<float> got = d_p.to_host();
        CHECK_NO_MISMATCHES("columns", loom_test::compare_relative(got, p, 1e-5));
        loom_test::check_orthonormal_columns(got, c.rows, c.cols);
    }
}
