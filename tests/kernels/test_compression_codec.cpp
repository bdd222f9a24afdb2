// Gradient compression above the kernels: the error-feedback identity (nothing
// is lost, only delayed), ChunkCodec over every chunk compressor, and the
// parsing and printing of compressors and GradCompress policies.
#include <catch2/catch.hpp>

#include <loom/parallel/chunk_codec.hpp>
#include <loom/kernels/host/quantize.hpp>
#include <loom/kernels/host/top_k.hpp>
#include <loom/parallel/grad_compress.hpp>
#include <loom/parallel/strategy.hpp>

#include "support/compression_values.hpp"
#include "support/message_of.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>
#include <sstream>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;
using namespace loom_test;

}  // namespace

// --- error feedback ---------------------------------------------------------------------

TEST_CASE("error feedback loses nothing: sent + residual == sum of the gradients", "[compress]") {
    constexpr std::size_t n = 1000;
    constexpr int steps = 20;
    const std::vector<loom::Compression> compressors{
        loom::TopK<0.05>::compression,
        loom::Compression{loom::CompressorKind::top_k, 0.001},  // k = 1
        loom::Compression{loom::CompressorKind::one_bit, 1.0, 0, 64},
        loom::OneBit::compression,
        loom::Int8Block<32>::compression,
        loom::CastBf16::compression,
    };
    for (const auto& c : compressors) {
        for (const bool in_place : {false, true}) {
            CAPTURE(c.describe(), in_place);
            std::mt19937 rng(555);
            loom::parallel::ChunkCodec codec(c);
            std::vector<double> sum_g(n, 0.0), sum_sent(n, 0.0), sum_abs(n, 0.0);
            std::vector<float> e(n, 0.0f), x(n);
            std::vector<std::uint32_t> words(static_cast<std::size_t>(codec.words(n)));
            std::vector<float> sent(n);
            for (int t = 0; t < steps; ++t) {
                const auto g = normal_values(n, rng, 0.0f, t % 3 == 0 ? 10.0f : 1.0f);
                for (std::size_t i = 0; i < n; ++i) {
                    sum_g[i] += g[i];
                    sum_abs[i] += std::fabs(g[i]);
                }
                if (in_place) {  // the executor's way: e += g, then pack e into itself
                    for (std::size_t i = 0; i < n; ++i) e[i] += g[i];
                    codec.pack(e.data(), n, words.data(), e.data());
                } else {
                    for (std::size_t i = 0; i < n; ++i) x[i] = g[i] + e[i];
                    codec.pack(x.data(), n, words.data(), e.data());
                }
                codec.unpack(words.data(), n, sent.data(), 1.0f, false);
                for (std::size_t i = 0; i < n; ++i) sum_sent[i] += sent[i];
            }
            double scale = 0, worst = 0, residual_size = 0;
            for (std::size_t i = 0; i < n; ++i) {
                scale = std::max(scale, sum_abs[i]);
                worst = std::max(worst, std::fabs(sum_sent[i] + e[i] - sum_g[i]));
                residual_size = std::max(residual_size, static_cast<double>(std::fabs(e[i])));
            }
            INFO("worst |sent + e - sum g| = " << worst << " of a scale " << scale);
            CHECK(worst <= 1e-5 * scale);
            if (c.error_feedback()) CHECK(residual_size > 1e-3 * scale);  // a lossy compressor left something
        }
    }
}

// --- ChunkCodec -------------------------------------------------------------------------

