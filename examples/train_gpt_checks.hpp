// What train_gpt's flags must agree on before anything is built, checked
// the same way on every rank so that every rank stops with the same one-line
// message: the degrees against the world size and the model (the planner's
// rules, plan/layout_rules.hpp), OptEx's workers, the memory, the corpus.
// Included by train_gpt.cpp inside its anonymous namespace, after
// train_gpt_flags.hpp.
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
        try {
            (void)loom::schedule::parse_partition(flags.partition, layers, stages, chunks == 1 ? "" : "--pp " +
                                                  std::to_string(flags.pp) + " x " + std::to_string(chunks) +
                                                  " chunks is " + std::to_string(stages));
        } catch (const loom::Error& e) {
            usage_error(e.message());
        }
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
    const loom::train::TrainingLayout layout{.batch = flags.batch,
                                             .dp = dp,
                                             .pp = flags.pp,
                                             .tp = flags.tp,
                                             .sp = flags.sp,
                                             .zero = flags.optex > 0 ? 0 : flags.strategy.zero_stage,
                                             .micro_batches = flags.optex > 0 ? 1 : flags.micro_batches,
                                             .ranks_in_process = ranks_in_process,
                                             .recompute = flags.strategy.recompute};
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

// The corpus --data names (or the synthetic one), checked to hold one sequence and its targets.
inline loom::data::ByteCorpus load_corpus(const Flags& flags) {
    auto corpus = flags.data.empty()
                      ? loom::data::ByteCorpus::synthetic(std::int64_t{1} << 20, flags.seed, static_cast<int>(flags.model.vocab))
                      : loom::data::ByteCorpus::from_file(flags.data, static_cast<int>(flags.model.vocab));
    std::vector<std::int32_t> probe(static_cast<std::size_t>(flags.model.seq)), probe_targets(probe.size());
    corpus.batch(flags.seed, 0, 1, flags.model.seq, probe, probe_targets);
    return corpus;
}

// A run every rank refused while setting up (train/setup_refusal.hpp): the
// lead prints why, once, and every process exits 1 after its ranks return.
inline std::atomic<bool> run_refused{false};
inline void refuse_run(const std::string& message, bool lead) {
    if (lead) std::fprintf(stderr, "%s\n", message.c_str());
    run_refused = true;
}
[[nodiscard]] inline bool refused_run() { return run_refused.load(); }
