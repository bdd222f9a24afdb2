// What train_gpt's flags must agree on before anything is built, checked
// the same way on every rank so that every rank stops with the same one-line
// message: the parallel degrees against the world size, and each degree
// against what it cuts (Megatron's heads, hidden features and vocabulary;
// Optimus's q x q grid; sequence parallelism's chunks and Ulysses's heads;
// the pipeline's stages, partition and schedule; the batch's split). Included
// by train_gpt.cpp inside its anonymous namespace, after train_gpt_flags.hpp.
#pragma once

// "1, 2 or 4": the divisors of n (or, with `squared`, their squares) as a sentence.
inline std::string divisors_of(std::int64_t n, bool squared = false) {
    std::vector<std::int64_t> d;
    for (std::int64_t k = 1; k <= n; ++k)
        if (n % k == 0) d.push_back(squared ? k * k : k);
    std::string out;
    for (std::size_t i = 0; i < d.size(); ++i)
        out += (i == 0 ? "" : i + 1 == d.size() ? " or " : ", ") + std::to_string(d[i]);
    return out;
}

// Megatron 1D cuts attention by heads, the MLP's 4C hidden features, and the
// embedding's token table and the head's logits by vocabulary.
inline void check_tensor_parallel(const Flags& flags) {
    const int tp = flags.tp;
    const std::int64_t heads = flags.model.heads, hidden = 4 * flags.model.width;
    if (heads % tp != 0)
        usage_error("--tp " + std::to_string(tp) + " does not divide the " + std::to_string(heads) +
                    " attention heads (--heads); use " + divisors_of(heads));
    if (hidden % tp != 0)
        usage_error("--tp " + std::to_string(tp) + " does not divide the MLP's " + std::to_string(hidden) +
                    " hidden features (4 x --width); use a divisor of " + std::to_string(hidden));
    if (flags.model.vocab % tp != 0)
        usage_error("--tp " + std::to_string(tp) + " does not divide the vocabulary of " +
                    std::to_string(flags.model.vocab) + " tokens (--vocab); use " + divisors_of(flags.model.vocab));
}

// Optimus 2D: tp = q x q, and q cuts the heads (and so the width and every
// matrix), the vocabulary, and each micro-batch's sequences.
inline void check_grid(const Flags& flags, int dp) {
    const int tp = flags.tp;
    int q = 1;
    while ((q + 1) * (q + 1) <= tp) ++q;
    if (q * q != tp)
        usage_error("--tp " + std::to_string(tp) + " with --tp-mode 2d is not a square grid; use " +
                    std::to_string(q * q) + " or " + std::to_string((q + 1) * (q + 1)) + " (q x q)");
    const std::string grid = "--tp " + std::to_string(tp) + " (2D, q = " + std::to_string(q) + ")";
    const auto need = [&](std::int64_t n, const std::string& what) {
        if (n % q != 0)
            usage_error(grid + ": q does not divide the " + std::to_string(n) + " " + what + "; use --tp " +
                        divisors_of(n, /*squared=*/true) + " with --tp-mode 2d");
    };
    need(flags.model.heads, "attention heads (--heads)");  // and so the width, which the heads divide
    need(flags.model.vocab, "tokens of the vocabulary (--vocab)");
    const std::int64_t split = static_cast<std::int64_t>(dp) * flags.micro_batches;
    if (flags.batch % split == 0) need(flags.batch / split, "sequences of each rank's micro-batch (--batch / (--dp x --micro-batches))");
}

