// OptEx in a sharded checkpoint (exec/sharded_checkpoint.hpp): each rank of
// one replica of the optex axis writes its slice of the iterate, of AdamW's
// moments and of every history point and gradient, with no gather; any number
// of workers (or the executor, under any strategy) loads the result.
//
// A shard of an OptEx run holds, beside the usual `values`, `m`, `v` and
// `runs` (the slice [lo, hi) of the whole point, one run):
//   optex_point.<t>      history point t's slice, in the kernel's coordinates
//                        (all of them, or the sampled effective dimension:
//                        optim::kernel_coordinates), placed by
//   optex_point_runs     the slice's run of those coordinates;
//   optex_gradient.<t>   history gradient t's slice, placed by `runs`;
//   optex_state          i64 [iterations, T, first, skipped];
//   optex_whole          what every rank holds whole, as the bits of doubles
//                        (the file holds f32 and i64; a resume must be exact):
//                        the length scale, T root norms, T x T distances.
// The index's metadata names the history's signature (dimension, effective
// dimension and its seed, normalisation, noise): a history is taken back only
// by a run whose kernel sees the same coordinates the same way.
//
// The executor's loader reads `values`, `m` and `v` and ignores the rest, so a
// run saved with OptEx resumes under any strategy; an executor's checkpoint
// resumes under OptEx with an empty history.
#pragma once

#include <bit>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/exec/sharded_checkpoint.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/optex.hpp"