TEST_CASE("ChunkCodec: word counts and round trips for every chunk compressor", "[compress]") {
    const std::vector<loom::Compression> compressors{
        loom::CastBf16::compression,   loom::CastFp16::compression,         loom::Int8Block<>::compression,
        loom::Int8Block<7>::compression, loom::TopK<0.01>::compression,     loom::TopK<0.3>::compression,
        loom::OneBit::compression,     loom::Compression{loom::CompressorKind::one_bit, 1.0, 0, 10},
    };
    std::mt19937 rng(8080);
    std::vector<std::int32_t> scratch;
    for (const auto& c : compressors) {
        loom::parallel::ChunkCodec codec(c);
        CHECK(codec.compression() == c);
        for (const std::int64_t n : {std::int64_t{1}, std::int64_t{2}, std::int64_t{7}, std::int64_t{1000},
                                     std::int64_t{1025}}) {
            CAPTURE(c.describe(), n);
            std::int64_t expected_words = 0;
            switch (c.kind) {
                case loom::CompressorKind::bf16:
                case loom::CompressorKind::fp16: expected_words = host::cast_words(n); break;
                case loom::CompressorKind::int8: expected_words = host::int8_words(n, c.block); break;
                case loom::CompressorKind::one_bit: expected_words = host::sign_words(n, c.block); break;
                case loom::CompressorKind::top_k: expected_words = 2 * host::top_k_count(n, c.ratio); break;
                default: FAIL("not a chunk compressor");
            }
            CHECK(codec.words(n) == expected_words);

            const auto x = normal_values(static_cast<std::size_t>(n), rng);
            auto words = words_with_sentinel(codec.words(n));
            std::vector<float> residual(x.size(), 6.0f);
            codec.pack(x.data(), n, words.data(), residual.data());
            CHECK(words.back() == sentinel);

            // The same words as the kernel itself writes.
            auto kernel_words = words_with_sentinel(expected_words);
            switch (c.kind) {
                case loom::CompressorKind::bf16: host::pack_cast(host::Cast::bf16, x.data(), n, kernel_words.data()); break;
                case loom::CompressorKind::fp16: host::pack_cast(host::Cast::f16, x.data(), n, kernel_words.data()); break;
                case loom::CompressorKind::int8: host::pack_int8(x.data(), n, c.block, kernel_words.data()); break;
                case loom::CompressorKind::one_bit: host::pack_signs(x.data(), n, c.block, kernel_words.data()); break;
                case loom::CompressorKind::top_k:
                    host::pack_top_k(x.data(), n, host::top_k_count(n, c.ratio), kernel_words.data(), scratch);
                    break;
                default: break;
            }
            CHECK(words == kernel_words);

            // Decoded: written over garbage, then accumulated with a weight.
            std::vector<float> decoded(x.size(), 1e9f);
            codec.unpack(words.data(), n, decoded.data(), 1.0f, false);
            std::int64_t wrong = 0, wrong_residual = 0, wrong_add = 0;
            const auto k = host::top_k_count(n, c.ratio);
            const auto selected = c.kind == loom::CompressorKind::top_k ? reference_top_k(x, k) : std::vector<std::int32_t>{};
            for (std::size_t i = 0; i < x.size(); ++i) {
                float expected = 0;
                switch (c.kind) {
                    case loom::CompressorKind::bf16: expected = scalar_round_trip(host::Cast::bf16, x[i]); break;
                    case loom::CompressorKind::fp16: expected = scalar_round_trip(host::Cast::f16, x[i]); break;
                    case loom::CompressorKind::top_k:
                        expected = std::binary_search(selected.begin(), selected.end(), static_cast<std::int32_t>(i)) ? x[i] : 0.0f;
                        break;
                    default: expected = decoded[i]; break;  // checked against the kernels below
                }
                if (bits_of(decoded[i]) != bits_of(expected)) ++wrong;
                if (bits_of(residual[i]) != bits_of(x[i] - decoded[i])) ++wrong_residual;
            }
            if (c.kind == loom::CompressorKind::int8) {
                std::vector<float> direct(x.size());
                host::unpack_int8(words.data(), n, c.block, direct.data());
                CHECK(direct == decoded);
                for (std::size_t i = 0; i < x.size(); ++i) {
                    const auto b = static_cast<std::int64_t>(i) / c.block;
                    if (!(std::fabs(x[i] - decoded[i]) <= from_bits(words[static_cast<std::size_t>(b)]) * 0.50001f)) ++wrong;
                }
            }
            if (c.kind == loom::CompressorKind::one_bit) {
                for (std::size_t i = 0; i < x.size(); ++i) {
                    const float s = from_bits(words[static_cast<std::size_t>(static_cast<std::int64_t>(i) / c.block)]);
                    if (decoded[i] != (x[i] < 0 ? -s : s)) ++wrong;
                }
            }
            CHECK(wrong == 0);
            CHECK(wrong_residual == 0);

            std::vector<float> acc(x.size(), 2.0f);
            codec.unpack(words.data(), n, acc.data(), 0.25f, true);
            for (std::size_t i = 0; i < x.size(); ++i)
                if (acc[i] != 2.0f + 0.25f * decoded[i]) ++wrong_add;
            CHECK(wrong_add == 0);
        }
    }
}

TEST_CASE("ChunkCodec refuses PowerSGD, no compression and invalid settings", "[compress]") {
    CHECK(message_of([] { loom::parallel::ChunkCodec codec(loom::PowerSGD<4>::compression); }) ==
          "ChunkCodec: PowerSGD<4> does not compress chunk by chunk");
    CHECK(message_of([] { loom::parallel::ChunkCodec codec(loom::Compression{}); }) ==
          "ChunkCodec: NoCompression does not compress chunk by chunk");
    CHECK(message_of([] { loom::parallel::ChunkCodec codec(loom::Compression{loom::CompressorKind::top_k, 0.0}); }) ==
          "TopK: ratio 0 is outside (0, 1]; it is the fraction of each chunk sent, e.g. 0.01 for 1%");
    CHECK(message_of([] { loom::parallel::ChunkCodec codec(loom::Compression{loom::CompressorKind::int8, 1.0, 0, 0}); }) ==
          "Int8Block<0>: a block of 0 values; it must hold at least 1");
    CHECK(message_of([] { loom::parallel::ChunkCodec codec(loom::Compression{loom::CompressorKind::one_bit}); }) ==
          "OneBit<0>: a block of 0 values; it must hold at least 1");
    CHECK(message_of([] { loom::parallel::ChunkCodec codec(loom::Compression{loom::CompressorKind::power_sgd}); }) ==
          "PowerSGD: rank 0 must be at least 1 (1 to 4 is typical)");
}

