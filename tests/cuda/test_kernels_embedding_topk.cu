// The CUDA kernels of kernels/cuda/embedding.cuh and top_k.cuh against their
// host twins in kernels/host, on the same seeded inputs, and their argument
// errors against the host's, word for word. Every comparison here is bit for
// bit (equal bits), because both kernels do exactly the host's arithmetic:
//   embedding: the forward is one addition per element (a vocabulary slice's
//              lookup a copy or a zero); the backward adds each
//              table row's contributions in the host's (b, t) order (a stable
//              sort by token id, then one thread per run and channel), so the
//              gradients are the host's sums, not merely close to them;
//   top-k:     the selection is an exact integer computation, so the packed
//              words (indices and value bits, NaN payloads included) and the
//              residuals (copies and zeros) are the host's bits; unpacking
//              rounds weight * value and the addition separately, as the host
//              does, and is compared bit for bit too.
// Where a NaN flows through arithmetic (a NaN gradient, an unpacked NaN value)
// x86 keeps the operand's payload and the GPU returns its canonical NaN, so
// there NaN must meet NaN with any payload.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../support/embedding_top_k_inputs.hpp"
#include "../support/message_of.hpp"
#include "device_support.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/kernels/cuda/embedding.cuh"
#include "loom/kernels/cuda/top_k.cuh"
#include "loom/kernels/host/embedding.hpp"
#include "loom/kernels/host/top_k.hpp"

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_test::bits_of;
using loom_test::compare_floats;
using loom_test::compare_words;
using loom_test::DeviceArray;
using loom_test::embedding_shapes;
using loom_test::EmbeddingShape;
using loom_test::from_bits;
using loom_test::message_of;
using loom_test::repeated_tokens;
using loom_test::Stream;
using loom_test::top_k_inputs;
using loom_test::uniform;
using loom_test::uploads_done;
using loom_test::wide_range;

}  // namespace

// --- embedding ------------------------------------------------------------------

// Forward: one IEEE addition per element on both sides, so bit for bit. The
// output starts as garbage (all bytes 0xff, a NaN) that must be overwritten.
// The position table has more rows than T, as the host allows.
TEST_CASE("cuda::embedding_forward equals host::embedding_forward bit for bit", "[kernels][embedding]") {
    Stream stream(cudaStreamNonBlocking);
    std::mt19937 rng(1101);
    for (const auto [B, T, C, vocab] : embedding_shapes) {
        CAPTURE(B, T, C, vocab);
        const std::vector<std::int32_t> tokens = repeated_tokens(B * T, vocab, rng);
        const std::vector<float> token_table = uniform(static_cast<std::size_t>(vocab * C), -1.0f, 1.0f, rng);
        const std::vector<float> position_table = wide_range(static_cast<std::size_t>((T + 3) * C), rng);
        std::vector<float> expected(static_cast<std::size_t>(B * T * C));
        host::embedding_forward(tokens.data(), token_table.data(), position_table.data(), expected.data(), B, T, C,
                                vocab);

        DeviceArray<std::int32_t> d_tokens(tokens);
        DeviceArray<float> d_token_table(token_table), d_position_table(position_table), d_out(expected.size());
        d_out.fill_bytes(0xff);
        uploads_done();
        dev::embedding_forward(d_tokens.get(), d_token_table.get(), d_position_table.get(), d_out.get(), B, T, C,
                               vocab, stream.get());
        CHECK_NO_MISMATCHES("out", compare_floats(d_out.to_host(), expected, false));
    }
}

