// GPT checkpoints in safetensors: every parameter under its readable name
// (gpt::parameter_names), the AdamW moments under "optimizer.m.<name>" and
// "optimizer.v.<name>", and the configuration and step as metadata. Written
// atomically (a failed save never replaces an existing file); loading checks
// the configuration against the flags before any tensor is read.
#pragma once

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <span>
#include <string_view>
#include <string>
#include <system_error>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/reflect.hpp"
#include "loom/gpt/model.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/nn/param_arena.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/train/finite_check.hpp"

namespace loom::gpt {

// The largest step or optimizer step count a checkpoint holds: half the
// int64 range, so a resumed run can go on counting (and adding a schedule's
// offsets) without a signed overflow.
inline constexpr std::int64_t max_checkpoint_steps = std::numeric_limits<std::int64_t>::max() / 2;

struct CheckpointSteps {
    std::int64_t step = 0;             // the training step to continue from
    std::int64_t optimizer_steps = 0;  // AdamW's step count
};

namespace detail {

// A metadata step count, strictly: decimal digits only (no sign, blank,
// exponent or trailing text), at most max_checkpoint_steps.
inline std::int64_t parse_step_count(const std::filesystem::path& path, const std::string& key, const std::string& text) {
    std::int64_t value = -1;
    const char* const end = text.data() + text.size();
    const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    const auto [stop, error] = std::from_chars(text.data(), end, value);
    LOOM_CHECK(digits && error == std::errc{} && stop == end && value <= max_checkpoint_steps, "checkpoint ",
               path.string(), ": metadata '", key, "' is '", text, "'; give a whole number from 0 to ",
               max_checkpoint_steps);
    return value;
}

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
    LOOM_CHECK(step >= 0 && step <= max_checkpoint_steps, "GPT checkpoint ", path.string(), ": step ", step,
               " cannot be saved; give a whole number from 0 to ", max_checkpoint_steps);
    LOOM_CHECK(optimizer_steps >= 0 && optimizer_steps <= max_checkpoint_steps, "GPT checkpoint ", path.string(),
               ": optimizer_steps ", optimizer_steps, " cannot be saved; give a whole number from 0 to ",
               max_checkpoint_steps);
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

// Throws "<context>: tensor <name> holds nan at element i of n; only finite
// values are valid" for the first parameter or AdamW moment (checkpoint
// names, "optimizer.m.<name>") holding a NaN or an infinity. The training
// loop calls it before a save ("step 120"), so a diverged run stops without
// replacing the last good checkpoint.
inline void check_finite_state(const Config& config, std::span<const float> values, std::span<const float> m,
                               std::span<const float> v, std::string_view context) {
    auto writable = [](std::span<const float> s) { return std::span<float>(const_cast<float*>(s.data()), s.size()); };
    detail::for_each_named(config, writable(values), writable(m), writable(v),
                           [&](const std::string& name, const Tensor& value, const Tensor& mv, const Tensor& vv) {
                               train::check_finite(value, name, context);
                               train::check_finite(mv, "optimizer.m." + name, context);
                               train::check_finite(vv, "optimizer.v." + name, context);
                           });
}

namespace detail {

// The configuration and step counts a checkpoint's metadata records, checked
// against `config`; `find(key)` gives a metadata value or nothing. A
// mismatch names both values before any tensor is read.
template <class Find>
CheckpointSteps check_metadata(const std::filesystem::path& path, const Config& config, std::string_view format,
                               Find&& find) {
    auto field = [&](const std::string& key) -> std::string {
        const std::optional<std::string_view> value = find(key);
        LOOM_CHECK(value.has_value(), "checkpoint ", path.string(), " has no '", key,
                   "' in its metadata; it was not written by train_gpt");
        return std::string(*value);
    };
    LOOM_CHECK(field("format") == format, "checkpoint ", path.string(), " has format '", field("format"), "', expected ",
               format);
    for (const auto& [key, expected] : config_metadata(config))
        LOOM_CHECK(field(key) == expected, "checkpoint ", path.string(), " was trained with ", key, " ", field(key),
                   " but this model has ", key, " ", expected);
    return {parse_step_count(path, "step", field("step")),
            parse_step_count(path, "optimizer_steps", field("optimizer_steps"))};
}

}  // namespace detail

// A sharded checkpoint's metadata (exec/sharded_checkpoint.hpp keeps it in
// its index): what save_checkpoint records, as strings.
[[nodiscard]] inline std::map<std::string, std::string> sharded_metadata(const Config& config, std::int64_t step,
                                                                        std::int64_t optimizer_steps,
                                                                        const std::string& data) {
    auto metadata = detail::config_metadata(config);
    metadata["format"] = "loom-gpt-sharded-1";
    metadata["step"] = std::to_string(step);
    metadata["optimizer_steps"] = std::to_string(optimizer_steps);
    metadata["data"] = data;
    return metadata;
}

// Checks a sharded checkpoint's metadata against `config` and returns its steps.
[[nodiscard]] inline CheckpointSteps check_sharded_metadata(const std::filesystem::path& path, const Config& config,
                                                            const std::map<std::string, std::string>& metadata) {
    return detail::check_metadata(path, config, "loom-gpt-sharded-1",
                                  [&](const std::string& key) -> std::optional<std::string_view> {
                                      const auto it = metadata.find(key);
                                      if (it == metadata.end()) return std::nullopt;
                                      return std::string_view(it->second);
                                  });
}

// Reads parameters and moments into dense arrays, after checking the
// checkpoint's configuration against `config` (a mismatch names both values
// before any tensor is read).
inline CheckpointSteps load_checkpoint(const std::filesystem::path& path, const Config& config, std::span<float> values,
                                       std::span<float> m, std::span<float> v) {
    const io::SafetensorsFile file(path);
    // The step counts before any tensor is read, so a bad one leaves the
    // caller's arrays untouched.
    const CheckpointSteps steps = detail::check_metadata(path, config, "loom-gpt-checkpoint-1",
                                                         [&](const std::string& key) { return file.metadata().find(key); });
    // A NaN or an infinity would train to `loss nan` and be saved over the
    // good checkpoint: refused here, naming the tensor and its first bad element.
    const std::string context = "checkpoint " + path.string();
    auto read = [&](const std::string& name, const Tensor& into) {
        train::check_finite(file.tensor(name), name, context);
        file.read_into(name, into);
    };
    detail::for_each_named(config, values, m, v,
                           [&](const std::string& name, const Tensor& value, const Tensor& mv, const Tensor& vv) {
                               read(name, value);
                               read("optimizer.m." + name, mv);
                               read("optimizer.v." + name, vv);
                           });
    return steps;
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
