// GPT checkpoints in safetensors: every parameter under its readable name
// (gpt::parameter_names), the AdamW moments under "optimizer.m.<name>" and
// "optimizer.v.<name>", and the configuration and step as metadata. Written
// atomically (a failed save never replaces an existing file); loading checks
// the configuration against the flags before any tensor is read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/reflect.hpp"
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

// Calls f(name, value_view, m_view, v_view) for every parameter with
// elements, viewing the dense arrays (reflection order, the serial arena's)
// under each parameter's shape. The shapes come from the configuration alone:
// a model that is only built, never bound, allocates nothing.
template <class F>
void for_each_named(const Config& config, std::span<float> values, std::span<float> m, std::span<float> v, F&& f) {
    const auto names = parameter_names(config);
    auto shapes = make_model(config);
    std::size_t index = 0;
    std::int64_t offset = 0;
    reflect::visit_params(shapes, [&](const Param& p, std::string_view) {
        LOOM_CHECK(index < names.size(), "GPT checkpoint: the model has more parameters than its ", names.size(), " names");
        const std::string& name = names[index++];
        if (p.numel() > 0) {
            LOOM_CHECK(offset + p.numel() <= static_cast<std::int64_t>(values.size()) && m.size() == values.size() &&
                           v.size() == values.size(),
                       "GPT checkpoint: arrays of ", values.size(), ", ", m.size(), " and ", v.size(),
                       " elements cannot hold the parameters of ", config);
            const auto at = static_cast<std::size_t>(offset);
            f(name, Tensor::of(values.data() + at, p.shape), Tensor::of(m.data() + at, p.shape),
              Tensor::of(v.data() + at, p.shape));
        }
        offset += p.numel();
    });
    LOOM_CHECK(index == names.size() && offset == static_cast<std::int64_t>(values.size()), "GPT checkpoint: ",
               values.size(), " elements in the arrays but ", offset, " in the parameters of ", config);
}

}  // namespace detail

// Saves dense parameters and AdamW moments (every rank's view after a
// gather, or a serial arena): the file does not depend on how training was
// split across ranks, so any strategy resumes it.
// `extra` tensors and `extra_metadata` ride along (train_gpt's compressor
// state, train/compression_state.hpp); their names must not clash.
inline void save_checkpoint(const std::filesystem::path& path, const Config& config, std::span<const float> values,
                            std::span<const float> m, std::span<const float> v, std::int64_t optimizer_steps,
                            std::int64_t step, const std::string& data,
                            const std::vector<io::NamedTensor>& extra = {},
                            const std::map<std::string, std::string>& extra_metadata = {}) {
    std::vector<io::NamedTensor> tensors;
    auto writable = [](std::span<const float> s) { return std::span<float>(const_cast<float*>(s.data()), s.size()); };
    detail::for_each_named(config, writable(values), writable(m), writable(v),
                           [&](const std::string& name, const Tensor& value, const Tensor& mv, const Tensor& vv) {
                               tensors.push_back({name, value});
                               tensors.push_back({"optimizer.m." + name, mv});
                               tensors.push_back({"optimizer.v." + name, vv});
                           });
    auto metadata = detail::config_metadata(config);
    metadata["format"] = "loom-gpt-checkpoint-1";
    metadata["step"] = std::to_string(step);
    metadata["optimizer_steps"] = std::to_string(optimizer_steps);
    metadata["data"] = data;
    for (const auto& [key, value] : extra_metadata) {
        LOOM_CHECK(!metadata.contains(key), "GPT checkpoint: extra metadata '", key, "' clashes with the checkpoint's own");
        metadata[key] = value;
    }
    tensors.insert(tensors.end(), extra.begin(), extra.end());
    io::save_safetensors(path, tensors, metadata);
}

struct CheckpointSteps {
    std::int64_t step = 0;             // the training step to continue from
    std::int64_t optimizer_steps = 0;  // AdamW's step count
};

// Reads parameters and moments into dense arrays, after checking the
// checkpoint's configuration against `config` (a mismatch names both values
// before any tensor is read).
inline CheckpointSteps load_checkpoint(const std::filesystem::path& path, const Config& config, std::span<float> values,
                                       std::span<float> m, std::span<float> v) {
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
    detail::for_each_named(config, values, m, v,
                           [&](const std::string& name, const Tensor& value, const Tensor& mv, const Tensor& vv) {
                               file.read_into(name, value);
                               file.read_into("optimizer.m." + name, mv);
                               file.read_into("optimizer.v." + name, vv);
                           });
    auto number = [&](const std::string& key) {
        const std::string& text = field(key);
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        LOOM_CHECK(end != text.c_str() && *end == '\0' && value >= 0, "checkpoint ", path.string(), ": '", key,
                   "' is '", text, "', not a step count");
        return static_cast<std::int64_t>(value);
    };
    return {number("step"), number("optimizer_steps")};
}

// The serial forms: a ParamArena and its AdamW.
inline void save_checkpoint(const std::filesystem::path& path, const Config& config, const nn::ParamArena& arena,
                            const optim::AdamW& optimizer, std::int64_t step, const std::string& data) {
    save_checkpoint(path, config, arena.values(), optimizer.m(), optimizer.v(), optimizer.steps(), step, data);
}

// Restores parameters and optimizer state; returns the step to continue from.
inline std::int64_t load_checkpoint(const std::filesystem::path& path, const Config& config,
                                    const nn::ParamArena& arena, optim::AdamW& optimizer) {
    const CheckpointSteps steps = load_checkpoint(path, config, arena.values(), optimizer.m(), optimizer.v());
    optimizer.restore(steps.optimizer_steps);
    return steps.step;
}

}  // namespace loom::gpt
