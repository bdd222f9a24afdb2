// The flags of the generation benches (bench_generate, bench_speculative):
// --reps N (runs per measurement, the median reported) and --tokens N (new
// tokens per request). A bad flag is named on stderr with the valid ones.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace bench {

struct GenerationFlags {
    int reps = 3;
    std::int64_t tokens = 100;
};

// None (after saying why) when a flag is unknown or lacks its value.
[[nodiscard]] inline std::optional<GenerationFlags> parse_generation_flags(int argc, char** argv, const char* program) {
    GenerationFlags flags;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--reps" && i + 1 < argc) {
            flags.reps = std::atoi(argv[++i]);
        } else if (flag == "--tokens" && i + 1 < argc) {
            flags.tokens = std::atoll(argv[++i]);
        } else {
            std::fprintf(stderr, "%s: unknown flag %s (--reps N --tokens N)\n", program, flag.c_str());
            return std::nullopt;
        }
    }
    if (flags.reps < 1 || flags.tokens < 1) {
        std::fprintf(stderr, "%s: --reps %d and --tokens %lld must be at least 1\n", program, flags.reps,
                     static_cast<long long>(flags.tokens));
        return std::nullopt;
    }
    return flags;
}

}  // namespace bench
