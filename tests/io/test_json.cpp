// The strict JSON reader behind safetensors headers and metrics lines.
#include <catch2/catch.hpp>

#include <loom/io/json.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>
#include <string>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace json = loom::io::json;

namespace {

std::string parse_error(std::string_view text) {
    std::string error;
    const auto value = json::parse(text, error);
    return value.has_value() ? std::string("<parsed>") : error;
}

}  // namespace

TEST_CASE("json parses objects in document order with nested values", "[json]") {
    const json::Document doc = json::parse_or_throw(
        R"( {"b": [1, 20, 300], "a": {"x": "y"}, "t": true, "f": false, "n": null, "d": -1.5e3} )", "test");
    const json::Value v = doc.root();
    REQUIRE(v.is_object());
    std::vector<std::string> keys;
    std::vector<std::size_t> key_offsets;
    for (const json::Member& m : v.members()) {
        keys.emplace_back(m.key);
        key_offsets.push_back(m.key_offset);
    }
    CHECK(keys == std::vector<std::string>{"b", "a", "t", "f", "n", "d"});
    CHECK(key_offsets == std::vector<std::size_t>{2, 21, 38, 49, 61, 72});
    const std::optional<json::Value> b = v.find("b");
    REQUIRE(b.has_value());
    REQUIRE(b->is_array());
    REQUIRE(b->size() == 3);
    CHECK(b->item(2).as_uint64() == 300u);
    std::vector<std::uint64_t> elements;
    for (const json::Value e : b->items()) elements.push_back(*e.as_uint64());
    CHECK(elements == std::vector<std::uint64_t>{1, 20, 300});
    CHECK(b->offset() == 7);
    CHECK(v.find("a")->find("x")->text() == "y");
    CHECK(v.find("t")->kind() == json::Kind::boolean);
    CHECK(v.find("t")->boolean());
    CHECK_FALSE(v.find("f")->boolean());
    CHECK(v.find("n")->kind() == json::Kind::null);
    CHECK(v.find("d")->as_double() == -1500.0);
    CHECK_FALSE(v.find("d")->as_uint64().has_value());
    CHECK_FALSE(v.find("missing").has_value());
    CHECK_FALSE(v.find("b")->find("x").has_value());  // not an object
    // Handles stay valid when their document moves.
    json::Document moved = json::parse_or_throw(R"({"k": "short"})", "t");
    const json::Value k = *moved.root().find("k");
    const json::Document elsewhere = std::move(moved);
    CHECK(k.text() == "short");
}

TEST_CASE("json integers keep all 64 bits and refuse anything that is not a plain non-negative integer",
          "[json]") {
    CHECK(json::parse_or_throw("18446744073709551615", "t").root().as_uint64() ==
          std::numeric_limits<std::uint64_t>::max());
    CHECK_FALSE(json::parse_or_throw("18446744073709551616", "t").root().as_uint64().has_value());
    CHECK(json::parse_or_throw("0", "t").root().as_uint64() == 0u);
    for (const char* not_unsigned : {"-1", "-0", "1.0", "1e3", "2.5"})
        CHECK_FALSE(json::parse_or_throw(not_unsigned, "t").root().as_uint64().has_value());
}

TEST_CASE("json strings decode every escape, surrogate pairs and raw UTF-8", "[json]") {
    const json::Document doc = json::parse_or_throw(R"("q\" b\\ s\/ \b\f\n\r\t \u00e9 \ud83d\ude00 ü")", "t");
    CHECK(doc.root().text() == "q\" b\\ s/ \b\f\n\r\t \xc3\xa9 \xf0\x9f\x98\x80 \xc3\xbc");
}

TEST_CASE("json quote round-trips any valid UTF-8 text", "[json]") {
    const std::string text = std::string("tab\there \"quoted\" back\\slash nul") + '\0' + "\x01 \xc3\xa9 end\n";
    const std::string quoted = json::quote(text);
    CHECK(quoted.find('\0') == std::string::npos);
    CHECK(json::parse_or_throw(quoted, "t").root().text() == text);
    CHECK(json::quote("a\"b") == R"("a\"b")");
    CHECK(json::quote(std::string("\x1f")) == R"("\u001f")");
}

