// A small, strict JSON reader and the few writing helpers loom's files need
// (safetensors headers, metrics lines). Strict means RFC 8259 exactly: no
// comments, no trailing commas, no NaN, no leading zeros, valid UTF-8 only,
// plus one rule of our own: an object may not repeat a key, because a
// checkpoint whose header names a tensor twice has no single meaning.
// What a parse gives (Document, Value) is in io/json_value.hpp.
#pragma once

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/io/json_value.hpp"

namespace loom::io::json {

// The largest text parse accepts, just under 1 GiB: offsets are 32-bit, and
// the nodes (at most half the bytes plus one) are indexed, up to one past
// the last, in the 29 bits above the kind.
inline constexpr std::size_t max_document_bytes = (std::size_t{1} << 30) - 4;

namespace detail {

class Parser {
public:
    // Nesting beyond this is refused rather than recursed into: a header of
    // a million '[' must fail with a message, not overflow the stack.
    static constexpr int max_depth = 64;

    // `limit` below max_document_bytes only lets tests see the refusal
    // without a gigabyte of text.
    explicit Parser(std::string_view text, std::size_t limit = max_document_bytes)
        : source_size_(text.size()), input_(text), limit_(limit < max_document_bytes ? limit : max_document_bytes) {}

    // The whole text must be exactly one value, with optional whitespace around it.
    std::optional<Document> document(std::string& error) {
        if (input_.size() > limit_) {
            error = "a JSON text of " + std::to_string(input_.size()) + " bytes is longer than the " +
                    std::to_string(limit_) + " this reader accepts at byte 0";
            return std::nullopt;
        }
        Document result;
        result.storage_ = std::make_unique<Storage>();
        Storage& storage = *result.storage_;
        storage.text = std::make_unique_for_overwrite<char[]>(input_.size() + 1);
        if (!input_.empty()) std::memcpy(storage.text.get(), input_.data(), input_.size());
        storage.text[input_.size()] = '\0';
        storage.text_size = input_.size();
        text_ = storage.text.get();
        storage.nodes.reserve(most_nodes());
        nodes_ = &storage.nodes;
        skip_whitespace();
        if (!value(0)) {
            error = std::move(error_);
            return std::nullopt;
        }
        skip_whitespace();
        if (at_ < source_size_) {
            error = "unexpected " + describe_here() + " after the end of the value at byte " + std::to_string(at_);
            return std::nullopt;
        }
        return result;
    }

private:
    // Every node but the root follows one of ',', ':' or the '[' or '{' of
    // a container that is not empty, outside a string, so their count plus
    // one bounds the nodes: one allocation of the right size instead of a
    // vector doubling (whose peak is three times the nodes). Valid JSON has
    // at most a node per two bytes (plus the root), which caps the count
    // for texts that are not JSON ("[,,,,"): the parser stops at their
    // first error before it has more nodes than that.
    [[nodiscard]] std::size_t most_nodes() const noexcept {
        std::size_t count = 1;
        bool in_string = false;
        const std::size_t n = input_.size();
        for (std::size_t i = 0; i < n; ++i) {
            const char c = input_[i];
            if (in_string) {
                if (c == '\\') ++i;
                else if (c == '"') in_string = false;
            } else if (c == '"') {
                in_string = true;
            } else if (c == ',' || c == ':') {
                ++count;
            } else if (c == '[' || c == '{') {
                std::size_t next = i + 1;
                while (next < n && (input_[next] == ' ' || input_[next] == '\t' || input_[next] == '\n' ||
                                    input_[next] == '\r'))
                    ++next;
                if (next < n && input_[next] != ']' && input_[next] != '}') ++count;
            }
        }
        return std::min(count, n / 2 + 1);
    }

    std::uint32_t push(Kind kind, std::size_t offset, std::size_t size = 0) {
        const auto index = static_cast<std::uint32_t>(nodes_->size());
        nodes_->push_back(Node{static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(size),
                               static_cast<std::uint32_t>(kind) | ((index + 1) << kind_bits)});
        return index;
    }
    void close(std::uint32_t index, std::size_t size) {
        Node& node = (*nodes_)[index];
        node.size = static_cast<std::uint32_t>(size);
        node.kind_end = (node.kind_end & ((1u << kind_bits) - 1)) | (static_cast<std::uint32_t>(nodes_->size()) << kind_bits);
    }
    [[nodiscard]] std::string_view string_at(std::uint32_t index) const noexcept {
        const Node& node = (*nodes_)[index];
        return {text_ + node.offset + 1, node.size};
    }