// Backward: both tables start nonzero (it accumulates) and the gradients span
// 24 binary orders of magnitude, so any other order of the additions would
// show (checked below on the host for the GPT-2-sized shape). Two backward
// calls accumulate twice, on the host and on the device, to the same bits.
// One gradient is NaN: its token row and position row turn NaN on both sides.
TEST_CASE("cuda::embedding_backward accumulates the host's sums in the host's order, bit for bit",
          "[kernels][embedding]") {
    Stream stream(cudaStreamNonBlocking);
    std::mt19937 rng(1102);
    for (const auto [B, T, C, vocab] : embedding_shapes) {
        CAPTURE(B, T, C, vocab);
        const std::int64_t n = B * T;
        const std::vector<std::int32_t> tokens = repeated_tokens(n, vocab, rng);
        std::vector<float> dout = wide_range(static_cast<std::size_t>(n * C), rng);
        const bool with_nan = n * C > 1;
        if (with_nan) dout[static_cast<std::size_t>(n * C / 2)] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> dtoken_table = uniform(static_cast<std::size_t>(vocab * C), -1.0f, 1.0f, rng);
        std::vector<float> dposition_table = uniform(static_cast<std::size_t>((T + 3) * C), -1.0f, 1.0f, rng);

        DeviceArray<std::int32_t> d_tokens(tokens);
        DeviceArray<float> d_dout(dout), d_dtoken_table(dtoken_table), d_dposition_table(dposition_table);
        uploads_done();
        for (int call = 1; call <= 2; ++call) {
            CAPTURE(call);
            host::embedding_backward(tokens.data(), dout.data(), dtoken_table.data(), dposition_table.data(), B, T, C);
            dev::embedding_backward(d_tokens.get(), d_dout.get(), d_dtoken_table.get(), d_dposition_table.get(), B, T,
                                    C, stream.get());
            // NaN as NaN only where the NaN gradient went; everywhere else equal bits.
            CHECK_NO_MISMATCHES("dtoken_table", compare_floats(d_dtoken_table.to_host(), dtoken_table, with_nan));
            CHECK_NO_MISMATCHES("dposition_table",
                                compare_floats(d_dposition_table.to_host(), dposition_table, with_nan));
        }

        if (vocab == 50257) {
            // The test can tell orders apart: adding each token row's
            // gradients in reverse (b, t) order changes some bits.
            std::vector<float> forward_order(static_cast<std::size_t>(vocab * C), 0.0f), reverse_order = forward_order;
            for (std::int64_t i = 0; i < n; ++i)
                for (std::int64_t c = 0; c < C; ++c) {
                    forward_order[static_cast<std::size_t>(tokens[i] * C + c)] += dout[static_cast<std::size_t>(i * C + c)];
                    const std::int64_t r = n - 1 - i;
                    reverse_order[static_cast<std::size_t>(tokens[r] * C + c)] += dout[static_cast<std::size_t>(r * C + c)];
                }
            CHECK(compare_floats(forward_order, reverse_order, true).count > 0);
        }
    }
}

// A vocabulary slice (tensor parallelism's embedding): the lookup copies the
// slice's rows and zeros the rest, and the backward adds the slice's token
// rows and the whole position table, in the host's order: bit for bit, for a
// slice at the start, in the middle and at the end of the vocabulary.
TEST_CASE("cuda::embedding_slice_lookup and embedding_slice_backward equal the host's bit for bit",
          "[kernels][embedding]") {
    Stream stream(cudaStreamNonBlocking);
    std::mt19937 rng(1103);
    for (const auto [B, T, C, vocab] : embedding_shapes) {
        const std::int64_t n = B * T;
        for (const auto [start, stop] : loom_test::vocabulary_slices(vocab)) {
            CAPTURE(B, T, C, vocab, start, stop);
            const std::vector<std::int32_t> tokens = repeated_tokens(n, vocab, rng);
            const std::vector<float> table = uniform(static_cast<std::size_t>((stop - start) * C), -1.0f, 1.0f, rng);
            std::vector<float> expected(static_cast<std::size_t>(n * C));
            host::embedding_slice_lookup(tokens.data(), table.data(), expected.data(), n, T, C, start, stop, vocab);
            const std::vector<float> dout = wide_range(static_cast<std::size_t>(n * C), rng);
            std::vector<float> dtoken = uniform(static_cast<std::size_t>((stop - start) * C), -1.0f, 1.0f, rng);
            std::vector<float> dposition = uniform(static_cast<std::size_t>((T + 3) * C), -1.0f, 1.0f, rng);

            DeviceArray<std::int32_t> d_tokens(tokens);
            DeviceArray<float> d_table(table), d_out(expected.size()), d_dout(dout), d_dtoken(dtoken),
                d_dposition(dposition);
            d_out.fill_bytes(0xff);
            uploads_done();
            dev::embedding_slice_lookup(d_tokens.get(), d_table.get(), d_out.get(), n, T, C, start, stop, vocab,
                                        stream.get());
            CHECK_NO_MISMATCHES("out", compare_floats(d_out.to_host(), expected, false));
            host::embedding_slice_backward(tokens.data(), dout.data(), dtoken.data(), dposition.data(), n, T, C, start,
                                           stop);
            dev::embedding_slice_backward(d_tokens.get(), d_dout.get(), d_dtoken.get(), d_dposition.get(), n, T, C,
                                          start, stop, stream.get());
            CHECK_NO_MISMATCHES("dtoken", compare_floats(d_dtoken.to_host(), dtoken, false));
            CHECK_NO_MISMATCHES("dposition", compare_floats(d_dposition.to_host(), dposition, false));
        }
    }
}

