// train_gpt's flags: what each means (Flags, and --help, grouped by CLI11),
// and how a command line becomes Flags, refusing a bad value with one line
// that names it and what would be valid. The strategy is one value,
// loom::StrategySpec: --strategy TEXT in the grammar Strategy<...> prints
// (parallel/strategy_text.hpp), or built from the older flags (--zero,
// --schedule, --tp-mode, --sp-mode, --compress, ...); the degrees (--dp --pp
// --tp --sp) stay separate. Included by train_gpt.cpp inside its anonymous
// namespace, after the loom, CLI11 and standard headers it uses.
#pragma once

// The run's settings are the library's (train/gpt_training.hpp: their
// meanings and defaults); the rest is what only the command line says.
struct Flags : loom::train::GptTraining {
    bool resume_anyway = false;        // resume on other --data or --seed
    bool no_memory_check = false;      // skip the memory preflight (train/memory_preflight.hpp)
    bool device_per_process = false;   // --device cuda under mpirun: each process its node rank's GPU
    std::string cluster;               // --cluster FILE: rank threads talk over its links (Shaped), as loom-plan
                                       // prices them
};

// "train_gpt: <what> (train_gpt --help lists every flag)": a flag's value refused.
inline loom::Error usage(const std::string& what) {
    return loom::Error("train_gpt: " + what + " (train_gpt --help lists every flag)");
}
[[noreturn]] inline void usage_error(const std::string& what) { throw usage(what); }

// The library's rules, their messages naming the settings as train_gpt's
// flags: "save_every" is --save-every.
inline const loom::SettingNames flag_names{[](std::string_view setting) {
    std::string flag = "--" + std::string(setting);
    std::replace(flag.begin(), flag.end(), '_', '-');
    return flag;
}};

// f(), whose loom::Error about a flag's value becomes a usage error that
// starts with `prefix` (the flag: "--matmul: ").
template <class F>
decltype(auto) flag_checked(const std::string& prefix, F&& f) {
    try {
        return f();
    } catch (const loom::Error& e) {
        usage_error(prefix + e.message());
    }
}

// A line for the run's summary when its matrix products are not plain f32.
inline std::string matmul_note(const Flags& flags) {
    return flags.matmul == loom::kernels::MatmulPrecision::bf16
               ? "matrix products: bf16 operands, f32 sums and outputs (--matmul bf16)"
               : "";
}

inline std::int64_t parse_int(std::string_view flag, const std::string& text, std::int64_t low, std::int64_t high) {
    char* end = nullptr;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || value < low || value > high)
        usage_error(std::string(flag) + " " + text + " is not a whole number in " + std::to_string(low) + ".." +
                    std::to_string(high));
    return value;
}

// A finite number in (0, high] as a T (a float flag refuses what rounds to
// 0), or "--lr 0 is not a number in (0, 10]".
template <class T>
T parse_real(std::string_view flag, const std::string& text, double high, const std::string& valid) {
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(value) || value > high || !(static_cast<T>(value) > 0))
        usage_error(std::string(flag) + " " + text + " is not " + valid);
    return static_cast<T>(value);
}

// "--tp-mode 3d is not 1d (Megatron) or 2d (Optimus)": the index of `text` among `names`.
inline int pick(std::string_view flag, const std::string& text, std::initializer_list<std::string_view> names,
                const std::string& valid) {
    int i = 0;
    for (std::string_view n : names) {
        if (text == n) return i;
        ++i;
    }
    usage_error(std::string(flag) + " " + text + " is not " + valid);
}

// The flags that name the strategy piece by piece, as given (empty: not given).
struct StrategyFlags {
    std::string strategy, zero, schedule, chunks, tp_mode, sp_mode, ulysses, sp_layout, compress, compress_pp, compress_tp,
        recompute;
};

// --compress, --compress-pp, --compress-tp: what each axis may take is the
// strategy's rule (LOOM_RULE_ACTIVATION_CAST), checked with the whole spec.
inline loom::Compression parse_compress_flag(const std::string& flag, const std::string& text) {
    return flag_checked(flag + ": ", [&] { return loom::parse_compression(text); });
}