namespace loom::train {

inline constexpr std::string_view optex_history_key = "optex_history_signature";

// What must match for a saved history to mean the same to a loading run.
[[nodiscard]] inline std::string optex_history_signature(const optim::OptExConfig& c, std::int64_t dimension) {
    const bool subset = c.effective_dim > 0 && c.effective_dim < dimension;
    std::ostringstream out;
    out << std::setprecision(17) << "d=" << dimension << " effective_dim=" << (subset ? c.effective_dim : 0)
        << " seed=" << (subset ? c.seed : 0) << " normalise=" << c.estimator.normalise_inputs
        << " noise=" << c.estimator.noise;
    return out.str();
}

// `metadata` with the history's signature added: what an OptEx save puts in its index.
template <comm::Communicator C>
[[nodiscard]] std::map<std::string, std::string> with_optex_signature(std::map<std::string, std::string> metadata,
                                                                      const optim::OptEx<optim::AdamW, C>& optex) {
    metadata[std::string(optex_history_key)] = optex_history_signature(optex.config(), optex.dimension());
    return metadata;
}

namespace detail {

[[nodiscard]] inline std::string optex_point_name(std::size_t t) { return "optex_point." + std::to_string(t); }
[[nodiscard]] inline std::string optex_gradient_name(std::size_t t) { return "optex_gradient." + std::to_string(t); }

}  // namespace detail

// This rank's shard of an OptEx run. `holder`: whether this rank writes
// (one replica of the optex axis: with data parallelism inside each worker,
// the others hold copies and write empty shards).
template <comm::Communicator C>
[[nodiscard]] exec::ShardContents optex_shard_contents(optim::OptEx<optim::AdamW, C>& optex, bool holder) {
    exec::ShardContents out;
    out.parameters = optex.dimension();
    out.optimizer_steps = optex.inner().steps();
    if (!holder) return out;
    const auto m = optex.inner().m(), v = optex.inner().v();
    out.values.assign(optex.slice().begin(), optex.slice().end());
    out.m.assign(m.begin(), m.end());
    out.v.assign(v.begin(), v.end());
    out.runs = {optex.slice_begin(), optex.slice_end() - optex.slice_begin()};
    optim::GpHistory h = optex.estimator().history();
    const std::size_t t = h.points.size();
    out.extra_runs["optex_point_runs"] = {optex.feature_begin(), optex.feature_end() - optex.feature_begin()};
    out.extra_integers["optex_state"] = {optex.iterations(), static_cast<std::int64_t>(t), h.first, h.skipped};
    std::vector<std::int64_t> whole{std::bit_cast<std::int64_t>(h.length_scale)};
    for (const double r : h.root_norms) whole.push_back(std::bit_cast<std::int64_t>(r));
    for (const auto& row : h.distances)
        for (const double d : row) whole.push_back(std::bit_cast<std::int64_t>(d));
    out.extra_integers["optex_whole"] = std::move(whole);
    for (std::size_t i = 0; i < t; ++i) {
        out.extra_floats[detail::optex_point_name(i)] = std::move(h.points[i]);
        out.extra_floats[detail::optex_gradient_name(i)] = std::move(h.gradients[i]);
    }
    return out;
}

// Collective over the world, as exec::ShardedSave is; see optex_shard_contents.
template <comm::Communicator C>
void save_sharded_optex(optim::OptEx<optim::AdamW, C>& optex, bool holder, C& world,
                        const std::filesystem::path& directory, std::map<std::string, std::string> metadata = {}) {
    exec::ShardedSave<C>(world, directory, optex_shard_contents(optex, holder), with_optex_signature(std::move(metadata), optex))
        .finish();
}

// Loads a sharded checkpoint (OptEx's, or the executor's under any strategy)
// into this rank's slice: x, AdamW's moments and steps, and the history when
// the checkpoint keeps one with the same signature. Returns the index and,
// in `history_note`, why the history starts empty (empty when restored).
// Every rank reads only its slice; no communication.
template <comm::Communicator C>
exec::ShardedIndex load_sharded_optex(optim::OptEx<optim::AdamW, C>& optex, const std::filesystem::path& directory,
                                std::string& history_note) {
    const std::string where = "sharded checkpoint " + directory.string();
    exec::ShardedIndex index = exec::read_sharded_index(directory);
    LOOM_CHECK(index.parameters == optex.dimension(), where, " holds ", index.parameters,
               " parameters but this model has ", optex.dimension(), "; load it into the model it was saved from");
    exec::ShardedReader reader(directory, index);
    const std::int64_t lo = optex.slice_begin(), n = optex.slice_end() - lo;
    const std::vector<std::int64_t> slice{lo, n};
    reader.read("values", "runs", slice, optex.slice());
    reader.read("m", "runs", slice, optex.inner().m());
    reader.read("v", "runs", slice, optex.inner().v());
    optex.inner().restore(index.optimizer_steps);

    history_note = signature_mismatch(index, optex_history_key,
                                      optex_history_signature(optex.config(), optex.dimension()), "OptEx history");
    if (!history_note.empty()) return index;
    int from = -1;
    for (int s = 0; s < static_cast<int>(index.shards.size()) && from < 0; ++s)
        if (reader.has(s, "optex_state")) from = s;
    LOOM_CHECK(from >= 0, where, ": the index names an OptEx history but no shard holds optex_state");
    const auto state = reader.read_whole<std::int64_t>(from, "optex_state");
    LOOM_CHECK(state.size() == 4 && state[0] >= 0 && state[1] >= 0 && state[1] <= 1000000, where, ": ",
               index.shards[static_cast<std::size_t>(from)], "'s optex_state holds ", state.size(),
               " values; expected [iterations >= 0, T in [0, 1e6], first, skipped]");
    const auto t = static_cast<std::size_t>(state[1]);
    const auto whole = reader.read_whole<std::int64_t>(from, "optex_whole");
    LOOM_CHECK(whole.size() == 1 + t + t * t, where, ": ", index.shards[static_cast<std::size_t>(from)], "'s optex_whole holds ",
               whole.size(), " values; a history of ", t, " points needs ", 1 + t + t * t);
    optim::GpHistory h;
    h.first = state[2];
    h.skipped = state[3];
    h.length_scale = std::bit_cast<double>(whole[0]);
    for (std::size_t i = 0; i < t; ++i) h.root_norms.push_back(std::bit_cast<double>(whole[1 + i]));
    h.distances.assign(t, std::vector<double>(t));
    for (std::size_t i = 0; i < t; ++i)
        for (std::size_t j = 0; j < t; ++j) h.distances[i][j] = std::bit_cast<double>(whole[1 + t + i * t + j]);
    const std::int64_t features = optex.feature_end() - optex.feature_begin();
    const std::vector<std::int64_t> feature_run =
        features > 0 ? std::vector<std::int64_t>{optex.feature_begin(), features} : std::vector<std::int64_t>{};
    for (std::size_t i = 0; i < t; ++i) {
        h.points.emplace_back(static_cast<std::size_t>(features));
        h.gradients.emplace_back(static_cast<std::size_t>(n));
        reader.read(detail::optex_point_name(i), "optex_point_runs", feature_run, h.points.back());
        reader.read(detail::optex_gradient_name(i), "runs", slice, h.gradients.back());
    }
    optex.restore_history(state[0], std::move(h));
    return index;
}

}  // namespace loom::train
