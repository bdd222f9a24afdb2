// What a checkpoint was trained on, so a resume can tell it is continuing the
// same run. "Resumed equals uninterrupted" holds only for the same data in
// the same order: other data or another seed would go on silently and give
// a run that matches neither. A checkpoint records the data's identity (its
// size and a hash of its first MiB, or "synthetic") and the seed; a resume
// compares them and refuses a difference in one line naming both values,
// unless the caller allows it. Checkpoints written before these fields load
// with a notice.
//
//   metadata.merge(train::run_identity_metadata(data_path, seed));   // when saving
//   note = train::check_run_identity(file.metadata(), path, data_path, seed, allow, names);
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/setting_names.hpp"
#include "loom/io/safetensors.hpp"

namespace loom::train {

inline constexpr std::string_view data_identity_key = "data_identity";
inline constexpr std::string_view seed_key = "seed";

// "synthetic" for an empty path, else "<size> bytes, fnv1a64 <hash of the
// first MiB>": the path is left out so a moved or copied file is the same
// data; the hash of a prefix keeps this cheap for a corpus of many GiB.
[[nodiscard]] inline std::string data_identity(const std::string& path) {
    if (path.empty()) return "synthetic";
    std::error_code error;
    const std::uintmax_t size = std::filesystem::file_size(path, error);
    LOOM_CHECK(!error, "cannot read the size of the data file ", path, ": ", error.message());
    std::ifstream in(path, std::ios::binary);
    LOOM_CHECK(in.good(), "cannot open the data file ", path);
    std::vector<char> head(static_cast<std::size_t>(std::min<std::uintmax_t>(size, std::uintmax_t{1} << 20)));
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a, 64 bits
    for (const char c : head) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
    return std::to_string(size) + " bytes, fnv1a64 " + hex;
}

// The metadata a checkpoint carries for check_run_identity.
[[nodiscard]] inline std::map<std::string, std::string> run_identity_metadata(const std::string& data_path,
                                                                              std::uint64_t seed) {
    return {{std::string(data_identity_key), data_identity(data_path)}, {std::string(seed_key), std::to_string(seed)}};
}

// Compares a checkpoint's recorded data and seed with this run's. A
// difference throws "checkpoint <path> was trained on data '<data>' but
// data <path> is '<data>'; ..." unless `allow`, when it is returned as a
// note instead (the settings "data", "seed" and the switch "resume_anyway"
// named as `name` spells them, core/setting_names.hpp);
// a checkpoint without the fields returns a note that nothing was checked.
// Returns "" when everything matches.
// `metadata` is a safetensors header's, or a sharded checkpoint's index's (a map).
template <class Metadata>
[[nodiscard]] std::string check_run_identity(const Metadata& metadata, const std::filesystem::path& checkpoint,
                                             const std::string& data_path, std::uint64_t seed, bool allow,
                                             const SettingNames& name) {
    const auto find = [&](std::string_view key) -> std::optional<std::string_view> {
        if constexpr (std::is_same_v<Metadata, std::map<std::string, std::string>>) {
            const auto it = metadata.find(std::string(key));
            if (it == metadata.end()) return std::nullopt;
            return std::string_view(it->second);
        } else {
            return metadata.find(key);
        }
    };
    const std::optional<std::string_view> data = find(data_identity_key);
    const std::optional<std::string_view> saved_seed = find(seed_key);
    if (!data || !saved_seed)
        return "checkpoint " + checkpoint.string() + " records no data identity or seed (written before they were); "
               "not checked";
    const std::string now_data = data_identity(data_path);
    const std::string now_seed = std::to_string(seed);
    std::string difference;
    if (*data != now_data)
        difference = "was trained on data '" + std::string(*data) + "' but " + name("data") + " " +
                     (data_path.empty() ? std::string("(none: synthetic)") : data_path) + " is '" + now_data + "'";
    else if (*saved_seed != now_seed)
        difference = "was trained with " + name("seed") + " " + std::string(*saved_seed) + " but this run has " +
                     name("seed") + " " + now_seed;
    if (difference.empty()) return "";
    const std::string what = "checkpoint " + checkpoint.string() + " " + difference;
    LOOM_CHECK(allow, what, "; resuming would not continue the same run (give the same settings, or ",
               name("resume_anyway"), " to continue anyway)");
    return what + "; continuing anyway (" + name("resume_anyway") + ")";
}

}  // namespace loom::train
