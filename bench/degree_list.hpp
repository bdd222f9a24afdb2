// "1,2,4": a bench's list of parallel degrees from a flag's value, each in
// 1..64; anything else ends the program with a line naming the flag and item.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace loom_bench {

inline std::vector<int> parse_degree_list(const char* program, const char* flag, const std::string& text) {
    std::vector<int> out;
    std::size_t at = 0;
    while (at <= text.size()) {
        const std::size_t comma = text.find(',', at);
        const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 1 || v > 64) {
            std::fprintf(stderr, "%s: %s %s: '%s' is not a degree in 1..64\n", program, flag, text.c_str(),
                         item.c_str());
            std::exit(2);
        }
        out.push_back(static_cast<int>(v));
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    return out;
}

}  // namespace loom_bench
