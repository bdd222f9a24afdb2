// Reading the planner's JSON files (cluster_json.hpp, model_json.hpp) with
// messages a person can act on: every error names the file, the line and
// column, the field's path and what it holds, and what would be valid:
//
//   cluster.json:7:21: nodes[1].devices is -2; give a whole number of devices, 1 or more
//
// Document parses (a malformed file is located the same way), Node is one
// value with its path, Object a member list whose keys are all known.
//
//   json_fields::Document doc(text, "cluster.json");
//   json_fields::Object top = doc.top({"nodes", "links"});
//   for (const json_fields::Node& node : top.required("nodes", "give an array of nodes").elements("give ..."))
//       int devices = node.object({"name", "devices"}).integer("devices", 1, "devices");
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/io/json.hpp"

namespace loom::plan::json_fields {

namespace json = io::json;

// Where a byte of a text stands, as editors count: lines from 1, columns from
// 1 in characters (a UTF-8 sequence is one column, so a node named "küche"
// does not shift the column of what follows it).
struct Position {
    std::size_t line = 1;
    std::size_t column = 1;
};

[[nodiscard]] inline Position position_of(std::string_view text, std::size_t offset) {
    Position at;
    const std::size_t end = offset < text.size() ? offset : text.size();
    for (std::size_t i = 0; i < end; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c == '\n') {
            ++at.line;
            at.column = 1;
        } else if ((c & 0xC0u) != 0x80u) {  // continuation bytes belong to the character before
            ++at.column;
        }
    }
    return at;
}

// "cluster.json:7:21".
[[nodiscard]] inline std::string location(std::string_view source, std::string_view text, std::size_t offset) {
    const Position at = position_of(text, offset);
    return loom::detail::concat(source, ":", at.line, ":", at.column);
}

// A value as the file writes it, for "nodes[1].devices is -2": numbers by
// their literal, strings quoted, anything else by its kind.
[[nodiscard]] inline std::string describe(const json::Value& value) {
    switch (value.kind()) {
        case json::Kind::number: return std::string(value.text());
        case json::Kind::string: return json::quote(value.text());
        case json::Kind::boolean: return value.boolean() ? "true" : "false";
        case json::Kind::array: return value.empty() ? "an empty array" : "an array";
        case json::Kind::object: return value.empty() ? "an empty object" : "an object";
        default: return std::string(json::kind_name(value.kind()));
    }
}

// What a rule accepts, said the same way when the value is wrong and when it
// is missing: "give a whole number of devices, 1 or more".
[[nodiscard]] inline std::string give_positive(std::string_view unit = {}) {
    return unit.empty() ? std::string("give a positive number")
                        : loom::detail::concat("give a positive number of ", unit);
}
[[nodiscard]] inline std::string give_non_negative(std::string_view unit = {}) {
    return unit.empty() ? std::string("give a number, 0 or more")
                        : loom::detail::concat("give a number of ", unit, ", 0 or more");
}
[[nodiscard]] inline std::string give_integer(std::int64_t at_least, std::int64_t at_most, std::string_view unit = {}) {
    std::string text =
        unit.empty() ? std::string("give a whole number") : loom::detail::concat("give a whole number of ", unit);
    text += at_most == std::numeric_limits<std::int64_t>::max()
                ? loom::detail::concat(", ", at_least, " or more")
                : loom::detail::concat(" from ", at_least, " to ", at_most);
    return text;
}
[[nodiscard]] inline std::string give_string(std::string_view what = {}) {
    return what.empty() ? std::string("give a string") : loom::detail::concat("give ", what, " as a string");
}

class Object;

// A whole file: its text, the name messages use for it, and its parsed root.
class Document {
public:
    // Parses `text`; malformed JSON throws "<source>:<line>:<col>: invalid JSON: <why>".
    Document(std::string_view text, std::string_view source) : text_(text), source_(source) {
        std::string error;
        std::optional<json::Document> parsed = json::parse(text_, error);
        if (!parsed) {
            // The parser ends its sentence with "at byte N": turn N into a line
            // and column, which is what an editor can jump to.
            std::size_t offset = 0;
            constexpr std::string_view marker = " at byte ";
            if (const std::size_t at = error.rfind(marker); at != std::string::npos) {
                const char* digits = error.data() + at + marker.size();
                if (std::from_chars(digits, error.data() + error.size(), offset).ec == std::errc{}) error.erase(at);
            }
            LOOM_FAIL(location(source_, text_, offset), ": invalid JSON: ", error);
        }
        parsed_ = std::move(*parsed);
    }

