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
// Loading reads only what the loading rank keeps (exec/sharded_reader.hpp):
// the executor names the whole-model runs of its parameters and moments
// (Executor::held_runs: its pipeline stage's, its tp cut's, at ZeRO 3 or
// for the moments at ZeRO 1-3 only its blocks), the reader intersects them
// with each shard's runs and preads those bytes only, checking that each
// element it needs is in exactly one shard and finite, and
// Executor::load_held_state puts them in place. No rank allocates or reads
// the whole model (unless it keeps all of it, as a serial run does).
//
// ShardedSave writes in the background: the state is copied at once, the
// shard written on a thread while training goes on, and finish() commits.
// Anything else can write shards too (ShardContents: any runs, any extra
// tensors) and read them back by the element (ShardedReader).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/staged.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/executor.hpp"
#include "loom/exec/sharded_index.hpp"
#include "loom/exec/sharded_reader.hpp"
#include "loom/io/atomic_file.hpp"
#include "loom/io/safetensors.hpp"
#include "loom/train/finite_check.hpp"

namespace loom::exec {

namespace detail {

// The first rank whose flag is set, the same on every rank (a sum over the
// world, staged through `where` when the communicator moves device memory);
// -1 when none is.
template <comm::Communicator C>
[[nodiscard]] int first_failed_rank(C& world, bool failed, Device where) {
    std::vector<float> flags(static_cast<std::size_t>(world.size()), 0.0f);
    flags[static_cast<std::size_t>(world.rank())] = failed ? 1.0f : 0.0f;
    const Tensor t = Tensor::of(flags.data(), {static_cast<std::int64_t>(flags.size())});
    comm::staged_all_reduce(world, t, comm::ReduceOp::sum, where);
    for (std::size_t r = 0; r < flags.size(); ++r)
        if (flags[r] != 0.0f) return static_cast<int>(r);
    return -1;
}

}  // namespace detail

// What one rank's shard holds: the elements it owns of the model's
// `parameters`, with AdamW's moments (values, m, v: one element each per
// position of `runs`, (first whole index, count) pairs), and any further
// 1-D tensors, written as they are, and further runs ((first, count) pairs,
// written i64 [R, 2] like `runs`) that place an extra tensor's elements in
// an order of its own (ShardedReader::read's `runs_name`). A rank may own
// nothing (empty arrays, no runs): its shard is still written.
struct ShardContents {
    std::int64_t parameters = 0;  // the whole model's elements
    std::int64_t optimizer_steps = 0;
    std::vector<float> values, m, v;
    std::vector<std::int64_t> runs;
    std::map<std::string, std::vector<float>> extra_floats;
    std::map<std::string, std::vector<std::int64_t>> extra_integers;
    std::map<std::string, std::vector<std::int64_t>> extra_runs;
};

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
    // Any contents (ShardContents says what); the same on every rank but
    // for the rank's own arrays.
    // `where`: the memory `world` moves (its ranks agree on failures through it).
    ShardedSave(C& world, std::filesystem::path directory, ShardContents contents,
                std::map<std::string, std::string> metadata = {}, RankState rank_state = {}, Device where = host_device)
        : ShardedSave(world, std::move(directory), contents.parameters, contents.optimizer_steps, std::move(metadata),
                      std::move(rank_state)) {
        where_ = where;
        contents_ = std::move(contents);
        start();
    }
    // An executor's state: what it owns (Executor::owned_state), read into
    // host memory from the executor's device.
    ShardedSave(const Executor<C>& exec, C& world, std::filesystem::path directory,
                std::map<std::string, std::string> metadata = {}, RankState rank_state = {})
        : ShardedSave(world, std::move(directory), exec.parameter_count(), exec.optimizer_steps(), std::move(metadata),
                      std::move(rank_state)) {
        where_ = exec.device();
        try {
            auto owned = exec.owned_state();
            contents_.values = std::move(owned.values);
            contents_.m = std::move(owned.m);
            contents_.v = std::move(owned.v);
            contents_.runs = std::move(owned.runs);
        } catch (const std::exception& e) {
            error_ = e.what();
        }
        contents_.parameters = index_.parameters;
        contents_.optimizer_steps = index_.optimizer_steps;
        start();
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
    ShardedSave(C& world, std::filesystem::path directory, std::int64_t parameters, std::int64_t optimizer_steps,
                std::map<std::string, std::string> metadata, RankState rank_state)
        : world_(&world),
          directory_(std::move(directory)),
          index_{parameters, optimizer_steps, {}, std::move(metadata)},
          rank_state_(std::move(rank_state)) {
        for (int r = 0; r < world.size(); ++r) index_.shards.push_back(shard_file_name(index_.optimizer_steps, r, world.size()));
        if (!rank_state_.signature.empty()) {
            LOOM_CHECK(!index_.metadata.contains(std::string(rank_state_key)), where(), ": metadata key ", rank_state_key,
                       " is the checkpoint's own");
            index_.metadata[std::string(rank_state_key)] = rank_state_.signature;
        }
    }

    // Checks the contents and starts the writer, unless this rank already
    // failed (then finish() says so on every rank).
    void start() {
        if (error_.empty()) {
            try {
                check_contents();
                check_finite();
            } catch (const std::exception& e) {
                error_ = e.what();
            }
        }
        if (!error_.empty()) return;
        writer_ = std::thread([this, file = directory_ / index_.shards[static_cast<std::size_t>(world_->rank())],
                               rank = world_->rank(), size = world_->size()] {
            try {
                write_shard(file, rank, size);
            } catch (const std::exception& e) {
                error_ = e.what();
            }
        });
    }

    void check_contents() const {
        const ShardContents& c = contents_;
        LOOM_CHECK(c.m.size() == c.values.size() && c.v.size() == c.values.size(), where(), ": ShardContents has ",
                   c.values.size(), " values, ", c.m.size(), " m and ", c.v.size(), " v; one of each per element");
        LOOM_CHECK(c.runs.size() % 2 == 0, where(), ": ShardContents has ", c.runs.size(),
                   " run numbers; runs are (first, count) pairs");
        std::int64_t placed = 0;
        for (std::size_t i = 0; i < c.runs.size(); i += 2) {
            const std::int64_t first = c.runs[i], count = c.runs[i + 1];
            LOOM_CHECK(first >= 0 && count >= 0 && first <= c.parameters - count, where(), ": ShardContents has a run of ",
                       count, " elements from ", first, "; the model has ", c.parameters);
            placed += count;
        }
        LOOM_CHECK(placed == static_cast<std::int64_t>(c.values.size()), where(), ": ShardContents holds ",
                   c.values.size(), " elements but its runs place ", placed);
        const auto check_name = [&](const std::string& name) {
            for (const char* own : {"values", "m", "v", "runs", "rank_state"})
                LOOM_CHECK(name != own, where(), ": an extra tensor is named ", name,
                           "; values, m, v, runs and rank_state are the checkpoint's own");
        };
        for (const auto& [name, array] : c.extra_floats) check_name(name);
        for (const auto& [name, array] : c.extra_integers) {
            check_name(name);
            LOOM_CHECK(!c.extra_floats.contains(name), where(), ": ", name,
                       " is both an extra float and an extra integer tensor; names must be unique");
        }
        for (const auto& [name, pairs] : c.extra_runs) {
            check_name(name);
            LOOM_CHECK(!c.extra_floats.contains(name) && !c.extra_integers.contains(name), where(), ": ", name,
                       " is both extra runs and another extra tensor; names must be unique");
            LOOM_CHECK(pairs.size() % 2 == 0, where(), ": extra runs ", name, " have ", pairs.size(),
                       " numbers; runs are (first, count) pairs");
        }
    }

    void write_shard(const std::filesystem::path& file, int rank, int size) {
        std::error_code made;
        std::filesystem::create_directories(directory_, made);
        LOOM_CHECK(!made, where(), ": cannot create the directory: ", made.message());
        const auto n = static_cast<std::int64_t>(contents_.values.size());
        std::vector<io::NamedTensor> tensors{
            {"values", Tensor::of(contents_.values.data(), {n})},
            {"m", Tensor::of(contents_.m.data(), {n})},
            {"v", Tensor::of(contents_.v.data(), {n})},
            {"runs", Tensor::of(contents_.runs.data(), {static_cast<std::int64_t>(contents_.runs.size() / 2), 2})}};
        for (auto& [name, array] : contents_.extra_floats)
            tensors.push_back({name, Tensor::of(array.data(), {static_cast<std::int64_t>(array.size())})});
        for (auto& [name, array] : contents_.extra_integers)
            tensors.push_back({name, Tensor::of(array.data(), {static_cast<std::int64_t>(array.size())})});
        for (auto& [name, pairs] : contents_.extra_runs)
            tensors.push_back({name, Tensor::of(pairs.data(), {static_cast<std::int64_t>(pairs.size() / 2), 2})});
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
        for (const auto& [array, name] : {std::pair{&contents_.values, "values"}, std::pair{&contents_.m, "m"},
                                          std::pair{&contents_.v, "v"}})
            train::check_finite(Tensor::of(array->data(), {static_cast<std::int64_t>(array->size())}), name, context);
        for (const auto& [name, array] : contents_.extra_floats)
            train::check_finite(Tensor::of(array.data(), {static_cast<std::int64_t>(array.size())}), name, context);
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
        const int failed = detail::first_failed_rank(*world_, !error_.empty(), where_);
        if (failed < 0) return;
        if (!error_.empty()) throw Error(error_);
        LOOM_FAIL(where(), ": rank ", failed, " ", what, "; the previous checkpoint is kept");
    }

    [[nodiscard]] std::string where() const { return "sharded checkpoint " + directory_.string(); }

    C* world_;
    Device where_ = host_device;
    std::filesystem::path directory_;
    ShardedIndex index_;
    ShardContents contents_;
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
    why = signature_mismatch(index, rank_state_key, signature, "per-rank state", "saved without it");
    if (!why.empty()) return false;
    const std::string where = "sharded checkpoint " + directory.string();
    LOOM_CHECK(rank >= 0 && rank < static_cast<int>(index.shards.size()), where, " has ", index.shards.size(),
               " shards but its per-rank state is asked for rank ", rank);
    const std::string& name = index.shards[static_cast<std::size_t>(rank)];
    const io::SafetensorsFile shard(directory / name, io::SafetensorsRead::on_demand);
    LOOM_CHECK(shard.contains("rank_state"), where, ": ", name, " has no rank_state, though the index says it keeps one");
    shard.read_into("rank_state", Tensor::of(out.data(), {static_cast<std::int64_t>(out.size())}));
    return true;
}

namespace detail {

// `wanted`'s elements of `name` in `wanted`'s order, whatever it is (a tp
// cut's runs need not ascend): read in ascending order, then put in place.
inline std::vector<float> read_in_order(ShardedReader& reader, std::string_view name,
                                        const std::vector<std::int64_t>& wanted) {
    const std::size_t runs = wanted.size() / 2;
    std::vector<std::size_t> order(runs);
    std::vector<std::int64_t> at(runs + 1, 0);
    for (std::size_t i = 0; i < runs; ++i) {
        order[i] = i;
        at[i + 1] = at[i] + wanted[2 * i + 1];
    }
    std::vector<float> out(static_cast<std::size_t>(at[runs]));
    const auto first = [&](std::size_t i) { return wanted[2 * i]; };
    if (std::is_sorted(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return first(a) < first(b); })) {
        reader.read(name, "runs", wanted, out);
        return out;
    }
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return first(a) < first(b); });
    std::vector<std::int64_t> sorted;
    sorted.reserve(wanted.size());
    for (std::size_t i : order) sorted.insert(sorted.end(), {wanted[2 * i], wanted[2 * i + 1]});
    std::vector<float> read(out.size());
    reader.read(name, "runs", sorted, read);
    std::size_t from = 0;
    for (std::size_t i : order) {
        const auto n = static_cast<std::size_t>(wanted[2 * i + 1]);
        std::copy_n(read.begin() + static_cast<std::ptrdiff_t>(from), n,
                    out.begin() + static_cast<std::ptrdiff_t>(at[i]));
        from += n;
    }
    return out;
}

}  // namespace detail

// Collective as Executor::load_state is: every rank of the loading job calls
// it with its executor. Each rank reads only the elements it keeps
// (Executor::held_runs). Returns the index (its metadata and step count);
// `bytes_read`, when given, is set to what this rank read of the shards.
template <comm::Communicator C>
ShardedIndex load_sharded(Executor<C>& exec, const std::filesystem::path& directory,
                          std::uint64_t* bytes_read = nullptr) {
    const std::string where = "sharded checkpoint " + directory.string();
    ShardedIndex index = read_sharded_index(directory);
    const std::int64_t n = exec.parameter_count();
    LOOM_CHECK(index.parameters == n, where, " holds ", index.parameters, " parameters but this model has ", n,
               "; load it into the model it was saved from");
    const auto held = exec.held_runs();
    ShardedReader reader(directory, index);
    const std::vector<float> values = detail::read_in_order(reader, "values", held.values);
    const std::vector<float> m = detail::read_in_order(reader, "m", held.moments);
    const std::vector<float> v = detail::read_in_order(reader, "v", held.moments);
    exec.load_held_state(values, m, v, index.optimizer_steps);
    if (bytes_read != nullptr) *bytes_read = reader.bytes_read();
    return index;
}

}  // namespace loom::exec