// Sequence parallelism cuts every sequence into chunks (2 per rank in the
// zigzag layout); Ulysses also gives each sp rank heads/sp of its heads.
inline void check_sequence_parallel(const Flags& flags) {
    const loom::StrategySpec& s = flags.strategy;
    if (s.tensor_grid)
        usage_error("--sp with --tp-mode 2d is not supported; use --tp-mode 1d (Megatron) with --sp");
    const int sp = flags.sp, chunks = s.sequence_zigzag ? 2 * sp : sp;
    const std::int64_t heads = flags.model.heads / flags.tp;
    if (s.sequence_attention == loom::nn::SequenceAttention::hybrid) {
        const int k = s.sequence_ulysses;
        if (sp % k != 0 || k == sp)
            usage_error("--ulysses " + std::to_string(k) + " does not leave a ring of 2 or more in --sp " +
                        std::to_string(sp) + "; use an --sp that is a multiple of " + std::to_string(2 * k) +
                        " (or --sp-mode ulysses for --ulysses = --sp)");
        if (heads % k != 0)
            usage_error("--ulysses " + std::to_string(k) + " does not divide the " + std::to_string(heads) +
                        " attention heads" + (flags.tp > 1 ? " per --tp rank" : "") + "; use a divisor of " +
                        std::to_string(heads));
    }
    if (flags.model.seq % chunks != 0)
        usage_error("--seq " + std::to_string(flags.model.seq) + " does not split into the " + std::to_string(chunks) +
                    " chunks of --sp " + std::to_string(sp) +
                    (s.sequence_zigzag ? " in the zigzag layout (2 x --sp)" : "") +
                    "; use a --seq that is a multiple of " + std::to_string(chunks));
    if (s.sequence_attention == loom::nn::SequenceAttention::ulysses && heads % sp != 0)
        usage_error("--sp " + std::to_string(sp) + " with --sp-mode ulysses does not divide the " +
                    std::to_string(heads) + " attention heads" + (flags.tp > 1 ? " per --tp rank" : "") + "; use " +
                    divisors_of(heads) + ", or --sp-mode ring");
}

inline void check_degrees(const Flags& flags, int world, int dp) {
    const int pp = flags.pp, tp = flags.tp, sp = flags.sp, product = dp * pp * tp * sp;
    std::string degrees = "--dp " + std::to_string(dp);
    if (pp > 1) degrees += " x --pp " + std::to_string(pp);
    if (tp > 1) degrees += " x --tp " + std::to_string(tp);
    if (sp > 1) degrees += " x --sp " + std::to_string(sp);
    if (world % product != 0)
        usage_error(degrees + (product == dp ? "" : " = " + std::to_string(product)) +
                    " does not divide the world size " + std::to_string(world) + "; use degrees whose product divides " +
                    std::to_string(world));
    if (product != world)
        usage_error(degrees + " leaves " + std::to_string(world - product) + " of the " + std::to_string(world) +
                    " ranks without work; the degrees must multiply to " + std::to_string(world));
    if (flags.strategy.tensor_grid) check_grid(flags, dp);
    else check_tensor_parallel(flags);
    if (sp > 1) check_sequence_parallel(flags);
    const std::int64_t split = static_cast<std::int64_t>(dp) * flags.micro_batches;
    if (flags.compress().on() && dp * sp == 1)
        usage_error("--compress " + flags.compress().describe() + " compresses the data-parallel gradient exchange, "
                    "which one rank does not have; use --dp 2 or more");
    if (flags.batch % split != 0)
        usage_error("--batch " + std::to_string(flags.batch) + " is not divisible by --dp " + std::to_string(dp) +
                    " x --micro-batches " + std::to_string(flags.micro_batches) + " = " + std::to_string(split) +
                    "; every rank needs the same whole number of sequences per micro-batch");
    if (pp == 1) return;
    const int chunks = flags.strategy.chunks, stages = pp * chunks;
    const auto layers = static_cast<int>(flags.model.layers);
    const std::string stage_words =
        chunks == 1 ? "--pp " + std::to_string(pp) : "--pp " + std::to_string(pp) + " x " + std::to_string(chunks) + " chunks";
    if (stages > layers)
        usage_error(stage_words + " = " + std::to_string(stages) + " stages but the model has " + std::to_string(layers) +
                    (layers == 1 ? " layer" : " layers") + " (--layers); every stage needs at least one layer: use --pp <= " +
                    std::to_string(layers / chunks) + (chunks > 1 ? ", fewer --chunks" : "") + " or more --layers");
    if (flags.partition.empty() && flags.strategy.schedule == loom::ScheduleKind::interleaved && layers % stages != 0)
        usage_error("--schedule interleaved with " + std::to_string(chunks) + " chunks per rank needs the " +
                    std::to_string(layers) + " layers to split evenly into " + std::to_string(stages) +
                    " chunks (--layers divisible by --pp x --chunks); use --chunks dividing the " +
                    (layers % pp == 0 ? std::to_string(layers / pp) + " " : "") +
                    "layers per stage, other --layers, or --partition");
    try {
        if (!flags.partition.empty())
            (void)loom::schedule::parse_partition(flags.partition, layers, stages, chunks == 1 ? "" : stage_words + " is " + std::to_string(stages));
        // The schedule's own rules (interleaving needs micro-batches in multiples of --pp).
        (void)loom::schedule::pipeline_program(flags.strategy.schedule, pp, flags.micro_batches, chunks);
    } catch (const loom::Error& e) {
        usage_error(e.message());
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
