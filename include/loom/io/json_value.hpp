// A parsed JSON document as loom keeps it (io/json.hpp parses): compact,
// because a safetensors header may be 100 MB of JSON written by anyone. The
// document keeps one copy of its text (each string decoded in place, over
// its own escapes, which are never shorter than what they decode to) and
// one 12-byte node per value, laid out in document order; a Value is a
// handle into it. A value takes at least 2 bytes of text with its
// separator, so the nodes take at most 6 bytes per byte and the whole, with
// the copy and the key check's scratch, stays under 8 bytes per byte of
// text at its peak (tests/io/test_parse_memory.cpp measures it).
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <system_error>
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

namespace detail {

struct Node {
    std::uint32_t offset = 0;  // byte offset of the value in the text (a string's opening quote)
    std::uint32_t size = 0;    // string: decoded bytes (from offset + 1); number: its literal's bytes;
                               // array: elements; object: members; boolean: 1 for true
    std::uint32_t kind_end = 0;  // the Kind in the low 3 bits; above them, the index just past its subtree
};
static_assert(sizeof(Node) == 12);

inline constexpr std::uint32_t kind_bits = 3;

class Parser;

struct Storage {
    std::unique_ptr<char[]> text;
    std::size_t text_size = 0;
    std::vector<Node> nodes;
};

}  // namespace detail

struct Member;

// One value of a parsed Document: a handle (a pointer and an index), cheap
// to copy, valid while its Document lives (moving the Document keeps it
// valid). Objects keep their members in document order: safetensors lists
// tensors in the order the header gives. Numbers keep their literal text so
// integers beyond 2^53 are not rounded.
class Value {
public:
    Value() = default;

    [[nodiscard]] Kind kind() const noexcept { return static_cast<Kind>(node().kind_end & ((1u << detail::kind_bits) - 1)); }
    [[nodiscard]] bool is_object() const noexcept { return kind() == Kind::object; }
    [[nodiscard]] bool is_array() const noexcept { return kind() == Kind::array; }
    [[nodiscard]] bool is_string() const noexcept { return kind() == Kind::string; }
    [[nodiscard]] bool is_number() const noexcept { return kind() == Kind::number; }
    [[nodiscard]] bool boolean() const noexcept { return kind() == Kind::boolean && node().size != 0; }
    // Byte offset of the value in the parsed text, for messages.
    [[nodiscard]] std::size_t offset() const noexcept { return node().offset; }
    // A string's decoded contents, or a number's literal; empty otherwise.
    [[nodiscard]] std::string_view text() const noexcept {
        const Kind k = kind();
        if (k == Kind::string) return {storage_->text.get() + node().offset + 1, node().size};
        if (k == Kind::number) return {storage_->text.get() + node().offset, node().size};
        return {};
    }
    // An array's elements or an object's members; 0 for anything else.
    [[nodiscard]] std::size_t size() const noexcept {
        const Kind k = kind();
        return k == Kind::array || k == Kind::object ? node().size : 0;
    }
    [[nodiscard]] bool empty() const noexcept { return size() == 0; }

    // An array's elements, or an object's member values, in document order:
    //   for (json::Value element : array.items()) ...
    class Items;
    [[nodiscard]] inline Items items() const noexcept;
    // An object's members in document order:
    //   for (const json::Member& m : object.members()) ... m.key, m.value
    class Members;
    [[nodiscard]] inline Members members() const noexcept;
    // Element i of an array (or member value i of an object), walking to it:
    // O(i), so loops use items().
    [[nodiscard]] inline Value item(std::size_t i) const;

    // The member named `key` of an object; nullopt if absent or not an object.
    [[nodiscard]] inline std::optional<Value> find(std::string_view key) const noexcept;

    // The value of a number written as a plain non-negative integer ("0",
    // "42") that fits in 64 bits; nullopt for anything else, including "1.0",
    // "1e3" and "-0", which a shape or an offset must not be.
    [[nodiscard]] std::optional<std::uint64_t> as_uint64() const noexcept {
        const std::string_view t = text();
        if (kind() != Kind::number || t.empty()) return std::nullopt;
        for (char c : t)
            if (c < '0' || c > '9') return std::nullopt;
        std::uint64_t result = 0;
        const auto [end, error] = std::from_chars(t.data(), t.data() + t.size(), result);
        if (error != std::errc{} || end != t.data() + t.size()) return std::nullopt;
        return result;
    }

    // Any number as a double (rounded to nearest); nullopt for non-numbers.
    [[nodiscard]] std::optional<double> as_double() const noexcept {
        if (kind() != Kind::number) return std::nullopt;
        const std::string_view t = text();
        double result = 0.0;
        const auto [end, error] = std::from_chars(t.data(), t.data() + t.size(), result);
        if (error != std::errc{} || end != t.data() + t.size()) return std::nullopt;
        return result;
    }

private:
    friend class Document;
    Value(const detail::Storage* storage, std::uint32_t index) noexcept : storage_(storage), index_(index) {}

