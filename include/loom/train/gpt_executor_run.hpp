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
//   const std::int64_t done = train::run_gpt_executor(world, run, {.dp = 2, .transport = "rank threads"}, corpus,
//       [&](const std::vector<int>& partition) { return exec::ExecutorOptions{.partition = partition, ...}; });
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
#include "loom/train/gpt_training.hpp"
#include "loom/train/run_summary.hpp"
#include "loom/train/step_loop.hpp"

namespace loom::train {

// Trains `run`, a collective over `world` (dp x pp x tp x sp ranks, dp
// given by `context`), and returns the step the run ended after (before its
// end after a stop signal). `options_for(partition)` sets the executor up
// given the units of each virtual stage (the caller's: what it asks of the
// executor is more than these settings say).
template <class OptionsFor>
std::int64_t run_gpt_executor(comm::AnyComm& world, const GptTraining& run, const RunContext& context,
                              const data::ByteCorpus& corpus, OptionsFor&& options_for) {
    using C = comm::AnyComm;
    const bool lead = world.rank() == 0;
    comm::Mesh<C> mesh(world, {{"dp", context.dp}, {"pp", run.pp}, {"tp", run.tp}, {"sp", run.sp}});
    // Sequence-parallel ranks reduce gradients with the data-parallel ones.
    C& dp = run.sp > 1 ? mesh.combined({"dp", "sp"}) : mesh.axis("dp");
    const std::int64_t rows = run.batch / context.dp, T = run.model.seq;
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
        compressor.on() ? compression_signature(compressor, context.dp, run.pp, run.tp, run.sp) : std::string();
    std::string compression_note;  // why a resume starts the compressor's state from zero
    std::int64_t first_step = 0;
    if (run.resume.empty()) exec.initialize(run.seed);
    else first_step = resume_executor(world, exec, run.model, run.resume, signature, compression_note);

    if (lead) {
        std::ostringstream config;
        config << run.model;
        const auto lines = run_summary(
            {.model = config.str(), .parameters = exec.parameter_count(), .batch = run.batch, .seq = T,
             .data = corpus.describe(), .strategy = run.strategy.text(), .ranks = world.size(), .transport = context.transport,
             .dp = context.dp, .pp = run.pp, .tp = run.tp, .sp = run.sp, .micro_batches = run.micro_batches,
             .blas_threads = run.threads, .matmul = context.matmul_note, .gemm = kernels::host::host_gemm_report(),
             .stages = run.pp > 1 ? plan::describe_stages(gpt, stage_layers) : "",
             .stages_from = run.partition.empty() ? "balanced over measured layer times" : context.partition_from,
             .cuts = run.tp > 1 ? exec.cut_report().summary() : "",  // what tp did to the layers
             // Only host rank threads share this machine's cores.
             .cores = context.transport == "rank threads" ? std::thread::hardware_concurrency() : 0u,
             .resumed_at = first_step, .resumed_from = run.resume, .compression_note = compression_note,
             .compressor = compressor.describe(), .warmup = run.warmup_steps()});
        for (const std::string& line : lines) std::printf("%s\n", line.c_str());
    }

    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * T)), targets(inputs.size());
    const auto input_tensor = Tensor::of(inputs.data(), {rows, T});
    const auto target_tensor = Tensor::of(targets.data(), {rows, T});
    ExecutorSaves<C> saves(world, exec, run.model, corpus.describe(), run_identity_metadata(run.data, run.seed), signature,
                           run.sharded);
    const StepLoop loop = run.step_loop(first_step, run.batch * T, run.device);
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
