// The message of the loom::Error a call throws, or "(no error)": lets tests
// compare whole one-line messages instead of substrings.
#pragma once

#include <functional>
#include <string>

#include "loom/core/error.hpp"

namespace loom_test {

inline std::string message_of(const std::function<void()>& call) {
    try {
        call();
    } catch (const loom::Error& e) {
        return e.message();
    }
    return "(no error)";
}

}  // namespace loom_test
