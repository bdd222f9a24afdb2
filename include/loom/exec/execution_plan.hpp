// What the executor is asked to run: ExecutorOptions (micro-batches, AdamW,
// tracing, the pipeline partition) and ExecutionPlan (a Strategy's value,
// StrategySpec, so one executor serves every strategy), and how a
// partition becomes the units of each virtual stage.
#pragma once

#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/nn/sequence_layout.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/gradient_exchange.hpp"
#include "loom/parallel/pipeline.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/schedule/partition.hpp"
#include "loom/schedule/pipeline_step.hpp"

namespace loom::exec {

struct ExecutorOptions {
    int micro_batches = 1;
    optim::AdamWConfig adamw{};
    bool trace = false;                      // record a Trace of every step
    std::vector<std::string> field_names{};  // names of the model's top-level fields, for traces
    // Pipelines: units per virtual stage (stages x chunks entries, in model
    // order, summing to the units); empty: balanced over unit_costs (one
    // per unit; empty: every unit costs the same) by schedule::balance.
    std::vector<int> partition{};
    std::vector<double> unit_costs{};
    // What the gradient exchange is set up with besides the strategy
    // (parallel/gradient_exchange.hpp: a compressor's warm-up steps).
    parallel::ExchangeOptions exchange{};
    // Where one-time notices go (a component's, from the first rank of the
    // gradient group; a tensor-parallel strategy that cuts nothing in a unit,
    // from the world's first rank); empty: stderr.
    std::function<void(const std::string&)> notice{};
    // Where the parameters, gradients, AdamW state and activations live. A
    // device needs its backend built in and a communicator that moves that
    // device's memory; every strategy runs there (docs/cuda.md).
    Device device = host_device;
    // The arithmetic of every layer's matrix products: f32, or bf16 operands
    // with f32 sums (kernels/matmul_precision.hpp). Weights, gradients and
    // AdamW state stay f32 either way.
    kernels::MatmulPrecision matmul = kernels::MatmulPrecision::f32;
    // Whether the executor keeps AdamW's moments. False for an optimizer that
    // keeps its own state and only asks for gradients (Executor::gradient:
    // OptEx): 8 bytes per parameter fewer, and step(), gather_state and the
    // other calls that read the moments refuse.
    bool optimizer_state = true;
};

// Where a one-time notice goes: `notice` (ExecutorOptions::notice), or standard error ("loom: ...").
[[nodiscard]] inline std::function<void(const std::string&)> notice_sink(const std::function<void(const std::string&)>& notice) {
    if (notice) return notice;
    return [](const std::string& line) { std::cerr << "loom: " << line << "\n"; };
}

// What a Strategy asks of the executor, as run-time values: the strategy's
// one value (parallel/strategy_spec.hpp), under the executor's older name.
using ExecutionPlan = StrategySpec;

// The units per virtual stage for `units` units over `virtual_stages`: the
// given partition, checked, or the min-max balance of the costs.
[[nodiscard]] inline schedule::StageBounds stage_bounds(int units, int virtual_stages, const ExecutorOptions& options) {
    std::vector<int> sizes = options.partition;
    if (sizes.empty()) {
        std::vector<double> costs = options.unit_costs;
        if (costs.empty()) costs.assign(static_cast<std::size_t>(units), 1.0);
        LOOM_CHECK(static_cast<int>(costs.size()) == units, "Executor: ", costs.size(), " unit costs for ", units,
                   " units; give one per unit");
        sizes = schedule::balance(costs, virtual_stages).layers_per_stage;
    }
    LOOM_CHECK(static_cast<int>(sizes.size()) == virtual_stages, "Executor: a partition of ", sizes.size(),
               " stages for a pipeline of ", virtual_stages, " virtual stages; give one count per virtual stage");
    int sum = 0;
    for (int n : sizes) {
        LOOM_CHECK(n >= 1, "Executor: a stage of ", n, " units in the partition; every stage needs at least 1");
        sum += n;
    }
    LOOM_CHECK(sum == units, "Executor: the partition covers ", sum, " units but the model has ", units,
               "; the counts must sum to ", units);
    return schedule::StageBounds::of_sizes(sizes);
}

}  // namespace loom::exec
