// Partitioning a model into pipeline stages: consecutive runs of layers, one
// run per device, chosen to minimise the slowest stage's time. Devices may
// differ in speed and memory (the heterogeneous clusters of AMP and Sky
// Computing): stage s on device s takes sum(cost of its layers) / speed[s]
// and must fit sum(memory of its layers) <= capacity[s]. A min-max dynamic
// program over (device, first layer) finds the optimum exactly in
// O(devices x layers^2); parse_partition("3,3,2", ...) takes one by hand instead.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/setting_names.hpp"

namespace loom::schedule {

struct StageDevice {
    double speed = 1.0;                                           // relative compute speed
    double memory = std::numeric_limits<double>::infinity();     // bytes it can hold for its layers
};

struct Partition {
    std::vector<int> layers_per_stage;  // sums to the layer count
    std::vector<double> stage_times;    // cost / speed of each stage
    double slowest = 0;                 // max of stage_times: what the partition minimises

    [[nodiscard]] int first_layer(int stage) const {
        int first = 0;
        for (int s = 0; s < stage; ++s) first += layers_per_stage[static_cast<std::size_t>(s)];
        return first;
    }
    friend std::ostream& operator<<(std::ostream& out, const Partition& p) {
        out << "partition ";
        for (std::size_t s = 0; s < p.layers_per_stage.size(); ++s) out << (s ? "," : "") << p.layers_per_stage[s];
        return out << " (slowest stage " << p.slowest << ")";
    }
};

namespace detail {

inline void check_layers_and_stages(std::size_t layers, std::size_t stages) {
    LOOM_CHECK(stages >= 1, "partition: ", stages, " stages; there must be at least 1");
    LOOM_CHECK(layers >= stages, "partition: ", stages, " stages but the model has ", layers,
               " layers; every stage needs at least one layer, so use at most ", layers, " stages");
}

}  // namespace detail

// The stage times and slowest stage of a given split.
[[nodiscard]] inline Partition evaluate(const std::vector<int>& layers_per_stage, const std::vector<double>& cost,
                                        const std::vector<StageDevice>& devices) {
    LOOM_CHECK(layers_per_stage.size() == devices.size(), "partition: ", layers_per_stage.size(), " stages for ",
               devices.size(), " devices; give one stage per device");
    Partition p{layers_per_stage, {}, 0};
    std::size_t at = 0;
    for (std::size_t s = 0; s < devices.size(); ++s) {
        double sum = 0;
        for (int k = 0; k < layers_per_stage[s]; ++k) sum += cost.at(at++);
        p.stage_times.push_back(sum / devices[s].speed);
        p.slowest = std::max(p.slowest, p.stage_times.back());
    }
    return p;
}

// The split of `cost.size()` layers over `devices` (in pipeline order) that
// minimises the slowest stage, every stage fitting its device's memory.
// Ties go to the split with the earlier, smaller first stages.
[[nodiscard]] inline Partition balance(const std::vector<double>& cost, const std::vector<double>& memory,
                                       const std::vector<StageDevice>& devices) {
    const std::size_t n = cost.size(), p = devices.size();
    detail::check_layers_and_stages(n, p);
    LOOM_CHECK(memory.size() == n, "partition: ", memory.size(), " layer memory sizes for ", n, " layers");
    for (std::size_t i = 0; i < n; ++i)
        LOOM_CHECK(cost[i] >= 0 && memory[i] >= 0, "partition: layer ", i, " has cost ", cost[i], " and memory ",
                   memory[i], "; both must be >= 0");
    for (std::size_t s = 0; s < p; ++s)
        LOOM_CHECK(devices[s].speed > 0, "partition: device ", s, " has speed ", devices[s].speed, "; it must be > 0");
    std::vector<double> cost_prefix(n + 1, 0), memory_prefix(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
        cost_prefix[i + 1] = cost_prefix[i] + cost[i];
        memory_prefix[i + 1] = memory_prefix[i] + memory[i];
    }
    constexpr double inf = std::numeric_limits<double>::infinity();
    // best[s][i]: the smallest slowest-stage time for layers [i, n) on devices [s, p).
    std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, inf));
    std::vector<std::vector<std::size_t>> cut(p + 1, std::vector<std::size_t>(n + 1, n));
    best[p][n] = 0;
    for (std::size_t s = p; s-- > 0;) {
        const std::size_t stages_after = p - s - 1;
        for (std::size_t i = s; i + stages_after < n; ++i) {
            // Stage s takes layers [i, j); the rest need one layer per stage.
            for (std::size_t j = i + 1; j + stages_after <= n; ++j) {
                if (memory_prefix[j] - memory_prefix[i] > devices[s].memory) break;
                const double here = (cost_prefix[j] - cost_prefix[i]) / devices[s].speed;
                const double slowest = std::max(here, best[s + 1][j]);
                if (slowest < best[s][i]) {
                    best[s][i] = slowest;
                    cut[s][i] = j;
                }
            }
        }
    }
    LOOM_CHECK(best[0][0] < inf, "partition: the model's ", n, " layers (", memory_prefix[n],
               " bytes) do not fit the memory of the ", p, " devices in any split into consecutive stages");
    std::vector<int> sizes;
    for (std::size_t s = 0, i = 0; s < p; ++s) {
        sizes.push_back(static_cast<int>(cut[s][i] - i));
        i = cut[s][i];
    }
    return evaluate(sizes, cost, devices);
}

// Equal devices, no memory limit.
[[nodiscard]] inline Partition balance(const std::vector<double>& cost, int stages) {
    LOOM_CHECK(stages >= 1, "partition: ", stages, " stages; there must be at least 1");
    return balance(cost, std::vector<double>(cost.size(), 0.0), std::vector<StageDevice>(static_cast<std::size_t>(stages)));
}

// "3,3,2" -> {3, 3, 2}, checked against the layer count and the stages.
// Messages name the partition and the pipeline degree as `name` spells the
// settings "partition" and "pp" (core/setting_names.hpp); `stages_are` says
// where the stage count comes from ("pp is 3" by default; "pp 2 x 2 chunks
// is 4" for interleaving).
[[nodiscard]] inline std::vector<int> parse_partition(std::string_view text, int layers, int stages,
                                                      const SettingNames& name = {}, std::string stages_are = {}) {
    if (stages_are.empty()) stages_are = name("pp") + " is " + std::to_string(stages);
    const std::string partition = name("partition") + " " + std::string(text);
    std::vector<int> sizes;
    std::string item;
    std::istringstream in{std::string(text)};
    while (std::getline(in, item, ',')) {
        char* end = nullptr;
        const long value = std::strtol(item.c_str(), &end, 10);
        LOOM_CHECK(!item.empty() && end != item.c_str() && *end == '\0' && value >= 1 && value <= layers,
                   partition, ": '", item, "' is not a layer count in 1..", layers);
        sizes.push_back(static_cast<int>(value));
    }
    int sum = 0;
    for (int s : sizes) sum += s;
    LOOM_CHECK(static_cast<int>(sizes.size()) == stages, partition, " has ", sizes.size(), " stages but ",
               stages_are, "; give one layer count per stage");
    LOOM_CHECK(sum == layers, partition, " sums to ", sum, " layers but the model has ", layers);
    return sizes;
}

}  // namespace loom::schedule