// The spec the piecewise flags name, for the degrees given.
inline loom::StrategySpec strategy_of(const StrategyFlags& s, const Flags& f) {
    loom::StrategySpec spec;
    spec.zero_stage = s.zero.empty() ? 0 : static_cast<int>(parse_int("--zero", s.zero, 0, 3));
    if (f.pp > 1) {
        spec.pipelined = true;
        if (!s.schedule.empty())
            spec.schedule = flag_checked("--schedule: ", [&] { return parse_schedule_flag(s.schedule); });
        spec.chunks = loom::fixed_chunks(spec.schedule) == 0 ? 2 : loom::fixed_chunks(spec.schedule);
    } else if (!s.schedule.empty()) {
        usage_error("--schedule " + s.schedule + " needs a pipeline; add --pp 2 or more");
    }
    if (!s.chunks.empty()) {
        const int chunks = static_cast<int>(parse_int("--chunks", s.chunks, 2, 4));
        if (spec.schedule != loom::ScheduleKind::interleaved)
            usage_error("--chunks " + s.chunks + " is for --schedule interleaved; " + std::string(loom::name(spec.schedule)) +
                        " runs " + std::to_string(loom::fixed_chunks(spec.schedule)) + " chunk(s) per rank");
        spec.chunks = chunks;
    }
    const bool grid = !s.tp_mode.empty() && pick("--tp-mode", s.tp_mode, {"1d", "2d"}, "1d (Megatron) or 2d (Optimus)") == 1;
    spec.tensor_parallel = f.tp > 1;
    spec.tensor_grid = f.tp > 1 && grid;
    const int mode = s.sp_mode.empty() ? 0 : pick("--sp-mode", s.sp_mode, {"ring", "ulysses", "hybrid"},
                                                  "ring (RingAttention), ulysses (Ulysses) or hybrid (UlyssesRing, with --ulysses)");
    const int ulysses = s.ulysses.empty() ? 0 : static_cast<int>(parse_int("--ulysses", s.ulysses, 2, 4));
    if (ulysses == 3) usage_error("--ulysses 3 is not a Ulysses group size this binary has; use 2 or 4");
    if (ulysses != 0 && (mode != 2 || f.sp == 1))
        usage_error("--ulysses " + s.ulysses + " sets the hybrid's Ulysses group size; use it with --sp-mode hybrid and --sp " +
                    std::to_string(2 * ulysses) + " or more");
    const bool contiguous = !s.sp_layout.empty() && pick("--sp-layout", s.sp_layout, {"zigzag", "contiguous"}, "zigzag or contiguous") == 1;
    if (f.sp > 1) {
        if (mode == 2 && ulysses == 0) usage_error("--sp-mode hybrid needs --ulysses 2 or 4 (the Ulysses group size)");
        spec.sequence_parallel = true;
        spec.sequence_attention = mode == 0 ? loom::nn::SequenceAttention::ring
                                : mode == 1 ? loom::nn::SequenceAttention::ulysses : loom::nn::SequenceAttention::hybrid;
        spec.sequence_ulysses = mode == 0 ? 1 : mode == 1 ? 0 : ulysses;
        spec.sequence_zigzag = !contiguous;
    }
    if (!s.compress.empty()) spec.dp_compression = parse_compress_flag("--compress", s.compress);
    if (!s.compress_pp.empty()) spec.pp_compression = parse_compress_flag("--compress-pp", s.compress_pp);
    if (!s.compress_tp.empty()) spec.tp_compression = parse_compress_flag("--compress-tp", s.compress_tp);
    // none | full | selective | budget:SIZE: Recompute<...>, in the spelling loom-plan shares.
    if (!s.recompute.empty())
        spec.recompute = flag_checked("--recompute: ", [&] { return parse_recompute_flag(s.recompute); });
    return spec;
}

