// --save-every N --keep K: a checkpoint every N steps, so a crash or a kill
// -9 loses at most N steps, and only the K most recent of them on disk, so a
// long run does not fill it. Each is "<save>.step-<n>" beside the final
// <save>, written atomically like it (io/atomic_file.hpp); the final file is
// never pruned.
//
//   const auto path = train::periodic_checkpoint_path(save, step);  // run.st.step-200
//   ... write it ...;  train::prune_periodic_checkpoints(save, keep);
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::train {

// "<save>.step-<step>".
[[nodiscard]] inline std::filesystem::path periodic_checkpoint_path(const std::filesystem::path& save, std::int64_t step) {
    std::filesystem::path path = save;
    path += ".step-" + std::to_string(step);
    return path;
}

// The periodic checkpoints of `save` on disk, oldest step first: the files
// of its directory named "<save's name>.step-<digits>".
[[nodiscard]] inline std::vector<std::pair<std::int64_t, std::filesystem::path>> periodic_checkpoints(
    const std::filesystem::path& save) {
    const std::filesystem::path dir = save.has_parent_path() ? save.parent_path() : std::filesystem::path(".");
    const std::string prefix = save.filename().string() + ".step-";
    std::vector<std::pair<std::int64_t, std::filesystem::path>> found;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
        const std::string name = entry.path().filename().string();
        if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string digits = name.substr(prefix.size());
        if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
            continue;  // "run.st.step-5.tmp-123" is a temporary, not a checkpoint
        found.emplace_back(std::stoll(digits), entry.path());
    }
    LOOM_CHECK(!error, "cannot list ", dir.string(), " for the periodic checkpoints of ", save.string(), ": ",
               error.message());
    std::sort(found.begin(), found.end());
    return found;
}

// Removes all but the `keep` most recent periodic checkpoints of `save`.
inline void prune_periodic_checkpoints(const std::filesystem::path& save, std::int64_t keep) {
    LOOM_CHECK(keep >= 1, "prune_periodic_checkpoints: keep ", keep, " must be 1 or more");
    auto found = periodic_checkpoints(save);
    const auto excess = static_cast<std::int64_t>(found.size()) - keep;
    for (std::int64_t i = 0; i < excess; ++i) {
        std::error_code error;
        std::filesystem::remove(found[static_cast<std::size_t>(i)].second, error);
        LOOM_CHECK(!error, "cannot remove the old periodic checkpoint ", found[static_cast<std::size_t>(i)].second.string(),
                   ": ", error.message());
    }
}

}  // namespace loom::train
