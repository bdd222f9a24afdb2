// ByteCorpus: the simplest language-model data there is. Tokens are the bytes
// of a text (vocab 256), or the bytes modulo a smaller vocab, so no tokenizer
// is needed and any file is a corpus. Batches are counter-based: batch `step`
// is a pure function of (seed, step), so a run resumed at step k sees exactly
// the batches the uninterrupted run saw, and data-parallel ranks can each
// take their rows of the same global batch without talking to each other.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"

namespace loom::data {

namespace detail {

// "512 bytes", "12.3 kB", "1.2 MB", "3.4 GB" (decimal units, as file managers show).
[[nodiscard]] inline std::string human_bytes(std::int64_t bytes) {
    if (bytes < 1000) return std::to_string(bytes) + (bytes == 1 ? " byte" : " bytes");
    const char* units[] = {"kB", "MB", "GB", "TB"};
    double value = static_cast<double>(bytes) / 1000.0;
    int unit = 0;
    while (value >= 999.95 && unit < 3) {
        value /= 1000.0;
        ++unit;
    }
    char text[32];
    std::snprintf(text, sizeof text, "%.1f %s", value, units[unit]);
    return text;
}

[[nodiscard]] inline std::string read_data_file(const std::filesystem::path& path) {
    const std::string name = path.string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int error = errno;
        LOOM_FAIL("data file ", name, " cannot be opened: ", std::generic_category().message(error));
    }
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct ::stat status {};
    LOOM_CHECK(::fstat(fd, &status) == 0 && S_ISREG(status.st_mode), "data file ", name,
               " is not a regular file; give the path of a text file");
    std::string bytes(static_cast<std::size_t>(status.st_size), '\0');
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ::ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
        if (got < 0) {
            const int error = errno;
            if (error == EINTR) continue;
            LOOM_FAIL("data file ", name, " cannot be read: ", std::generic_category().message(error));
        }
        if (got == 0) break;  // the file shrank while we read it; keep what is there
        done += static_cast<std::size_t>(got);
    }
    bytes.resize(done);
    LOOM_CHECK(!bytes.empty(), "data file ", name, " is empty; a byte corpus needs at least one sequence of text");
    return bytes;
}

// A small probabilistic grammar of English-like sentences: a fixed
// vocabulary of words, noun phrases with optional adjectives, transitive and
// intransitive clauses, capitals and full stops. Spelling is perfectly
// regular and the word classes alternate, so a byte-level model's loss falls
// quickly from log2(256) = 8 bits towards the ~2.6 bits of the next byte given
// the previous one (less still given more context).
class SentenceGrammar {
public:
    explicit SentenceGrammar(std::uint64_t seed) : rng_{seed, stream_id("loom.data.synthetic_corpus")} {}

    void sentence(std::string& out) {
        const std::size_t first = out.size();
        noun_phrase(out);
        if (draw(3) != 0) {
            word(out, transitive_verbs);
            noun_phrase(out);
            if (draw(3) == 0) {
                word(out, prepositions);
                noun_phrase(out);
            }
        } else {
            word(out, intransitive_verbs);
            if (draw(2) == 0) word(out, adverbs);
        }
        out[first] = static_cast<char>(out[first] - 'a' + 'A');
        out.back() = '.';  // replaces the space after the last word
        out += draw(6) == 0 ? '\n' : ' ';
    }

private:
    static constexpr std::array<std::string_view, 6> determiners{"the", "a", "every", "some", "my", "this"};
    static constexpr std::array<std::string_view, 10> adjectives{"small", "quick", "red",   "old",  "happy",
                                                                 "quiet", "bright", "lazy", "green", "tall"};
    static constexpr std::array<std::string_view, 12> nouns{"cat",   "dog",    "bird",  "fox",    "child", "farmer",
                                                            "river", "tree",   "house", "garden", "teacher", "robot"};
    static constexpr std::array<std::string_view, 8> transitive_verbs{"sees",    "likes", "chases", "finds",
                                                                      "follows", "helps", "paints", "watches"};
    static constexpr std::array<std::string_view, 5> intransitive_verbs{"sleeps", "runs", "sings", "waits", "smiles"};
    static constexpr std::array<std::string_view, 5> prepositions{"near", "under", "behind", "with", "beside"};
    static constexpr std::array<std::string_view, 4> adverbs{"slowly", "quietly", "today", "again"};

    void noun_phrase(std::string& out) {
        word(out, determiners);
        if (draw(2) == 0) word(out, adjectives);
        word(out, nouns);
    }

    template <std::size_t N>
    void word(std::string& out, const std::array<std::string_view, N>& choices) {
        out += choices[draw(static_cast<std::uint32_t>(N))];
        out += ' ';
    }

    std::uint32_t draw(std::uint32_t n) { return rng_.bits(next_++) % n; }

    RngStream rng_;
    std::uint64_t next_ = 0;
};

}  // namespace detail

class ByteCorpus {
public:
    // The bytes of `path`; token i is byte i modulo `vocab`.
    [[nodiscard]] static ByteCorpus from_file(const std::filesystem::path& path, int vocab = 256) {
        check_vocab(vocab);
        std::string bytes = detail::read_data_file(path);
        const std::string name = path.string();
        return ByteCorpus(std::move(bytes), vocab, "data file " + name, "file " + name);
    }

