// What a training run of the reference GPT is, as plain values: the model,
// the batch and the schedule, the degrees and the strategy that cuts along
// them, the data, what the run writes, the device, and OptEx's workers. A
// command line (train_gpt's flags) or a config file fills one; the runs
// (gpt_executor_run.hpp, optex_run.hpp) and the memory preflight read it, so
// the settings are declared once, with their defaults, and not copied field
// by field at every call. Also what follows from them alone: the
// compressor's warm-up, the step loop, the memory preflight's layout, the
// corpus.
//
//   train::GptTraining run;
//   run.model.layers = 2, run.dp = 2, run.steps = 100, run.save = "run.st";
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/data/corpus.hpp"
#include "loom/gpt/model.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/optim/optex.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/train/memory_preflight.hpp"
#include "loom/train/step_loop.hpp"

namespace loom::train {

struct GptTraining {
    gpt::Config model{};
    std::int64_t batch = 8;        // global: all ranks, all micro-batches
    std::int64_t steps = 200;      // the learning-rate schedule's length
    std::int64_t until = -1;       // stop after this step (-1: steps)
    float lr = 1e-3f;              // the cosine schedule's peak
    std::uint64_t seed = 1;        // initialisation, data order and sampling
    int threads = 1;               // BLAS threads per rank
    int dp = 0;                    // 0: what the world leaves (1 on threads, the world size under MPI)
    int pp = 1, tp = 1, sp = 1;    // the other degrees; what cuts along them is `strategy`
    int micro_batches = 1;
    StrategySpec strategy{};       // the policies
    std::string partition{};       // layers per virtual stage, "3,3,2"; empty: balanced by profiling
    std::string data{};            // a text file; empty: a synthetic corpus
    std::string metrics{};         // one JSON line per step; empty: none
    std::string save{};            // the checkpoint at the end (a directory when sharded); empty: none
    std::string resume{};          // a checkpoint to continue; empty: a fresh run
    std::string trace{};           // the step programs' Chrome/Perfetto trace; empty: none
    std::int64_t save_every = 0;   // also save <save>.step-<n> every N steps
    std::int64_t keep = 2;         // periodic checkpoints kept, the newest
    bool sharded = false;          // `save` is a directory of per-rank shards (exec/sharded_checkpoint.hpp)
    std::int64_t sample = 0;       // bytes of generated text at the end of a completed run
    Device device = host_device;   // where one rank's layers run
    kernels::MatmulPrecision matmul = kernels::MatmulPrecision::f32;
    std::int64_t compress_warmup = -1;  // -1: PowerSGD and TopK 10%, OneBit 20% of `steps`, others 0
    std::int64_t freeze_variance = -1;  // AdamW's v frozen after N steps; -1: at an error-feedback compressor's start
    int optex = 0;                      // OptEx workers; 0: plain AdamW under the executor
    optim::OptExConfig optex_config{};  // its workers and tuning are filled from `optex` and `optex_tune`
                                        // (gpt_training_rules.hpp: settled_training)
    int optex_tune = -1;                // re-tune the length scale every N iterations; -1: 25, 0: never

    // The warm-up the run uses: given, or the reference's share of the
    // steps (PowerSGD and TopK want their error feedback to start from a
    // settled gradient, OneBit more so).
    [[nodiscard]] std::int64_t warmup_steps() const {
        const CompressorKind kind = strategy.dp_compression.kind;
        if (compress_warmup >= 0) return compress_warmup;
        if (kind == CompressorKind::power_sgd || kind == CompressorKind::top_k) return steps / 10;
        return kind == CompressorKind::one_bit ? steps / 5 : 0;
    }
    [[nodiscard]] const Compression& compress() const { return strategy.dp_compression; }
    [[nodiscard]] std::int64_t last_step() const { return until < 0 ? steps : until; }

    // The step loop's settings (step_loop.hpp) for the run resumed at
    // `first_step`, `tokens_per_step` over all ranks, its collectives on `where`.
    [[nodiscard]] StepLoop step_loop(std::int64_t first_step, std::int64_t tokens_per_step, Device where) const {
        LOOM_CHECK(first_step <= last_step(), "the checkpoint ", resume, " is at step ", first_step,
                   ", past the run's last step ", last_step());
        return {.first_step = first_step, .until = last_step(), .tokens_per_step = tokens_per_step, .metrics = metrics,
                .save = save, .save_every = save_every, .keep = keep, .sharded = sharded, .device = where};
    }
};

// The memory preflight's layout (memory_preflight.hpp) of `ranks_in_process`
// ranks of `run` at data-parallel degree `dp`: OptEx keeps no ZeRO and one
// micro-batch, whatever the strategy says.
[[nodiscard]] inline TrainingLayout training_layout(const GptTraining& run, int dp, int ranks_in_process) {
    return {.batch = run.batch,
            .dp = dp,
            .pp = run.pp,
            .tp = run.tp,
            .sp = run.sp,
            .zero = run.optex > 0 ? 0 : run.strategy.zero_stage,
            .micro_batches = run.optex > 0 ? 1 : run.micro_batches,
            .ranks_in_process = ranks_in_process,
            .recompute = run.strategy.recompute};
}

// The corpus `run.data` names (or a synthetic one of 1 MiB from the seed),
// checked to hold one sequence and its targets, so that a file too short
// fails before anything is built.
[[nodiscard]] inline data::ByteCorpus training_corpus(const GptTraining& run) {
    const auto vocab = static_cast<int>(run.model.vocab);
    auto corpus = run.data.empty() ? data::ByteCorpus::synthetic(std::int64_t{1} << 20, run.seed, vocab)
                                   : data::ByteCorpus::from_file(run.data, vocab);
    std::vector<std::int32_t> probe(static_cast<std::size_t>(run.model.seq)), probe_targets(probe.size());
    corpus.batch(run.seed, 0, 1, run.model.seq, probe, probe_targets);
    return corpus;
}

// What a run says about where it runs, beside its settings: the degree the
// world gave, the transport's name, and the lines and names a program words
// its own way.
struct RunContext {
    int dp = 1;                   // the data-parallel degree (under OptEx: each worker's)
    std::string transport{};      // what carries the ranks ("rank threads", "MPI processes", ...)
    std::string matmul_note{};    // a line on the matrix products' precision; empty: none
    std::string partition_from{};  // how the summary names a partition the settings give
};

}  // namespace loom::train
