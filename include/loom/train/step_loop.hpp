// run_steps: what a training loop does around its step, written once for
// every loop (the executor's, OptEx's): times each step into tokens per
// second, shows the progress bar and writes the metrics file on the lead
// rank (a resumed run continues the file), agrees with every rank to stop
// after a signal (stop_signal.hpp: all stop at the same step), and saves
// every `save_every` steps: a whole file as "<save>.step-<n>", the newest
// `keep` kept (periodic_save.hpp), or a sharded directory rewritten in
// place. The step and the save are the caller's; a step that throws (a
// non-finite loss) ends the loop on every rank alike.
//
//   const auto end = train::run_steps(world, {.first_step = 0, .until = 100, .tokens_per_step = B * T},
//                                     [&](std::int64_t step) { return exec.step(...); },
//                                     [&](const std::string& path, std::int64_t step) { ...save... });
//   // end.done: steps done (fewer after a signal); end.loss: the last step's
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/train/metrics.hpp"
#include "loom/train/periodic_save.hpp"
#include "loom/train/progress.hpp"
#include "loom/train/stop_signal.hpp"

namespace loom::train {

struct StepLoop {
    std::int64_t first_step = 0;       // the step a resume starts at
    std::int64_t until = 0;            // the loop ends after this step
    std::int64_t tokens_per_step = 0;  // over all ranks, for tokens per second
    std::string metrics{};             // one JSON line per step on the lead rank; empty: none
    std::string save{};                // where periodic saves go; empty: none
    std::int64_t save_every = 0;       // 0: no periodic saves
    std::int64_t keep = 2;             // whole-file periodic saves kept, the newest
    bool sharded = false;              // `save` is a directory every save rewrites
    Device device = host_device;       // where the communicator's buffers live
};

struct StepLoopEnd {
    std::int64_t done = 0;  // the step the loop ended after: `until`, or earlier after a stop signal
    float loss = 0;         // the last step's loss
};

// `step(n)` trains step n and returns its loss (the same on every rank);
// `save(path, n)` saves the state after n steps to `path` (a collective).
template <comm::Communicator C, class Step, class Save>
StepLoopEnd run_steps(C& world, const StepLoop& loop, Step&& step, Save&& save) {
    const bool lead = world.rank() == 0;
    std::optional<MetricsWriter> metrics;
    std::optional<Progress> progress;
    if (lead && !loop.metrics.empty())
        metrics.emplace(loop.metrics, loop.first_step > 0 ? MetricsWriter::Mode::append : MetricsWriter::Mode::replace);
    if (lead) progress.emplace(loop.until - loop.first_step);
    StepLoopEnd end{loop.until, 0.0f};
    for (std::int64_t n = loop.first_step; n < loop.until; ++n) {
        const auto t0 = std::chrono::steady_clock::now();
        end.loss = step(n);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tokens_per_second = static_cast<double>(loop.tokens_per_step) / seconds;
        if (progress) progress->update(n - loop.first_step + 1, end.loss, tokens_per_second);
        if (metrics) metrics->write(n, end.loss, tokens_per_second);
        if (agree_to_stop(world, loop.device)) {
            end.done = n + 1;
            break;
        }
        if (loop.save_every > 0 && (n + 1) % loop.save_every == 0 && n + 1 < loop.until) {
            if (loop.sharded) {
                save(loop.save, n + 1);
            } else {
                save(periodic_checkpoint_path(loop.save, n + 1).string(), n + 1);
                if (lead) prune_periodic_checkpoints(loop.save, loop.keep);
            }
        }
    }
    if (progress) progress->finish();
    return end;
}

}  // namespace loom::train