    [[nodiscard]] json::Value root() const noexcept { return parsed_.root(); }
    [[nodiscard]] const std::string& source() const noexcept { return source_; }
    [[nodiscard]] const std::string& text() const noexcept { return text_; }
    [[nodiscard]] std::string where(std::size_t offset) const { return location(source_, text_, offset); }

    // The root, which must be an object whose keys are all in `keys`.
    [[nodiscard]] inline Object top(std::vector<std::string_view> keys) const;

private:
    std::string text_;
    std::string source_;
    json::Document parsed_;
};

// One value of a document and its path ("nodes[1].link"; empty for the root).
class Node {
public:
    Node(const Document& doc, json::Value value, std::string path)
        : doc_(&doc), value_(value), path_(std::move(path)) {}

    [[nodiscard]] const json::Value& value() const noexcept { return value_; }
    [[nodiscard]] const std::string& path() const noexcept { return path_; }
    [[nodiscard]] const Document& document() const noexcept { return *doc_; }
    // What messages call it: its path, or "the top level" for the root.
    [[nodiscard]] std::string subject() const { return path_.empty() ? std::string("the top level") : path_; }
    [[nodiscard]] std::string where() const { return doc_->where(value_.offset()); }

    // Throws "<where>: <subject> <problem>".
    template <class... Parts>
    [[noreturn]] void fail(const Parts&... problem) const {
        LOOM_FAIL(where(), ": ", subject(), " ", problem...);
    }
    // Throws "<where>: <subject> is <value>; <valid>".
    [[noreturn]] void invalid(std::string_view valid) const { fail("is ", describe(value_), "; ", valid); }

    [[nodiscard]] bool is_string(std::string_view text) const {
        return value_.is_string() && value_.text() == text;
    }

    // A finite number > 0.
    [[nodiscard]] double positive(std::string_view unit = {}) const {
        const std::optional<double> x = value_.as_double();
        if (!x || !std::isfinite(*x) || *x <= 0) invalid(give_positive(unit));
        return *x;
    }
    // A finite number >= 0.
    [[nodiscard]] double non_negative(std::string_view unit = {}) const {
        const std::optional<double> x = value_.as_double();
        if (!x || !std::isfinite(*x) || *x < 0) invalid(give_non_negative(unit));
        return *x;
    }
    // A whole number in [at_least, at_most]. "24", and also "1e3" or "2.0",
    // which are whole too (a parameter count reads better as 1.2e9), as long
    // as a double holds them exactly (up to 2^53).
    [[nodiscard]] std::int64_t integer(std::int64_t at_least, std::string_view unit = {},
                                       std::int64_t at_most = std::numeric_limits<std::int64_t>::max()) const {
        std::optional<std::int64_t> n;
        if (const std::optional<std::uint64_t> u = value_.as_uint64();
            u && *u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
            n = static_cast<std::int64_t>(*u);
        } else if (const std::optional<double> x = value_.as_double();
                   x && std::isfinite(*x) && std::floor(*x) == *x && std::fabs(*x) <= 9007199254740992.0) {
            n = static_cast<std::int64_t>(*x);
        }
        if (!n || *n < at_least || *n > at_most) invalid(give_integer(at_least, at_most, unit));
        return *n;
    }
    // Any string; `what` names it in the message ("a node name").
    [[nodiscard]] std::string string(std::string_view what = {}) const {
        if (!value_.is_string()) invalid(give_string(what));
        return std::string(value_.text());
    }
    // An array's elements, with paths "<path>[i]"; `valid` says what the
    // array should be if this is something else.
    [[nodiscard]] std::vector<Node> elements(std::string_view valid) const {
        if (!value_.is_array()) invalid(valid);
        std::vector<Node> out;
        out.reserve(value_.size());
        for (const json::Value element : value_.items())
            out.emplace_back(*doc_, element, loom::detail::concat(path_, "[", out.size(), "]"));
        return out;
    }
    // This value as an object whose keys must all be in `keys`.
    [[nodiscard]] inline Object object(std::vector<std::string_view> keys) const;

private:
    const Document* doc_;
    json::Value value_;
    std::string path_;
};

