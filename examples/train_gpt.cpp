// train_gpt: trains loom's reference GPT byte by byte, on a text file or on a
// built-in synthetic corpus: on one core, on --dp x --pp x --tp x --sp rank
// threads of this process, on the processes of `mpirun -np N train_gpt`
// (found from the launcher's environment), or on GPUs (--device cuda). The
// strategy is one loom::StrategySpec, from --strategy TEXT or the piecewise
// flags. `train_gpt --help` lists every flag, docs/train_gpt.md says more.
// This program is its flags (train_gpt_flags.hpp), what they must agree on
// before anything is built (train_gpt_checks.hpp: the degrees by
// plan/layout_rules.hpp) and the files it writes (train_gpt_outputs.hpp);
// the rest is loom::train's: where the ranks run (transport_launch.hpp), the
// executor's run (gpt_executor_run.hpp: stages, resume, summary, step loop,
// saves) and OptEx's (optex_run.hpp).
#include <loom/comm/any_comm.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/sharded_checkpoint.hpp>
#include <loom/gpt/model.hpp>
#include <loom/io/atomic_file.hpp>
#include <loom/kernels/attention_shape.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/kernels/matmul_precision.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/optex.hpp>
#include <loom/parallel/strategy_spec.hpp>
#include <loom/parallel/strategy_text.hpp>
#include <loom/plan/cluster_json.hpp>
#include <loom/plan/gpt_description.hpp>
#include <loom/plan/layout_rules.hpp>
#include <loom/schedule/partition.hpp>
#include <loom/train/data_identity.hpp>
#include <loom/train/gpt_executor_run.hpp>
#include <loom/train/launcher.hpp>
#include <loom/train/memory_preflight.hpp>
#include <loom/train/optex_run.hpp>
#include <loom/train/setup_refusal.hpp>
#include <loom/train/step_loop.hpp>
#include <loom/train/stop_signal.hpp>
#include <loom/train/transport_launch.hpp>

#if LOOM_EXAMPLE_WITH_MPI
#include <loom/comm/communicator_mpi.hpp>
#include <loom/comm/session_mpi.hpp>
#endif

#include <CLI/CLI.hpp>

#include "train_gpt_spelling.hpp"  // tools/: the schedule spellings loom-plan shares

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

#include "train_gpt_flags.hpp"

#include "train_gpt_checks.hpp"
#include "train_gpt_outputs.hpp"

// The training loop's settings (train/step_loop.hpp) for a run resumed at `first_step`.
loom::train::StepLoop step_loop(const Flags& flags, std::int64_t first_step, std::int64_t tokens_per_step,
                                loom::Device device) {
    LOOM_CHECK(first_step <= flags.until, "train_gpt: the checkpoint ", flags.resume, " is at step ", first_step,
               ", past --until ", flags.until);
    return {.first_step = first_step, .until = flags.until, .tokens_per_step = tokens_per_step, .metrics = flags.metrics,
            .save = flags.save, .save_every = flags.save_every, .keep = flags.keep, .sharded = flags.sharded,
            .device = device};
}

// --optex N: OptEx<AdamW> over N workers, each a group of --dp ranks, in its
// own loop (train/optex_run.hpp); its state stays on the host, `device`
// computes the gradients.
void train_optex(loom::comm::AnyComm& world, const Flags& flags, const char* transport, loom::Device device) {
    const int dp_size = optex_dp_size(flags, world.size());
    loom::kernels::host::set_blas_threads(flags.threads);
    const std::int64_t done = loom::train::run_optex_gpt(
        world,
        {.workers = flags.optex, .dp = dp_size, .model = flags.model, .batch = flags.batch, .strategy = flags.strategy,
         .device = device, .matmul = flags.matmul, .matmul_note = matmul_note(flags), .seed = flags.seed, .lr = flags.lr,
         .steps = flags.steps, .optex = flags.optex_config, .data = flags.data, .resume = flags.resume, .save = flags.save,
         .sharded = flags.sharded, .sample = flags.sample},
        load_corpus(flags), transport, [&](std::int64_t first_step) {
            return step_loop(flags, first_step, flags.optex * flags.batch * flags.model.seq, loom::host_device);
        });
    if (world.rank() == 0 && done < flags.until) report_stop(flags, done);
}

