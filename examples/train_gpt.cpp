// train_gpt: trains loom's reference GPT byte by byte, on a text file or on a
// built-in synthetic corpus: on one core, on --dp x --pp x --tp x --sp rank
// threads of this process, on the processes of `mpirun -np N train_gpt`
// (found from the launcher's environment), or on GPUs (--device cuda). The
// strategy is one loom::StrategySpec, from --strategy TEXT or the piecewise
// flags; the executor runs it whatever it is, and every transport is one
// AnyComm, so nothing here dispatches on types. `train_gpt --help` lists
// every flag, docs/train_gpt.md says more. The flags are train_gpt_flags.hpp;
// what they must agree on before anything is built, train_gpt_checks.hpp
// (the degrees by plan/layout_rules.hpp); the pipeline's stages,
// train_gpt_stages.hpp; --device, train_gpt_device.hpp; --optex,
// train_gpt_optex.hpp; probes and stops, train_gpt_outputs.hpp. The loop
// around each step and the checkpoints are the library's (train/step_loop.hpp,
// train/executor_checkpoint.hpp, train/optex_checkpoint.hpp).
#include <loom/comm/any_comm.hpp>
#include <loom/comm/device_processes.hpp>
#include <loom/comm/device_ranks.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/comm/shaped.hpp>
#include <loom/comm/staged.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/core/device_runtime.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/sharded_checkpoint.hpp>
#include <loom/exec/trace.hpp>
#include <loom/gpt/model.hpp>
#include <loom/gpt/sample.hpp>
#include <loom/io/atomic_file.hpp>
#include <loom/kernels/attention_shape.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/kernels/matmul_precision.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/optex.hpp>
#include <loom/plan/cluster_json.hpp>
#include <loom/plan/gpt_description.hpp>
#include <loom/plan/layout_rules.hpp>
#include <loom/plan/stage_units.hpp>
#include <loom/schedule/partition.hpp>
#include <loom/plan/profile.hpp>
#include <loom/optim/schedule.hpp>
#include <loom/parallel/strategy_spec.hpp>
#include <loom/parallel/strategy_text.hpp>
#include <loom/train/compression_state.hpp>
#include <loom/train/data_identity.hpp>
#include <loom/train/executor_checkpoint.hpp>
#include <loom/train/finite_check.hpp>
#include <loom/train/setup_refusal.hpp>
#include <loom/train/launcher.hpp>
#include <loom/train/memory_preflight.hpp>
#include <loom/train/optex_checkpoint.hpp>
#include <loom/train/optex_gradient.hpp>
#include <loom/train/step_loop.hpp>
#include <loom/train/stop_signal.hpp>

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
#include <functional>
#include <numeric>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

#include "train_gpt_flags.hpp"

#include "train_gpt_checks.hpp"
#include "train_gpt_stages.hpp"
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

#include "train_gpt_device.hpp"

// --sample N: N bytes generated on the host from the whole model's values,
// prompted with the corpus's first 16 bytes.
void print_sample(const Flags& flags, const loom::data::ByteCorpus& corpus, const std::vector<float>& values) {
    loom::gpt::Model serial = loom::gpt::make_model(flags.model);
    loom::nn::ParamArena arena(serial);
    std::copy(values.begin(), values.end(), arena.values().begin());
    const std::string text = loom::gpt::sample(serial, flags.model, corpus.text().substr(0, 16), flags.sample, flags.seed);
    std::printf("sample:\n%s\n", text.c_str());
}

#include "train_gpt_optex.hpp"

