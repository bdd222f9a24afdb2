// A small, strict JSON reader and the few writing helpers loom's files need
// (safetensors headers, metrics lines). Strict means RFC 8259 exactly: no
// comments, no trailing commas, no NaN, no leading zeros, valid UTF-8 only,
// plus one rule of our own: an object may not repeat a key, because a
// checkpoint whose header names a tensor twice has no single meaning.
#pragma once

#include <charconv>
#include <concepts>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::io::json {

enum class Kind : std::uint8_t { null, boolean, number, string, array, object };

[[nodiscard]] constexpr std::string_view kind_name(Kind kind) {
    switch (kind) {
        case Kind::null: return "null";
        case Kind::boolean: return "a boolean";
        case Kind::number: return "a number";
        case Kind::string: return "a string";
        case Kind::array: return "an array";
        case Kind::object: return "an object";
    }
    return "an unknown value";
}

// One parsed value. Objects keep their members in document order (keys[i]
// names items[i]): safetensors lists tensors in the order the header gives.
// Numbers keep their literal text so integers beyond 2^53 are not rounded.
struct Value {
    Kind kind = Kind::null;
    bool boolean = false;
    std::string text;               // a string's contents, or a number's literal
    std::vector<Value> items;       // array elements, or object member values
    std::vector<std::string> keys;  // object member names, parallel to items
    std::size_t offset = 0;         // byte offset in the parsed text, for messages

    [[nodiscard]] bool is_object() const noexcept { return kind == Kind::object; }
    [[nodiscard]] bool is_array() const noexcept { return kind == Kind::array; }
    [[nodiscard]] bool is_string() const noexcept { return kind == Kind::string; }
    [[nodiscard]] bool is_number() const noexcept { return kind == Kind::number; }

    // The member named `key` of an object, or nullptr.
    [[nodiscard]] const Value* find(std::string_view key) const noexcept {
        if (kind != Kind::object) return nullptr;
        for (std::size_t i = 0; i < keys.size(); ++i)
            if (keys[i] == key) return &items[i];
        return nullptr;
    }

    // The value of a number written as a plain non-negative integer ("0",
    // "42") that fits in 64 bits; nullopt for anything else, including "1.0",
    // "1e3" and "-0", which a shape or an offset must not be.
    [[nodiscard]] std::optional<std::uint64_t> as_uint64() const noexcept {
        if (kind != Kind::number || text.empty()) return std::nullopt;
        for (char c : text)
            if (c < '0' || c > '9') return std::nullopt;
        std::uint64_t result = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), result);
        if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
        return result;
    }

    // Any number as a double (rounded to nearest); nullopt for non-numbers.
    [[nodiscard]] std::optional<double> as_double() const noexcept {
        if (kind != Kind::number) return std::nullopt;
        double result = 0.0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), result);
        if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
        return result;
    }
};

namespace detail {

class Parser {
public:
    // Nesting beyond this is refused rather than recursed into: a header of
    // a million '[' must fail with a message, not overflow the stack.
    static constexpr int max_depth = 64;

    explicit Parser(std::string_view text) : text_(text) {}

    // The whole text must be exactly one value, with optional whitespace around it.
    std::optional<Value> document(std::string& error) {
        Value result;
        skip_whitespace();
        if (!value(result, 0)) {
            error = std::move(error_);
            return std::nullopt;
        }
        skip_whitespace();
        if (at_ < text_.size()) {
            error = "unexpected " + describe_here() + " after the end of the value at byte " + std::to_string(at_);
            return std::nullopt;
        }
        return result;
    }

private:
    bool value(Value& out, int depth) {
        out.offset = at_;
        if (at_ >= text_.size()) return fail("the text ends where a value was expected");
        switch (text_[at_]) {
            case '{': return object(out, depth);
            case '[': return array(out, depth);
            case '"': out.kind = Kind::string; return string(out.text);
            case 't': return literal("true", out, Kind::boolean, true);
            case 'f': return literal("false", out, Kind::boolean, false);
            case 'n': return literal("null", out, Kind::null, false);
            default:
                if (text_[at_] == '-' || (text_[at_] >= '0' && text_[at_] <= '9')) return number(out);
                return fail("expected a value but found " + describe_here());
        }
    }

