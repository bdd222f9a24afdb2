// What a training run checks about its files before it builds anything, so
// that nothing is lost late: every output can be written (a bad path fails
// in one line, not after hours of training), a sharded checkpoint's
// directory exists, the temporaries a killed run left beside a checkpoint
// are removed, and a resume continues the same run (data and seed,
// data_identity.hpp) whichever form its checkpoint has (one file, or a
// sharded directory's index).
//
//   train::prepare_output(save, sharded, true);   // throws "<path> cannot be written (checked before training): ..."
//   note = train::check_resume_identity(resume, data_path, seed, allow, names);
//   if (train::checkpoint_step(resume) > until) ...refuse: nothing is left to train
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "loom/core/error.hpp"
#include "loom/exec/sharded_checkpoint.hpp"
#include "loom/io/atomic_file.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/train/data_identity.hpp"

namespace loom::train {

// Checks that `path` (empty: nothing) can be written: a file, or with
// `directory` a directory, made now, whose index.json is probed (a sharded
// checkpoint's). With `checkpoint`, the temporaries a killed run left beside
// it are removed, each said on standard output. Throws "<path> cannot be
// written (checked before training): <why>".
inline void prepare_output(const std::string& path, bool directory, bool checkpoint) {
    if (path.empty()) return;
    const std::filesystem::path file = directory ? std::filesystem::path(path) / "index.json" : std::filesystem::path(path);
    try {
        std::error_code made;
        if (directory) std::filesystem::create_directories(path, made);
        LOOM_CHECK(!made, "cannot create the directory: ", made.message());
        io::probe_writable(file);
    } catch (const Error& e) {
        throw Error(path + " cannot be written (checked before training): " + e.message());
    }
    if (checkpoint)
        for (const auto& stale : io::remove_stale_temporaries(file))
            std::printf("removed %s, a temporary file left by a run that was killed\n", stale.string().c_str());
}

// check_run_identity (data_identity.hpp) on the checkpoint at `path`, a
// sharded directory (its index's metadata) or one safetensors file (its
// header's): "" when the data and seed match, else a note, or the refusal
// unless `allow`, the settings named as `name` spells them.
[[nodiscard]] inline std::string check_resume_identity(const std::string& path, const std::string& data_path,
                                                       std::uint64_t seed, bool allow, const SettingNames& name) {
    if (std::filesystem::is_directory(path))
        return check_run_identity(exec::read_sharded_index(path).metadata, path, data_path, seed, allow, name);
    return check_run_identity(io::SafetensorsFile(path).metadata(), path, data_path, seed, allow, name);
}

// The step the checkpoint at `path` (a sharded directory or one file) was
// saved after, read from its metadata before anything loads it, so that a
// run can refuse a resume past its end at once; nothing when the metadata
// does not say (the resume itself then names what is wrong).
[[nodiscard]] inline std::optional<std::int64_t> checkpoint_step(const std::string& path) {
    std::string text;
    if (std::filesystem::is_directory(path)) {
        const auto metadata = exec::read_sharded_index(path).metadata;
        if (const auto it = metadata.find("step"); it != metadata.end()) text = it->second;
    } else if (const auto step = io::SafetensorsFile(path).metadata().find("step")) {
        text = std::string(*step);
    }
    std::int64_t step = -1;
    const char* const end = text.data() + text.size();
    const auto [stop, error] = std::from_chars(text.data(), end, step);
    if (text.empty() || error != std::errc{} || stop != end || step < 0) return std::nullopt;
    return step;
}

}  // namespace loom::train
