// ByteCorpus: byte tokens, counter-based batches, and a synthetic text with
// structure a small model can learn.
#include <catch2/catch.hpp>

#include <loom/data/corpus.hpp>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "io/temp_dir.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::data::ByteCorpus;
using loom_test::TempDir;
using loom_test::write_bytes;

namespace {

struct Batch {
    std::vector<std::int32_t> inputs, targets;
    bool operator==(const Batch&) const = default;
};

Batch batch_of(const ByteCorpus& corpus, std::uint64_t seed, std::int64_t step, std::int64_t batch, std::int64_t seq) {
    Batch b{std::vector<std::int32_t>(static_cast<std::size_t>(batch * seq)),
            std::vector<std::int32_t>(static_cast<std::size_t>(batch * seq))};
    corpus.batch(seed, step, batch, seq, b.inputs, b.targets);
    return b;
}

// H(next byte | byte) in bits, estimated from the text's bigram counts.
double conditional_entropy_bits(const ByteCorpus& corpus) {
    std::vector<double> pair(256 * 256, 0.0), first(256, 0.0);
    for (std::int64_t i = 0; i + 1 < corpus.size(); ++i) {
        const auto a = static_cast<std::size_t>(corpus.token(i));
        const auto b = static_cast<std::size_t>(corpus.token(i + 1));
        pair[a * 256 + b] += 1.0;
        first[a] += 1.0;
    }
    const double n = static_cast<double>(corpus.size() - 1);
    double h = 0.0;
    for (std::size_t a = 0; a < 256; ++a)
        for (std::size_t b = 0; b < 256; ++b)
            if (pair[a * 256 + b] > 0) h -= pair[a * 256 + b] / n * std::log2(pair[a * 256 + b] / first[a]);
    return h;
}

}  // namespace

TEST_CASE("ByteCorpus reads a file and maps bytes to tokens modulo the vocab", "[corpus]") {
    TempDir dir;
    const auto path = dir / "data.txt";
    write_bytes(path, std::string("AB\xff\x00z", 5));
    const ByteCorpus bytes = ByteCorpus::from_file(path);
    CHECK(bytes.size() == 5);
    CHECK(bytes.vocab() == 256);
    CHECK(bytes.text() == std::string("AB\xff\x00z", 5));
    CHECK(std::vector<std::int32_t>{bytes.token(0), bytes.token(1), bytes.token(2), bytes.token(3), bytes.token(4)} ==
          std::vector<std::int32_t>{65, 66, 255, 0, 122});
    CHECK(bytes.describe() == "file " + path.string() + " (5 bytes)");

    const ByteCorpus small = ByteCorpus::from_file(path, 64);
    CHECK(small.vocab() == 64);
    CHECK(std::vector<std::int32_t>{small.token(0), small.token(1), small.token(2), small.token(3), small.token(4)} ==
          std::vector<std::int32_t>{1, 2, 63, 0, 58});
    CHECK_THROWS_WITH(small.token(5), Catch::StartsWith("token index 5 is out of range for file " + path.string() +
                                                        " (5 bytes); valid are 0..4"));

    // Every token of a batch is in range.
    const Batch b = batch_of(small, 1, 0, 3, 2);
    for (std::int32_t t : b.inputs) CHECK((t >= 0 && t < 64));
    for (std::int32_t t : b.targets) CHECK((t >= 0 && t < 64));
}

