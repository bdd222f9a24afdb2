// A whole run of the reference GPT under the executor, any strategy: the
// mesh of its degrees, the pipeline's stages (gpt_stages.hpp), the executor,
// a fresh start or a resume (executor_checkpoint.hpp, with each rank's
// compressor state under its signature), the opening lines (run_summary.hpp),
// the loop around each step (step_loop.hpp), and the end: the final loss,
// the memory per rank, the checkpoint, a sample, the trace
// (executor_saves.hpp). The caller checks the degrees against the world,
// loads the corpus and says how the executor is set up; a program such as
// train_gpt is then its flags and this call.
//
//   const std::int64_t done = train::run_gpt_executor(world, run, corpus, transport,
//       [&](const std::vector<int>& partition) { return exec::ExecutorOptions{.partition = partition, ...}; },
//       [&](std::int64_t first_step) { return train::StepLoop{.first_step = first_step, .until = 100, ...}; });
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"
#include "loom/data/corpus.hpp"
#include "loom/exec/executor.hpp"
#include "loom/gpt/model.hpp"
#include "loom/gpt/sample.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/plan/gpt_description.hpp"
#include "loom/plan/stage_units.hpp"
#include "loom/train/compression_state.hpp"
#include "loom/train/data_identity.hpp"
#include "loom/train/executor_checkpoint.hpp"
#include "loom/train/executor_saves.hpp"
#include "loom/train/finite_check.hpp"
#include "loom/train/gpt_stages.hpp"
#include "loom/train/run_summary.hpp"
#include "loom/train/step_loop.hpp"

