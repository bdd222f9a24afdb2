// "1,2,4": a bench's list of whole numbers from a flag's value (parallel
// degrees: each in 1..64); anything else ends the program with a line naming
// the flag and item.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace loom_bench {

inline std::vector<int> parse_int_list(const char* program, const char* flag, const std::string& text, long most,
                                       const char* what) {
    std::vector<int> out;
    std::size_t at = 0;
    while (at <= text.size()) {
        const std::size_t comma = text.find(',', at);
        const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 1 || v > most) {
            std::fprintf(stderr, "%s: %s %s: '%s' is not %s\n", program, flag, text.c_str(), item.c_str(), what);
            std::exit(2);
        }
        out.push_back(static_cast<int>(v));
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    return out;
}

inline std::vector<int> parse_degree_list(const char* program, const char* flag, const std::string& text) {
    return parse_int_list(program, flag, text, 64, "a degree in 1..64");
}

}  // namespace loom_bench
