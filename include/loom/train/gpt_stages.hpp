// The reference GPT's pipeline stages: how many of its layers each virtual
// stage runs, given as text ("3,3,2"), split evenly for an interleaved
// schedule, or balanced over unit times that a short profiling pass
// measures where the stages will run (plan/profile.hpp) and world rank 0
// sends to all, so that every rank cuts the model the same way.
// plan/stage_units.hpp turns the layers into the executor's units.
//
//   const auto seconds = train::profiled_unit_seconds(world, config, corpus, rows, seed, device, matmul);
//   const auto layers = train::gpt_stage_layers(gpt, config.layers, stages, schedule, "", seconds);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/staged.hpp"
#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"
#include "loom/data/corpus.hpp"
#include "loom/gpt/model.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/plan/profile.hpp"
#include "loom/plan/stage_units.hpp"
#include "loom/schedule/partition.hpp"

namespace loom::train {

// Layers (blocks) per virtual stage: `partition`'s when given (checked
// against the layers and stages), an even split for interleaving (whose
// chunks must be alike), else balanced over the measured unit times folded
// into their layers (plan/stage_units.hpp: embed's time counts with the first
// block, the final layers' with the last).
[[nodiscard]] inline std::vector<int> gpt_stage_layers(const plan::ModelDescription& gpt, std::int64_t layers, int stages,
                                                       ScheduleKind schedule, const std::string& partition,
                                                       const std::vector<double>& unit_seconds) {
    const auto count = static_cast<int>(layers);
    if (!partition.empty()) return schedule::parse_partition(partition, count, stages);
    if (schedule == ScheduleKind::interleaved) {
        LOOM_CHECK(count % stages == 0, "gpt_stage_layers: ", count, " layers do not split evenly into ", stages,
                   " interleaved chunks");
        return std::vector<int>(static_cast<std::size_t>(stages), count / stages);
    }
    return schedule::balance(plan::layer_costs(gpt, unit_seconds), stages).layers_per_stage;
}

// The short profiling pass, a collective: world rank 0 times every unit of
// a fresh model on `rows` sequences (the corpus's first, a micro-batch) on
// `device` with the run's matrix products, and sends the times to all.
template <comm::Communicator C>
[[nodiscard]] std::vector<double> profiled_unit_seconds(C& world, const gpt::Config& config, const data::ByteCorpus& corpus,
                                                        std::int64_t rows, std::uint64_t seed, Device device,
                                                        kernels::MatmulPrecision matmul) {
    std::vector<double> seconds(static_cast<std::size_t>(config.layers + 4), 0.0);  // embed, blocks, ln_f, head, loss
    if (world.rank() == 0) {
        gpt::Model probe = gpt::make_model(config);
        std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * config.seq)), targets(inputs.size());
        corpus.rows(seed, 0, 0, rows, config.seq, inputs, targets);
        // Timed where the stages will run: a GPU's costs are not the host's.
        seconds = plan::profile_units(probe, seed, Tensor::of(inputs.data(), {rows, config.seq}),
                                      Tensor::of(targets.data(), {rows, config.seq}), 3, device, matmul);
    }
    // Sent as 8-byte words (there is no f64 dtype): a broadcast copies bits.
    // A device's communicator moves device memory, so the words go through it.
    comm::staged_broadcast(world, Tensor(seconds.data(), DType::i64, Shape{static_cast<std::int64_t>(seconds.size())}), 0,
                           device);
    return seconds;
}

}  // namespace loom::train
