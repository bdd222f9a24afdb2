// loom::Error and LOOM_CHECK: every failure in loom is one line that names the
// wrong value, what would be valid, and where the check sits.
#pragma once

#include <cstdint>
#include <source_location>  // empty where the library lacks it; SourceLocation below
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

// Where a check sits: std::source_location where the standard library has
// it; clang 14 with libstdc++ 12 does not (libstdc++ builds it on
// __builtin_source_location, which clang gained in 15), so there the same
// interface comes from the builtins both compilers have had for years. A
// default argument is evaluated at the call, so current() names the caller.
#if defined(__cpp_lib_source_location)
using SourceLocation = std::source_location;
#else
class SourceLocation {
public:
    [[nodiscard]] static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                                          const char* function = __builtin_FUNCTION(),
                                                          unsigned line = __builtin_LINE(),
                                                          unsigned column = __builtin_COLUMN()) noexcept {
        SourceLocation at;
        at.file_ = file;
        at.function_ = function;
        at.line_ = line;
        at.column_ = column;
        return at;
    }
    constexpr SourceLocation() noexcept = default;
    [[nodiscard]] constexpr const char* file_name() const noexcept { return file_; }
    [[nodiscard]] constexpr const char* function_name() const noexcept { return function_; }
    [[nodiscard]] constexpr std::uint_least32_t line() const noexcept { return line_; }
    [[nodiscard]] constexpr std::uint_least32_t column() const noexcept { return column_; }

private:
    const char* file_ = "";
    const char* function_ = "";
    std::uint_least32_t line_ = 0;
    std::uint_least32_t column_ = 0;
};
#endif

// Thrown for every invalid input and every failed backend call. what() is a
// single line: "<message> [<file>:<line>]", identical on every rank that hits
// the same check, so a collective failure reads the same everywhere.
class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message,
                   SourceLocation where = SourceLocation::current())
        : Error(one_line(message), where, OneLine{}) {}

    // The message without the location suffix.
    [[nodiscard]] const std::string& message() const noexcept { return message_; }
    [[nodiscard]] const SourceLocation& where() const noexcept { return where_; }

private:
    struct OneLine {};  // tags a message that one_line() has already cleaned
    Error(std::string message, SourceLocation where, OneLine)
        : std::runtime_error(with_location(message, where)), message_(std::move(message)), where_(where) {}

    // Errors are one line, whatever the message carried.
    static std::string one_line(std::string text) {
        for (char& c : text)
            if (c == '\n' || c == '\r') c = ' ';
        return text;
    }

    static std::string with_location(const std::string& message, const SourceLocation& where) {
        std::string file = where.file_name();
        // Trim to the path inside include/ or the project so messages do not
        // depend on where the source tree was checked out.
        for (std::string_view anchor : {"/include/", "/tests/", "/examples/", "/bench/", "/tools/"}) {
            if (auto at = file.rfind(anchor); at != std::string::npos) {
                file = file.substr(at + 1);
                break;
            }
        }
        return message + " [" + file + ":" + std::to_string(where.line()) + "]";
    }

    std::string message_;
    SourceLocation where_;
};

namespace detail {

// Streams every part into one string; loom::Error makes it one line.
template <class... Parts>
[[nodiscard]] std::string concat(const Parts&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return std::move(out).str();
}

template <class... Parts>
[[noreturn]] void fail(SourceLocation where, const Parts&... parts) {
    throw Error(concat(parts...), where);
}

}  // namespace detail

// Throws loom::Error built from the message parts unless `cond` holds.
//   LOOM_CHECK(n % p == 0, "pipeline degree ", p, " does not divide ", n, " layers");
// The parts are only evaluated when the check fails.
#define LOOM_CHECK(cond, ...)                                                            \
    do {                                                                                 \
        if (!(cond)) [[unlikely]]                                                        \
            ::loom::detail::fail(::loom::SourceLocation::current(), __VA_ARGS__);   \
    } while (false)

// Throws unconditionally: for branches that are only reached by bad input.
#define LOOM_FAIL(...) ::loom::detail::fail(::loom::SourceLocation::current(), __VA_ARGS__)

}  // namespace loom