    bool value(int depth) {
        if (at_ >= source_size_) return fail("the text ends where a value was expected");
        switch (text_[at_]) {
            case '{': return object(depth);
            case '[': return array(depth);
            case '"': return string();
            case 't': return literal("true", Kind::boolean, true);
            case 'f': return literal("false", Kind::boolean, false);
            case 'n': return literal("null", Kind::null, false);
            default:
                if (text_[at_] == '-' || (text_[at_] >= '0' && text_[at_] <= '9')) return number();
                return fail("expected a value but found " + describe_here());
        }
    }

    bool object(int depth) {
        if (depth >= max_depth) return fail("nesting deeper than " + std::to_string(max_depth) + " levels");
        const std::uint32_t self = push(Kind::object, at_);
        ++at_;  // '{'
        skip_whitespace();
        std::size_t members = 0;
        if (!consume('}')) {
            for (;;) {
                skip_whitespace();
                if (at_ >= source_size_ || text_[at_] != '"')
                    return fail("expected a string key in an object but found " + describe_here());
                const std::uint32_t key = static_cast<std::uint32_t>(nodes_->size());
                if (!string()) return false;
                skip_whitespace();
                if (!consume(':'))
                    return fail("expected ':' after the object key \"" + std::string(string_at(key)) + "\" but found " +
                                describe_here());
                skip_whitespace();
                if (!value(depth + 1)) return false;
                ++members;
                skip_whitespace();
                if (consume('}')) break;
                if (!consume(',')) return fail("expected ',' or '}' in an object but found " + describe_here());
            }
        }
        close(self, members);
        return unique_keys(self, members);
    }

    // An object may not repeat a key. Sorting its keys finds a repeat in
    // O(n log n) (comparing every pair took 28 s for 160,000 keys); the
    // message names the first key, in document order, that repeats an
    // earlier one, as a reader going through the text would meet it.
    bool unique_keys(std::uint32_t self, std::size_t members) {
        if (members < 2) return true;
        std::vector<std::uint32_t> keys;
        keys.reserve(members);
        for (std::uint32_t at = self + 1; at < nodes_->size(); at = (*nodes_)[at + 1].kind_end >> kind_bits)
            keys.push_back(at);
        std::sort(keys.begin(), keys.end(), [&](std::uint32_t a, std::uint32_t b) {
            const std::string_view ka = string_at(a), kb = string_at(b);
            return ka != kb ? ka < kb : a < b;
        });
        std::uint32_t first_repeat = 0;
        for (std::size_t i = 1; i < keys.size(); ++i) {
            // keys[i] repeats keys[i - 1]; the second of each run of equal keys is its first repeat.
            const bool repeat = string_at(keys[i]) == string_at(keys[i - 1]);
            const bool second = i < 2 || string_at(keys[i - 2]) != string_at(keys[i - 1]);
            if (repeat && second && (first_repeat == 0 || keys[i] < first_repeat)) first_repeat = keys[i];
        }
        if (first_repeat == 0) return true;
        at_ = (*nodes_)[first_repeat].offset;
        return fail("duplicate object key \"" + std::string(string_at(first_repeat)) + "\"");
    }

    bool array(int depth) {
        if (depth >= max_depth) return fail("nesting deeper than " + std::to_string(max_depth) + " levels");
        const std::uint32_t self = push(Kind::array, at_);
        ++at_;  // '['
        skip_whitespace();
        std::size_t elements = 0;
        if (!consume(']')) {
            for (;;) {
                skip_whitespace();
                if (!value(depth + 1)) return false;
                ++elements;
                skip_whitespace();
                if (consume(']')) break;
                if (!consume(',')) return fail("expected ',' or ']' in an array but found " + describe_here());
            }
        }
        close(self, elements);
        return true;
    }

    bool literal(std::string_view word, Kind kind, bool truth) {
        if (std::string_view(text_ + at_, source_size_ - at_).substr(0, word.size()) != word)
            return fail("expected a value but found " + describe_here());
        push(kind, at_, truth ? 1 : 0);
        at_ += word.size();
        return true;
    }

    // RFC 8259 grammar: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
    bool number() {
        const std::size_t begin = at_;
        consume('-');
        if (consume('0')) {
            if (digit_here()) return fail("a number may not have a leading zero");
        } else if (!digits()) {
            return fail("expected a digit in a number but found " + describe_here());
        }
        if (consume('.') && !digits()) return fail("expected a digit after the decimal point but found " + describe_here());
        if (at_ < source_size_ && (text_[at_] == 'e' || text_[at_] == 'E')) {
            ++at_;
            if (!consume('+')) consume('-');
            if (!digits()) return fail("expected a digit in an exponent but found " + describe_here());
        }
        push(Kind::number, begin, at_ - begin);
        return true;
    }

