// A pipeline partition over a model's layers (ModelDescription), in the
// executor's units: a layer folds one or more of them (LayerSpec::units; the
// GPT's first layer is embed and blocks[0], its last blocks[L-1], ln_f, head
// and loss), so layers per stage become units per stage (what
// ExecutorOptions::partition counts), profiled unit times become layer costs
// for schedule::balance, and a partition reads as the units each stage runs:
// "embed+blocks[0..3] | blocks[4..7]+ln_f+head+loss".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/plan/model_description.hpp"

namespace loom::plan {

namespace stage_units_detail {

inline void check_covers(const ModelDescription& model, const std::vector<int>& layers_per_stage) {
    std::size_t sum = 0;
    for (const int n : layers_per_stage) sum += n < 1 ? model.layers.size() + 1 : static_cast<std::size_t>(n);
    LOOM_CHECK(sum == model.layers.size(), "a partition of ", layers_per_stage.size(), " stages covers ", sum,
               " layers but model ", model.name, " has ", model.layers.size(), "; give counts of 1 or more summing to ",
               model.layers.size());
}

// "blocks[7]" -> ("blocks", 7); a name without a trailing index -> (name, -1).
inline std::pair<std::string, std::int64_t> indexed(const std::string& name) {
    const std::size_t open = name.rfind('[');
    if (open == std::string::npos || name.back() != ']' || open + 2 >= name.size()) return {name, -1};
    std::int64_t index = 0;
    for (std::size_t i = open + 1; i + 1 < name.size(); ++i) {
        if (name[i] < '0' || name[i] > '9') return {name, -1};
        index = index * 10 + (name[i] - '0');
    }
    return {name.substr(0, open), index};
}

}  // namespace stage_units_detail

// The executor's units per stage for `layers_per_stage` layers per stage.
[[nodiscard]] inline std::vector<int> units_per_stage(const ModelDescription& model,
                                                      const std::vector<int>& layers_per_stage) {
    stage_units_detail::check_covers(model, layers_per_stage);
    std::vector<int> units;
    std::size_t layer = 0;
    for (const int n : layers_per_stage) {
        int count = 0;
        for (int k = 0; k < n; ++k) count += static_cast<int>(model.layers[layer++].executor_units().size());
        units.push_back(count);
    }
    return units;
}

// Each layer's cost: the costs of its units (one per executor unit, in order), summed in order.
[[nodiscard]] inline std::vector<double> layer_costs(const ModelDescription& model, const std::vector<double>& unit_costs) {
    std::size_t units = 0;
    for (const LayerSpec& l : model.layers) units += l.executor_units().size();
    LOOM_CHECK(units == unit_costs.size(), "model ", model.name, " has ", units, " units but ", unit_costs.size(),
               " costs were given; give one cost per executor unit");
    std::vector<double> costs;
    std::size_t unit = 0;
    for (const LayerSpec& l : model.layers) {
        double sum = unit_costs[unit++];
        for (std::size_t k = 1; k < l.executor_units().size(); ++k) sum += unit_costs[unit++];
        costs.push_back(sum);
    }
    return costs;
}

// "embed+blocks[0..3] | blocks[4..7]+ln_f+head+loss": the units each stage
// runs, a run of consecutive indexed units ("blocks[4]" to "blocks[7]") as one range.
[[nodiscard]] inline std::string describe_stages(const ModelDescription& model, const std::vector<int>& layers_per_stage) {
    stage_units_detail::check_covers(model, layers_per_stage);
    std::string out;
    std::size_t layer = 0;
    for (std::size_t s = 0; s < layers_per_stage.size(); ++s) {
        std::vector<std::string> names;
        for (int k = 0; k < layers_per_stage[s]; ++k)
            for (const UnitParams& u : model.layers[layer++].executor_units()) names.push_back(u.name);
        std::string stage;
        for (std::size_t i = 0; i < names.size();) {
            const auto [prefix, first] = stage_units_detail::indexed(names[i]);
            std::size_t j = i + 1;
            while (first >= 0 && j < names.size() &&
                   stage_units_detail::indexed(names[j]) == std::pair{prefix, first + static_cast<std::int64_t>(j - i)})
                ++j;
            if (!stage.empty()) stage += '+';
            if (first < 0) {
                stage += names[i];
            } else {
                stage.append(prefix).append("[").append(std::to_string(first)).append("..");
                stage.append(std::to_string(first + static_cast<std::int64_t>(j - i) - 1)).append("]");
            }
            i = j;
        }
        if (s > 0) out += " | ";
        out += stage;
    }
    return out;
}

}  // namespace loom::plan
