// Host token + position embedding: the lookup against a loop, the backward
// against central finite differences of the forward in double (the layer's
// gradient check, with repeated tokens), and bad token ids.
#include <catch2/catch.hpp>

#include "support/message_of.hpp"

#include <loom/core/error.hpp>
#include <loom/core/rng.hpp>
#include <loom/kernels/host/embedding.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;

constexpr std::int64_t B = 3, T = 5, C = 7, vocab = 11;

std::vector<float> normal_values(std::size_t n, std::uint64_t stream) {
    std::vector<float> v(n);
    loom::RngStream{19, stream}.fill_normal(v, 0);
    return v;
}

// Includes repeats (3 appears four times), the first id and the last.
const std::vector<std::int32_t> batch_tokens{3, 0, 10, 3, 5,   //
                                             7, 3, 3, 1, 10,  //
                                             2, 9, 4, 6, 0};

using loom_test::message_of;

}  // namespace

TEST_CASE("embedding_forward adds the token's row and the position's row", "[kernels][embedding]") {
    const auto token_table = normal_values(vocab * C, 1);
    const auto position_table = normal_values(T * C, 2);
    std::vector<float> out(B * T * C, 123.0f);
    host::embedding_forward(batch_tokens.data(), token_table.data(), position_table.data(), out.data(), B, T, C,
                            vocab);
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t < T; ++t)
            for (std::int64_t c = 0; c < C; ++c)
                CHECK(out[(b * T + t) * C + c] ==
                      token_table[batch_tokens[b * T + t] * C + c] + position_table[t * C + c]);
}

TEST_CASE("embedding_backward accumulates the gradients finite differences give, repeated tokens included",
          "[kernels][embedding][gradcheck]") {
    const auto dout = normal_values(B * T * C, 3);  // the loss is sum(dout * out)
    auto dtoken = normal_values(vocab * C, 4);
    auto dposition = normal_values(T * C, 5);
    const auto dtoken_before = dtoken, dposition_before = dposition;
    host::embedding_backward(batch_tokens.data(), dout.data(), dtoken.data(), dposition.data(), B, T, C);

    const auto token_table = normal_values(vocab * C, 6);
    const auto position_table = normal_values(T * C, 7);
    std::vector<double> tokens_d(token_table.begin(), token_table.end());
    std::vector<double> positions_d(position_table.begin(), position_table.end());
    auto loss = [&] {
        double total = 0.0;
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t t = 0; t < T; ++t)
                for (std::int64_t c = 0; c < C; ++c)
                    total += double{dout[(b * T + t) * C + c]} *
                             (tokens_d[batch_tokens[b * T + t] * C + c] + positions_d[t * C + c]);
        return total;
    };
    auto check_against_differences = [&](std::vector<double>& table, const std::vector<float>& after,
                                         const std::vector<float>& before) {
        for (std::size_t i = 0; i < table.size(); ++i) {
            const double saved = table[i];
            table[i] = saved + 1e-3;
            const double up = loss();
            table[i] = saved - 1e-3;
            const double down = loss();
            table[i] = saved;
            CAPTURE(i);
            CHECK(after[i] - before[i] == Approx((up - down) / 2e-3).epsilon(1e-5).margin(1e-5));
        }
    };
    check_against_differences(tokens_d, dtoken, dtoken_before);
    check_against_differences(positions_d, dposition, dposition_before);
}

TEST_CASE("embedding_forward names a token outside the vocabulary and where it sits, writing nothing",
          "[kernels][embedding]") {
    const auto token_table = normal_values(vocab * C, 8);
    const auto position_table = normal_values(T * C, 9);
    std::vector<float> out(B * T * C, 123.0f);
    auto tokens = batch_tokens;
    tokens[1 * T + 2] = 11;  // == vocab
    CHECK(message_of([&] {
              host::embedding_forward(tokens.data(), token_table.data(), position_table.data(), out.data(), B, T, C,
                                      vocab);
          }) == "embedding: token id 11 at batch 1, position 2 is outside the vocabulary [0, 11)");
    CHECK(out == std::vector<float>(B * T * C, 123.0f));
    tokens[1 * T + 2] = 3;
    tokens[2 * T + 4] = -1;
    CHECK(message_of([&] {
              host::embedding_forward(tokens.data(), token_table.data(), position_table.data(), out.data(), B, T, C,
                                      vocab);
          }) == "embedding: token id -1 at batch 2, position 4 is outside the vocabulary [0, 11)");
    CHECK(message_of([&] {
              host::embedding_forward(tokens.data(), token_table.data(), position_table.data(), out.data(), B, T, C,
                                      0);
          }) == "embedding: vocab = 0 has no tokens; pass vocab >= 1");
    CHECK(message_of([&] {
              host::embedding_forward(tokens.data(), token_table.data(), position_table.data(), out.data(), B, -T,
                                      C, vocab);
          }) == "embedding: sizes B = 3, T = -5, C = 7 must all be >= 0");
}

