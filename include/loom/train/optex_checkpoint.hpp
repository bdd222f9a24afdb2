// The reference GPT's checkpoints from and into OptEx<AdamW> (optim/optex.hpp),
// whose ranks each hold a slice of x, of AdamW's moments and of the history:
// one file (the state gathered over the optex axis, written by world rank 0,
// gpt/checkpoint.hpp; it keeps no history) or a sharded directory (each
// rank its slice and the history, train/sharded_optex.hpp), which resumes
// under any number of workers or from the executor's shards. Every function
// is a collective: all ranks call it at the same point.
//
//   std::string note;  // why the history starts empty
//   const std::int64_t step = train::resume_optex(optex, config, path, note);
//   train::save_optex(world, optex, config, "run.st", step, corpus.describe(), metadata);
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/exec/sharded_checkpoint.hpp"
#include "loom/gpt/checkpoint.hpp"
#include "loom/gpt/model.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/optex.hpp"
#include "loom/train/sharded_optex.hpp"

namespace loom::train {

// Loads this rank's slice of x, AdamW's moments and steps from `path` (a
// sharded directory, with the history when it keeps one of the same
// signature, or one file) and returns the step it was saved at; `note` says
// why the history starts empty (empty when it was restored).
template <comm::Communicator C>
std::int64_t resume_optex(optim::OptEx<optim::AdamW, C>& optex, const gpt::Config& config, const std::string& path,
                          std::string& note) {
    if (std::filesystem::is_directory(path)) {
        const std::int64_t step = gpt::check_sharded_metadata(path, config, exec::read_sharded_index(path).metadata).step;
        (void)load_sharded_optex(optex, path, note);
        return step;
    }
    const auto d = static_cast<std::size_t>(optex.dimension());
    std::vector<float> values(d), m(d), v(d);
    const auto steps = gpt::load_checkpoint(path, config, values, m, v);
    const auto lo = static_cast<std::ptrdiff_t>(optex.slice_begin()), hi = static_cast<std::ptrdiff_t>(optex.slice_end());
    std::copy(values.begin() + lo, values.begin() + hi, optex.slice().begin());
    std::copy(m.begin() + lo, m.begin() + hi, optex.inner().m().begin());
    std::copy(v.begin() + lo, v.begin() + hi, optex.inner().v().begin());
    optex.inner().restore(steps.optimizer_steps);
    note = "a single-file checkpoint keeps no OptEx history (a sharded one does)";
    return steps.step;
}

// Gathers x and the moments over the optex axis, checks them finite (every
// rank holds the same, so all throw together and nothing is written), and
// world rank 0 writes them to `path` with the data's name and `metadata`.
template <comm::Communicator C>
void save_optex(C& world, optim::OptEx<optim::AdamW, C>& optex, const gpt::Config& config, const std::string& path,
                std::int64_t step, const std::string& data, const std::map<std::string, std::string>& metadata) {
    const auto d = static_cast<std::size_t>(optex.dimension());
    std::vector<float> values(d), m(d), v(d);
    optex.gather_params(values);
    optex.gather(optex.inner().m(), m);
    optex.gather(optex.inner().v(), v);
    gpt::check_finite_state(config, values, m, v, "step " + std::to_string(step) + " (" + path + " was not written)");
    if (world.rank() == 0)
        gpt::save_checkpoint(path, config, values, m, v, optex.inner().steps(), step, data, {}, metadata);
}

// Finishes the sharded save in flight, then starts this one into
// `directory`: each rank's slice and history, written while training goes
// on. `holder`: this rank writes its slice (one replica of each, when dp
// groups hold copies).
template <comm::Communicator C>
void save_optex_sharded(C& world, optim::OptEx<optim::AdamW, C>& optex, bool holder, const gpt::Config& config,
                        const std::string& directory, std::int64_t step, const std::string& data,
                        const std::map<std::string, std::string>& metadata,
                        std::optional<exec::ShardedSave<C>>& in_flight) {
    auto all_metadata = gpt::sharded_metadata(config, step, optex.inner().steps(), data);
    all_metadata.merge(std::map<std::string, std::string>(metadata));
    if (in_flight) in_flight->finish();
    in_flight.reset();
    in_flight.emplace(world, directory, optex_shard_contents(optex, holder),
                      with_optex_signature(std::move(all_metadata), optex));
}

}  // namespace loom::train