TEST_CASE("json refuses what RFC 8259 refuses, with the reason and the byte", "[json][errors]") {
    CHECK(parse_error("") == "the text ends where a value was expected at byte 0");
    CHECK(parse_error("{\"a\": 1,}") == "expected a string key in an object but found '}' at byte 8");
    CHECK(parse_error("[1, 2,]") == "expected a value but found ']' at byte 6");
    CHECK(parse_error("{\"a\" 1}") == "expected ':' after the object key \"a\" but found '1' at byte 5");
    CHECK(parse_error("{\"a\": 1 \"b\": 2}") == "expected ',' or '}' in an object but found '\"' at byte 8");
    CHECK(parse_error("[01]") == "a number may not have a leading zero at byte 2");
    CHECK(parse_error("1.") == "expected a digit after the decimal point but found the end of the text at byte 2");
    CHECK(parse_error("NaN") == "expected a value but found 'N' at byte 0");
    CHECK(parse_error("{} x") == "unexpected 'x' after the end of the value at byte 3");
    CHECK(parse_error("\"abc") == "a string is not closed before the end of the text at byte 4");
    CHECK(parse_error("\"a\nb\"") == "a string holds the raw control byte 10; it must be escaped at byte 2");
    CHECK(parse_error(R"("\x")") == R"(invalid escape sequence \x in a string at byte 2)");
    CHECK(parse_error(R"("\ud800")") == R"(a \u escape holds a lone high surrogate at byte 7)");
    CHECK(parse_error(R"("\udc00")") == R"(a \u escape holds a lone low surrogate at byte 7)");
    CHECK(parse_error("\"\xff\"") == "invalid UTF-8 byte 255 in a string at byte 1");
    CHECK(parse_error("\"\xc0\xaf\"") == "invalid UTF-8 byte 192 in a string at byte 1");  // overlong '/'
    CHECK(parse_error("\"\xed\xa0\x80\"") ==
          "an invalid UTF-8 sequence (overlong, surrogate or beyond U+10FFFF) in a string at byte 1");
    CHECK(parse_error("{\"a\": 1, \"a\": 2}") == "duplicate object key \"a\" at byte 9");
    CHECK(parse_error("tru") == "expected a value but found 't' at byte 0");
    CHECK(parse_error("\x01") == "expected a value but found byte 0x01 at byte 0");
}

TEST_CASE("json refuses deep nesting instead of overflowing the stack", "[json][errors]") {
    const std::string deep(100000, '[');
    CHECK(parse_error(deep) == "nesting deeper than 64 levels at byte 64");
    std::string ok = std::string(60, '[') + std::string(60, ']');
    CHECK(parse_error(ok) == "<parsed>");
}

TEST_CASE("json refuses a text longer than its offsets can address", "[json][errors]") {
    CHECK(json::max_document_bytes == (std::size_t{1} << 30) - 4);
    std::string error;
    CHECK_FALSE(json::detail::Parser("[1, 2]", 5).document(error).has_value());
    CHECK(error == "a JSON text of 6 bytes is longer than the 5 this reader accepts at byte 0");
    CHECK(json::detail::Parser("[1, 2]", 6).document(error).has_value());
}

TEST_CASE("json parse_or_throw names the context", "[json][errors]") {
    CHECK_THROWS_WITH(json::parse_or_throw("{", "header of x.st"),
                      Catch::StartsWith("header of x.st: invalid JSON: expected a string key in an object but found "
                                        "the end of the text at byte 1"));
}

TEST_CASE("json numbers print the shortest text that reads back exactly, and null for NaN", "[json]") {
    CHECK(json::number(2.5) == "2.5");
    CHECK(json::number(0.1) == "0.1");
    CHECK(json::number(12345.6) == "12345.6");
    CHECK(json::number(2.3141f) == "2.3141");
    CHECK(json::number(3) == "3");
    CHECK(json::number(std::int64_t{-7}) == "-7");
    CHECK(json::number(std::nan("")) == "null");
    CHECK(json::number(std::numeric_limits<float>::infinity()) == "null");
    for (double x : {1e20, 1e-300, 123456789.125, -0.0})
        CHECK(json::parse_or_throw(json::number(x), "t").root().as_double() == x);
}

}  // namespace LOOM_TEST_FILE
