// A sharded checkpoint's index (exec/sharded_checkpoint.hpp): what
// index.json holds, how it is written, and how it is read back. Apart from
// the checkpoint itself so that reading an index (untrusted text, fuzzed in
// tests/fuzz) needs no executor.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/io/json.hpp"
#include "loom/io/json_value.hpp"

namespace loom::exec {

inline constexpr std::string_view sharded_format = "loom-sharded-1";

[[nodiscard]] inline std::string shard_file_name(std::int64_t steps, int rank, int world) {
    return "shard-s" + std::to_string(steps) + "-r" + std::to_string(rank) + "-of-" + std::to_string(world) +
           ".safetensors";
}

// State that belongs to one rank and means nothing in the whole model's
// order (a compressor's error feedback): each shard keeps its rank's, and a
// load takes it back only under the same `signature` (the same compressor on
// the same degrees), so rank r's state goes back to rank r.
struct RankState {
    std::string signature;  // empty: none
    std::vector<float> values;
};

inline constexpr std::string_view rank_state_key = "rank_state_signature";

// What index.json says.
struct ShardedIndex {
    std::int64_t parameters = 0;
    std::int64_t optimizer_steps = 0;
    std::vector<std::string> shards;  // file names, in rank order
    std::map<std::string, std::string> metadata;
};

// Why the state the index keeps under `key` is not for a loader whose
// state has `signature`: "the checkpoint keeps no <what> (<absent>)" or
// "the checkpoint's <what> belongs to <saved>, not <signature>"; empty
// when it is (the same signature).
[[nodiscard]] inline std::string signature_mismatch(const ShardedIndex& index, std::string_view key,
                                                    const std::string& signature, const std::string& what,
                                                    const std::string& absent = "") {
    const auto saved = index.metadata.find(std::string(key));
    if (saved == index.metadata.end())
        return "the checkpoint keeps no " + what + (absent.empty() ? "" : " (" + absent + ")");
    if (saved->second != signature) return "the checkpoint's " + what + " belongs to " + saved->second + ", not " + signature;
    return "";
}

namespace detail {

// index.json's text: one field a line, so people and diffs read it.
[[nodiscard]] inline std::string index_text(const ShardedIndex& index) {
    std::string out = "{\n  \"format\": " + io::json::quote(sharded_format) +
                      ",\n  \"parameters\": " + std::to_string(index.parameters) +
                      ",\n  \"optimizer_steps\": " + std::to_string(index.optimizer_steps) + ",\n  \"shards\": [";
    for (std::size_t i = 0; i < index.shards.size(); ++i)
        out += std::string(i == 0 ? "\n    " : ",\n    ") + io::json::quote(index.shards[i]);
    out += "\n  ],\n  \"metadata\": {";
    bool first = true;
    for (const auto& [key, value] : index.metadata) {
        out += std::string(first ? "\n    " : ",\n    ") + io::json::quote(key) + ": " + io::json::quote(value);
        first = false;
    }
    return out + "\n  }\n}\n";
}

}  // namespace detail

// Parses and checks an index's text; `where` names it in errors. Untrusted
// input (tests/fuzz fuzzes it): every problem is one loom::Error.
[[nodiscard]] inline ShardedIndex parse_sharded_index(std::string_view text, const std::string& where) {
    const io::json::Document document = io::json::parse_or_throw(text, where + "/index.json");
    const io::json::Value root = document.root();
    LOOM_CHECK(root.is_object(), where, ": index.json is not a JSON object");
    const auto field = [&](std::string_view key) {
        const auto value = root.find(key);
        LOOM_CHECK(value.has_value(), where, ": index.json has no \"", key, "\"");
        return *value;
    };
    LOOM_CHECK(field("format").is_string() && field("format").text() == sharded_format, where,
               ": index.json's format is '", field("format").text(), "'; this loom reads ", sharded_format);
    ShardedIndex index;
    const auto count = [&](std::string_view key) {
        const auto n = field(key).as_uint64();
        LOOM_CHECK(n.has_value() && *n <= static_cast<std::uint64_t>(std::int64_t{1} << 62), where, ": index.json's \"",
                   key, "\" is '", field(key).text(), "'; give a whole number");
        return static_cast<std::int64_t>(*n);
    };
    index.parameters = count("parameters");
    index.optimizer_steps = count("optimizer_steps");
    const io::json::Value shards = field("shards");
    LOOM_CHECK(shards.is_array() && !shards.empty(), where, ": index.json's \"shards\" must be a list of file names");
    for (io::json::Value name : shards.items()) {
        const std::string file(name.text());
        LOOM_CHECK(name.is_string() && !file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
                   where, ": index.json names shard '", file, "'; a shard is a file name in the checkpoint's directory");
        index.shards.push_back(file);
    }
    if (const auto metadata = root.find("metadata"); metadata && metadata->is_object())
        for (const auto& member : metadata->members())
            index.metadata[std::string(member.key)] = std::string(member.value.text());
    return index;
}

// Reads and checks `directory`/index.json.
[[nodiscard]] inline ShardedIndex read_sharded_index(const std::filesystem::path& directory) {
    const std::string where = "sharded checkpoint " + directory.string();
    const auto path = directory / "index.json";
    std::error_code error;
    const auto size = std::filesystem::file_size(path, error);
    LOOM_CHECK(!error, where, ": cannot read ", path.string(), ": ", error.message());
    LOOM_CHECK(size <= (std::uintmax_t{1} << 26), where, ": index.json is ", size, " bytes; an index is at most 64 MiB");
    std::string text(static_cast<std::size_t>(size), '\0');
    std::FILE* file = std::fopen(path.c_str(), "rb");
    LOOM_CHECK(file != nullptr, where, ": cannot open ", path.string());
    const std::size_t got = std::fread(text.data(), 1, text.size(), file);
    std::fclose(file);
    LOOM_CHECK(got == text.size(), where, ": read ", got, " of ", text.size(), " bytes of index.json");
    return parse_sharded_index(text, where);
}

}  // namespace loom::exec
