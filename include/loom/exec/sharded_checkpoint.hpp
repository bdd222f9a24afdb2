// Sharded, reshardable checkpoints: every rank writes the part of the
// model's state it owns, at once and with no gather, and any strategy on
// any number of ranks loads the result.
//
//   <dir>/index.json                               what the checkpoint is, written last
//   <dir>/shard-s<steps>-r<rank>-of-<world>.safetensors   one per rank
//
// A shard holds `values`, `m` and `v` (f32, the parameters and AdamW moments
// the rank owns: each element of the model is owned by exactly one rank,
// exec/policy_component.hpp says how) and `runs` (i64 [R, 2]: where those
// elements are in the whole model's serial order, as (first index, count)).
// So a shard does not depend on the strategy that wrote it: ZeRO's blocks,
// tensor-parallel cuts (1D or 2D), pipeline stages and sequence-parallel
// replicas all reduce to runs of whole-model indices.
//
// Nothing is lost on failure: each shard is written atomically, then the
// index (the commit point) names this save's shards, and only then are an
// older save's shards removed. A crash at any moment leaves the previous
// index and its shards, or the new ones, whole.
//
// Loading reads the index and every shard on every rank, checks that each
// element of the model is present exactly once, and hands the whole arrays
// to Executor::load_state, which keeps what the loading strategy places on
// this rank.
//
// ShardedSave writes in the background: the state is copied at once, the
// shard written on a thread while training goes on, and finish() commits. (A model too large for one host's memory would need each rank
// to read only its runs; the format allows it, this loader does not yet.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/executor.hpp"
#include "loom/exec/sharded_index.hpp"
#include "loom/io/atomic_file.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/train/finite_check.hpp"

namespace loom::exec {

namespace detail {

// True on every rank when any rank's flag is set (a sum over the world).
template <comm::Communicator C>
[[nodiscard]] int first_failed_rank(C& world, bool failed) {
    std::vector<float> flags(static_cast<std::size_t>(world.size()), 0.0f);
    flags[static_cast<std::size_t>(world.rank())] = failed ? 1.0f : 0.0f;
    const Tensor t = Tensor::of(flags.data(), {static_cast<std::int64_t>(flags.size())});
    world.all_reduce(t, t, comm::ReduceOp::sum);
    for (std::size_t r = 0; r < flags.size(); ++r)
        if (flags[r] != 0.0f) return static_cast<int>(r);
    return -1;
}

}  // namespace detail

// A save in progress. The constructor copies the state this rank owns (a
// memcpy's time) and starts writing its shard on a thread of its own, so
// training goes on while the file is written; finish() is the collective
// that waits for every rank's shard and commits the index. Every rank
// constructs it, and later calls finish(), at the same point of the run.
// Destroyed unfinished (an exception, a stop), it waits for its file and
// writes no index: the previous checkpoint stays the one the index names.
template <comm::Communicator C>
class ShardedSave {
public:
    ShardedSave(const Executor<C>& exec, C& world, std::filesystem::path directory,
                std::map<std::string, std::string> metadata = {}, RankState rank_state = {})
        : world_(&world),
          directory_(std::move(directory)),
          index_{exec.parameter_count(), exec.optimizer_steps(), {}, std::move(metadata)},
          rank_state_(std::move(rank_state)) {
        for (int r = 0; r < world.size(); ++r) index_.shards.push_back(shard_file_name(index_.optimizer_steps, r, world.size()));
        if (!rank_state_.signature.empty()) {
            LOOM_CHECK(!index_.metadata.contains(std::string(rank_state_key)), where(), ": metadata key ", rank_state_key,
                       " is the checkpoint's own");
            index_.metadata[std::string(rank_state_key)] = rank_state_.signature;
        }
        try {
            state_ = exec.owned_state();
            check_finite();
        } catch (const std::exception& e) {
            error_ = e.what();
            return;
        }
        writer_ = std::thread([this, file = directory_ / index_.shards[static_cast<std::size_t>(world.rank())],
                               rank = world.rank(), size = world.size()] {
            try {
                write_shard(file, rank, size);
            } catch (const std::exception& e) {
                error_ = e.what();
            }
        });
    }
    ShardedSave(const ShardedSave&) = delete;
    ShardedSave& operator=(const ShardedSave&) = delete;
    ~ShardedSave() {
        if (writer_.joinable()) writer_.join();
    }