TEST_CASE("embedding_backward names a negative token id before writing", "[kernels][embedding]") {
    const auto dout = normal_values(B * T * C, 10);
    std::vector<float> dtoken(vocab * C, 0.0f), dposition(T * C, 0.0f);
    auto tokens = batch_tokens;
    tokens[0 * T + 3] = -7;
    CHECK(message_of([&] {
              host::embedding_backward(tokens.data(), dout.data(), dtoken.data(), dposition.data(), B, T, C);
          }) == "embedding backward: token id -7 at batch 0, position 3 is negative; token ids are in [0, vocab)");
    CHECK(dtoken == std::vector<float>(vocab * C, 0.0f));
    CHECK(dposition == std::vector<float>(T * C, 0.0f));
}

// A vocabulary split over 3 ranks ([0, 4), [4, 8), [8, 11)): each slice's
// lookup holds its own ids' rows and zeros elsewhere, so the slices' sum is
// the whole table's lookup; their backwards split the token gradient by
// rows, and each adds the whole position gradient.
TEST_CASE("embedding_slice_lookup and embedding_slice_backward split the whole vocabulary's", "[kernels][embedding]") {
    const auto token_table = normal_values(vocab * C, 7);
    const auto dout = normal_values(B * T * C, 8);
    const std::int64_t cuts[] = {0, 4, 8, vocab};
    std::vector<float> summed(B * T * C, 0.0f);
    std::vector<float> dtoken_whole(vocab * C, 0.0f), dposition_whole(T * C, 0.0f);
    host::embedding_backward(batch_tokens.data(), dout.data(), dtoken_whole.data(), dposition_whole.data(), B, T, C);
    for (int s = 0; s < 3; ++s) {
        CAPTURE(s);
        const std::int64_t start = cuts[s], stop = cuts[s + 1];
        std::vector<float> out(B * T * C, 123.0f);
        host::embedding_slice_lookup(batch_tokens.data(), token_table.data() + start * C, out.data(), B * T, T, C,
                                     start, stop, vocab);
        for (std::int64_t i = 0; i < B * T; ++i) {
            const bool own = batch_tokens[i] >= start && batch_tokens[i] < stop;
            for (std::int64_t c = 0; c < C; ++c) {
                CHECK(out[i * C + c] == (own ? token_table[batch_tokens[i] * C + c] : 0.0f));
                summed[i * C + c] += out[i * C + c];
            }
        }
        std::vector<float> dtoken((stop - start) * C, 0.0f), dposition(T * C, 0.0f);
        host::embedding_slice_backward(batch_tokens.data(), dout.data(), dtoken.data(), dposition.data(), B * T, T, C,
                                       start, stop);
        CHECK(dposition == dposition_whole);
        CHECK(std::vector<float>(dtoken_whole.begin() + start * C, dtoken_whole.begin() + stop * C) == dtoken);
    }
    for (std::int64_t i = 0; i < B * T; ++i)
        for (std::int64_t c = 0; c < C; ++c) CHECK(summed[i * C + c] == token_table[batch_tokens[i] * C + c]);
}

TEST_CASE("embedding_slice_lookup checks every id against the whole vocabulary, writing nothing",
          "[kernels][embedding]") {
    auto tokens = batch_tokens;
    tokens[7] = static_cast<std::int32_t>(vocab);  // batch 1, position 2: past the last id
    const auto token_table = normal_values(4 * C, 9);
    std::vector<float> out(B * T * C, 123.0f);
    CHECK(message_of([&] {
              host::embedding_slice_lookup(tokens.data(), token_table.data(), out.data(), B * T, T, C, 0, 4, vocab);
          }) == "embedding: token id 11 at batch 1, position 2 is outside the vocabulary [0, 11)");
    CHECK(out == std::vector<float>(B * T * C, 123.0f));
    CHECK(message_of([&] {
              host::embedding_slice_lookup(tokens.data(), token_table.data(), out.data(), B * T, 4, C, 0, 4, vocab);
          }) == "embedding: 15 tokens in sequences of T = 4 and C = 7; n must be a multiple of T >= 1 and C >= 0");
}

TEST_CASE("embedding_slice_backward refuses a negative id, as the whole backward and the device do, writing nothing",
          "[kernels][embedding]") {
    auto tokens = batch_tokens;
    tokens[8] = -3;  // batch 1, position 3: in no slice, and no id at all
    const auto dout = normal_values(B * T * C, 10);
    std::vector<float> dtoken(4 * C, 0.5f), dposition(T * C, 0.5f);
    // Slice [4, 8) holds none of the negative id's rows: it is refused all the same.
    CHECK(message_of([&] {
              host::embedding_slice_backward(tokens.data(), dout.data(), dtoken.data(), dposition.data(), B * T, T, C,
                                             4, 8);
          }) == "embedding backward: token id -3 at batch 1, position 3 is negative; token ids are in [0, vocab)");
    CHECK(dtoken == std::vector<float>(4 * C, 0.5f));
    CHECK(dposition == std::vector<float>(T * C, 0.5f));
    std::vector<float> dwhole(vocab * C, 0.0f), dposition_whole(T * C, 0.0f);
    CHECK(message_of([&] {
              host::embedding_backward(tokens.data(), dout.data(), dwhole.data(), dposition_whole.data(), B, T, C);
          }) == "embedding backward: token id -3 at batch 1, position 3 is negative; token ids are in [0, vocab)");
}

}  // namespace LOOM_TEST_FILE