    bool object(Value& out, int depth) {
        if (depth >= max_depth) return fail("nesting deeper than " + std::to_string(max_depth) + " levels");
        out.kind = Kind::object;
        ++at_;  // '{'
        skip_whitespace();
        if (consume('}')) return true;
        for (;;) {
            skip_whitespace();
            if (at_ >= text_.size() || text_[at_] != '"')
                return fail("expected a string key in an object but found " + describe_here());
            const std::size_t key_offset = at_;
            std::string key;
            if (!string(key)) return false;
            for (const std::string& seen : out.keys)
                if (seen == key) {
                    at_ = key_offset;
                    return fail("duplicate object key \"" + key + "\"");
                }
            skip_whitespace();
            if (!consume(':')) return fail("expected ':' after the object key \"" + key + "\" but found " + describe_here());
            skip_whitespace();
            Value member;
            if (!value(member, depth + 1)) return false;
            out.keys.push_back(std::move(key));
            out.items.push_back(std::move(member));
            skip_whitespace();
            if (consume('}')) return true;
            if (!consume(',')) return fail("expected ',' or '}' in an object but found " + describe_here());
        }
    }

    bool array(Value& out, int depth) {
        if (depth >= max_depth) return fail("nesting deeper than " + std::to_string(max_depth) + " levels");
        out.kind = Kind::array;
        ++at_;  // '['
        skip_whitespace();
        if (consume(']')) return true;
        for (;;) {
            skip_whitespace();
            Value element;
            if (!value(element, depth + 1)) return false;
            out.items.push_back(std::move(element));
            skip_whitespace();
            if (consume(']')) return true;
            if (!consume(',')) return fail("expected ',' or ']' in an array but found " + describe_here());
        }
    }

    bool literal(std::string_view word, Value& out, Kind kind, bool truth) {
        if (text_.substr(at_, word.size()) != word) return fail("expected a value but found " + describe_here());
        at_ += word.size();
        out.kind = kind;
        out.boolean = truth;
        return true;
    }

    // RFC 8259 grammar: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
    bool number(Value& out) {
        const std::size_t begin = at_;
        consume('-');
        if (consume('0')) {
            if (digit_here()) return fail("a number may not have a leading zero");
        } else if (!digits()) {
            return fail("expected a digit in a number but found " + describe_here());
        }
        if (consume('.') && !digits()) return fail("expected a digit after the decimal point but found " + describe_here());
        if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
            ++at_;
            if (!consume('+')) consume('-');
            if (!digits()) return fail("expected a digit in an exponent but found " + describe_here());
        }
        out.kind = Kind::number;
        out.text = std::string(text_.substr(begin, at_ - begin));
        return true;
    }

    bool string(std::string& out) {
        ++at_;  // opening quote
        for (;;) {
            if (at_ >= text_.size()) return fail("a string is not closed before the end of the text");
            const auto c = static_cast<unsigned char>(text_[at_]);
            if (c == '"') {
                ++at_;
                return true;
            }
            if (c < 0x20) return fail("a string holds the raw control byte " + std::to_string(c) + "; it must be escaped");
            if (c == '\\') {
                if (!escape(out)) return false;
            } else if (c < 0x80) {
                out += static_cast<char>(c);
                ++at_;
            } else if (!utf8_sequence(out)) {
                return false;
            }
        }
    }