    // Collective over the world. Throws on every rank if any rank's shard or
    // the index could not be written (the failing rank with its own reason).
    void finish() {
        if (writer_.joinable()) writer_.join();
        agree("could not write its shard (its message says why)");
        if (world_->rank() == 0) {
            try {
                io::write_file_atomically(directory_ / "index.json", detail::index_text(index_));
                remove_older_shards();
            } catch (const std::exception& e) {
                error_ = e.what();
            }
        }
        agree("could not write the index (its message says why)");
    }

private:
    void write_shard(const std::filesystem::path& file, int rank, int size) {
        std::error_code made;
        std::filesystem::create_directories(directory_, made);
        LOOM_CHECK(!made, where(), ": cannot create the directory: ", made.message());
        const auto n = static_cast<std::int64_t>(state_.values.size());
        std::vector<io::NamedTensor> tensors{
            {"values", Tensor::of(state_.values.data(), {n})},
            {"m", Tensor::of(state_.m.data(), {n})},
            {"v", Tensor::of(state_.v.data(), {n})},
            {"runs", Tensor::of(state_.runs.data(), {static_cast<std::int64_t>(state_.runs.size() / 2), 2})}};
        if (!rank_state_.signature.empty())
            tensors.push_back({"rank_state", Tensor::of(rank_state_.values.data(),
                                                        {static_cast<std::int64_t>(rank_state_.values.size())})});
        io::save_safetensors(file, tensors,
                             {{"format", std::string(sharded_format)}, {"rank", std::to_string(rank)},
                              {"world", std::to_string(size)}});
    }

    // A diverged run must not replace the last good checkpoint.
    void check_finite() const {
        const std::string context = where() + " was not written";
        for (const auto& [array, name] : {std::pair{&state_.values, "values"}, std::pair{&state_.m, "m"},
                                          std::pair{&state_.v, "v"}})
            train::check_finite(Tensor::of(array->data(), {static_cast<std::int64_t>(array->size())}), name, context);
    }

    // The index names this save's shards; anything else of ours in the
    // directory is an older save's, or the temporary of a killed one.
    void remove_older_shards() const {
        (void)io::remove_stale_temporaries(directory_ / "shard-s");
        std::error_code ignored;
        for (const auto& entry : std::filesystem::directory_iterator(directory_, ignored)) {
            const std::string name = entry.path().filename().string();
            const bool ours = name.starts_with("shard-s") && name.ends_with(".safetensors");
            if (ours && std::find(index_.shards.begin(), index_.shards.end(), name) == index_.shards.end())
                std::filesystem::remove(entry.path(), ignored);
        }
    }

    void agree(const char* what) {
        const int failed = detail::first_failed_rank(*world_, !error_.empty());
        if (failed < 0) return;
        if (!error_.empty()) throw Error(error_);
        LOOM_FAIL(where(), ": rank ", failed, " ", what, "; the previous checkpoint is kept");
    }

    [[nodiscard]] std::string where() const { return "sharded checkpoint " + directory_.string(); }

