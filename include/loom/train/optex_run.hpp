// A whole OptEx run on the reference GPT (optim/optex.hpp): OptEx<AdamW> on
// an optex axis of N workers, each a group of dp ranks that averages its
// worker's gradient, in its own training loop beside the executor's. Worker
// k of iteration t reads batch t N + k, so one worker is plain AdamW on the
// same batches. OptEx's state, history and collectives stay in host memory
// (`world` is a host communicator); each rank's forward and backward run on
// the run's device (OptExGradient). It resumes from one file or a sharded
// directory (checkpoints of any number of workers, or of the executor),
// saves through run_steps and at the end, and the lead prints what it did.
//
//   const auto done = train::run_optex_gpt(world, run, {.dp = 1, .transport = "rank threads"}, corpus);
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"
#include "loom/data/corpus.hpp"
#include "loom/exec/sharded_checkpoint.hpp"
#include "loom/gpt/model.hpp"
#include "loom/gpt/sample.hpp"
#include "loom/kernels/matmul_precision.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/optex.hpp"
#include "loom/optim/schedule.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/train/data_identity.hpp"
#include "loom/train/gpt_training.hpp"
#include "loom/train/optex_checkpoint.hpp"
#include "loom/train/optex_gradient.hpp"
#include "loom/train/step_loop.hpp"

namespace loom::train {

// Trains `run` with `run.optex` workers, a collective over `world` (optex x
// dp ranks, dp given by `context`; `run.device` computes the gradients), and
// returns the step the run ended after (before its end after a stop signal).
inline std::int64_t run_optex_gpt(comm::AnyComm& world, const GptTraining& run, const RunContext& context,
                                  const data::ByteCorpus& corpus) {
    using C = comm::AnyComm;
    const int workers = run.optex;
    const bool lead = world.rank() == 0;
    comm::Mesh<C> mesh(world, {{"optex", workers}, {"dp", context.dp}});
    const int worker = mesh.coordinate("optex");

    gpt::Model model = gpt::make_model(run.model);
    OptExGradient<gpt::Model, C> gradient_at(model, mesh.axis("dp"), run.strategy,
                                             {.field_names = {"embed", "blocks", "ln_f", "head", "loss"},
                                              .device = run.device,
                                              .matmul = run.matmul});
    const std::int64_t parameters = gradient_at.size();
    std::vector<float> values(static_cast<std::size_t>(parameters));
    if (run.resume.empty()) gradient_at.initial_values(run.seed, values);
    const optim::AdamWConfig adamw{run.lr, 0.9f, 0.95f, 1e-8f, 0.1f};
    optim::OptEx<optim::AdamW, C> optex(
        mesh.axis("optex"), values, [&](std::int64_t n) { return optim::AdamW(n, adamw); }, run.optex_config);
    // A sharded resume reads this rank's slice of everything, the history
    // included, from any number of workers (or the executor's shards, with
    // no history); one file keeps no history.
    std::string history_note;  // why a resume starts with an empty history
    const std::int64_t first_step = run.resume.empty() ? 0 : resume_optex(optex, run.model, run.resume, history_note);

    if (lead) {
        std::ostringstream config, method;
        config << run.model;
        method << run.optex_config << "<AdamW>";
        if (run.strategy.recompute.on()) method << ", Recompute<" << run.strategy.recompute.describe() << ">";
        std::printf("%s, %lld parameters, batch %lld x %lld tokens per worker, %s\n", config.str().c_str(),
                    static_cast<long long>(parameters), static_cast<long long>(run.batch),
                    static_cast<long long>(run.model.seq), corpus.describe().c_str());
        std::printf("%s on %d %s (optex %d x dp %d), each rank holding 1/%d of the state and history\n",
                    method.str().c_str(), world.size(), context.transport.c_str(), workers, context.dp, workers);
        if (!context.matmul_note.empty()) std::printf("%s\n", context.matmul_note.c_str());
        if (!run.resume.empty())
            std::printf("resumed from %s at step %lld%s%s\n", run.resume.c_str(), static_cast<long long>(first_step),
                        history_note.empty() ? " with OptEx's history" : "; OptEx's history starts empty: ",
                        history_note.c_str());
    }

    // Saves: a sharded one writes each rank's slice, history included, in
    // the background (finished at the next save, a collective); one file is
    // the whole state gathered to every rank and written by the lead.
    const bool holder = mesh.coordinate("dp") == 0;  // the other dp replicas hold copies
    std::optional<exec::ShardedSave<C>> in_flight;
    const auto identity = run_identity_metadata(run.data, run.seed);  // for a resume to check
    const auto save = [&](const std::string& path, std::int64_t step) {
        if (run.sharded)
            save_optex_sharded(world, optex, holder, run.model, path, step, corpus.describe(), identity, in_flight);
        else
            save_optex(world, optex, run.model, path, step, corpus.describe(), identity);
    };

    const std::int64_t rows = run.batch / context.dp, T = run.model.seq, total = run.steps;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * T)), targets(inputs.size());
    double length_scale = run.optex_config.estimator.length_scale;
    std::int64_t skipped = 0;
    // The collectives between steps stay on the host, with OptEx's.
    const StepLoop loop = run.step_loop(first_step, workers * run.batch * T, host_device);
    const auto [done, loss] = run_steps(
        world, loop,
        [&](std::int64_t step) {
            optex.set_lr(optim::cosine_lr(step + 1, total, run.lr, std::min<std::int64_t>(20, total / 10)));
            const auto result = optex.iterate([&](std::span<const float> x, std::span<float> g) {
                corpus.rows(run.seed, step * workers + worker, mesh.coordinate("dp") * rows, rows, T, inputs, targets);
                return gradient_at(x, Tensor::of(inputs.data(), {rows, T}), Tensor::of(targets.data(), {rows, T}), g);
            });
            skipped += result.skipped;
            if (lead && result.length_scale != length_scale)
                std::printf("\nOptEx: length scale tuned to %g at step %lld\n", result.length_scale,
                            static_cast<long long>(step));
            length_scale = result.length_scale;
            return result.loss;
        },
        save);
    if (lead && done > first_step) {
        std::printf("final loss %.4f after %lld steps\n", static_cast<double>(loss), static_cast<long long>(done));
        std::printf("OptEx: %lld sequential iterations, %lld gradients, %lld not finite (kept out of the history)\n",
                    static_cast<long long>(done - first_step), static_cast<long long>((done - first_step) * workers),
                    static_cast<long long>(skipped));
    }
    if (!run.save.empty()) {
        save(run.save, done);
        if (in_flight) in_flight->finish();
        if (lead)
            std::printf("saved %s (step %lld%s)\n", run.save.c_str(), static_cast<long long>(done),
                        run.sharded ? ", one shard per rank, with OptEx's history" : "");
    }
    if (run.sample > 0 && done == loop.until) {
        optex.gather_params(values);  // a collective
        if (lead)  // prompted with the corpus's first 16 bytes
            std::printf("sample:\n%s\n", gpt::sample(run.model, values, corpus.text().substr(0, 16), run.sample, run.seed).c_str());
    }
    return done;
}

}  // namespace loom::train