// The executor's loop on `world`, whatever carries it (threads, shaped
// links, MPI, a GPU's ranks: one AnyComm, so one instantiation); or, with
// --optex, OptEx's, whose gradients run on `optex_device`.
void train(loom::comm::AnyComm& world, const Flags& flags, const char* transport,
           loom::Device optex_device = loom::host_device) {
    using C = loom::comm::AnyComm;
    if (flags.optex > 0) {
        train_optex(world, flags, transport, optex_device);
        return;
    }
    const int dp_size = flags.dp > 0 ? flags.dp : std::max(1, world.size() / (flags.pp * flags.tp * flags.sp));
    check_degrees(flags, world.size(), dp_size);
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
    const loom::data::ByteCorpus& corpus = *loaded;

    loom::comm::Mesh<C> mesh(world, {{"dp", dp_size}, {"pp", flags.pp}, {"tp", flags.tp}, {"sp", flags.sp}});
    // Sequence-parallel ranks reduce gradients with the data-parallel ones.
    C& dp = flags.sp > 1 ? mesh.combined({"dp", "sp"}) : mesh.axis("dp");
    const std::int64_t rows = flags.batch / dp_size;
    const loom::plan::ModelDescription gpt = loom::plan::describe_gpt(flags.model, flags.batch);
    std::vector<int> stage_layers, partition;  // per virtual stage: layers, and the executor's units
    if (flags.pp > 1) {
        stage_layers = gpt_partition(flags, gpt, flags.partition.empty()
                                                     ? profiled_unit_seconds(world, flags, corpus, rows / flags.micro_batches)
                                                     : std::vector<double>{});
        partition = loom::plan::units_per_stage(gpt, stage_layers);
    }
    loom::gpt::Model model = loom::gpt::make_model(flags.model);
    loom::exec::Executor<C> exec(model, dp, flags.pp > 1 ? &mesh.axis("pp") : nullptr,
                                 flags.tp > 1 ? &mesh.axis("tp") : nullptr,
                                 flags.sp > 1 ? &mesh.axis("sp") : nullptr, flags.strategy,
                                 {.micro_batches = flags.micro_batches,
                                  .adamw = loom::optim::AdamWConfig{flags.lr, 0.9f, 0.95f, 1e-8f, 0.1f,
                                                                     std::max<std::int64_t>(0, flags.freeze_variance)},
                                  .trace = !flags.trace.empty(),
                                  .field_names = {"embed", "blocks", "ln_f", "head", "loss"},
                                  .partition = partition,
                                  .exchange = {.compress_warmup = flags.warmup_steps()},
                                  .device = flags.device,
                                  .matmul = flags.matmul});
    const auto parameters = exec.parameter_count();  // the whole model, whatever this rank holds
    // A compressor's state is per rank: checkpoints keep it under a signature of the compressor and the degrees.
    const std::string compression_signature =
        flags.compress().on() ? loom::train::compression_signature(flags.compress(), dp_size, flags.pp, flags.tp, flags.sp)
                              : std::string();
    std::string compression_note;  // why a resume starts the compressor's state from zero
    std::int64_t first_step = 0;
    if (flags.resume.empty()) exec.initialize(flags.seed);
    else first_step = loom::train::resume_executor(world, exec, flags.model, flags.resume, compression_signature, compression_note);

    if (lead) {
        std::ostringstream config;
        config << flags.model;
        std::printf("%s, %lld parameters, batch %lld x %lld tokens, %s\n", config.str().c_str(),
                    static_cast<long long>(parameters), static_cast<long long>(flags.batch),
                    static_cast<long long>(flags.model.seq), corpus.describe().c_str());
        std::printf("%s on %d %s%s, %d micro-batch%s, %d BLAS thread%s per rank\n", flags.strategy.text().c_str(), world.size(),
                    transport,
                    flags.pp == 1 && flags.tp == 1 && flags.sp == 1
                        ? ""
                        : (" (dp " + std::to_string(dp_size) + " x pp " + std::to_string(flags.pp) + " x tp " +
                           std::to_string(flags.tp) + (flags.sp > 1 ? " x sp " + std::to_string(flags.sp) : "") +
                           ")").c_str(),
                    flags.micro_batches, flags.micro_batches == 1 ? "" : "es", flags.threads, flags.threads == 1 ? "" : "s");
        print_matmul_precision(flags);
        std::printf("host GEMM: %s\n", loom::kernels::host::host_gemm_report().c_str());
        if (flags.pp > 1)
            std::printf("pipeline stages (%s): %s\n", flags.partition.empty() ? "balanced over measured layer times" : "--partition",
                        loom::plan::describe_stages(gpt, stage_layers).c_str());
        if (flags.tp > 1) std::printf("%s\n", exec.cut_report().summary().c_str());  // what tp did to the layers
        const unsigned cores = std::thread::hardware_concurrency();
        if (cores > 0 && std::string_view(transport) == "rank threads" &&
            static_cast<unsigned>(world.size() * flags.threads) > cores)
            std::printf("note: %d ranks x %d BLAS threads oversubscribe the %u cores; expect lower speed\n", world.size(),
                        flags.threads, cores);
        if (first_step > 0) std::printf("resumed from %s at step %lld\n", flags.resume.c_str(), static_cast<long long>(first_step));
        if (!compression_note.empty())
            std::printf("note: %s; the error feedback starts from zero\n", compression_note.c_str());
        if (flags.warmup_steps() > 0)
            std::printf("%s starts after %lld uncompressed warm-up steps\n", flags.compress().describe().c_str(),
                        static_cast<long long>(flags.warmup_steps()));
    }

    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * flags.model.seq)), targets(inputs.size());
    const auto input_tensor = loom::Tensor::of(inputs.data(), {rows, flags.model.seq});
    const auto target_tensor = loom::Tensor::of(targets.data(), {rows, flags.model.seq});
    const std::int64_t total = flags.steps, last = flags.until;
    std::optional<loom::exec::ShardedSave<C>> sharded_save;  // --sharded: a save writing while training goes on
    const auto identity = loom::train::run_identity_metadata(flags.data, flags.seed);  // for a resume to check
    const auto [done, loss] = loom::train::run_steps(
        world, step_loop(flags, first_step, flags.batch * flags.model.seq, flags.device),
        [&](std::int64_t step) {
            corpus.rows(flags.seed, step, mesh.coordinate("dp") * rows, rows, flags.model.seq, inputs, targets);
            const float lr = loom::optim::cosine_lr(step + 1, total, flags.lr, std::min<std::int64_t>(20, total / 10));
            const float step_loss = exec.step(input_tensor, target_tensor, lr);
            loom::train::check_finite_loss(step_loss, step);  // the same loss on every rank: all stop together
            return step_loss;
        },
        [&](const std::string& path, std::int64_t step) {
            if (flags.sharded)
                loom::train::save_executor_sharded(world, exec, flags.model, path, step, corpus.describe(), identity,
                                                   compression_signature, sharded_save);
            else
                (void)loom::train::save_executor(world, exec, flags.model, path, step, corpus.describe(), identity,
                                                 compression_signature);
        });
    if (lead && done > first_step)
        std::printf("final loss %.4f after %lld steps\n", static_cast<double>(loss), static_cast<long long>(done));
    if (lead && world.size() > 1) {
        std::ostringstream report;
        report << exec.memory_report();
        std::printf("memory per rank: %s\n", report.str().c_str());
    }

    // The checkpoint first: a trace that cannot be written must not cost it.
    if (flags.sharded) {
        loom::train::save_executor_sharded(world, exec, flags.model, flags.save, done, corpus.describe(), identity,
                                           compression_signature, sharded_save);
        sharded_save->finish();
        if (lead)
            std::printf("saved %s (step %lld, one shard per rank)\n", flags.save.c_str(), static_cast<long long>(done));
    }
    const std::string whole_file = flags.sharded ? std::string() : flags.save;
    if (!whole_file.empty() || flags.sample > 0) {
        const std::vector<float> values = loom::train::save_executor(world, exec, flags.model, whole_file, done,
                                                                     corpus.describe(), identity, compression_signature);
        if (lead && !whole_file.empty()) std::printf("saved %s (step %lld)\n", flags.save.c_str(), static_cast<long long>(done));
        if (lead && flags.sample > 0 && done == last) print_sample(flags, corpus, values);
    }
    if (!flags.trace.empty()) {
        loom::exec::write_trace(world, exec.trace(), flags.trace, flags.device);
        if (lead) std::printf("trace of %d ranks written to %s (open in ui.perfetto.dev)\n", world.size(), flags.trace.c_str());
    }
    if (lead && done < last) report_stop(flags, done);
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
                if (flags.device.kind == loom::DeviceKind::host) {
                    train(host, flags, "MPI processes");
                    return;
                }
                // One GPU per process, the processes joined over NCCL
                // (bootstrapped through MPI), each training on its GPU's stream;
                // OptEx's state and collectives stay on the host, over MPI.
                const loom::Device device = process_device(flags);
                if (flags.optex > 0) {
                    train(host, flags, device_transport(device, "MPI processes, one GPU each, rank 0").c_str(), device);
                    return;
                }
                // NCCL pairs one link's messages in the order they are issued,
                // whatever their tags, and ZB-V's two ranks of a link post
                // activations and gradients in different orders (transport_nccl.hpp).
                if (flags.pp > 1 && flags.strategy.schedule == loom::ScheduleKind::zero_bubble_v)
                    usage_error("--schedule zbv with --device cuda under mpirun: NCCL pairs a link's messages in the "
                                "order they are sent, and ZB-V's ranks send and receive them in different orders; "
                                "use --schedule gpipe, 1f1b, zb or interleaved, or rank threads on one GPU "
                                "(no mpirun)");
                const std::string transport = device_transport(device, "NCCL processes, one GPU each, rank 0");
                loom::comm::run_process_on(device, host,
                                           [&](loom::comm::AnyComm& gpus) { train(gpus, flags, transport.c_str()); });
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
    const std::string threads = ranks == 1 ? "rank thread" : "rank threads";
    if (flags.device.kind != loom::DeviceKind::host && flags.optex == 0) {
        // Rank threads on the GPU (the backend's world), each with its own stream.
        const std::string transport = device_transport(flags.device, threads);
        loom::comm::run_ranks_on(flags.device, ranks,
                                 [&](loom::comm::AnyComm& comm) { train(comm, flags, transport.c_str()); });
        return refused_run() ? 1 : stop.exit_code();
    }
    // Host rank threads; with --device and OptEx, its state and collectives
    // stay in host memory and each thread computes its gradients on the GPU.
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
    const std::string transport = flags.device.kind != loom::DeviceKind::host ? device_transport(flags.device, threads)
                                  : cluster ? "rank threads" : threads;
    loom::comm::ThreadWorld(ranks).run([&](loom::comm::ThreadComm& comm) {
        std::optional<loom::comm::Shaped<loom::comm::ThreadComm>> shaped;
        if (cluster) shaped.emplace(std::move(comm), cluster->links());
        loom::comm::AnyComm world = shaped ? loom::comm::AnyComm::view(*shaped) : loom::comm::AnyComm::view(comm);
        train(world, flags, transport.c_str(), flags.device);
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