// An object's members, checked against the keys it may have: a misspelt key
// ("tflop") is an error naming it and the valid ones, not a field silently
// left at its default.
class Object {
public:
    Object(const Node& node, std::vector<std::string_view> keys) : node_(node), keys_(std::move(keys)) {
        if (!node_.value().is_object()) node_.invalid("give an object {...}");
        for (const json::Member& member : node_.value().members()) {
            bool known = false;
            for (std::string_view k : keys_) known = known || k == member.key;
            if (known) continue;
            std::ostringstream valid;
            for (std::size_t k = 0; k < keys_.size(); ++k) valid << (k == 0 ? "" : ", ") << keys_[k];
            LOOM_FAIL(node_.document().where(member.key_offset), ": ", node_.subject(), " has an unknown key ",
                      json::quote(member.key), "; the valid keys are ", valid.str());
        }
    }

    [[nodiscard]] const Node& node() const noexcept { return node_; }
    [[nodiscard]] bool has(std::string_view key) const { return node_.value().find(key).has_value(); }

    // The member `key`, or nullopt.
    [[nodiscard]] std::optional<Node> optional(std::string_view key) const {
        const std::optional<json::Value> v = node_.value().find(key);
        if (!v) return std::nullopt;
        return Node(node_.document(), *v, member_path(key));
    }
    // The member `key`; absent: "<where>: <subject> has no "<key>"; <valid>".
    [[nodiscard]] Node required(std::string_view key, std::string_view valid) const {
        std::optional<Node> member = optional(key);
        if (!member) node_.fail("has no ", json::quote(key), "; ", valid);
        return *member;
    }

    // Typed members: required (absent is an error) or with a default.
    [[nodiscard]] double positive(std::string_view key, std::string_view unit = {}) const {
        return required(key, give_positive(unit)).positive(unit);
    }
    [[nodiscard]] double positive_or(std::string_view key, double otherwise, std::string_view unit = {}) const {
        const std::optional<Node> member = optional(key);
        return member ? member->positive(unit) : otherwise;
    }
    [[nodiscard]] double non_negative(std::string_view key, std::string_view unit = {}) const {
        return required(key, give_non_negative(unit)).non_negative(unit);
    }
    [[nodiscard]] double non_negative_or(std::string_view key, double otherwise, std::string_view unit = {}) const {
        const std::optional<Node> member = optional(key);
        return member ? member->non_negative(unit) : otherwise;
    }
    [[nodiscard]] std::int64_t integer(std::string_view key, std::int64_t at_least, std::string_view unit = {},
                                       std::int64_t at_most = std::numeric_limits<std::int64_t>::max()) const {
        return required(key, give_integer(at_least, at_most, unit)).integer(at_least, unit, at_most);
    }
    [[nodiscard]] std::int64_t integer_or(std::string_view key, std::int64_t otherwise, std::int64_t at_least,
                                          std::string_view unit = {},
                                          std::int64_t at_most = std::numeric_limits<std::int64_t>::max()) const {
        const std::optional<Node> member = optional(key);
        return member ? member->integer(at_least, unit, at_most) : otherwise;
    }
    [[nodiscard]] std::string string(std::string_view key, std::string_view what = {}) const {
        return required(key, give_string(what)).string(what);
    }

private:
    [[nodiscard]] std::string member_path(std::string_view key) const {
        return node_.path().empty() ? std::string(key) : loom::detail::concat(node_.path(), ".", key);
    }

    Node node_;
    std::vector<std::string_view> keys_;
};

inline Object Node::object(std::vector<std::string_view> keys) const { return Object(*this, std::move(keys)); }

inline Object Document::top(std::vector<std::string_view> keys) const {
    return Object(Node(*this, root(), ""), std::move(keys));
}

// The whole of a file, or "<what>: cannot open <path> (no such file); <hint>".
[[nodiscard]] inline std::string read_file(const std::string& path, std::string_view what, std::string_view hint) {
    std::error_code ec;
    const bool exists = std::filesystem::exists(path, ec);
    LOOM_CHECK(exists, what, ": cannot open ", path, " (no such file); ", hint);
    LOOM_CHECK(!std::filesystem::is_directory(path, ec), what, ": ", path, " is a directory; ", hint);
    std::ifstream in(path, std::ios::binary);
    LOOM_CHECK(in.good(), what, ": cannot open ", path, " (it exists but cannot be read); ", hint);
    std::ostringstream text;
    text << in.rdbuf();
    LOOM_CHECK(!in.bad(), what, ": reading ", path, " failed part way; ", hint);
    return std::move(text).str();
}

}  // namespace loom::plan::json_fields
