// What train_gpt's flags must agree on before anything is built, checked
// the same way on every rank so that every rank stops with the same one-line
// message: the degrees against the world size and the model (the planner's
// rules, plan/layout_rules.hpp), OptEx's workers, --device, the memory, the
// files it writes and resumes (train/file_preflight.hpp); and how a stopped
// run says where it stands. Included by train_gpt.cpp inside its anonymous
// namespace, after train_gpt_flags.hpp.
#pragma once

// The degrees and the strategy against a world of `world` ranks and the
// model, by the planner's rules (plan/layout_rules.hpp: the same sentence on
// every rank), then what only train_gpt's flags say: --partition's text, and
// interleaving's even split when it is not given.
inline void check_degrees(const Flags& flags, int world, int dp) {
    const loom::plan::Layout layout{dp, flags.pp, flags.tp, flags.sp, flags.micro_batches, flags.strategy, {}};
    if (const std::string why = loom::plan::why_invalid(loom::plan::describe_gpt(flags.model, flags.batch), layout, world);
        !why.empty())
        usage_error(why);
    if (flags.pp == 1) return;
    const int chunks = flags.strategy.chunks, stages = layout.virtual_stages(), layers = static_cast<int>(flags.model.layers);
    if (!flags.partition.empty()) {
        (void)flag_checked("", [&] {
            return loom::schedule::parse_partition(flags.partition, layers, stages, chunks == 1 ? "" : "--pp " +
                                                   std::to_string(flags.pp) + " x " + std::to_string(chunks) +
                                                   " chunks is " + std::to_string(stages));
        });
    } else if (flags.strategy.schedule == loom::ScheduleKind::interleaved && layers % stages != 0) {
        usage_error("--schedule interleaved with " + std::to_string(chunks) + " chunks per rank needs the " +
                    std::to_string(layers) + " layers to split evenly into " + std::to_string(stages) +
                    " chunks (--layers divisible by --pp x --chunks); use --chunks dividing the " +
                    (layers % flags.pp == 0 ? std::to_string(layers / flags.pp) + " " : "") +
                    "layers per stage, other --layers, or --partition");
    }
}

// --optex N: the workers' dp degree in a world of `world` ranks.
inline int optex_dp_size(const Flags& flags, int world) {
    const int workers = flags.optex;
    if (world % workers != 0)
        usage_error("--optex " + std::to_string(workers) + " needs a multiple of " + std::to_string(workers) +
                    " ranks (one group per worker), but there are " + std::to_string(world) + "; use --optex " +
                    std::to_string(std::gcd(world, workers)) + " or " + std::to_string(workers) + " x --dp ranks");
    const int dp_size = flags.dp > 0 ? flags.dp : world / workers;
    if (dp_size * workers != world)
        usage_error("--optex " + std::to_string(workers) + " x --dp " + std::to_string(dp_size) + " = " +
                    std::to_string(dp_size * workers) + " ranks, but there are " + std::to_string(world));
    if (flags.batch % dp_size != 0)
        usage_error("--batch " + std::to_string(flags.batch) + " is not divisible by --dp " + std::to_string(dp_size) +
                    "; every rank needs the same whole number of sequences");
    return dp_size;
}

// The degrees against a world of `world` ranks (under mpirun, known from the
// launcher before MPI starts, so every process refuses them alike); the dp
// degree they give.
inline int dp_degree(const Flags& flags, int world) {
    if (flags.optex > 0) return optex_dp_size(flags, world);
    const int dp = flags.dp > 0 ? flags.dp : std::max(1, world / (flags.pp * flags.tp * flags.sp));
    check_degrees(flags, world, dp);
    return dp;
}

// The memory preflight (train/memory_preflight.hpp) for `ranks_in_process`
// host ranks of a run whose dp degree is `dp`. A device run's states live on
// the device, which this does not measure.
inline void check_memory(const Flags& flags, int dp, int ranks_in_process) {
    if (flags.no_memory_check || flags.device.kind != loom::DeviceKind::host) return;
    const loom::train::TrainingLayout layout = loom::train::training_layout(flags, dp, ranks_in_process);
    try {
        loom::train::check_memory_fits(loom::train::gpt_training_memory(flags.model, layout),
                                       loom::train::available_memory(),
                                       {.lower_activations = flags.strategy.recompute.on()
                                                                     ? "--batch (or raise --micro-batches or --dp)"
                                                                     : "--batch (or raise --micro-batches or --dp, or pass --recompute full)",
                                        .lower_model_states = "--width or --layers (or raise --zero, --pp or --tp)",
                                        .skip_check = "--no-memory-check"});
    } catch (const loom::Error& e) {
        throw loom::Error("train_gpt: " + e.message() + " (checked before allocating)");
    }
}