    [[nodiscard]] const detail::Node& node() const noexcept { return storage_->nodes[index_]; }
    // The index just past the subtree of node `index`.
    [[nodiscard]] std::uint32_t end_of(std::uint32_t index) const noexcept {
        return storage_->nodes[index].kind_end >> detail::kind_bits;
    }

    const detail::Storage* storage_ = nullptr;
    std::uint32_t index_ = 0;
};

// An object member: its key (decoded), where the key starts, and its value.
struct Member {
    std::string_view key;
    std::size_t key_offset = 0;  // byte offset of the key's opening quote
    Value value;
};

class Value::Items {
public:
    class iterator {
    public:
        using value_type = Value;
        using difference_type = std::ptrdiff_t;
        iterator() = default;
        iterator(const Value& owner, std::uint32_t at, bool object) noexcept : owner_(owner), at_(at), object_(object) {}
        [[nodiscard]] Value operator*() const noexcept { return Value(owner_.storage_, object_ ? at_ + 1 : at_); }
        iterator& operator++() noexcept {
            at_ = owner_.end_of(object_ ? at_ + 1 : at_);
            return *this;
        }
        iterator operator++(int) noexcept {
            iterator old = *this;
            ++*this;
            return old;
        }
        [[nodiscard]] bool operator==(const iterator& other) const noexcept { return at_ == other.at_; }

    private:
        Value owner_;
        std::uint32_t at_ = 0;
        bool object_ = false;
    };
    explicit Items(const Value& owner) noexcept : owner_(owner) {}
    [[nodiscard]] iterator begin() const noexcept {
        const bool container = owner_.size() > 0;
        return {owner_, container ? owner_.index_ + 1 : owner_.end_of(owner_.index_), owner_.is_object()};
    }
    [[nodiscard]] iterator end() const noexcept { return {owner_, owner_.end_of(owner_.index_), owner_.is_object()}; }
    [[nodiscard]] std::size_t size() const noexcept { return owner_.size(); }

private:
    Value owner_;
};

class Value::Members {
public:
    class iterator {
    public:
        using value_type = Member;
        using difference_type = std::ptrdiff_t;
        iterator() = default;
        iterator(const Value& owner, std::uint32_t at) noexcept : owner_(owner), at_(at) {}
        [[nodiscard]] Member operator*() const noexcept {
            const Value key(owner_.storage_, at_);
            return Member{key.text(), key.offset(), Value(owner_.storage_, at_ + 1)};
        }
        iterator& operator++() noexcept {
            at_ = owner_.end_of(at_ + 1);
            return *this;
        }
        iterator operator++(int) noexcept {
            iterator old = *this;
            ++*this;
            return old;
        }
        [[nodiscard]] bool operator==(const iterator& other) const noexcept { return at_ == other.at_; }

    private:
        Value owner_;
        std::uint32_t at_ = 0;
    };
    explicit Members(const Value& owner) noexcept : owner_(owner) {}
    [[nodiscard]] iterator begin() const noexcept {
        return {owner_, owner_.is_object() && owner_.size() > 0 ? owner_.index_ + 1 : owner_.end_of(owner_.index_)};
    }
    [[nodiscard]] iterator end() const noexcept { return {owner_, owner_.end_of(owner_.index_)}; }
    [[nodiscard]] std::size_t size() const noexcept { return owner_.is_object() ? owner_.size() : 0; }

private:
    Value owner_;
};

inline Value::Items Value::items() const noexcept { return Items(*this); }
inline Value::Members Value::members() const noexcept { return Members(*this); }

inline Value Value::item(std::size_t i) const {
    LOOM_CHECK(i < size(), "json: item ", i, " of ", kind_name(kind()), " of ", size());
    auto it = items().begin();
    for (std::size_t k = 0; k < i; ++k) ++it;
    return *it;
}

inline std::optional<Value> Value::find(std::string_view key) const noexcept {
    if (!is_object()) return std::nullopt;
    for (const Member& m : members())
        if (m.key == key) return m.value;
    return std::nullopt;
}

// A parsed JSON text: owns the nodes its Values point into.
class Document {
public:
    Document() = default;
    [[nodiscard]] Value root() const noexcept { return Value(storage_.get(), 0); }
    // Bytes this document holds (text copy and nodes), for tests and budgets.
    [[nodiscard]] std::size_t memory_bytes() const noexcept {
        return storage_ ? storage_->text_size + storage_->nodes.capacity() * sizeof(detail::Node) : 0;
    }

private:
    friend class detail::Parser;
    std::unique_ptr<detail::Storage> storage_;
};

}  // namespace loom::io::json
