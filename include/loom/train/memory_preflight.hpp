// A memory preflight: before a run allocates anything, the bytes its ranks
// will hold (the memory model below) against the memory this process can
// have (the cgroup's limit less its usage, and the kernel's MemAvailable,
// whichever is smaller). A size the flags accept but memory cannot hold is
// otherwise found by the kernel's OOM killer, which prints nothing.
//
// The need is a lower bound on purpose, so a run that fits is never refused:
// the model states per rank as the ZeRO paper counts them (parallel/zero_shard.hpp:
// 16 bytes per parameter in plain data parallelism, less when sharded) and
// one micro-batch's saved activations (plan/gpt_description.hpp's per-sample
// bytes), each divided by the degrees that split them, times the ranks of
// this process. Buffers, the corpus and pipeline micro-batches in flight come
// on top. With Recompute<Full> a block keeps only what recomputing it keeps
// (LayerSpec::kept_when_recomputed), and one block's activations come back
// for its backward: per rank at least the layers' recomputed bytes over the
// pipeline stages, plus the smallest block's saved bytes (every stage reruns
// one). Recompute<Budget> counts as Full: the budget may allow more, but no
// budget goes below Full (and its first step runs as Full), so the bound
// stays a lower bound and a run that recomputes is not refused for the
// activations it no longer keeps. Recompute<Selective> counts as Full too:
// it keeps more (its matrix products, LayerSpec::kept_when_selective, which
// the planner counts), so Full's bytes stay below what it needs.
//
//   const auto need = train::gpt_training_memory(config, layout);
//   train::check_memory_fits(need, train::available_memory(), advice);
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "loom/core/error.hpp"
#include "loom/exec/memory.hpp"
#include "loom/parallel/zero_shard.hpp"
#include "loom/gpt/model.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/recompute.hpp"
#include "loom/plan/gpt_description.hpp"

namespace loom::train {

// How one run spreads over ranks: the degrees, the ZeRO stage, the global
// batch in sequences and its micro-batches, how many of the ranks live in
// this process (rank threads share one process's memory; under mpirun each
// process is one rank), and its recomputation.
struct TrainingLayout {
    std::int64_t batch = 1;
    int dp = 1, pp = 1, tp = 1, sp = 1;
    int zero = 0;
    int micro_batches = 1;
    int ranks_in_process = 1;
    RecomputeSpec recompute{};
};

// The bytes one rank needs at least, and the ranks of this process that need them.
struct MemoryNeed {
    double model_states = 0;  // per rank: parameters, gradients, AdamW moments
    double activations = 0;   // per rank: what one micro-batch's forward keeps for its backward
    int ranks = 1;

