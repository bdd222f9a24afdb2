// train_gpt's pipeline stages: how many of the GPT's layers each virtual
// stage runs (given by --partition; split evenly for --schedule interleaved;
// else balanced over unit times measured by a short profiling pass on world
// rank 0 and sent to all); plan/stage_units.hpp turns them into units.
// Included by train_gpt.cpp inside its anonymous namespace, after
// train_gpt_flags.hpp.
#pragma once

// Layers (blocks) per virtual stage: --partition's, split evenly for
// interleaving, else balanced over the measured unit times folded into their
// layers (plan/stage_units.hpp: embed's time counts with the first block,
// the final layers' with the last).
inline std::vector<int> gpt_partition(const Flags& flags, const loom::plan::ModelDescription& gpt,
                                      const std::vector<double>& unit_seconds) {
    const auto layers = static_cast<int>(flags.model.layers);
    const int stages = flags.pp * flags.strategy.chunks;
    if (!flags.partition.empty()) return loom::schedule::parse_partition(flags.partition, layers, stages);
    if (flags.strategy.schedule == loom::ScheduleKind::interleaved)
        return std::vector<int>(static_cast<std::size_t>(stages), layers / stages);
    return loom::schedule::balance(loom::plan::layer_costs(gpt, unit_seconds), stages).layers_per_stage;
}

// The short profiling pass: world rank 0 times every unit on one micro-batch
// and sends the times to all, so every rank cuts the model the same way.
inline std::vector<double> profiled_unit_seconds(loom::comm::AnyComm& world, const Flags& flags, const loom::data::ByteCorpus& corpus,
                                          std::int64_t rows) {
    std::vector<double> seconds(static_cast<std::size_t>(flags.model.layers + 4), 0.0);
    if (world.rank() == 0) {
        loom::gpt::Model probe = loom::gpt::make_model(flags.model);
        std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * flags.model.seq)), targets(inputs.size());
        corpus.rows(flags.seed, 0, 0, rows, flags.model.seq, inputs, targets);
        // Timed where the stages will run: a GPU's costs are not the host's.
        seconds = loom::plan::profile_units(probe, flags.seed, loom::Tensor::of(inputs.data(), {rows, flags.model.seq}),
                                            loom::Tensor::of(targets.data(), {rows, flags.model.seq}), 3, flags.device,
                                            flags.matmul);
    }
    // Sent as 8-byte words (there is no f64 dtype): a broadcast copies bits.
    // A device's communicator moves device memory, so the words go through it.
    loom::comm::staged_broadcast(
        world, loom::Tensor(seconds.data(), loom::DType::i64, loom::Shape{static_cast<std::int64_t>(seconds.size())}), 0,
        flags.device);
    return seconds;
}
