// The reference GPT's checkpoints from and into an Executor, whatever its
// strategy: one file (the whole state gathered, written by rank 0,
// gpt/checkpoint.hpp) or a sharded directory (each rank its own part, in the
// background, exec/sharded_checkpoint.hpp), each with every rank's
// compressor state under its signature (compression_state.hpp) so that a
// resume with the same compressor and degrees is exact and any other says
// why it starts the error feedback from zero. Every function is a
// collective: all ranks call it at the same point.
//
//   std::string note;
//   const std::int64_t step = train::resume_executor(world, exec, config, path, signature, note);
//   ...
//   train::save_executor(world, exec, config, "run.st", step, corpus.describe(), metadata, signature);
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/buffer.hpp"
#include "loom/exec/sharded_checkpoint.hpp"
#include "loom/gpt/checkpoint.hpp"
#include "loom/gpt/model.hpp"
#include "loom/train/compression_state.hpp"

namespace loom::train {

// Loads `exec`'s state from `path`, a sharded directory (from any strategy:
// each rank reads what it keeps) or one file (every rank reads it whole and
// keeps what it owns), and returns the step it was saved at. With a
// compressor (`compression_signature` not empty) each rank's state comes
// back when the checkpoint holds it under that signature; else `note` says
// why it starts from zero.
template <comm::Communicator C>
std::int64_t resume_executor(C& world, exec::Executor<C>& exec, const gpt::Config& config, const std::string& path,
                             const std::string& compression_signature, std::string& note) {
    std::vector<float> state(compression_signature.empty() ? 0 : static_cast<std::size_t>(exec.gradient_exchange().state_size()));
    std::int64_t step = 0;
    bool has_state = false;
    if (std::filesystem::is_directory(path)) {
        step = gpt::check_sharded_metadata(path, config, exec::read_sharded_index(path).metadata).step;
        const auto index = exec::load_sharded(exec, path);
        if (!compression_signature.empty())
            has_state = exec::read_sharded_rank_state(path, index, world.rank(), compression_signature, state, note);
    } else {
        const auto parameters = static_cast<std::size_t>(exec.parameter_count());
        std::vector<float> values(parameters), m(parameters), v(parameters);
        const auto steps = gpt::load_checkpoint(path, config, values, m, v);
        exec.load_state(values, m, v, steps.optimizer_steps);
        step = steps.step;
        if (!compression_signature.empty())
            has_state = read_compression_state(path, compression_signature, world.rank(), state, note);
    }
    if (has_state) exec.gradient_exchange().load_state(state);
    return step;
}

// Gathers the whole model's state to every rank and returns its values; if
// `path` is given, checks the state is finite (every rank holds the same, so
// all throw together and nothing is written) and rank 0 writes it with the
// data's name, `metadata` and each rank's compressor state.
template <comm::Communicator C, class Exec>
std::vector<float> save_executor(C& world, Exec& exec, const gpt::Config& config, const std::string& path,
                                 std::int64_t step, const std::string& data, std::map<std::string, std::string> metadata,
                                 const std::string& compression_signature) {
    const auto parameters = static_cast<std::size_t>(exec.parameter_count());
    std::vector<float> values(parameters), m(parameters), v(parameters);
    exec.gather_state(values, m, v);
    if (path.empty()) return values;
    gpt::check_finite_state(config, values, m, v, "step " + std::to_string(step) + " (" + path + " was not written)");
    std::vector<Buffer<Host>> storage;
    std::vector<io::NamedTensor> extra;
    if (!compression_signature.empty()) {
        std::vector<float> state(static_cast<std::size_t>(exec.gradient_exchange().state_size()));
        exec.gradient_exchange().save_state(state);
        extra = gather_compression_states(world, state, storage);
        metadata[compression_metadata_key] = compression_signature;
    }
    if (world.rank() == 0)
        gpt::save_checkpoint(path, config, values, m, v, exec.optimizer_steps(), step, data, extra, metadata);
    return values;
}

// Finishes the sharded save in flight (`in_flight`; a non-finite state
// throws there on every rank, and the last good checkpoint stays), then
// starts this one into `directory`, which writes while training goes on.
// Each rank's compressor state rides in its own shard.
template <comm::Communicator C>
void save_executor_sharded(C& world, const exec::Executor<C>& exec, const gpt::Config& config,
                           const std::string& directory, std::int64_t step, const std::string& data,
                           const std::map<std::string, std::string>& metadata, const std::string& compression_signature,
                           std::optional<exec::ShardedSave<C>>& in_flight) {
    if (in_flight) {
        in_flight->finish();
        in_flight.reset();
    }
    auto all_metadata = gpt::sharded_metadata(config, step, exec.optimizer_steps(), data);
    all_metadata.merge(std::map<std::string, std::string>(metadata));
    exec::RankState compressor;
    if (!compression_signature.empty()) {
        compressor = {compression_signature, std::vector<float>(static_cast<std::size_t>(exec.gradient_exchange().state_size()))};
        exec.gradient_exchange().save_state(compressor.values);
    }
    in_flight.emplace(exec, world, directory, std::move(all_metadata), std::move(compressor));
}

}  // namespace loom::train