// --- parsing and printing ---------------------------------------------------------------

TEST_CASE("parse_compression reads train_gpt's --compress spellings", "[compress]") {
    using K = loom::CompressorKind;
    CHECK(loom::parse_compression("none") == loom::Compression{});
    CHECK_FALSE(loom::parse_compression("none").on());
    CHECK(loom::parse_compression("bf16").kind == K::bf16);
    CHECK(loom::parse_compression("bf16") == loom::CastBf16::compression);
    CHECK(loom::parse_compression("fp16") == loom::CastFp16::compression);
    const auto int8 = loom::parse_compression("int8");
    CHECK(int8.kind == K::int8);
    CHECK(int8.block == 128);
    CHECK(int8 == loom::Int8Block<128>::compression);
    CHECK(loom::parse_compression("int8:64").block == 64);
    CHECK(loom::parse_compression("int8:64") == loom::Int8Block<64>::compression);
    const auto topk = loom::parse_compression("topk:0.01");
    CHECK(topk.kind == K::top_k);
    CHECK(topk.ratio == 0.01);
    CHECK(topk == loom::TopK<0.01>::compression);
    CHECK(loom::parse_compression("topk:1").ratio == 1.0);
    CHECK(loom::parse_compression("topk:1e-3").ratio == 0.001);
    const auto psgd = loom::parse_compression("powersgd:4");
    CHECK(psgd.kind == K::power_sgd);
    CHECK(psgd.rank == 4);
    CHECK(psgd == loom::PowerSGD<4>::compression);
    const auto onebit = loom::parse_compression("onebit");
    CHECK(onebit.kind == K::one_bit);
    CHECK(onebit.block == loom::default_one_bit_block);
    CHECK(onebit == loom::OneBit::compression);

    // What each kind does with the exchange.
    CHECK(topk.error_feedback());
    CHECK(psgd.error_feedback());
    CHECK(onebit.error_feedback());
    CHECK_FALSE(int8.error_feedback());
    CHECK_FALSE(loom::CastBf16::compression.error_feedback());
    CHECK(int8.two_stage());
    CHECK(onebit.two_stage());
    CHECK_FALSE(topk.two_stage());
    CHECK_FALSE(psgd.two_stage());
    CHECK(loom::CastFp16::compression.is_cast());
    CHECK_FALSE(int8.is_cast());
}

TEST_CASE("parse_compression: bad spellings give one line naming the value", "[compress]") {
    const auto parse = [](const char* text) { return message_of([text] { (void)loom::parse_compression(text); }); };
    const auto zip = parse("zip");
    CHECK_THAT(zip, Catch::Contains("unknown compressor 'zip'"));
    for (const char* valid : {"none", "bf16", "fp16", "int8", "topk:RATIO", "powersgd:RANK", "onebit"}) {
        CAPTURE(valid);
        CHECK_THAT(zip, Catch::Contains(valid));
    }
    CHECK(parse("") != "(no error)");
    CHECK_THAT(parse("BF16"), Catch::Contains("unknown compressor 'BF16'"));

    const auto zero = parse("topk:0");
    CHECK_THAT(zero, Catch::Contains("outside (0, 1]"));
    CHECK_THAT(zero, Catch::Contains("ratio 0 "));
    const auto big = parse("topk:1.5");
    CHECK_THAT(big, Catch::Contains("outside (0, 1]"));
    CHECK_THAT(big, Catch::Contains("1.5"));
    CHECK_THAT(parse("topk:-0.1"), Catch::Contains("outside (0, 1]"));
    CHECK_THAT(parse("topk:nan"), Catch::Contains("outside (0, 1]"));
    CHECK(parse("topk") == "compressor 'topk' needs its ratio, e.g. topk:0.01");
    CHECK(parse("topk:") == "compressor 'topk' needs its ratio, e.g. topk:0.01");
    CHECK(parse("topk:abc") == "compressor 'topk:abc': 'abc' is not a ratio");
    CHECK(parse("topk:0.01x") == "compressor 'topk:0.01x': '0.01x' is not a ratio");

    CHECK(parse("powersgd:0") == "compressor 'powersgd:0': PowerSGD rank 0 must be a whole number in 1..1024");
    CHECK(parse("powersgd:2.5") == "compressor 'powersgd:2.5': PowerSGD rank 2.5 must be a whole number in 1..1024");
    CHECK(parse("powersgd:2000") ==
          "compressor 'powersgd:2000': PowerSGD rank 2000 must be a whole number in 1..1024");
    CHECK(parse("powersgd") == "compressor 'powersgd' needs its rank, e.g. powersgd:4");
    CHECK(parse("powersgd:x") == "compressor 'powersgd:x': 'x' is not a rank");

    CHECK(parse("bf16:3") == "compressor 'bf16:3' takes no ':' argument");
    CHECK(parse("bf16:") == "compressor 'bf16:' takes no ':' argument");
    CHECK(parse("onebit:0") == "compressor 'onebit:0': the onebit block 0 must be a whole number in 1..16777216");
    CHECK(parse("none:1") == "compressor 'none:1' takes no ':' argument");
    CHECK(parse("fp16:x") == "compressor 'fp16:x' takes no ':' argument");

    CHECK(parse("int8:0") == "compressor 'int8:0': the int8 block 0 must be a whole number in 1..16777216");
    CHECK(parse("int8:1.5") == "compressor 'int8:1.5': the int8 block 1.5 must be a whole number in 1..16777216");
    CHECK(parse("int8:q") == "compressor 'int8:q': 'q' is not a block size");

    for (const char* text : {"zip", "topk:0", "topk:1.5", "topk", "powersgd:0", "bf16:3", "int8:0"}) {
        CAPTURE(text);
        const auto m = parse(text);
        CHECK(m != "(no error)");
        CHECK(m.find('\n') == std::string::npos);
    }
}

