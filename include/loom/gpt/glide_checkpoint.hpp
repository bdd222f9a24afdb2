// A GliDe draft's weights in safetensors (gpt/glide_draft.hpp): every
// parameter under a readable name (glide_parameter_names), and as metadata
// the draft's shape and the target's (layers, width, heads) it was trained
// to read, so loading it beside another target is refused by name, and how
// its cross-attention scores (CrossScores; a file without the key is plain,
// as every draft was before `recency`). No
// optimizer state: a draft is trained once, beside its frozen target (the
// bench trains it; docs/speculative.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/gpt/glide_draft.hpp"
#include "loom/gpt/model.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/nn/param_arena.hpp"

namespace loom::gpt {

// Names in reflection (= arena) order, the absent head bias included.
[[nodiscard]] inline std::vector<std::string> glide_parameter_names(const Config& draft) {
    std::vector<std::string> names{"embed.token", "embed.position"};
    for (std::int64_t i = 0; i < draft.layers; ++i) {
        const std::string b = "blocks." + std::to_string(i) + ".";
        for (const char* leaf : {"ln1.gain", "ln1.shift", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                                 "attn.proj.bias", "ln_cross.gain", "ln_cross.shift", "cross.query.weight",
                                 "cross.query.bias", "cross.proj.weight", "cross.proj.bias", "ln2.gain", "ln2.shift",
                                 "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"})
            names.push_back(b + leaf);
    }
    for (const char* leaf : {"ln_f.gain", "ln_f.shift", "head.weight", "head.bias"}) names.emplace_back(leaf);
    return names;
}

namespace detail {

[[nodiscard]] inline std::map<std::string, std::string> glide_metadata(const Config& draft, const Config& target,
                                                                      CrossScores scores) {
    return {{"format", "loom-glide-draft-1"},
            {"cross_scores", name_of(scores)},
            {"layers", std::to_string(draft.layers)},
            {"width", std::to_string(draft.width)},
            {"heads", std::to_string(draft.heads)},
            {"seq", std::to_string(draft.seq)},
            {"vocab", std::to_string(draft.vocab)},
            {"target_layers", std::to_string(target.layers)},
            {"target_width", std::to_string(target.width)},
            {"target_heads", std::to_string(target.heads)}};
}

template <class F>
void for_each_glide_param(const Config& draft, const nn::ParamArena& arena, F&& f) {
    const std::vector<std::string> names = glide_parameter_names(draft);
    LOOM_CHECK(names.size() == arena.entries().size(), "GliDe checkpoint: the arena holds ", arena.entries().size(),
               " parameters but a draft of ", draft, " has ", names.size(), "; bind the arena to that draft");
    for (std::size_t i = 0; i < names.size(); ++i)
        if (arena.entries()[i].param->numel() > 0) f(names[i], arena.entries()[i].param->value);
}

}  // namespace detail

// Writes the draft's parameters (its arena, bound on the host).
inline void save_glide_draft(const std::filesystem::path& path, const Config& draft, const Config& target,
                             const nn::ParamArena& arena, CrossScores scores = CrossScores::plain) {
    std::vector<io::NamedTensor> tensors;
    detail::for_each_glide_param(draft, arena, [&](const std::string& name, const Tensor& value) {
        tensors.push_back({name, value});
    });
    io::save_safetensors(path, tensors, detail::glide_metadata(draft, target, scores));
}

// Reads them into the arena, after checking the file's shapes against the
// draft's and the target's (a mismatch names the key and both values).
inline void load_glide_draft(const std::filesystem::path& path, const Config& draft, const Config& target,
                             const nn::ParamArena& arena, CrossScores scores = CrossScores::plain) {
    const io::SafetensorsFile file(path);
    for (const auto& [key, expected] : detail::glide_metadata(draft, target, scores)) {
        auto found = file.metadata().find(key);
        if (!found.has_value() && key == "cross_scores") found = std::string_view(name_of(CrossScores::plain));
        LOOM_CHECK(found.has_value(), "GliDe checkpoint ", path.string(), ": no metadata '", key,
                   "'; this is not a loom GliDe draft (save it with gpt::save_glide_draft)");
        LOOM_CHECK(*found == expected, "GliDe checkpoint ", path.string(), ": ", key, " is ", *found, " but ",
                   expected, " was asked for; ",
                   key == "cross_scores" ? "build the draft with the file's scores (gpt::glide_cross_scores)"
                                         : "give the draft's and the target's shapes it was trained with");
    }
    detail::for_each_glide_param(draft, arena, [&](const std::string& name, const Tensor& value) {
        file.read_into(name, value);
    });
}

// How the draft in `path` scores (its "cross_scores"; plain when absent):
// build the draft with it before loading (make_glide_draft's `scores`).
[[nodiscard]] inline CrossScores glide_cross_scores(const std::filesystem::path& path) {
    const io::SafetensorsFile file(path);
    const auto found = file.metadata().find("cross_scores");
    if (!found.has_value() || *found == name_of(CrossScores::plain)) return CrossScores::plain;
    LOOM_CHECK(*found == name_of(CrossScores::recency), "GliDe checkpoint ", path.string(), ": cross_scores is ",
               *found, "; a loom GliDe draft's is plain or recency");
    return CrossScores::recency;
}

}  // namespace loom::gpt