// --device's own checks, before anything runs: --cluster's links are shaped
// between host threads by host clocks, while a GPU's work runs
// asynchronously to them (the modelled times would not be the run's); heads
// wider than the CUDA attention kernels take; and under mpirun, ZB-V over
// NCCL, which pairs one link's messages in the order they are issued,
// whatever their tags, while ZB-V's two ranks of a link post activations and
// gradients in different orders (transport_nccl.hpp). The device itself is
// checked where the ranks start (train/transport_launch.hpp).
inline void check_device_flags(const Flags& flags) {
    if (flags.device.kind == loom::DeviceKind::host) return;
    std::ostringstream where;
    where << flags.device;
    if (!flags.cluster.empty())
        usage_error("--device " + where.str() + " runs every flag but --cluster, whose links delay rank threads by "
                    "host clocks while the GPU's work runs asynchronously to them; drop --cluster or use "
                    "--device host");
    const std::int64_t width = flags.model.width, limit = loom::kernels::cuda_attention_max_head_size;
    const std::int64_t head_size = width / flags.model.heads;
    if (flags.device.kind == loom::DeviceKind::cuda && head_size > limit) {
        // The fewest heads that divide the width into heads of at most `limit`
        // (width itself always does: heads of one feature).
        std::int64_t fits = (width + limit - 1) / limit;
        while (width % fits != 0) ++fits;
        usage_error("--device " + where.str() + ": --width " + std::to_string(width) + " over --heads " +
                    std::to_string(flags.model.heads) + " gives heads of " + std::to_string(head_size) +
                    " features; the CUDA attention kernels take at most " + std::to_string(limit) + ": use --heads " +
                    std::to_string(fits) + " (or another divisor of --width giving heads of at most " +
                    std::to_string(limit) + "), or --device host");
    }
    if (loom::train::launched_by_mpi() && flags.optex == 0 && flags.pp > 1 &&
        flags.strategy.schedule == loom::ScheduleKind::zero_bubble_v)
        usage_error("--schedule zbv with --device cuda under mpirun: NCCL pairs a link's messages in the "
                    "order they are sent, and ZB-V's ranks send and receive them in different orders; "
                    "use --schedule gpipe, 1f1b, zb or interleaved, or rank threads on one GPU "
                    "(no mpirun)");
}

// Before any rank starts: --save (a directory when --sharded) and --trace
// can be written, the temporaries a killed run left beside --save are
// removed, and --resume leaves steps to train and continues this run's data
// and seed (or --resume-anyway says go on).
inline void check_outputs_and_resume(const Flags& flags) {
    const std::tuple<const char*, std::string, bool> outputs[] = {{"--save", flags.save, flags.sharded},
                                                                  {"--trace", flags.trace, false}};
    for (const auto& [flag, path, directory] : outputs) {
        try {
            loom::train::prepare_output(path, directory, flag == std::string_view("--save"));
        } catch (const loom::Error& e) {
            throw loom::Error("train_gpt: " + std::string(flag) + " " + e.message());
        }
    }
    if (flags.resume.empty()) return;
    const auto step = loom::train::checkpoint_step(flags.resume);
    LOOM_CHECK(!step || *step <= flags.until, "train_gpt: the checkpoint ", flags.resume, " is at step ", *step,
               ", past --until ", flags.until);
    const std::string note = loom::train::check_resume_identity(flags.resume, flags.data, flags.seed, flags.resume_anyway,
                                                                "--resume-anyway");
    if (!note.empty()) std::printf("note: %s\n", note.c_str());
}

// After a stop signal: where the run stands and how to go on.
inline void report_stop(const Flags& flags, std::int64_t done) {
    std::printf("train_gpt: %s: stopped after step %lld of %lld; %s\n", loom::train::StopSignal::name().c_str(),
                static_cast<long long>(done), static_cast<long long>(flags.until),
                flags.save.empty() ? "no --save, so these steps are not kept"
                                   : ("continue with --resume " + flags.save).c_str());
}
