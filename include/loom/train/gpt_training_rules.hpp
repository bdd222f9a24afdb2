// What a GptTraining's settings must agree on before anything is built,
// checked alike on every rank so that every rank stops with the same
// one-line message: the settings among themselves (a compressor's warm-up
// needs a compressor, OptEx composes with data parallelism only, a periodic
// save needs a checkpoint, ...), the degrees against the world and the
// model (the planner's rules, plan/layout_rules.hpp), a device's limits, the
// memory, and the files the run writes and resumes (file_preflight.hpp).
// Each message names the settings as the front end spells them
// (core/setting_names.hpp), so train_gpt's say "--pp 2" and a config
// file's "pp 2".
//
//   run = train::settled_training(run, names);         // checked, derived settings filled
//   const int dp = train::dp_degree(run, world, names);
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <tuple>

#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/setting_names.hpp"
#include "loom/kernels/attention_shape.hpp"
#include "loom/plan/gpt_description.hpp"
#include "loom/plan/layout_rules.hpp"
#include "loom/schedule/partition.hpp"
#include "loom/train/file_preflight.hpp"
#include "loom/train/gpt_training.hpp"
#include "loom/train/launcher.hpp"
#include "loom/train/memory_preflight.hpp"

namespace loom::train {

// `run` checked among its own settings, with what follows from them filled
// in: the last step, and OptEx's tuning (re-tuned every 25 iterations unless
// `optex_tune` says otherwise, from a history of 3 or more).
[[nodiscard]] inline GptTraining settled_training(GptTraining run, const SettingNames& name) {
    const StrategySpec& spec = run.strategy;
    LOOM_CHECK(run.pp > 1 || run.partition.empty(), name("partition"), " ", run.partition, " needs a pipeline; add ",
               name("pp"), " 2 or more");
    LOOM_CHECK(run.compress_warmup < 0 || run.compress().on(), name("compress_warmup"), " ", run.compress_warmup,
               " needs a compressor; add ", name("compress"));
    LOOM_CHECK(!spec.pp_compression.on() || run.pp > 1, name("compress_pp"), " needs a pipeline; add ", name("pp"),
               " 2 or more");
    LOOM_CHECK(!spec.tp_compression.on() || run.tp > 1, name("compress_tp"), " needs tensor parallelism; add ",
               name("tp"), " 2 or more");
    LOOM_CHECK(!spec.tp_compression.on() || !spec.tensor_grid, name("compress_tp"),
               " casts Megatron's all-reduces; it is not supported with ", name("tp_mode"), " 2d");
    if (run.optex > 0) {
        // OptEx runs its own loop over whole-model gradients: data parallelism
        // inside each worker, nothing that cuts the model or the exchange.
        const std::string optex = name("optex") + " " + std::to_string(run.optex);
        const auto refuse = [&](bool given, const std::string& what) {
            LOOM_CHECK(!given, optex, " composes with ", name("dp"), " only; drop ", what);
        };
        const auto degree = [&](const char* axis, int value) { return name(axis) + " " + std::to_string(value); };
        refuse(run.pp > 1, degree("pp", run.pp));
        refuse(run.tp > 1, degree("tp", run.tp));
        refuse(run.sp > 1, degree("sp", run.sp));
        refuse(spec.pipelined || spec.tensor_parallel || spec.sequence_parallel,
               "the pipeline, tensor or sequence policy from " + name("strategy"));
        refuse(spec.zero_stage > 0, degree("zero", spec.zero_stage) + " (OptEx shards its own state over the workers)");
        refuse(run.micro_batches > 1, degree("micro_batches", run.micro_batches));
        refuse(run.compress().on(), name("compress") + " " + run.compress().describe());
        LOOM_CHECK(!spec.recompute.on() || run.device.kind == DeviceKind::host, optex,
                   " recomputes on the host only; drop ", name("recompute"), " or ", name("device"));
        refuse(run.freeze_variance >= 0, name("freeze_variance"));
        refuse(!run.trace.empty(), name("trace") + " (the step program is the executor's; OptEx steps outside it)");
        // Tuned by default: on the GPT the reference's l = 0.1 (chosen for its
        // synthetic functions) makes 4 workers worse than AdamW, and the
        // tuning picks 1 to 100 (docs/optex.md).
        optim::OptExConfig& optex_config = run.optex_config;
        const int history = optex_config.estimator.history;
        LOOM_CHECK(run.optex_tune <= 0 || history >= 3, name("optex_tune"), " needs ", name("optex_history"),
                   " 3 or more (one point held out, two fitted)");
        optex_config.tune_every = run.optex_tune >= 0 ? run.optex_tune : (history >= 3 ? 25 : 0);
        optex_config.holdout = std::max(1, std::min(optex_config.holdout, history - 2));
        optex_config.workers = run.optex;
    }
    LOOM_CHECK(run.save_every == 0 || !run.save.empty(), name("save_every"), " ", run.save_every, " needs ",
               name("save"), " FILE");
    LOOM_CHECK(!run.sharded || !run.save.empty(), name("sharded"), " needs ", name("save"), " DIR");
    if (run.until < 0) run.until = run.steps;
    LOOM_CHECK(run.until <= run.steps, name("until"), " ", run.until, " is past ", name("steps"), " ", run.steps);
    return run;
}

// OptEx's workers in a world of `world` ranks: each worker's dp degree.
[[nodiscard]] inline int optex_dp_degree(const GptTraining& run, int world, const SettingNames& name) {
    const int workers = run.optex;
    const std::string optex = name("optex") + " " + std::to_string(workers);
    LOOM_CHECK(world % workers == 0, optex, " needs a multiple of ", workers, " ranks (one group per worker), but there are ",
               world, "; use ", name("optex"), " ", std::gcd(world, workers), " or ", workers, " x ", name("dp"), " ranks");
    const int dp = run.dp > 0 ? run.dp : world / workers;
    LOOM_CHECK(dp * workers == world, optex, " x ", name("dp"), " ", dp, " = ", dp * workers, " ranks, but there are ", world);
    LOOM_CHECK(run.batch % dp == 0, name("batch"), " ", run.batch, " is not divisible by ", name("dp"), " ", dp,
               "; every rank needs the same whole number of sequences");
    return dp;
}

// The data-parallel degree of `run` in a world of `world` ranks (given, or
// what the other degrees leave), with the degrees and the strategy checked
// against the world and the model by the planner's rules, a partition
// against the stages, and interleaving's even split when none is given.
[[nodiscard]] inline int dp_degree(const GptTraining& run, int world, const SettingNames& name) {
    if (run.optex > 0) return optex_dp_degree(run, world, name);
    const int dp = run.dp > 0 ? run.dp : std::max(1, world / (run.pp * run.tp * run.sp));
    const plan::Layout layout{dp, run.pp, run.tp, run.sp, run.micro_batches, run.strategy, {}};
    const std::string why = plan::why_invalid(plan::describe_gpt(run.model, run.batch), layout, world);
    LOOM_CHECK(why.empty(), why);
    if (run.pp == 1) return dp;
    const int chunks = run.strategy.chunks, stages = layout.virtual_stages(), layers = static_cast<int>(run.model.layers);
    if (!run.partition.empty()) {
        (void)schedule::parse_partition(run.partition, layers, stages, name,
                                        chunks == 1 ? "" : name("pp") + " " + std::to_string(run.pp) + " x " +
                                                               std::to_string(chunks) + " chunks is " +
                                                               std::to_string(stages));
    } else {
        LOOM_CHECK(run.strategy.schedule != ScheduleKind::interleaved || layers % stages == 0, name("schedule"),
                   " interleaved with ", chunks, " chunks per rank needs the ", layers, " layers to split evenly into ",
                   stages, " chunks (", name("layers"), " divisible by ", name("pp"), " x ", name("chunks"), "); use ",
                   name("chunks"), " dividing the ",
                   layers % run.pp == 0 ? std::to_string(layers / run.pp) + " " : std::string(), "layers per stage, other ",
                   name("layers"), ", or ", name("partition"));
    }
    return dp;
}

// The memory preflight (memory_preflight.hpp) for `ranks_in_process` host
// ranks of `run` at data-parallel degree `dp`, its advice in the settings'
// names. A device run's states live on the device, which this does not measure.
inline void check_training_memory(const GptTraining& run, int dp, int ranks_in_process, const SettingNames& name) {
    if (run.device.kind != DeviceKind::host) return;
    const std::string raise = " (or raise " + name("micro_batches") + " or " + name("dp");
    check_memory_fits(gpt_training_memory(run.model, training_layout(run, dp, ranks_in_process)), available_memory(),
                      {.lower_activations = name("batch") + raise +
                                            (run.strategy.recompute.on() ? ")" : ", or pass " + name("recompute") + " full)"),
                       .lower_model_states = name("width") + " or " + name("layers") + " (or raise " + name("zero") + ", " +
                                             name("pp") + " or " + name("tp") + ")",
                       .skip_check = name("no_memory_check")});
}

// What a device asks before anything runs: heads no wider than the CUDA
// attention kernels take; and under mpirun, no ZB-V over NCCL, which pairs
// one link's messages in the order they are issued, whatever their tags,
// while ZB-V's two ranks of a link post activations and gradients in
// different orders (transport_nccl.hpp). The device itself is checked where
// the ranks start (transport_launch.hpp).
inline void check_device_settings(const GptTraining& run, const SettingNames& name) {
    if (run.device.kind != DeviceKind::cuda) return;
    std::ostringstream where;
    where << run.device;
    const std::int64_t width = run.model.width, limit = kernels::cuda_attention_max_head_size;
    const std::int64_t head_size = width / run.model.heads;
    if (head_size > limit) {
        // The fewest heads that divide the width into heads of at most `limit`
        // (width itself always does: heads of one feature).
        std::int64_t fits = (width + limit - 1) / limit;
        while (width % fits != 0) ++fits;
        LOOM_FAIL(name("device"), " ", where.str(), ": ", name("width"), " ", width, " over ", name("heads"), " ",
                  run.model.heads, " gives heads of ", head_size, " features; the CUDA attention kernels take at most ",
                  limit, ": use ", name("heads"), " ", fits, " (or another divisor of ", name("width"),
                  " giving heads of at most ", limit, "), or ", name("device"), " host");
    }
    LOOM_CHECK(!launched_by_mpi() || run.optex > 0 || run.pp == 1 || run.strategy.schedule != ScheduleKind::zero_bubble_v,
               name("schedule"), " zbv with ", name("device"), " ", where.str(), " under mpirun: NCCL pairs a link's "
               "messages in the order they are sent, and ZB-V's ranks send and receive them in different orders; use ",
               name("schedule"), " gpipe, 1f1b, zb or interleaved, or rank threads on one GPU (no mpirun)");
}

// Before any rank starts: the checkpoint (a directory when sharded) and the
// trace can be written, the temporaries a killed run left beside the
// checkpoint are removed, and a resume leaves steps to train and continues
// this run's data and seed (or `resume_anyway` says go on). Returns the
// note a resume on other data prints when allowed ("" when none).
[[nodiscard]] inline std::string check_training_files(const GptTraining& run, bool resume_anyway, const SettingNames& name) {
    const std::tuple<const char*, std::string, bool> outputs[] = {{"save", run.save, run.sharded}, {"trace", run.trace, false}};
    for (const auto& [setting, path, directory] : outputs) {
        try {
            prepare_output(path, directory, setting == std::string_view("save"));
        } catch (const Error& e) {
            throw Error(name(setting) + " " + e.message());
        }
    }
    if (run.resume.empty()) return "";
    const auto step = checkpoint_step(run.resume);
    LOOM_CHECK(!step || *step <= run.last_step(), "the checkpoint ", run.resume, " is at step ", *step, ", past ",
               name("until"), " ", run.last_step());
    return check_resume_identity(run.resume, run.data, run.seed, resume_anyway, name);
}

}  // namespace loom::train
