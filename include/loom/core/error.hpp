// loom::Error and LOOM_CHECK: every failure in loom is one line that names the
// wrong value, what would be valid, and where the check sits.
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

// Thrown for every invalid input and every failed backend call. what() is a
// single line: "<message> [<file>:<line>]", identical on every rank that hits
// the same check, so a collective failure reads the same everywhere.
class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message,
                   std::source_location where = std::source_location::current())
        : Error(one_line(message), where, OneLine{}) {}

    // The message without the location suffix.
    [[nodiscard]] const std::string& message() const noexcept { return message_; }
    [[nodiscard]] const std::source_location& where() const noexcept { return where_; }

private:
    struct OneLine {};  // tags a message that one_line() has already cleaned
    Error(std::string message, std::source_location where, OneLine)
        : std::runtime_error(with_location(message, where)), message_(std::move(message)), where_(where) {}

    // Errors are one line, whatever the message carried.
    static std::string one_line(std::string text) {
        for (char& c : text)
            if (c == '\n' || c == '\r') c = ' ';
        return text;
    }

    static std::string with_location(const std::string& message, const std::source_location& where) {
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
    std::source_location where_;
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
[[noreturn]] void fail(std::source_location where, const Parts&... parts) {
    throw Error(concat(parts...), where);
}

}  // namespace detail

// Throws loom::Error built from the message parts unless `cond` holds.
//   LOOM_CHECK(n % p == 0, "pipeline degree ", p, " does not divide ", n, " layers");
// The parts are only evaluated when the check fails.
#define LOOM_CHECK(cond, ...)                                                            \
    do {                                                                                 \
        if (!(cond)) [[unlikely]]                                                        \
            ::loom::detail::fail(std::source_location::current(), __VA_ARGS__);          \
    } while (false)

// Throws unconditionally: for branches that are only reached by bad input.
#define LOOM_FAIL(...) ::loom::detail::fail(std::source_location::current(), __VA_ARGS__)

}  // namespace loom
