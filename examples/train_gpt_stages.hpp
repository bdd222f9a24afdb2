// train_gpt's pipeline stages: how many of the GPT's units each virtual
// stage runs (given by --partition; split evenly for --schedule interleaved;
// else balanced over unit times measured by a short profiling pass on world
// rank 0 and sent to all), and a line that says who runs what. Included by train_gpt.cpp inside its anonymous
// namespace, after train_gpt_flags.hpp.
#pragma once

// Units per virtual stage: the GPT's units are embed, blocks[0..L-1], ln_f,
// head, loss; stages split the blocks, the first stage also runs embed and
// the last ln_f, head and loss. Without --partition the blocks are balanced
// over the measured unit times, embed's time counted with the first block and
// the final layers' with the last (interleaving splits them evenly instead).
inline std::vector<int> gpt_partition(const Flags& flags, const std::vector<double>& unit_seconds) {
    const auto layers = static_cast<int>(flags.model.layers);
    const int stages = flags.pp * flags.strategy.chunks;
    std::vector<int> blocks;
    if (!flags.partition.empty()) {
        blocks = loom::schedule::parse_partition(flags.partition, layers, stages);
    } else {
        std::vector<double> cost(unit_seconds.begin() + 1, unit_seconds.begin() + 1 + layers);
        cost.front() += unit_seconds.front();
        for (std::size_t u = static_cast<std::size_t>(layers) + 1; u < unit_seconds.size(); ++u) cost.back() += unit_seconds[u];
        if (flags.strategy.schedule == loom::ScheduleKind::interleaved) blocks.assign(static_cast<std::size_t>(stages), layers / stages);
        else blocks = loom::schedule::balance(cost, stages).layers_per_stage;
    }
    blocks.front() += 1;  // embed
    blocks.back() += 3;   // ln_f, head, loss
    return blocks;
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

// "embed+blocks[0..3] | blocks[4..7]+ln_f+head+loss": who runs what.
inline std::string describe_stages(const std::vector<int>& units_per_stage, std::int64_t layers) {
    std::ostringstream out;
    int first = 0;
    for (std::size_t s = 0; s < units_per_stage.size(); ++s) {
        const int last = first + units_per_stage[s] - 1;
        const int b0 = std::max(first, 1) - 1, b1 = std::min<int>(last, static_cast<int>(layers)) - 1;
        out << (s ? " | " : "") << (first == 0 ? "embed+" : "") << "blocks[" << b0 << ".." << b1 << "]"
            << (last > layers ? "+ln_f+head+loss" : "");
        first = last + 1;
    }
    return out.str();
}