// The whole command line as Flags, or the one-line reason it is not one.
inline Flags parse(int argc, char** argv) {
    Flags f;
    StrategyFlags s;
    CLI::App app{"train_gpt: trains loom's reference GPT byte by byte, on rank threads, MPI processes or GPUs.",
                 "train_gpt"};
    app.footer("Each flag is described in docs/train_gpt.md.");
    app.get_formatter()->column_width(24);
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a flag given again wins
    // Each flag with its group, its value's shape, its meaning and its default.
    const auto described = [](CLI::Option* o, const char* group, const char* type, const std::string& meaning,
                              const std::string& shown) {
        return o->type_name(type)->description(shown.empty() ? meaning : meaning + " (default " + shown + ")")->group(group);
    };
    const auto whole = [&](const char* group, const char* name, auto& field, std::int64_t low, std::int64_t high,
                           const char* meaning, std::string shown = "") {
        if (shown.empty()) shown = std::to_string(field);
        return described(app.add_option_function<std::string>(name, [&field, name, low, high](const std::string& v) {
            field = static_cast<std::remove_reference_t<decltype(field)>>(parse_int(name, v, low, high));
        }), group, "N", meaning, shown);
    };
    const auto text = [&](const char* group, const char* name, std::string& field, const char* type, const char* meaning,
                          const char* shown = "") {
        return described(app.add_option(name, field), group, type, meaning, shown);
    };
    const auto toggle = [&](const char* group, const char* name, bool& field, const char* meaning) {
        return described(app.add_flag(name, field), group, "", meaning, "");
    };
    const auto value = [&](const char* group, const char* name, const char* type, const char* shown, const char* meaning,
                           std::function<void(const std::string&)> set) {
        return described(app.add_option_function<std::string>(name, std::move(set)), group, type, meaning, shown);
    };

    whole("Model", "--layers", f.model.layers, 1, 1024, "transformer blocks");
    whole("Model", "--width", f.model.width, 1, 65536, "features per token");
    whole("Model", "--heads", f.model.heads, 1, 65536, "attention heads (dividing --width)");
    whole("Model", "--seq", f.model.seq, 1, 1 << 20, "tokens per sequence");
    whole("Model", "--vocab", f.model.vocab, 2, 256, "byte vocabulary: bytes taken modulo it");
    text("Data", "--data", f.data, "FILE", "text to train on", "a synthetic corpus");
    whole("Data", "--batch", f.batch, 1, 1 << 20, "sequences per optimizer step, over all ranks and micro-batches");
    whole("Data", "--seed", f.seed, 0, std::int64_t{1} << 62, "initialisation, data order and sampling");
    whole("Training", "--steps", f.steps, 0, std::int64_t{1} << 40, "the learning-rate schedule's length");
    whole("Training", "--until", f.until, 0, std::int64_t{1} << 40, "stop after this step", "--steps");
    value("Training", "--lr", "X", "1e-3", "peak learning rate, in (0, 10], cosine decay", [&f](const std::string& v) {
        f.lr = parse_real<float>("--lr", v, 10.0, "a number in (0, 10]");
    });
    whole("Training", "--threads", f.threads, 1, 1024, "BLAS threads per rank");
    whole("Training", "--freeze-variance", f.freeze_variance, 1, std::int64_t{1} << 40,
          "freeze AdamW's v after N steps", "at an error-feedback compressor's start");

    text("Strategy", "--strategy", s.strategy, "TEXT",
         "the policies as one value, as Strategy<...> prints them: e.g. 'Strategy<DataParallel<>, Pipeline<1F1B>, "
         "ZeroShard<1>>' (parallel/strategy_text.hpp); or name them piece by piece with --zero ... --compress-tp",
         "DataParallel<> and the pieces below");
    whole("Strategy", "--dp", f.dp, 1, 4096, "data-parallel degree", "1 on threads, the world under mpirun");
    whole("Strategy", "--pp", f.pp, 1, 1024, "pipeline stages");
    whole("Strategy", "--tp", f.tp, 1, 1024, "tensor-parallel degree (q x q with --tp-mode 2d)");
    whole("Strategy", "--sp", f.sp, 1, 1024, "sequence-parallel degree");
    whole("Strategy", "--micro-batches", f.micro_batches, 1, 1 << 20, "micro-batches per step");
    text("Strategy", "--partition", f.partition, "N,N,...", "layers per virtual stage", "balanced over measured times");
    const std::array pieces{text("Strategy", "--zero", s.zero, "0..3", "ZeRO stage", "0"),
                            text("Strategy", "--schedule", s.schedule, "NAME", "gpipe, 1f1b, interleaved, zb (ZB-H1) or zbv", "1f1b"),
                            text("Strategy", "--chunks", s.chunks, "2..4", "chunks per rank of --schedule interleaved", "2"),
                            text("Strategy", "--tp-mode", s.tp_mode, "1d|2d", "Megatron (1d) or Optimus (2d)", "1d"),
                            text("Strategy", "--sp-mode", s.sp_mode, "MODE", "ring, ulysses or hybrid (UlyssesRing)", "ring"),
                            text("Strategy", "--ulysses", s.ulysses, "2|4", "the hybrid's Ulysses group size"),
                            text("Strategy", "--sp-layout", s.sp_layout, "LAYOUT", "zigzag or contiguous", "zigzag"),
                            text("Strategy", "--compress", s.compress, "C",
                                 "dp gradients: none, bf16, fp16, int8[:B], topk:R, powersgd:R, onebit[:B]", "none"),
                            text("Strategy", "--compress-pp", s.compress_pp, "C", "pipeline traffic: none, bf16 or fp16", "none"),
                            text("Strategy", "--compress-tp", s.compress_tp, "C", "tensor-parallel traffic: none, bf16 or fp16", "none"),
                            text("Strategy", "--recompute", s.recompute, "WHAT",
                                 "activations recomputed in backward: none, full, selective (keeps matrix products), or budget:SIZE per rank (e.g. budget:64MiB)",
                                 "none")};
    whole("Strategy", "--compress-warmup", f.compress_warmup, 0, std::int64_t{1} << 40, "uncompressed steps first",
          "10% of --steps (PowerSGD, TopK), 20% (OneBit)");

    whole("OptEx", "--optex", f.optex, 1, 1024, "OptEx<AdamW> over N workers (each a --dp group)", "off");
    whole("OptEx", "--optex-history", f.optex_config.estimator.history, 2, 100000, "gradients the estimator keeps");
    value("OptEx", "--optex-length-scale", "X", "0.1", "the kernel's length scale, > 0", [&f](const std::string& v) {
        f.optex_config.estimator.length_scale =
            parse_real<double>("--optex-length-scale", v, HUGE_VAL, "a finite number > 0");
    });
    value("OptEx", "--optex-select", "RULE", "last", "which iterate to keep: last, lowest-loss or smallest-gradient",
          [&f](const std::string& v) {
              using loom::optim::OptExSelect;
              f.optex_config.select = std::array{OptExSelect::last, OptExSelect::lowest_loss, OptExSelect::smallest_gradient}[
                  static_cast<std::size_t>(pick("--optex-select", v, {"last", "lowest-loss", "smallest-gradient"},
                                                "last, lowest-loss or smallest-gradient"))];
          });
    whole("OptEx", "--optex-tune", f.optex_tune, 0, 1 << 30, "re-tune the length scale every N iterations (0: never)", "25");
    whole("OptEx", "--optex-effective-dim", f.optex_config.effective_dim, 1, std::int64_t{1} << 40,
          "dimensions the kernel sees", "all");

    text("Output", "--metrics", f.metrics, "FILE", "one JSON line per step");
    text("Output", "--save", f.save, "FILE", "checkpoint (safetensors) at the end, or on SIGINT/SIGTERM");
    whole("Output", "--save-every", f.save_every, 1, std::int64_t{1} << 40, "also save FILE.step-<n> every N steps", "off");
    whole("Output", "--keep", f.keep, 1, 1 << 20, "periodic checkpoints kept, the newest");
    toggle("Output", "--sharded", f.sharded,
           "--save is a directory: each rank writes its own shard, in the background; any strategy resumes it");
    text("Output", "--resume", f.resume, "FILE", "continue from a checkpoint or a --sharded directory (same --data and --seed)");
    toggle("Output", "--resume-anyway", f.resume_anyway, "resume on other --data or --seed");
    toggle("Training", "--no-memory-check", f.no_memory_check,
           "start although the memory model says the run cannot fit in this process's memory");
    text("Output", "--trace", f.trace, "FILE", "Chrome/Perfetto trace of every rank");
    whole("Output", "--sample", f.sample, 0, 1 << 20, "bytes of generated text at the end");

    value("Devices", "--device", "WHERE", "host", "host, cuda (under mpirun: each process its node rank's GPU) or cuda:N",
          [&f](const std::string& v) {
              f.device = flag_checked("--device ", [&] { return loom::parse_device(v); });
              f.device_per_process = v == "cuda";
          });
    value("Devices", "--matmul", "P", "f32", "f32, or bf16 operands with f32 sums", [&f](const std::string& v) {
        f.matmul = flag_checked("--matmul: ", [&] { return loom::kernels::parse_matmul_precision(v); });
    });
    text("Devices", "--cluster", f.cluster, "FILE", "rank threads talk over this cluster's links, as loom-plan prices them");

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
        // Under mpirun every process parses the same flags: one prints.
        if (loom::train::launcher_rank() == 0) std::printf("%s", app.help().c_str());
        std::exit(0);
    } catch (const CLI::ParseError& e) {
        usage_error(e.what());
    }
    f.model.validate();
    for (const CLI::Option* piece : pieces)
        if (!s.strategy.empty() && piece->count() > 0)
            usage_error("--strategy gives the whole strategy; drop " + piece->get_name() + " " + piece->as<std::string>() +
                        " or write it into --strategy");
    // --strategy TEXT is the spec as written (whose policies must match the
    // degrees: plan/layout_rules.hpp, with the other degree rules).
    f.strategy = s.strategy.empty() ? strategy_of(s, f)
                                    : flag_checked("--strategy: ", [&] { return loom::parse_strategy(s.strategy); });
    flag_checked("", [&] { f.strategy.validate(); });
    if (f.optex == 0 && app.count("--optex-history") + app.count("--optex-length-scale") + app.count("--optex-select") +
                                app.count("--optex-tune") + app.count("--optex-effective-dim") > 0)
        usage_error("--optex-history, --optex-length-scale, --optex-select, --optex-tune and --optex-effective-dim set "
                    "up OptEx; add --optex N");
    if (app.count("--keep") > 0 && f.save_every == 0) usage_error("--keep " + std::to_string(f.keep) + " needs --save-every N");
    if (f.resume_anyway && f.resume.empty()) usage_error("--resume-anyway needs --resume FILE");
    // The rest is the library's (train/gpt_training_rules.hpp), in train_gpt's words (flag_names).
    static_cast<loom::train::GptTraining&>(f) = flag_checked("", [&] { return loom::train::settled_training(f, flag_names); });
    return f;
}
