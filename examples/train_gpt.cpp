// train_gpt: trains loom's reference GPT byte by byte, on a text file or on a
// built-in synthetic corpus: on one core, on --dp x --pp x --tp x --sp rank
// threads of this process, on the processes of `mpirun -np N train_gpt`
// (found from the launcher's environment), or on GPUs (--device cuda). The
// strategy is one loom::StrategySpec, from --strategy TEXT or the piecewise
// flags. `train_gpt --help` lists every flag, docs/train_gpt.md says more.
// This program is its flags (train_gpt_flags.hpp) and what they must agree
// on before anything is built (train_gpt_checks.hpp, by the library's rules:
// gpt_training_rules.hpp); the rest is loom::train's: the run's
// settings (gpt_training.hpp), where the ranks run (transport_launch.hpp),
// the executor's run (gpt_executor_run.hpp: stages, resume, summary, step
// loop, saves) and OptEx's (optex_run.hpp).
#include <loom/comm/any_comm.hpp>
#include <loom/core/setting_names.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/kernels/matmul_precision.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/optex.hpp>
#include <loom/parallel/strategy_spec.hpp>
#include <loom/parallel/strategy_text.hpp>
#include <loom/plan/cluster_json.hpp>
#include <loom/train/gpt_executor_run.hpp>
#include <loom/train/gpt_training.hpp>
#include <loom/train/gpt_training_rules.hpp>
#include <loom/train/launcher.hpp>
#include <loom/train/optex_run.hpp>
#include <loom/train/setup_refusal.hpp>
#include <loom/train/stop_signal.hpp>
#include <loom/train/transport_launch.hpp>

#if LOOM_EXAMPLE_WITH_MPI
#include <loom/comm/communicator_mpi.hpp>
#include <loom/comm/session_mpi.hpp>
#include <loom/train/transport_launch_mpi.hpp>
#endif

#include <CLI/CLI.hpp>

#include "train_gpt_spelling.hpp"  // tools/: the schedule spellings loom-plan shares

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

#include "train_gpt_flags.hpp"

#include "train_gpt_checks.hpp"

// --optex N: OptEx<AdamW> over N workers, each a group of --dp ranks, in its
// own loop (train/optex_run.hpp); its state stays on the host, `device`
// computes the gradients.
void train_optex(loom::comm::AnyComm& world, const Flags& flags, const char* transport, loom::Device device) {
    const int dp_size = dp_degree(flags, world.size());
    loom::kernels::host::set_blas_threads(flags.threads);
    loom::train::GptTraining run = flags;
    run.device = device;  // where the gradients run; OptEx's state stays on the host
    const std::int64_t done = loom::train::run_optex_gpt(
        world, run, {.dp = dp_size, .transport = transport, .matmul_note = matmul_note(flags)},
        loom::train::training_corpus(flags));
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
    // A corpus that cannot be read, or too short for one sequence, is refused
    // before anything is built: by every rank alike, so the lead says it once
    // (and the process exits 1 after its ranks return).
    std::optional<loom::data::ByteCorpus> loaded;
    const auto refusal = loom::train::refusal_of([&] { loaded = loom::train::training_corpus(flags); });
    if (loom::train::refuse_if_everywhere(world, refusal, flags.device)) return;
    const std::int64_t done = loom::train::run_gpt_executor(
        world, flags,
        {.dp = dp_size, .transport = transport, .matmul_note = matmul_note(flags), .partition_from = "--partition"},
        *loaded,
        [&](const std::vector<int>& partition) -> loom::exec::ExecutorOptions {
            return {.micro_batches = flags.micro_batches,
                    .adamw = loom::optim::AdamWConfig{flags.lr, 0.9f, 0.95f, 1e-8f, 0.1f,
                                                       std::max<std::int64_t>(0, flags.freeze_variance)},
                    .trace = !flags.trace.empty(),
                    .field_names = {"embed", "blocks", "ln_f", "head", "loss"},
                    .partition = partition,
                    .exchange = {.compress_warmup = flags.warmup_steps()},
                    .device = flags.device,
                    .matmul = flags.matmul};
        });
    if (world.rank() == 0 && done < flags.until) report_stop(flags, done);
}

// What an error says: the library's refusal of a device in the words of the
// flag that chose it, any other as it is.
std::string said(const std::exception& e) {
    const auto* refused = dynamic_cast<const loom::train::DeviceRefused*>(&e);
    return refused != nullptr ? usage("--device " + refused->message()).what() : e.what();
}

int run(int argc, char** argv) {
    const Flags flags = parse(argc, argv);
    check_device_and_files(flags);
    // Under mpirun the degrees and the memory are checked from the launcher's
    // world size before MPI starts: every process refuses alike, rank 0 says
    // why (main), and none waits for another or aborts the job.
    using loom::train::launched_by_mpi;
    // Without mpirun, the rank threads the degrees name (per OptEx worker).
    const int ranks = (flags.dp > 0 ? flags.dp : 1) * flags.pp * flags.tp * flags.sp * std::max(1, flags.optex);
    if (const int world = loom::train::launcher_world_size(); launched_by_mpi() && world > 0)
        check_memory(flags, dp_degree(flags, world), 1);
    else if (!launched_by_mpi())
        check_memory(flags, flags.dp > 0 ? flags.dp : 1, ranks);
    // From here SIGINT and SIGTERM stop the run after its current step
    // (saving it), and run() returns 130 or 143.
    const loom::train::StopSignal stop;
    // Where the ranks run is the library's (train/transport_launch.hpp); a
    // device it refuses is named by the flag that chose it (said()).
    const loom::train::TransportBody train_on = [&](loom::comm::AnyComm& world, const char* transport,
                                                    loom::Device device) { train(world, flags, transport, device); };
    if (launched_by_mpi()) {
        if (!flags.cluster.empty())
            usage_error("--cluster " + flags.cluster + " shapes the links between rank threads; under mpirun the "
                        "processes use the real ones: drop --cluster");
#if LOOM_EXAMPLE_WITH_MPI
        loom::comm::MpiSession session(argc, argv);
        // An error is printed inside, by every process, before the session ends the job with MPI_Abort.
        if (!loom::train::launch_mpi_processes(loom::comm::Mpi::world(),
                                               {.device = flags.device,
                                                .per_process = flags.device_per_process,
                                                .host_collectives = flags.optex > 0},
                                               train_on, said))
            return 1;
        return loom::train::run_refused() ? 1 : stop.exit_code();
#else
        usage_error("started by an MPI launcher, but this build has no MPI (configure with LOOM_WITH_MPI=ON)");
#endif
    }
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
    loom::train::launch_rank_threads({.ranks = ranks,
                                      .device = flags.device,
                                      .cluster = cluster ? &*cluster : nullptr,
                                      .host_collectives = flags.optex > 0},
                                     train_on);
    return loom::train::run_refused() ? 1 : stop.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        // Under mpirun, an error found before MPI starts is every process's:
        // rank 0 prints it once.
        if (loom::train::launcher_rank() == 0) std::fprintf(stderr, "%s\n", said(e).c_str());
        else loom::train::let_rank_zero_report_first();
        return 1;
    }
}