TEST_CASE("Compression and GradCompress describe themselves as the policy types print", "[compress]") {
    CHECK(loom::parse_compression("topk:0.01").describe() == "TopK<0.01>");
    CHECK(loom::TopK<0.01>::compression.describe() == "TopK<0.01>");
    CHECK(loom::PowerSGD<4>::compression.describe() == "PowerSGD<4>");
    CHECK(loom::parse_compression("powersgd:4").describe() == "PowerSGD<4>");
    CHECK(loom::Int8Block<>::compression.describe() == "Int8Block<128>");
    CHECK(loom::parse_compression("int8:64").describe() == "Int8Block<64>");
    CHECK(loom::OneBit::compression.describe() == "OneBit");
    CHECK(loom::CastBf16::compression.describe() == "CastBf16");
    CHECK(loom::CastFp16::compression.describe() == "CastFp16");
    CHECK(loom::Compression{}.describe() == "NoCompression");

    CHECK(loom::describe<loom::GradCompress<loom::PowerSGD<4>>>() == "GradCompress<PowerSGD<4>>");
    CHECK(loom::describe<loom::GradCompress<loom::TopK<0.01>>>() == "GradCompress<TopK<0.01>>");
    CHECK(loom::describe<loom::GradCompress<loom::CastBf16, loom::PpAxis>>() == "GradCompress<CastBf16, PpAxis>");
    CHECK(loom::describe<loom::GradCompress<loom::CastFp16, loom::TpAxis>>() == "GradCompress<CastFp16, TpAxis>");
    CHECK(loom::describe<loom::GradCompress<loom::CastBf16, loom::DpAxis>>() == "GradCompress<CastBf16>");
    CHECK(loom::GradCompress<loom::CastBf16, loom::PpAxis>::axis == loom::CompressedAxis::pp);
    CHECK(loom::GradCompress<loom::OneBit>::axis == loom::CompressedAxis::dp);
    CHECK(loom::GradCompress<loom::OneBit>::kind == loom::PolicyKind::compression);

    using S = loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::TopK<0.01>>>;
    STATIC_REQUIRE(S::dp_compression.kind == loom::CompressorKind::top_k);
    CHECK(S::dp_compression.ratio == 0.01);
    CHECK(S::dp_compression == loom::parse_compression("topk:0.01"));
    CHECK_FALSE(S::pp_compression.on());
    CHECK_FALSE(S::tp_compression.on());
    std::ostringstream printed;
    printed << S{};
    CHECK_THAT(printed.str(), Catch::EndsWith(", GradCompress<TopK<0.01>>>"));
    CHECK_THAT(printed.str(), Catch::StartsWith("Strategy<DataParallel<"));

    using H = loom::Strategy<loom::DataParallel<>, loom::GradCompress<loom::PowerSGD<2>>,
                             loom::GradCompress<loom::CastBf16, loom::PpAxis>>;
    CHECK(H::dp_compression == loom::PowerSGD<2>::compression);
    CHECK(H::pp_compression == loom::CastBf16::compression);
    CHECK_FALSE(H::tp_compression.on());
    CHECK_FALSE(loom::Strategy<loom::DataParallel<>>::dp_compression.on());
}

}  // namespace LOOM_TEST_FILE