// Every token is checked before anything is written, and the error is the
// host's, word for word: the first bad id and where it sits. The outputs
// keep their bytes.
TEST_CASE("cuda::embedding refuses bad token ids with the host's message and writes nothing",
          "[kernels][embedding]") {
    Stream stream(cudaStreamNonBlocking);
    std::mt19937 rng(1103);
    const std::int64_t B = 3, T = 1025, C = 3, vocab = 97;
    const std::vector<float> token_table = uniform(static_cast<std::size_t>(vocab * C), -1.0f, 1.0f, rng);
    const std::vector<float> position_table = uniform(static_cast<std::size_t>(T * C), -1.0f, 1.0f, rng);
    const std::vector<float> dout = uniform(static_cast<std::size_t>(B * T * C), -1.0f, 1.0f, rng);
    DeviceArray<float> d_token_table(token_table), d_position_table(position_table), d_dout(dout);
    DeviceArray<float> d_out(static_cast<std::size_t>(B * T * C)), d_dtoken(token_table), d_dposition(position_table);

    struct BadCase {
        std::int64_t position;
        std::int32_t id;
        std::int64_t second_position;  // a later bad id, which must not be the one named (-1: none)
        std::int32_t second_id;
    };
    const BadCase cases[] = {{0, -1, -1, 0},
                             {2 * T + 1024, 97, -1, 0},
                             {T + 5, std::numeric_limits<std::int32_t>::max(), 2 * T, -7},
                             {1500, std::numeric_limits<std::int32_t>::min(), 1501, 1000},
                             {3000, 200, 3001, -3}};
    for (const auto& bad : cases) {
        CAPTURE(bad.position, bad.id, bad.second_position, bad.second_id);
        std::vector<std::int32_t> tokens = repeated_tokens(B * T, vocab, rng);
        tokens[static_cast<std::size_t>(bad.position)] = bad.id;
        if (bad.second_position >= 0) tokens[static_cast<std::size_t>(bad.second_position)] = bad.second_id;
        DeviceArray<std::int32_t> d_tokens(tokens);
        d_out.fill_bytes(0x5a);
        uploads_done();

        std::vector<float> host_out(static_cast<std::size_t>(B * T * C), 0.0f);
        const std::string expected = message_of([&] {
            host::embedding_forward(tokens.data(), token_table.data(), position_table.data(), host_out.data(), B, T, C,
                                    vocab);
        });
        REQUIRE(expected != "(no error)");
        CHECK(message_of([&] {
                  dev::embedding_forward(d_tokens.get(), d_token_table.get(), d_position_table.get(), d_out.get(), B,
                                         T, C, vocab, stream.get());
              }) == expected);
        const std::vector<float> out = d_out.to_host();
        CHECK(std::all_of(out.begin(), out.end(), [](float v) { return bits_of(v) == 0x5a5a'5a5au; }));

        // The backward checks only the sign: a negative id anywhere is refused
        // (the first one named); ids >= vocab pass unchecked, as on the host.
        std::vector<float> host_dtoken = token_table, host_dposition = position_table;
        const bool any_negative = std::any_of(tokens.begin(), tokens.end(), [](std::int32_t t) { return t < 0; });
        if (!any_negative) continue;
        const std::string expected_backward = message_of([&] {
            host::embedding_backward(tokens.data(), dout.data(), host_dtoken.data(), host_dposition.data(), B, T, C);
        });
        REQUIRE(expected_backward != "(no error)");
        CHECK(message_of([&] {
                  dev::embedding_backward(d_tokens.get(), d_dout.get(), d_dtoken.get(), d_dposition.get(), B, T, C,
                                          stream.get());
              }) == expected_backward);
        CHECK_NO_MISMATCHES("dtoken_table untouched", compare_floats(d_dtoken.to_host(), token_table, false));
        CHECK_NO_MISMATCHES("dposition_table untouched", compare_floats(d_dposition.to_host(), position_table, false));
    }
}

// Argument checks before any device work (null pointers are never read), the
// host's messages; tokens are still checked when C = 0; nothing to do for
// B * T = 0.
TEST_CASE("cuda::embedding's size checks and empty shapes match the host's", "[kernels][embedding]") {
    for (const EmbeddingShape s : {EmbeddingShape{-1, 2, 3, 5}, EmbeddingShape{1, -2, 3, 5},
                                   EmbeddingShape{1, 2, -3, 5}, EmbeddingShape{1, 2, 3, 0}}) {
        CAPTURE(s.B, s.T, s.C, s.vocab);
        const std::string expected =
            message_of([&] { host::embedding_forward(nullptr, nullptr, nullptr, nullptr, s.B, s.T, s.C, s.vocab); });
        REQUIRE(expected != "(no error)");
        CHECK(message_of([&] { dev::embedding_forward(nullptr, nullptr, nullptr, nullptr, s.B, s.T, s.C, s.vocab); }) ==
              expected);
        const bool bad_sizes = s.B < 0 || s.T < 0 || s.C < 0;  // else the backward would read the (null) tokens
        if (bad_sizes) {
            const std::string expected_backward =
                message_of([&] { host::embedding_backward(nullptr, nullptr, nullptr, nullptr, s.B, s.T, s.C); });
            REQUIRE(expected_backward != "(no error)");
            CHECK(message_of([&] { dev::embedding_backward(nullptr, nullptr, nullptr, nullptr, s.B, s.T, s.C); }) ==
                  expected_backward);
        }
    }
    CHECK_NOTHROW(dev::embedding_forward(nullptr, nullptr, nullptr, nullptr, 0, 5, 3, 7));
    CHECK_NOTHROW(dev::embedding_forward(nullptr, nullptr, nullptr, nullptr, 5, 0, 3, 7));
    CHECK_NOTHROW(dev::embedding_backward(nullptr, nullptr, nullptr, nullptr, 0, 5, 3));

    const std::vector<std::int32_t> tokens{1, 2, 9, -1, 3, 4};
    DeviceArray<std::int32_t> d_tokens(tokens);
    const std::string expected =
        message_of([&] { host::embedding_forward(tokens.data(), nullptr, nullptr, nullptr, 2, 3, 0, 5); });
    REQUIRE(expected != "(no error)");
    CHECK(message_of([&] { dev::embedding_forward(d_tokens.get(), nullptr, nullptr, nullptr, 2, 3, 0, 5); }) ==
          expected);
    const std::string expected_backward =
        message_of([&] { host::embedding_backward(tokens.data(), nullptr, nullptr, nullptr, 2, 3, 0); });
    REQUIRE(expected_backward != "(no error)");
    CHECK(message_of([&] { dev::embedding_backward(d_tokens.get(), nullptr, nullptr, nullptr, 2, 3, 0); }) ==
          expected_backward);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}

// --- top-k ----------------------------------------------------------------------

// Packing: the words (k indices, then k value bits, in increasing index
// order) equal the host's word for word, so do the residuals (copies and
// zeros: bits, NaN payloads included), with a separate residual, in place
// (residual = x) and without one. One scratch serves every call, growing and
// shrinking in use, on two streams in turn. Words past the 2k are a sentinel
// the device must not overwrite.
TEST_CASE("cuda::pack_top_k selects the host's elements: words and residuals equal bit for bit",
          "[kernels][top_k]") {
    Stream first_stream(cudaStreamNonBlocking), second_stream(cudaStreamNonBlocking);
    dev::TopKScratch scratch;
    std::vector<std::int32_t> host_scratch;
    std::mt19937 rng(1201);
    constexpr std::uint32_t sentinel = 0xdead'beefu;
    int call = 0;
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}, (std::int64_t{1} << 20) + 3}) {
        for (int kind = 0; kind < 3; ++kind) {
            const std::vector<float> x = top_k_inputs(n, kind, rng);
            DeviceArray<float> d_x(x), d_residual(x.size()), d_in_place(x);
            for (const std::int64_t k : {std::int64_t{1}, std::max<std::int64_t>(1, n / 100), n}) {
                CAPTURE(n, kind, k);
                const cudaStream_t stream = (call++ % 2 == 0 ? first_stream : second_stream).get();
                const auto word_count = static_cast<std::size_t>(host::top_k_words(k));
                std::vector<std::uint32_t> expected(word_count + 1, sentinel);
                std::vector<float> expected_residual(x.size(), 8.0f);
                host::pack_top_k(x.data(), n, k, expected.data(), host_scratch, expected_residual.data());
                REQUIRE(expected.back() == sentinel);

                DeviceArray<std::uint32_t> d_words(std::vector<std::uint32_t>(word_count + 1, sentinel));
                DeviceArray<std::uint32_t> d_words_in_place(std::vector<std::uint32_t>(word_count + 1, sentinel));
                DeviceArray<std::uint32_t> d_words_alone(std::vector<std::uint32_t>(word_count + 1, sentinel));
                LOOM_CUDA_CHECK(cudaMemcpy(d_in_place.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
                d_residual.fill_bytes(0x5a);
                uploads_done();
                dev::pack_top_k(d_x.get(), n, k, d_words.get(), scratch, d_residual.get(), stream);
                dev::pack_top_k(d_in_place.get(), n, k, d_words_in_place.get(), scratch, d_in_place.get(), stream);
                dev::pack_top_k(d_x.get(), n, k, d_words_alone.get(), scratch, nullptr, stream);

                CHECK_NO_MISMATCHES("words", compare_words(d_words.to_host(), expected));
                CHECK_NO_MISMATCHES("words, residual in place", compare_words(d_words_in_place.to_host(), expected));
                CHECK_NO_MISMATCHES("words, no residual", compare_words(d_words_alone.to_host(), expected));
                CHECK_NO_MISMATCHES("residual", compare_floats(d_residual.to_host(), expected_residual, false));
                CHECK_NO_MISMATCHES("residual in place", compare_floats(d_in_place.to_host(), expected_residual, false));
                CHECK_NO_MISMATCHES("x unchanged", compare_floats(d_x.to_host(), x, false));
            }
        }
    }
    CHECK(scratch.capacity() > 0);
}

// The host test's hand-picked cases (ties, NaN before any finite value, NaN
// tied with Inf, a NaN's bits travelling as they are) give the host's words.
TEST_CASE("cuda::pack_top_k on hand-picked ties and NaN gives the host's words", "[kernels][top_k]") {
    const std::vector<std::vector<float>> inputs = loom_test::top_k_hand_picked();
    dev::TopKScratch scratch;
    std::vector<std::int32_t> host_scratch;
    for (const auto& x : inputs) {
        const auto n = static_cast<std::int64_t>(x.size());
        DeviceArray<float> d_x(x);
        for (std::int64_t k = 0; k <= n; ++k) {
            CAPTURE(x, k);
            std::vector<std::uint32_t> expected(static_cast<std::size_t>(host::top_k_words(k)) + 1, 7u);
            host::pack_top_k(x.data(), n, k, expected.data(), host_scratch);
            DeviceArray<std::uint32_t> d_words(std::vector<std::uint32_t>(expected.size(), 7u));
            dev::pack_top_k(d_x.get(), n, k, d_words.get(), scratch);
            CHECK_NO_MISMATCHES("words", compare_words(d_words.to_host(), expected));
        }
    }
}

// Scatter: out[index] += weight * value, rounded as the host rounds, on
// messages the device packed (distinct, increasing indices: one thread per
// pair) and on one with repeated and decreasing indices (one thread, the
// host's order). A weight that is not a power of two rounds its product; it is
// compared only when the host cannot contract a * b + c into an FMA (baseline
// x86-64, loom's target, cannot). NaN values give NaN on both sides.
TEST_CASE("cuda::unpack_top_k_add equals host::unpack_top_k_add bit for bit", "[kernels][top_k]") {
#if defined(__FP_FAST_FMAF)
    const std::vector<float> weights{1.0f, 0.5f};
#else
    const std::vector<float> weights{1.0f, 0.5f, 0.3f};
#endif
    Stream stream(cudaStreamNonBlocking);
    dev::TopKScratch scratch;
    std::vector<std::int32_t> host_scratch;
    std::mt19937 rng(1301);
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1000}, (std::int64_t{1} << 20) + 3}) {
        const std::vector<float> x = top_k_inputs(n, 0, rng);
        const std::vector<float> start = uniform(x.size(), -1.0f, 1.0f, rng);
        for (const std::int64_t k : {std::int64_t{1}, std::max<std::int64_t>(1, n / 100), n}) {
            std::vector<std::uint32_t> words(static_cast<std::size_t>(host::top_k_words(k)));
            host::pack_top_k(x.data(), n, k, words.data(), host_scratch);
            DeviceArray<std::uint32_t> d_words(words);
            for (const float weight : weights) {
                CAPTURE(n, k, weight);
                std::vector<float> expected = start;
                host::unpack_top_k_add(words.data(), k, n, expected.data(), weight);
                DeviceArray<float> d_out(start);
                uploads_done();
                dev::unpack_top_k_add(d_words.get(), k, n, d_out.get(), weight, stream.get());
                CHECK_NO_MISMATCHES("out", compare_floats(d_out.to_host(), expected, true));
            }
        }
    }

    // Not from pack_top_k: index 2 three times, then decreasing indices.
    const std::vector<std::uint32_t> repeated{2, 2, 5, 2, 1, 0, bits_of(0.1f), bits_of(1e8f), bits_of(-3.0f),
                                              bits_of(-1e8f), bits_of(0.7f), bits_of(2.5f)};
    for (const float weight : weights) {
        CAPTURE(weight);
        std::vector<float> expected{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
        DeviceArray<float> d_out(expected);
        DeviceArray<std::uint32_t> d_repeated(repeated);
        host::unpack_top_k_add(repeated.data(), 6, 6, expected.data(), weight);
        dev::unpack_top_k_add(d_repeated.get(), 6, 6, d_out.get(), weight);
        CHECK_NO_MISMATCHES("out, repeated indices", compare_floats(d_out.to_host(), expected, false));
    }
}