    // `bytes` bytes of sentences from a small random grammar (see
    // SentenceGrammar), the same for the same seed on every machine.
    [[nodiscard]] static ByteCorpus synthetic(std::int64_t bytes, std::uint64_t seed, int vocab = 256) {
        check_vocab(vocab);
        LOOM_CHECK(bytes > 0, "a synthetic corpus needs a positive size in bytes, got ", bytes);
        std::string text;
        text.reserve(static_cast<std::size_t>(bytes) + 128);
        detail::SentenceGrammar grammar(seed);
        while (static_cast<std::int64_t>(text.size()) < bytes) grammar.sentence(text);
        text.resize(static_cast<std::size_t>(bytes));
        return ByteCorpus(std::move(text), vocab, "synthetic text",
                          "synthetic text, seed " + std::to_string(seed));
    }

    [[nodiscard]] std::int64_t size() const noexcept { return static_cast<std::int64_t>(text_.size()); }
    [[nodiscard]] int vocab() const noexcept { return vocab_; }
    // The raw bytes, before the vocab mapping.
    [[nodiscard]] std::string_view text() const noexcept { return text_; }

    // "file data.txt (1.2 MB)" or "synthetic text, seed 7 (100.0 kB)".
    [[nodiscard]] std::string describe() const { return description_ + " (" + detail::human_bytes(size()) + ")"; }

    // Token `i`: byte i modulo vocab.
    [[nodiscard]] std::int32_t token(std::int64_t i) const {
        LOOM_CHECK(i >= 0 && i < size(), "token index ", i, " is out of range for ", describe(), "; valid are 0..",
                   size() - 1);
        return token_at(static_cast<std::size_t>(i));
    }

    // Batch `step`: `batch` sequences of `seq` tokens, row-major into
    // `inputs` [batch * seq], with `targets` the same windows shifted by one
    // token. Row r starts at an offset drawn from RngStream{seed, step}
    // words 2r and 2r + 1, so rows do not depend on the batch size either.
    void batch(std::uint64_t seed, std::int64_t step, std::int64_t batch, std::int64_t seq,
               std::span<std::int32_t> inputs, std::span<std::int32_t> targets) const {
        rows(seed, step, 0, batch, seq, inputs, targets);
    }

    // Rows [first_row, first_row + row_count) of batch `step`, exactly as
    // batch() would produce them: a data-parallel rank reads its share of the
    // global batch and the union over ranks is the serial batch.
    void rows(std::uint64_t seed, std::int64_t step, std::int64_t first_row, std::int64_t row_count, std::int64_t seq,
              std::span<std::int32_t> inputs, std::span<std::int32_t> targets) const {
        LOOM_CHECK(step >= 0, "batch step ", step, " is negative; steps count from 0");
        LOOM_CHECK(first_row >= 0 && row_count > 0, "batch rows [", first_row, ", ", first_row + row_count,
                   ") are invalid; need first_row >= 0 and at least one row");
        LOOM_CHECK(seq > 0, "sequence length ", seq, " must be positive");
        LOOM_CHECK(size() > seq, source_, " has ", size(), size() == 1 ? " byte" : " bytes",
                   ", fewer than one sequence of ", seq, " tokens plus its target");
        const auto needed = static_cast<std::size_t>(row_count * seq);
        LOOM_CHECK(inputs.size() == needed, "inputs hold ", inputs.size(), " tokens but ", row_count, " rows x ", seq,
                   " tokens need ", needed);
        LOOM_CHECK(targets.size() == needed, "targets hold ", targets.size(), " tokens but ", row_count, " rows x ",
                   seq, " tokens need ", needed);

        const RngStream rng{seed, static_cast<std::uint64_t>(step)};
        const auto starts = static_cast<std::uint64_t>(size() - seq);  // windows [s, s + seq] inside the text
        const auto length = static_cast<std::size_t>(seq);
        for (std::int64_t r = 0; r < row_count; ++r) {
            const auto row = static_cast<std::uint64_t>(first_row + r);
            // 64 random bits make the modulo bias negligible (< starts / 2^64).
            const std::uint64_t bits = (std::uint64_t{rng.bits(2 * row)} << 32) | rng.bits(2 * row + 1);
            const auto start = static_cast<std::size_t>(bits % starts);
            const std::size_t out = static_cast<std::size_t>(r) * length;
            for (std::size_t t = 0; t < length; ++t) {
                inputs[out + t] = token_at(start + t);
                targets[out + t] = token_at(start + t + 1);
            }
        }
    }

private:
    ByteCorpus(std::string text, int vocab, std::string source, std::string description)
        : text_(std::move(text)), vocab_(vocab), source_(std::move(source)), description_(std::move(description)) {}

    static void check_vocab(int vocab) {
        LOOM_CHECK(vocab >= 2 && vocab <= 256, "byte corpus vocab ", vocab, " is out of range; valid are 2..256");
    }

    [[nodiscard]] std::int32_t token_at(std::size_t i) const {
        return static_cast<std::int32_t>(static_cast<unsigned char>(text_[i])) % vocab_;
    }

    std::string text_;
    int vocab_ = 256;
    std::string source_;       // "data file x.txt", the subject of error messages
    std::string description_;  // "file x.txt", for describe()
};

}  // namespace loom::data