    [[nodiscard]] double per_rank() const noexcept { return model_states + activations; }
    [[nodiscard]] double total() const noexcept { return per_rank() * ranks; }
};

[[nodiscard]] inline MemoryNeed gpt_training_memory(const gpt::Config& config, const TrainingLayout& layout) {
    LOOM_CHECK(layout.dp >= 1 && layout.pp >= 1 && layout.tp >= 1 && layout.sp >= 1 && layout.micro_batches >= 1 &&
                   layout.ranks_in_process >= 1 && layout.batch >= 1,
               "gpt_training_memory: degrees, micro-batches, ranks and batch must be at least 1");
    const plan::ModelDescription model = plan::describe_gpt(config, layout.batch);
    const double model_split = static_cast<double>(layout.pp) * layout.tp;
    MemoryNeed need;
    need.model_states = zero_model_state_bytes(layout.zero, 1, layout.dp * layout.sp) *
                        static_cast<double>(model.parameters()) / model_split;
    double saved_per_sample = 0, rerun = 0;
    for (const plan::LayerSpec& layer : model.layers) {
        const bool again = layout.recompute.on() && layer.recomputable;
        saved_per_sample += again ? layer.kept_when_recomputed() : layer.saved_bytes;
        if (again) rerun = rerun == 0 ? layer.saved_bytes : std::min(rerun, layer.saved_bytes);
    }
    const double samples = static_cast<double>(layout.batch) / (static_cast<double>(layout.dp) * layout.micro_batches);
    need.activations = (saved_per_sample / layout.pp + rerun) * samples / (static_cast<double>(layout.tp) * layout.sp);
    need.ranks = layout.ranks_in_process;
    return need;
}

// What this process may allocate, and where that figure came from.
struct AvailableMemory {
    double bytes = 0;
    std::string source;  // "the cgroup limit (memory.max) less its usage", "MemAvailable in /proc/meminfo"
};

namespace detail {

// A whole number of bytes in the first word of `file`; none for "max", a
// missing file or anything else.
[[nodiscard]] inline std::optional<double> read_bytes(const std::filesystem::path& file) {
    std::ifstream in(file);
    std::string word;
    if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    return std::stod(word);
}

// v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages).
constexpr double no_cgroup_limit = 1e18;

}  // namespace detail

// The smaller of the cgroup's room (v2: memory.max less memory.current under
// `cgroup`; v1: memory/memory.limit_in_bytes less memory/memory.usage_in_bytes)
// and MemAvailable in `meminfo`; none when neither says. The paths are
// parameters so a test can hand in its own files.
[[nodiscard]] inline std::optional<AvailableMemory> available_memory(
    const std::filesystem::path& cgroup = "/sys/fs/cgroup", const std::filesystem::path& meminfo = "/proc/meminfo") {
    std::optional<AvailableMemory> best;
    const auto consider = [&](double bytes, std::string source) {
        if (!best || bytes < best->bytes) best = AvailableMemory{std::max(0.0, bytes), std::move(source)};
    };
    const auto cgroup_room = [&](const std::filesystem::path& limit_file, const std::filesystem::path& usage_file,
                                 const std::string& name) {
        const auto limit = detail::read_bytes(limit_file);
        if (!limit || *limit >= detail::no_cgroup_limit) return;
        const double used = detail::read_bytes(usage_file).value_or(0);
        consider(*limit - used, "the cgroup limit (" + name + " " + readable_bytes(static_cast<std::int64_t>(*limit)) +
                                    ") less what it uses");
    };
    cgroup_room(cgroup / "memory.max", cgroup / "memory.current", "memory.max");
    cgroup_room(cgroup / "memory" / "memory.limit_in_bytes", cgroup / "memory" / "memory.usage_in_bytes",
                "memory.limit_in_bytes");
    std::ifstream in(meminfo);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("MemAvailable:", 0) != 0) continue;
        std::istringstream fields(line.substr(13));
        double kib = 0;
        if (fields >> kib) consider(kib * 1024, "MemAvailable in " + meminfo.string());
        break;
    }
    return best;
}

// What the message tells the user to change: the flag that shrinks the
// activations, the one that shrinks the model states, and the one that skips
// the check.
struct MemoryAdvice {
    std::string lower_activations = "the batch per rank";
    std::string lower_model_states = "the model";
    std::string skip_check = "";
};

// Throws, in one line naming both figures, when `need` is more than `available`.
inline void check_memory_fits(const MemoryNeed& need, const std::optional<AvailableMemory>& available,
                              const MemoryAdvice& advice) {
    if (!available || need.total() <= available->bytes) return;
    const auto bytes = [](double b) { return readable_bytes(static_cast<std::int64_t>(std::min(b, 9e18))); };
    const bool activations_dominate = need.activations >= need.model_states;
    const std::string ranks =
        need.ranks == 1 ? "" : "per rank " + bytes(need.per_rank()) + " x " + std::to_string(need.ranks) + " ranks: ";
    LOOM_FAIL("the run needs at least ", bytes(need.total()), " of memory (", ranks, "model states ",
              bytes(need.model_states), ", activations ", bytes(need.activations), ") but ", bytes(available->bytes),
              " is available (", available->source, "); lower ",
              activations_dominate ? advice.lower_activations : advice.lower_model_states,
              advice.skip_check.empty() ? "" : ", or pass " + advice.skip_check + " to try anyway");
}

}  // namespace loom::train