// The argument errors are the host's, word for word. A corrupted index is
// refused before anything is written (stricter than the host, which has
// applied the pairs before it); k = 0 packs nothing but still copies the
// residual; an empty message unpacks nothing.
TEST_CASE("cuda::pack_top_k and unpack_top_k_add refuse what the host refuses, with its messages",
          "[kernels][top_k]") {
    dev::TopKScratch scratch;
    std::vector<std::int32_t> host_scratch;
    const std::vector<float> x{0.5f, -7.0f, 0.25f, 6.0f, -0.125f};
    DeviceArray<float> d_x(x);
    DeviceArray<std::uint32_t> d_words(12);
    for (const std::int64_t k : {std::int64_t{6}, std::int64_t{-1}}) {
        CAPTURE(k);
        std::vector<std::uint32_t> words(12);
        const std::string expected = message_of([&] { host::pack_top_k(x.data(), 5, k, words.data(), host_scratch); });
        REQUIRE(expected != "(no error)");
        CHECK(message_of([&] { dev::pack_top_k(d_x.get(), 5, k, d_words.get(), scratch); }) == expected);
    }
    const std::int64_t too_many = std::int64_t{1} << 31;  // checked before any memory is touched
    const std::string expected_size =
        message_of([&] { host::pack_top_k(nullptr, too_many, 1, nullptr, host_scratch); });
    REQUIRE(expected_size != "(no error)");
    CHECK(message_of([&] { dev::pack_top_k(nullptr, too_many, 1, nullptr, scratch); }) == expected_size);

    // k = 0: no words, the residual is a copy of x.
    DeviceArray<std::uint32_t> untouched(std::vector<std::uint32_t>(2, 9u));
    DeviceArray<float> d_residual(x.size());
    d_residual.fill_bytes(0x5a);
    dev::pack_top_k(d_x.get(), 5, 0, untouched.get(), scratch, d_residual.get());
    CHECK(untouched.to_host() == std::vector<std::uint32_t>(2, 9u));
    CHECK_NO_MISMATCHES("residual for k = 0", compare_floats(d_residual.to_host(), x, false));

    const std::vector<std::vector<std::uint32_t>> corrupted{{1, 5, bits_of(2.0f), bits_of(3.0f)},
                                                            {0xffff'ffffu, 5, bits_of(2.0f), bits_of(3.0f)},
                                                            {3, 1, bits_of(2.0f), bits_of(3.0f)}};
    const std::vector<float> start{1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
    for (std::size_t m = 0; m < corrupted.size(); ++m) {
        CAPTURE(m);
        const std::int64_t n = m == 2 ? 3 : 5;  // the last: index 3 of a chunk of 3
        std::vector<float> host_out(6, 0.0f);
        const std::string expected =
            message_of([&] { host::unpack_top_k_add(corrupted[m].data(), 2, n, host_out.data()); });
        REQUIRE(expected != "(no error)");
        DeviceArray<std::uint32_t> d_bad(corrupted[m]);
        DeviceArray<float> d_out(start);
        CHECK(message_of([&] { dev::unpack_top_k_add(d_bad.get(), 2, n, d_out.get()); }) == expected);
        CHECK_NO_MISMATCHES("out untouched", compare_floats(d_out.to_host(), start, false));
    }
    CHECK_NOTHROW(dev::unpack_top_k_add(nullptr, 0, 5, nullptr));
    CHECK_NOTHROW(dev::pack_top_k(nullptr, 0, 0, nullptr, scratch));
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}