    // Decodes the string at the cursor into the text itself, from just
    // after its opening quote: the write position never passes the read
    // position, since no escape is shorter than what it stands for.
    bool string() {
        const std::uint32_t self = push(Kind::string, at_);
        ++at_;  // opening quote
        write_ = at_;
        const std::size_t begin = at_;
        for (;;) {
            if (at_ >= source_size_) return fail("a string is not closed before the end of the text");
            const auto c = static_cast<unsigned char>(text_[at_]);
            if (c == '"') {
                ++at_;
                (*nodes_)[self].size = static_cast<std::uint32_t>(write_ - begin);
                return true;
            }
            if (c < 0x20) return fail("a string holds the raw control byte " + std::to_string(c) + "; it must be escaped");
            if (c == '\\') {
                if (!escape()) return false;
            } else if (c < 0x80) {
                put(static_cast<char>(c));
                ++at_;
            } else if (!utf8_sequence()) {
                return false;
            }
        }
    }

    void put(char c) noexcept { text_[write_++] = c; }

    bool escape() {
        ++at_;  // backslash
        if (at_ >= source_size_) return fail("a string ends inside an escape sequence");
        const char c = text_[at_++];
        switch (c) {
            case '"': put('"'); return true;
            case '\\': put('\\'); return true;
            case '/': put('/'); return true;
            case 'b': put('\b'); return true;
            case 'f': put('\f'); return true;
            case 'n': put('\n'); return true;
            case 'r': put('\r'); return true;
            case 't': put('\t'); return true;
            case 'u': break;
            default: --at_; return fail("invalid escape sequence \\" + std::string(1, c) + " in a string");
        }
        std::uint32_t code = 0;
        if (!hex4(code)) return false;
        if (code >= 0xD800 && code <= 0xDBFF) {  // a high surrogate needs its low half next
            std::uint32_t low = 0;
            if (source_size_ - at_ < 2 || text_[at_] != '\\' || text_[at_ + 1] != 'u')
                return fail("a \\u escape holds a lone high surrogate");
            at_ += 2;
            if (!hex4(low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return fail("a \\u escape holds a high surrogate without its low half");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        } else if (code >= 0xDC00 && code <= 0xDFFF) {
            return fail("a \\u escape holds a lone low surrogate");
        }
        append_utf8(code);
        return true;
    }

    bool hex4(std::uint32_t& code) {
        if (at_ + 4 > source_size_) return fail("a \\u escape needs four hex digits");
        for (int i = 0; i < 4; ++i) {
            const char c = text_[at_];
            std::uint32_t v = 0;
            if (c >= '0' && c <= '9') v = static_cast<std::uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f') v = static_cast<std::uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') v = static_cast<std::uint32_t>(c - 'A' + 10);
            else return fail("a \\u escape needs four hex digits but found " + describe_here());
            code = code * 16 + v;
            ++at_;
        }
        return true;
    }

    // Copies one well-formed UTF-8 sequence (shortest form, no surrogates,
    // at most U+10FFFF), as Python's decoder demands.
    bool utf8_sequence() {
        const auto lead = static_cast<unsigned char>(text_[at_]);
        std::size_t length = 0;
        std::uint32_t code = 0;
        if (lead >= 0xC2 && lead <= 0xDF) {
            length = 2;
            code = lead & 0x1Fu;
        } else if (lead >= 0xE0 && lead <= 0xEF) {
            length = 3;
            code = lead & 0x0Fu;
        } else if (lead >= 0xF0 && lead <= 0xF4) {
            length = 4;
            code = lead & 0x07u;
        } else {
            return fail("invalid UTF-8 byte " + std::to_string(lead) + " in a string");
        }
        if (at_ + length > source_size_) return fail("a UTF-8 sequence is cut off by the end of the text");
        for (std::size_t i = 1; i < length; ++i) {
            const auto next = static_cast<unsigned char>(text_[at_ + i]);
            if ((next & 0xC0u) != 0x80u) return fail("invalid UTF-8 continuation byte " + std::to_string(next) + " in a string");
            code = (code << 6) | (next & 0x3Fu);
        }
        const std::uint32_t shortest = length == 2 ? 0x80u : length == 3 ? 0x800u : 0x10000u;
        if (code < shortest || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
            return fail("an invalid UTF-8 sequence (overlong, surrogate or beyond U+10FFFF) in a string");
        for (std::size_t i = 0; i < length; ++i) put(text_[at_ + i]);
        at_ += length;
        return true;
    }

    void append_utf8(std::uint32_t code) {
        if (code < 0x80) {
            put(static_cast<char>(code));
        } else if (code < 0x800) {
            put(static_cast<char>(0xC0 | (code >> 6)));
            put(static_cast<char>(0x80 | (code & 0x3F)));
        } else if (code < 0x10000) {
            put(static_cast<char>(0xE0 | (code >> 12)));
            put(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
            put(static_cast<char>(0x80 | (code & 0x3F)));
        } else {
            put(static_cast<char>(0xF0 | (code >> 18)));
            put(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
            put(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
            put(static_cast<char>(0x80 | (code & 0x3F)));
        }
    }

    bool digit_here() const { return at_ < source_size_ && text_[at_] >= '0' && text_[at_] <= '9'; }
    bool digits() {
        const std::size_t begin = at_;
        while (digit_here()) ++at_;
        return at_ > begin;
    }
    bool consume(char c) {
        if (at_ < source_size_ && text_[at_] == c) {
            ++at_;
            return true;
        }
        return false;
    }
    void skip_whitespace() {
        while (at_ < source_size_ &&
               (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
            ++at_;
    }

    // "'x'", "byte 0x07" or "the end of the text": what stands at the cursor
    // (which decoding never overwrites: it writes behind the cursor).
    std::string describe_here() const {
        if (at_ >= source_size_) return "the end of the text";
        const auto c = static_cast<unsigned char>(text_[at_]);
        if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
        constexpr char hex[] = "0123456789abcdef";
        return std::string("byte 0x") + hex[c >> 4] + hex[c & 0xF];
    }

    bool fail(std::string message) {
        if (error_.empty()) error_ = std::move(message) + " at byte " + std::to_string(at_);
        return false;
    }

    std::size_t source_size_;
    std::string_view input_;
    std::size_t limit_;
    char* text_ = nullptr;             // the document's copy, decoded in place
    std::vector<Node>* nodes_ = nullptr;
    std::size_t at_ = 0;               // read position
    std::size_t write_ = 0;            // where the current string's next decoded byte goes
    std::string error_;
};

}  // namespace detail

// Parses one JSON document. On failure returns nullopt and sets `error` to
// one sentence ending in the byte offset, e.g. "expected ':' after the object
// key \"a\" but found '}' at byte 5".
[[nodiscard]] inline std::optional<Document> parse(std::string_view text, std::string& error) {
    return detail::Parser(text).document(error);
}

// Parses or throws loom::Error "<context>: invalid JSON: <why> at byte N".
[[nodiscard]] inline Document parse_or_throw(std::string_view text, std::string_view context) {
    std::string error;
    std::optional<Document> result = parse(text, error);
    LOOM_CHECK(result.has_value(), context, ": invalid JSON: ", error);
    return std::move(*result);
}

// `text` as a JSON string literal with its quotes. Control characters and the
// two JSON metacharacters are escaped; other bytes pass through, so UTF-8
// stays UTF-8 (Python's json.loads reads both forms).
[[nodiscard]] inline std::string quote(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 2);
    out += '"';
    for (char c : text) {
        const auto u = static_cast<unsigned char>(c);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (u < 0x20) {
                    constexpr char hex[] = "0123456789abcdef";
                    out += "\\u00";
                    out += hex[u >> 4];
                    out += hex[u & 0xF];
                } else {
                    out += c;
                }
        }
    }
    out += '"';
    return out;
}

// The shortest text that reads back as exactly `value` ("2.5", "0.1",
// "12345.6", "1e+20"). JSON has no NaN or infinity: those become null, so a
// diverged run still writes a line every reader accepts.
[[nodiscard]] inline std::string number(double value) {
    if (!std::isfinite(value)) return "null";
    char text[64];
    const auto [end, error] = std::to_chars(text, text + sizeof text, value);
    return error == std::errc{} ? std::string(text, end) : std::string("null");
}

// As above for a float: the shortest text that reads back as the same float
// ("2.3141" rather than the double expansion "2.314100027084351").
[[nodiscard]] inline std::string number(float value) {
    if (!std::isfinite(value)) return "null";
    char text[64];
    const auto [end, error] = std::to_chars(text, text + sizeof text, value);
    return error == std::errc{} ? std::string(text, end) : std::string("null");
}

// Integers print exactly; a template so that number(3) picks this rather
// than being ambiguous between the float and double overloads.
template <std::integral T>
    requires(!std::same_as<T, bool>)
[[nodiscard]] std::string number(T value) {
    return std::to_string(value);
}

}  // namespace loom::io::json