TEST_CASE("ByteCorpus::from_file names the file that is missing, empty or not a file", "[corpus][errors]") {
    TempDir dir;
    const auto missing = dir / "missing.txt";
    CHECK_THROWS_WITH(ByteCorpus::from_file(missing),
                      Catch::StartsWith("data file " + missing.string() + " cannot be opened: No such file or directory"));
    write_bytes(dir / "empty.txt", "");
    CHECK_THROWS_WITH(ByteCorpus::from_file(dir / "empty.txt"),
                      Catch::StartsWith("data file " + (dir / "empty.txt").string() + " is empty"));
    CHECK_THROWS_WITH(ByteCorpus::from_file(dir.path()),
                      Catch::StartsWith("data file " + dir.path().string() + " is not a regular file"));
    write_bytes(dir / "ok.txt", "text");
    CHECK_THROWS_WITH(ByteCorpus::from_file(dir / "ok.txt", 257),
                      Catch::StartsWith("byte corpus vocab 257 is out of range; valid are 2..256"));
    CHECK_THROWS_WITH(ByteCorpus::synthetic(100, 1, 1), Catch::StartsWith("byte corpus vocab 1 is out of range"));
    CHECK_THROWS_WITH(ByteCorpus::synthetic(0, 1), Catch::StartsWith("a synthetic corpus needs a positive size in bytes, got 0"));
}

TEST_CASE("a corpus shorter than one sequence plus its target is refused by name", "[corpus][errors]") {
    TempDir dir;
    const auto path = dir / "x.txt";
    write_bytes(path, "0123456789");
    const ByteCorpus corpus = ByteCorpus::from_file(path);
    std::vector<std::int32_t> inputs(128), targets(128);
    CHECK_THROWS_WITH(corpus.batch(1, 0, 1, 128, inputs, targets),
                      Catch::StartsWith("data file " + path.string() +
                                        " has 10 bytes, fewer than one sequence of 128 tokens plus its target ["));
    std::vector<std::int32_t> in10(10), out10(10);
    CHECK_THROWS_WITH(corpus.batch(1, 0, 1, 10, in10, out10),
                      Catch::StartsWith("data file " + path.string() + " has 10 bytes, fewer than one sequence of 10"));
    std::vector<std::int32_t> in9(9), out9(9);
    corpus.batch(1, 0, 1, 9, in9, out9);  // exactly one window fits
    CHECK(in9 == std::vector<std::int32_t>{'0', '1', '2', '3', '4', '5', '6', '7', '8'});
    CHECK(out9 == std::vector<std::int32_t>{'1', '2', '3', '4', '5', '6', '7', '8', '9'});

    const ByteCorpus tiny = ByteCorpus::synthetic(1, 3);
    std::vector<std::int32_t> one(1), other(1);
    CHECK_THROWS_WITH(tiny.batch(1, 0, 1, 1, one, other),
                      Catch::StartsWith("synthetic text has 1 byte, fewer than one sequence of 1 tokens plus its target"));
    CHECK_THROWS_WITH(corpus.batch(1, 0, 2, 4, in9, out9),
                      Catch::StartsWith("inputs hold 9 tokens but 2 rows x 4 tokens need 8"));
    CHECK_THROWS_WITH(corpus.batch(1, -1, 1, 9, in9, out9), Catch::StartsWith("batch step -1 is negative"));
}

