// GPT checkpoints in safetensors: every parameter under its readable name
// (gpt::parameter_names), the AdamW moments under "optimizer.m.<name>" and
// "optimizer.v.<name>", and the configuration and step as metadata. Written
// atomically (a failed save never replaces an existing file); loading checks
// the configuration against the flags before any tensor is read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/gpt/model.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/optim/adamw.hpp"

namespace loom::gpt {

namespace detail {

inline std::map<std::string, std::string> config_metadata(const Config& c) {
    return {{"layers", std::to_string(c.layers)}, {"width", std::to_string(c.width)},
            {"heads", std::to_string(c.heads)},   {"seq", std::to_string(c.seq)},
            {"vocab", std::to_string(c.vocab)}};
}

// Calls f(name, value_view, m_view, v_view) for every parameter with elements.
template <class F>
void for_each_named(const Config& config, const nn::ParamArena& arena, optim::AdamW& optimizer, F&& f) {
    const auto names = parameter_names(config);
    LOOM_CHECK(names.size() == arena.entries().size(), "GPT checkpoint: the model has ", arena.entries().size(),
               " parameters but ", names.size(), " names");
    for (std::size_t i = 0; i < names.size(); ++i) {
        const auto& entry = arena.entries()[i];
        const Param& p = *entry.param;
        if (p.numel() == 0) continue;
        const auto offset = static_cast<std::size_t>(entry.offset);
        f(names[i], p.value, Tensor::of(optimizer.m().data() + offset, p.shape),
          Tensor::of(optimizer.v().data() + offset, p.shape));
    }
}

}  // namespace detail

inline void save_checkpoint(const std::filesystem::path& path, const Config& config, const nn::ParamArena& arena,
                            optim::AdamW& optimizer, std::int64_t step, const std::string& data) {
    std::vector<io::NamedTensor> tensors;
    detail::for_each_named(config, arena, optimizer, [&](const std::string& name, const Tensor& value,
                                                         const Tensor& m, const Tensor& v) {
        tensors.push_back({name, value});
        tensors.push_back({"optimizer.m." + name, m});
        tensors.push_back({"optimizer.v." + name, v});
    });
    auto metadata = detail::config_metadata(config);
    metadata["format"] = "loom-gpt-checkpoint-1";
    metadata["step"] = std::to_string(step);
    metadata["optimizer_steps"] = std::to_string(optimizer.steps());
    metadata["data"] = data;
    io::save_safetensors(path, tensors, metadata);
}

// Restores parameters and optimizer state; returns the step to continue from.
inline std::int64_t load_checkpoint(const std::filesystem::path& path, const Config& config,
                                    const nn::ParamArena& arena, optim::AdamW& optimizer) {
    const io::SafetensorsFile file(path);
    const auto& metadata = file.metadata();
    auto field = [&](const std::string& key) -> const std::string& {
        const auto it = metadata.find(key);
        LOOM_CHECK(it != metadata.end(), "checkpoint ", path.string(), " has no '", key,
                   "' in its metadata; it was not written by train_gpt");
        return it->second;
    };
    LOOM_CHECK(field("format") == "loom-gpt-checkpoint-1", "checkpoint ", path.string(), " has format '",
               field("format"), "', expected loom-gpt-checkpoint-1");
    for (const auto& [key, expected] : detail::config_metadata(config))
        LOOM_CHECK(field(key) == expected, "checkpoint ", path.string(), " was trained with --", key, " ", field(key),
                   " but the flags say --", key, " ", expected);
    detail::for_each_named(config, arena, optimizer, [&](const std::string& name, const Tensor& value,
                                                         const Tensor& m, const Tensor& v) {
        file.read_into(name, value);
        file.read_into("optimizer.m." + name, m);
        file.read_into("optimizer.v." + name, v);
    });
    auto number = [&](const std::string& key) {
        const std::string& text = field(key);
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        LOOM_CHECK(end != text.c_str() && *end == '\0' && value >= 0, "checkpoint ", path.string(), ": '", key,
                   "' is '", text, "', not a step count");
        return static_cast<std::int64_t>(value);
    };
    optimizer.restore(number("optimizer_steps"));
    return number("step");
}

}  // namespace loom::gpt
