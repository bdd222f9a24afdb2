// An executor run's saves, bound once to what every save of the run shares
// (the world, the executor, the model's configuration, the data's name, the
// run's identity for a resume to check, the compressor's signature, whether
// saves are sharded): the periodic save run_steps calls, and the run's end,
// in the order that loses nothing: the checkpoint first (a trace that cannot
// be written must not cost it), then whatever uses the whole model's values
// (a sample), then the trace. A sharded save writes in the background while
// training goes on and is finished by the next save, or by the end.
//
//   train::ExecutorSaves<C> saves(world, exec, config, corpus.describe(), identity, signature, sharded);
//   const auto end = train::run_steps(world, loop, step, saves);
//   saves.finish({.save = path, .step = end.done, .trace = trace_path}, [&](const auto& values) { ... });
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/exec/executor.hpp"
#include "loom/exec/sharded_checkpoint.hpp"
#include "loom/exec/trace.hpp"
#include "loom/gpt/model.hpp"
#include "loom/train/executor_checkpoint.hpp"

namespace loom::train {

// What a run's end writes; an empty path writes nothing there.
struct RunOutputs {
    std::string save{};            // the checkpoint: a file, or a directory when sharded
    std::int64_t step = 0;       // the step the run ended after
    std::string trace{};           // the step programs' Chrome/Perfetto trace of every rank
    Device device = host_device;  // the memory the world moves (the trace's gather goes through it)
};

template <comm::Communicator C>
class ExecutorSaves {
public:
    ExecutorSaves(C& world, exec::Executor<C>& exec, gpt::Config config, std::string data,
                  std::map<std::string, std::string> identity, std::string compression_signature, bool sharded)
        : world_(world), exec_(exec), config_(std::move(config)), data_(std::move(data)), identity_(std::move(identity)),
          signature_(std::move(compression_signature)), sharded_(sharded) {}

    // Saves the state after `step` to `path`, a collective: a sharded save
    // starts writing (after finishing the one before); one file is gathered
    // and written by rank 0 once it is checked finite.
    void operator()(const std::string& path, std::int64_t step) {
        if (sharded_)
            save_executor_sharded(world_, exec_, config_, path, step, data_, identity_, signature_, in_flight_);
        else
            (void)save_executor(world_, exec_, config_, path, step, data_, identity_, signature_);
    }

    // The run's end, a collective: the checkpoint (`out.save`, when given),
    // then `use_values` with the whole model's values on every rank (when
    // given; gathered with the whole-file save, or alone), then the trace.
    // The lead says what it wrote.
    void finish(const RunOutputs& out, const std::function<void(const std::vector<float>&)>& use_values = {}) {
        const bool lead = world_.rank() == 0;
        if (sharded_ && !out.save.empty()) {
            (*this)(out.save, out.step);
            in_flight_->finish();
            in_flight_.reset();
            if (lead) std::printf("saved %s (step %lld, one shard per rank)\n", out.save.c_str(), static_cast<long long>(out.step));
        }
        const std::string whole_file = sharded_ ? std::string() : out.save;
        if (!whole_file.empty() || use_values) {
            const std::vector<float> values =
                save_executor(world_, exec_, config_, whole_file, out.step, data_, identity_, signature_);
            if (lead && !whole_file.empty())
                std::printf("saved %s (step %lld)\n", whole_file.c_str(), static_cast<long long>(out.step));
            if (use_values) use_values(values);
        }
        if (!out.trace.empty()) {
            exec::write_trace(world_, exec_.trace(), out.trace, out.device);
            if (lead)
                std::printf("trace of %d ranks written to %s (open in ui.perfetto.dev)\n", world_.size(), out.trace.c_str());
        }
    }

private:
    C& world_;
    exec::Executor<C>& exec_;
    gpt::Config config_;
    std::string data_{};
    std::map<std::string, std::string> identity_;
    std::string signature_{};
    bool sharded_;
    std::optional<exec::ShardedSave<C>> in_flight_;  // a sharded save still writing
};

}  // namespace loom::train