TEST_CASE("batches depend on (seed, step) alone and targets are inputs shifted by one", "[corpus]") {
    const ByteCorpus corpus = ByteCorpus::synthetic(50'000, 11);
    const ByteCorpus same = ByteCorpus::synthetic(50'000, 11);
    const std::int64_t batch = 8, seq = 64;

    // Resuming at step 5 sees what the uninterrupted run saw at step 5.
    std::vector<Batch> uninterrupted;
    for (std::int64_t step = 0; step < 8; ++step) uninterrupted.push_back(batch_of(corpus, 42, step, batch, seq));
    for (std::int64_t step = 5; step < 8; ++step) CHECK(batch_of(same, 42, step, batch, seq) == uninterrupted[step]);
    CHECK(uninterrupted[0] != uninterrupted[1]);
    CHECK(batch_of(corpus, 43, 0, batch, seq) != uninterrupted[0]);

    const std::string_view text = corpus.text();
    for (const Batch& b : uninterrupted) {
        for (std::int64_t r = 0; r < batch; ++r) {
            const auto row = static_cast<std::size_t>(r * seq);
            for (std::size_t t = 0; t + 1 < static_cast<std::size_t>(seq); ++t)
                REQUIRE(b.targets[row + t] == b.inputs[row + t + 1]);
            // The row plus its last target is a window of the text.
            std::string window;
            for (std::size_t t = 0; t < static_cast<std::size_t>(seq); ++t) window += static_cast<char>(b.inputs[row + t]);
            window += static_cast<char>(b.targets[row + static_cast<std::size_t>(seq) - 1]);
            REQUIRE(text.find(window) != std::string_view::npos);
        }
    }
}

TEST_CASE("rows of a batch are the same whichever rank reads them", "[corpus]") {
    const ByteCorpus corpus = ByteCorpus::synthetic(10'000, 5);
    const std::int64_t batch = 8, seq = 16;
    const Batch whole = batch_of(corpus, 9, 3, batch, seq);
    Batch joined{std::vector<std::int32_t>(whole.inputs.size()), std::vector<std::int32_t>(whole.targets.size())};
    for (std::int64_t rank = 0; rank < 4; ++rank) {
        const auto at = static_cast<std::size_t>(rank * 2 * seq);
        corpus.rows(9, 3, rank * 2, 2, seq, std::span(joined.inputs).subspan(at, 2 * seq),
                    std::span(joined.targets).subspan(at, 2 * seq));
    }
    CHECK(joined == whole);
    // A smaller batch is a prefix of a larger one.
    const Batch half = batch_of(corpus, 9, 3, 4, seq);
    CHECK(std::equal(half.inputs.begin(), half.inputs.end(), whole.inputs.begin()));
}

TEST_CASE("batch offsets reach every window of the corpus", "[corpus]") {
    TempDir dir;
    write_bytes(dir / "abc.txt", "abcdefghijklmnopqrst");  // 20 bytes, seq 4: 16 windows
    const ByteCorpus corpus = ByteCorpus::from_file(dir / "abc.txt");
    std::set<std::int32_t> first_tokens;
    for (std::int64_t step = 0; step < 50; ++step) {
        const Batch b = batch_of(corpus, 1, step, 4, 4);
        for (std::size_t r = 0; r < 4; ++r) first_tokens.insert(b.inputs[r * 4]);
    }
    CHECK(first_tokens.size() == 16);
    CHECK(*first_tokens.begin() == 'a');
    CHECK(*first_tokens.rbegin() == 'p');
}

TEST_CASE("the synthetic corpus is deterministic, sized exactly and full of structure", "[corpus]") {
    const ByteCorpus a = ByteCorpus::synthetic(200'000, 7);
    CHECK(a.size() == 200'000);
    CHECK(a.text() == ByteCorpus::synthetic(200'000, 7).text());
    CHECK(a.text() != ByteCorpus::synthetic(200'000, 8).text());
    CHECK(a.describe() == "synthetic text, seed 7 (200.0 kB)");
    CHECK(ByteCorpus::synthetic(1'234'567, 7).describe() == "synthetic text, seed 7 (1.2 MB)");
    for (char c : a.text()) REQUIRE(((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' ' || c == '.' || c == '\n'));
    CHECK(a.text().substr(0, 1).find_first_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ") == 0);

    // A byte-level model starts at log2(256) = 8 bits per token; this text's
    // next byte given the previous one carries far less.
    const double h = conditional_entropy_bits(a);
    INFO("H(next byte | byte) = " << h << " bits");
    CHECK(h < 3.5);  // measured 2.65
    CHECK(h > 0.5);  // but it is not a constant either

    const ByteCorpus small = ByteCorpus::synthetic(200'000, 7, 32);
    const double h_small = conditional_entropy_bits(small);
    INFO("vocab 32: H = " << h_small << " bits, log2(32) = 5");
    CHECK(h_small < 0.6 * 5.0);
    for (std::int64_t i = 0; i < 1000; ++i) REQUIRE(small.token(i) == static_cast<unsigned char>(a.text()[i]) % 32);
}

}  // namespace LOOM_TEST_FILE