namespace loom::train {

// What a run of the GPT under the executor is; the degrees are checked
// against the world by the caller (plan/layout_rules.hpp).
struct GptRun {
    gpt::Config model{};
    std::int64_t batch = 8;        // sequences per step, over all ranks and micro-batches
    int dp = 1, pp = 1, tp = 1, sp = 1;
    int micro_batches = 1;         // per step (the executor's options say so too)
    StrategySpec strategy{};       // what cuts along the degrees
    std::string partition{};       // layers per virtual stage ("3,3,2"); empty: balanced over profiled times
    std::string partition_from{};  // how the summary names a given partition
    Device device = host_device;
    kernels::MatmulPrecision matmul = kernels::MatmulPrecision::f32;
    std::string matmul_note{};     // a line the summary prints about the matrix products; empty: none
    int blas_threads = 1;          // per rank, for the summary (the caller sets them)
    std::int64_t compress_warmup = 0;  // uncompressed steps before the dp compressor starts, for the summary
    std::uint64_t seed = 1;
    float lr = 1e-3f;              // the cosine schedule's peak
    std::int64_t steps = 0;        // the schedule's length
    std::string data{};            // the data's path (empty: synthetic), recorded for a resume to check
    std::string resume{};          // a checkpoint to continue; empty: a fresh run
    std::string save{};            // the checkpoint written at the end; empty: none
    bool sharded = false;          // saves are directories of per-rank shards, written in the background
    std::string trace{};           // the step programs' trace, written at the end; empty: none
    std::int64_t sample = 0;       // bytes generated at the end of a completed run; 0: none
};

// Trains, a collective over `world` (dp x pp x tp x sp ranks), and returns
// the step the run ended after (before run.steps' end after a stop signal).
// `options_for(partition)` sets the executor up given the units of each
// virtual stage; `loop_from(first_step)` gives the step loop's settings once
// a resume has said where the run starts.
template <class OptionsFor, class LoopFrom>
std::int64_t run_gpt_executor(comm::AnyComm& world, const GptRun& run, const data::ByteCorpus& corpus,
                              const char* transport, OptionsFor&& options_for, LoopFrom&& loop_from) {
    using C = comm::AnyComm;
    const bool lead = world.rank() == 0;
    comm::Mesh<C> mesh(world, {{"dp", run.dp}, {"pp", run.pp}, {"tp", run.tp}, {"sp", run.sp}});
    // Sequence-parallel ranks reduce gradients with the data-parallel ones.
    C& dp = run.sp > 1 ? mesh.combined({"dp", "sp"}) : mesh.axis("dp");
    const std::int64_t rows = run.batch / run.dp, T = run.model.seq;
    const plan::ModelDescription gpt = plan::describe_gpt(run.model, run.batch);
    std::vector<int> stage_layers, partition;  // per virtual stage: layers, and the executor's units
    if (run.pp > 1) {
        stage_layers = gpt_stage_layers(gpt, run.model.layers, run.pp * run.strategy.chunks, run.strategy.schedule,
                                        run.partition,
                                        run.partition.empty() ? profiled_unit_seconds(world, run.model, corpus, rows / run.micro_batches,
                                                                                      run.seed, run.device, run.matmul)
                                                              : std::vector<double>{});
        partition = plan::units_per_stage(gpt, stage_layers);
    }
    gpt::Model model = gpt::make_model(run.model);
    const exec::ExecutorOptions options = options_for(partition);
    exec::Executor<C> exec(model, dp, run.pp > 1 ? &mesh.axis("pp") : nullptr, run.tp > 1 ? &mesh.axis("tp") : nullptr,
                           run.sp > 1 ? &mesh.axis("sp") : nullptr, run.strategy, options);
    // A compressor's state is per rank: checkpoints keep it under a signature of the compressor and the degrees.
    const Compression& compressor = run.strategy.dp_compression;
    const std::string signature =
        compressor.on() ? compression_signature(compressor, run.dp, run.pp, run.tp, run.sp) : std::string();
    std::string compression_note;  // why a resume starts the compressor's state from zero
    std::int64_t first_step = 0;
    if (run.resume.empty()) exec.initialize(run.seed);
    else first_step = resume_executor(world, exec, run.model, run.resume, signature, compression_note);

    if (lead) {
        std::ostringstream config;
        config << run.model;
        const auto lines = run_summary(
            {.model = config.str(), .parameters = exec.parameter_count(), .batch = run.batch, .seq = T,
             .data = corpus.describe(), .strategy = run.strategy.text(), .ranks = world.size(), .transport = transport,
             .dp = run.dp, .pp = run.pp, .tp = run.tp, .sp = run.sp, .micro_batches = run.micro_batches,
             .blas_threads = run.blas_threads, .matmul = run.matmul_note, .gemm = kernels::host::host_gemm_report(),
             .stages = run.pp > 1 ? plan::describe_stages(gpt, stage_layers) : "",
             .stages_from = run.partition.empty() ? "balanced over measured layer times" : run.partition_from,
             .cuts = run.tp > 1 ? exec.cut_report().summary() : "",  // what tp did to the layers
             // Only host rank threads share this machine's cores.
             .cores = std::string(transport) == "rank threads" ? std::thread::hardware_concurrency() : 0u,
             .resumed_at = first_step, .resumed_from = run.resume, .compression_note = compression_note,
             .compressor = compressor.describe(), .warmup = run.compress_warmup});
        for (const std::string& line : lines) std::printf("%s\n", line.c_str());
    }

    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * T)), targets(inputs.size());
    const auto input_tensor = Tensor::of(inputs.data(), {rows, T});
    const auto target_tensor = Tensor::of(targets.data(), {rows, T});
    ExecutorSaves<C> saves(world, exec, run.model, corpus.describe(), run_identity_metadata(run.data, run.seed), signature,
                           run.sharded);
    const StepLoop loop = loop_from(first_step);
    const auto [done, loss] = run_steps(
        world, loop,
        [&](std::int64_t step) {
            corpus.rows(run.seed, step, mesh.coordinate("dp") * rows, rows, T, inputs, targets);
            const float lr = optim::cosine_lr(step + 1, run.steps, run.lr, std::min<std::int64_t>(20, run.steps / 10));
            const float step_loss = exec.step(input_tensor, target_tensor, lr);
            check_finite_loss(step_loss, step);  // the same loss on every rank: all stop together
            return step_loss;
        },
        saves);
    if (lead && done > first_step)
        std::printf("final loss %.4f after %lld steps\n", static_cast<double>(loss), static_cast<long long>(done));
    if (lead && world.size() > 1) {
        std::ostringstream report;
        report << exec.memory_report();
        std::printf("memory per rank: %s\n", report.str().c_str());
    }
    std::function<void(const std::vector<float>&)> sample;  // from the values the end gathers
    if (run.sample > 0)
        sample = [&, done = done](const std::vector<float>& values) {
            if (lead && done == loop.until)  // prompted with the corpus's first 16 bytes
                std::printf("sample:\n%s\n",
                            gpt::sample(run.model, values, corpus.text().substr(0, 16), run.sample, run.seed).c_str());
        };
    saves.finish({.save = run.save, .step = done, .trace = run.trace, .device = run.device}, sample);
    return done;
}

}  // namespace loom::train