    bool escape(std::string& out) {
        ++at_;  // backslash
        if (at_ >= text_.size()) return fail("a string ends inside an escape sequence");
        const char c = text_[at_++];
        switch (c) {
            case '"': out += '"'; return true;
            case '\\': out += '\\'; return true;
            case '/': out += '/'; return true;
            case 'b': out += '\b'; return true;
            case 'f': out += '\f'; return true;
            case 'n': out += '\n'; return true;
            case 'r': out += '\r'; return true;
            case 't': out += '\t'; return true;
            case 'u': break;
            default: --at_; return fail("invalid escape sequence \\" + std::string(1, c) + " in a string");
        }
        std::uint32_t code = 0;
        if (!hex4(code)) return false;
        if (code >= 0xD800 && code <= 0xDBFF) {  // a high surrogate needs its low half next
            std::uint32_t low = 0;
            if (text_.substr(at_, 2) != "\\u") return fail("a \\u escape holds a lone high surrogate");
            at_ += 2;
            if (!hex4(low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return fail("a \\u escape holds a high surrogate without its low half");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        } else if (code >= 0xDC00 && code <= 0xDFFF) {
            return fail("a \\u escape holds a lone low surrogate");
        }
        append_utf8(out, code);
        return true;
    }

    bool hex4(std::uint32_t& code) {
        if (at_ + 4 > text_.size()) return fail("a \\u escape needs four hex digits");
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
    bool utf8_sequence(std::string& out) {
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
        if (at_ + length > text_.size()) return fail("a UTF-8 sequence is cut off by the end of the text");
        for (std::size_t i = 1; i < length; ++i) {
            const auto next = static_cast<unsigned char>(text_[at_ + i]);
            if ((next & 0xC0u) != 0x80u) return fail("invalid UTF-8 continuation byte " + std::to_string(next) + " in a string");
            code = (code << 6) | (next & 0x3Fu);
        }
        const std::uint32_t shortest = length == 2 ? 0x80u : length == 3 ? 0x800u : 0x10000u;
        if (code < shortest || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF))
            return fail("an invalid UTF-8 sequence (overlong, surrogate or beyond U+10FFFF) in a string");
        out.append(text_.substr(at_, length));
        at_ += length;
        return true;
    }

    static void append_utf8(std::string& out, std::uint32_t code) {
        if (code < 0x80) {
            out += static_cast<char>(code);
        } else if (code < 0x800) {
            out += static_cast<char>(0xC0 | (code >> 6));
            out += static_cast<char>(0x80 | (code & 0x3F));
        } else if (code < 0x10000) {
            out += static_cast<char>(0xE0 | (code >> 12));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (code >> 18));
            out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (code & 0x3F));
        }
    }

    bool digit_here() const { return at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9'; }
    bool digits() {
        const std::size_t begin = at_;
        while (digit_here()) ++at_;
        return at_ > begin;
    }
    bool consume(char c) {
        if (at_ < text_.size() && text_[at_] == c) {
            ++at_;
            return true;
        }
        return false;
    }
    void skip_whitespace() {
        while (at_ < text_.size() &&
               (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r'))
            ++at_;
    }

    // "'x'", "byte 0x07" or "the end of the text": what stands at the cursor.
    std::string describe_here() const {
        if (at_ >= text_.size()) return "the end of the text";
        const auto c = static_cast<unsigned char>(text_[at_]);
        if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
        constexpr char hex[] = "0123456789abcdef";
        return std::string("byte 0x") + hex[c >> 4] + hex[c & 0xF];
    }

    bool fail(std::string message) {
        if (error_.empty()) error_ = std::move(message) + " at byte " + std::to_string(at_);
        return false;
    }

    std::string_view text_;
    std::size_t at_ = 0;
    std::string error_;
};

}  // namespace detail

// Parses one JSON document. On failure returns nullopt and sets `error` to
// one sentence ending in the byte offset, e.g. "expected ':' after the object
// key \"a\" but found '}' at byte 5".
[[nodiscard]] inline std::optional<Value> parse(std::string_view text, std::string& error) {
    return detail::Parser(text).document(error);
}

// Parses or throws loom::Error "<context>: invalid JSON: <why> at byte N".
[[nodiscard]] inline Value parse_or_throw(std::string_view text, std::string_view context) {
    std::string error;
    std::optional<Value> result = parse(text, error);
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