// The executor's run on `world` (train/gpt_executor_run.hpp), whatever
// carries it (threads, shaped links, MPI, a GPU's ranks: one AnyComm, so one
// instantiation); or, with --optex, OptEx's, whose gradients run on `optex_device`.
void train(loom::comm::AnyComm& world, const Flags& flags, const char* transport, loom::Device optex_device) {
    if (flags.optex > 0) {
        train_optex(world, flags, transport, optex_device);
        return;
    }
    const int dp_size = dp_degree(flags, world.size());
    loom::kernels::host::set_blas_threads(flags.threads);
    const bool lead = world.rank() == 0;
    // A corpus that cannot be read, or too short for one sequence, is refused
    // before anything is built: by every rank alike, so the lead says it once.
    std::optional<loom::data::ByteCorpus> loaded;
    const auto refusal = loom::train::refusal_of([&] { loaded = load_corpus(flags); });
    if (loom::train::refused_everywhere(world, refusal, flags.device)) {
        refuse_run(refusal.message, lead);
        return;
    }
    const std::int64_t done = loom::train::run_gpt_executor(
        world,
        {.model = flags.model, .batch = flags.batch, .dp = dp_size, .pp = flags.pp, .tp = flags.tp, .sp = flags.sp,
         .micro_batches = flags.micro_batches, .strategy = flags.strategy, .partition = flags.partition,
         .partition_from = "--partition", .device = flags.device, .matmul = flags.matmul, .matmul_note = matmul_note(flags),
         .blas_threads = flags.threads, .compress_warmup = flags.warmup_steps(), .seed = flags.seed, .lr = flags.lr,
         .steps = flags.steps, .data = flags.data, .resume = flags.resume, .save = flags.save, .sharded = flags.sharded,
         .trace = flags.trace, .sample = flags.sample},
        *loaded, transport,
        [&](const std::vector<int>& partition) -> loom::exec::ExecutorOptions {
            return {.micro_batches = flags.micro_batches,
                    .adamw = loom::optim::AdamWConfig{flags.lr, 0.9f, 0.95f, 1e-8f, 0.1f,
                                                       std::max<std::int64_t>(0, flags.freeze_variance)},
                    .trace = !flags.trace.empty(),
                    .field_names = {"embed", "blocks", "ln_f", "head", "loss"},
                    .partition = partition,
                    .compress_warmup = flags.warmup_steps(),
                    .device = flags.device,
                    .matmul = flags.matmul};
        },
        [&](std::int64_t first_step) { return step_loop(flags, first_step, flags.batch * flags.model.seq, flags.device); });
    if (lead && done < flags.until) report_stop(flags, done);
}

int run(int argc, char** argv) {
    const Flags flags = parse(argc, argv);
    check_device_flags(flags);
    check_outputs_and_resume(flags);
    // Under mpirun the degrees and the memory are checked from the launcher's
    // world size before MPI starts: every process refuses alike, rank 0 says
    // why (main), and none waits for another or aborts the job.
    using loom::train::launched_by_mpi;
    if (const int world = loom::train::launcher_world_size(); launched_by_mpi() && world > 0)
        check_memory(flags, dp_degree(flags, world), 1);
    else if (!launched_by_mpi())
        check_memory(flags, flags.dp > 0 ? flags.dp : 1,
                     (flags.dp > 0 ? flags.dp : 1) * flags.pp * flags.tp * flags.sp * std::max(1, flags.optex));
    // From here SIGINT and SIGTERM stop the run after its current step
    // (saving it), and run() returns 130 or 143.
    const loom::train::StopSignal stop;
    // Where the ranks run is the library's (train/transport_launch.hpp); a
    // device it refuses is named by the flag that chose it.
    const loom::train::TransportBody train_on = [&](loom::comm::AnyComm& world, const char* transport, loom::Device device) {
        train(world, flags, transport, device);
    };
    const auto on_device = [](auto&& launch) {
        try {
            launch();
        } catch (const loom::train::DeviceRefused& e) {
            usage_error("--device " + e.message());
        }
    };
    if (launched_by_mpi()) {
        if (!flags.cluster.empty())
            usage_error("--cluster " + flags.cluster + " shapes the links between rank threads; under mpirun the "
                        "processes use the real ones: drop --cluster");
#if LOOM_EXAMPLE_WITH_MPI
        loom::comm::MpiSession session(argc, argv);
        auto world = loom::comm::Mpi::world();
        try {
            world.run([&](loom::comm::Mpi& comm) {
                loom::comm::AnyComm host = loom::comm::AnyComm::view(comm);
                on_device([&] {
                    loom::train::launch_on_processes(host, flags.device, flags.device_per_process, flags.optex > 0, train_on);
                });
            });
        } catch (const std::exception& e) {
            // Printed here, before the session ends the job with MPI_Abort.
            std::fprintf(stderr, "%s\n", e.what());
            return 1;
        }
        return refused_run() ? 1 : stop.exit_code();
#else
        usage_error("started by an MPI launcher, but this build has no MPI (configure with LOOM_WITH_MPI=ON)");
#endif
    }
    const int ranks = device_ranks(flags) * std::max(1, flags.optex);
    std::optional<loom::plan::Cluster> cluster;
    if (!flags.cluster.empty()) {
        // The rank threads' traffic takes as long as it would over the
        // cluster's links (comm/shaped.hpp): the runs loom-plan's cost model is checked against.
        cluster = loom::plan::load_cluster(flags.cluster);
        if (cluster->size() != ranks)
            usage_error("--cluster " + flags.cluster + " describes " + std::to_string(cluster->size()) +
                        " devices but the run has " + std::to_string(ranks) +
                        " ranks; give a cluster with one device per rank");
        std::ostringstream links;
        links << cluster->links();
        std::printf("links of %s: %s\n", flags.cluster.c_str(), links.str().c_str());
    }
    // With --device and OptEx, its state and collectives stay in host memory
    // and each thread computes its gradients on the GPU.
    on_device([&] {
        loom::train::launch_rank_threads({.ranks = ranks, .device = flags.device, .cluster = cluster ? &*cluster : nullptr,
                                          .host_collectives = flags.optex > 0},
                                         train_on);
    });
    return refused_run() ? 1 : stop.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        // Under mpirun, an error found before MPI starts is every process's:
        // rank 0 prints it once.
        if (loom::train::launcher_rank() == 0) std::fprintf(stderr, "%s\n", e.what());
        else loom::train::let_rank_zero_report_first();
        return 1;
    }
}