    C* world_;
    std::filesystem::path directory_;
    ShardedIndex index_;
    typename Executor<C>::OwnedState state_;
    RankState rank_state_;
    std::string error_;
    std::thread writer_;
};

// Collective over `world`, every rank of the job (each calls it with its
// executor): writes this rank's shard, then rank 0 the index. `metadata`
// (the step, the data the run reads, ...) goes into the index as strings.
// A failure on any rank throws on every rank, and the previous checkpoint
// in `directory` stays as it was. ShardedSave does the same in the background.
template <comm::Communicator C>
void save_sharded(const Executor<C>& exec, C& world, const std::filesystem::path& directory,
                  const std::map<std::string, std::string>& metadata = {}, RankState rank_state = {}) {
    ShardedSave<C>(exec, world, directory, metadata, std::move(rank_state)).finish();
}

// Rank `rank`'s RankState from the checkpoint into `out`, when it was saved
// with the same `signature`; false (and `why` says why not) otherwise.
[[nodiscard]] inline bool read_sharded_rank_state(const std::filesystem::path& directory, const ShardedIndex& index,
                                                  int rank, const std::string& signature, std::span<float> out,
                                                  std::string& why) {
    const auto saved = index.metadata.find(std::string(rank_state_key));
    if (saved == index.metadata.end()) {
        why = "the checkpoint keeps no per-rank state (saved without it)";
        return false;
    }
    if (saved->second != signature) {
        why = "the checkpoint's per-rank state belongs to " + saved->second + ", not " + signature;
        return false;
    }
    const std::string where = "sharded checkpoint " + directory.string();
    LOOM_CHECK(rank >= 0 && rank < static_cast<int>(index.shards.size()), where, " has ", index.shards.size(),
               " shards but its per-rank state is asked for rank ", rank);
    const std::string& name = index.shards[static_cast<std::size_t>(rank)];
    const io::SafetensorsFile shard(directory / name);
    LOOM_CHECK(shard.contains("rank_state"), where, ": ", name, " has no rank_state, though the index says it keeps one");
    shard.read_into("rank_state", Tensor::of(out.data(), {static_cast<std::int64_t>(out.size())}));
    return true;
}

// Collective as Executor::load_state is: every rank of the loading job calls
// it with its executor. Returns the index (its metadata and step count).
template <comm::Communicator C>
ShardedIndex load_sharded(Executor<C>& exec, const std::filesystem::path& directory) {
    const std::string where = "sharded checkpoint " + directory.string();
    ShardedIndex index = read_sharded_index(directory);
    const std::int64_t n = exec.parameter_count();
    LOOM_CHECK(index.parameters == n, where, " holds ", index.parameters, " parameters but this model has ", n,
               "; load it into the model it was saved from");
    const auto size = static_cast<std::size_t>(n);
    std::vector<float> values(size), m(size), v(size);
    std::vector<std::uint8_t> seen(size, 0);
    for (const std::string& name : index.shards) {
        const io::SafetensorsFile shard(directory / name);
        const Tensor runs = shard.tensor("runs");
        LOOM_CHECK(runs.dtype() == DType::i64 && runs.rank() == 2 && runs.dim(1) == 2, where, ": ", name,
                   "'s runs are ", runs.dtype(), " ", runs.shape(), "; expected i64 [R, 2]");
        const Tensor held = shard.tensor("values");
        const std::int64_t count = held.rank() == 1 ? held.dim(0) : -1;
        std::vector<float> part_values(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
        std::vector<float> part_m(part_values.size()), part_v(part_values.size());
        shard.read_into("values", Tensor::of(part_values.data(), {count}));
        shard.read_into("m", Tensor::of(part_m.data(), {count}));
        shard.read_into("v", Tensor::of(part_v.data(), {count}));
        std::vector<std::int64_t> pairs(static_cast<std::size_t>(runs.numel()));
        shard.read_into("runs", Tensor::of(pairs.data(), runs.shape()));
        std::int64_t at = 0;
        for (std::size_t i = 0; i < pairs.size(); i += 2) {
            const std::int64_t first = pairs[i], length = pairs[i + 1];
            LOOM_CHECK(first >= 0 && length >= 0 && first <= n - length && at <= count - length, where, ": ", name,
                       " has a run of ", length, " elements from ", first, "; the model has ", n,
                       " and the shard holds ", count);
            for (std::int64_t k = 0; k < length; ++k, ++at) {
                const auto to = static_cast<std::size_t>(first + k), from = static_cast<std::size_t>(at);
                LOOM_CHECK(seen[to] == 0, where, ": element ", first + k, " is in two shards (", name,
                           " and an earlier one)");
                seen[to] = 1;
                values[to] = part_values[from];
                m[to] = part_m[from];
                v[to] = part_v[from];
            }
        }
        LOOM_CHECK(at == count, where, ": ", name, " holds ", count, " elements but its runs place ", at);
    }
    for (std::size_t k = 0; k < size; ++k)
        LOOM_CHECK(seen[k] == 1, where, ": element ", k, " of the model is in no shard; the checkpoint is incomplete");
    for (const auto& [array, name] : {std::pair{&values, "values"}, std::pair{&m, "m"}, std::pair{&v, "v"}})
        train::check_finite(Tensor::of(array->data(), {n}), name, where);
    exec.load_state(values, m, v, index.optimizer_steps);
    return index;
}

}  // namespace loom::exec
