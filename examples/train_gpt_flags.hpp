// train_gpt's flags: what each means (Flags), what --help prints, and how
// a command line becomes Flags, refusing a bad flag with the line that names
// it and the list of every flag. Included by train_gpt.cpp inside its
// anonymous namespace, after the loom and standard headers it uses.
#pragma once

struct Flags {
    loom::gpt::Config model;
    std::int64_t batch = 8;        // global: all ranks, all micro-batches
    std::int64_t steps = 200;      // the schedule's length
    std::int64_t until = -1;       // stop after this step (default: steps)
    float lr = 1e-3f;
    std::uint64_t seed = 1;
    int threads = 1;               // BLAS threads per rank
    int dp = 0;                    // 0: 1 on threads, the world size under MPI
    int zero = 0;
    int micro_batches = 1;
    int pp = 1;
    int tp = 1;                    // tensor parallel: Megatron 1D, or Optimus 2D (tp = q x q)
    bool tp_grid = false;          // --tp-mode 2d
    int sp = 1;                    // sequence parallel: each sequence split over sp ranks
    bool sp_ulysses = false;       // --sp-mode ulysses (default ring)
    bool sp_hybrid = false;        // --sp-mode hybrid
    int ulysses = 0;               // --ulysses: the hybrid's Ulysses group size (2 or 4)
    bool sp_contiguous = false;    // --sp-layout contiguous (default zigzag)
    loom::ScheduleKind schedule = loom::ScheduleKind::one_f_one_b;
    std::string schedule_text;     // as given, for messages; empty: not given
    int chunks = 0;                // 0: the schedule's own (interleaved 2, zbv 2, others 1)
    std::string partition;         // layers per virtual stage, "3,3,2"; empty: balanced by profiling
    std::string data, metrics, save, resume, trace;
    loom::Device device = loom::host_device;  // --device: where one rank's layers run
    bool device_per_process = false;          // --device cuda under mpirun: each process its node rank's GPU
    loom::kernels::MatmulPrecision matmul = loom::kernels::MatmulPrecision::f32;  // --matmul
    std::string cluster;           // --cluster FILE: rank threads talk over its links (Shaped), as loom-plan prices them
    loom::Compression compress{};      // --compress: the dp gradient exchange
    std::int64_t compress_warmup = -1;  // -1: PowerSGD and TopK 10%, OneBit 20% of --steps, others 0
    loom::Compression compress_pp{}, compress_tp{};  // casts of the pp / tp traffic
    std::int64_t freeze_variance = -1;  // AdamW's v frozen after N steps; -1: at an error-feedback compressor's start
    int optex = 0;                      // OptEx workers; 0: plain AdamW
    int optex_tune = -1;                // re-tune the length scale every N iterations; -1: 25, 0: never
    loom::optim::OptExConfig optex_config{};  // --optex-history, --optex-length-scale, --optex-select, --optex-tune

    // The warm-up the run uses: given, or the reference's share of the steps.
    [[nodiscard]] std::int64_t warmup_steps() const {
        if (compress_warmup >= 0) return compress_warmup;
        if (compress.kind == loom::CompressorKind::power_sgd || compress.kind == loom::CompressorKind::top_k)
            return steps / 10;
        if (compress.kind == loom::CompressorKind::one_bit) return steps / 5;
        return 0;
    }

    [[nodiscard]] int chunks_per_rank() const {
        if (chunks > 0) return chunks;
        return schedule == loom::ScheduleKind::interleaved || schedule == loom::ScheduleKind::zero_bubble_v ? 2 : 1;
    }
    std::int64_t sample = 0;
};

// Every flag: what --help prints, and what a bad flag's line ends with.
constexpr const char* flag_list =
    "--data FILE --layers N --width N --heads N --seq N --batch N --vocab N --steps N --lr X --until N --seed N "
    "--threads N --dp N --zero 0..3 --micro-batches N --pp N --tp N --tp-mode 1d|2d --sp N "
    "--sp-mode ring|ulysses|hybrid --ulysses 2|4 --sp-layout zigzag|contiguous --schedule gpipe|1f1b|interleaved|zb|zbv "
    "--chunks 2..4 --partition N,N,... --trace FILE --metrics FILE --save FILE --resume FILE --sample N "
    "--compress none|bf16|fp16|int8|topk:R|powersgd:R|onebit --compress-warmup N --compress-pp none|bf16|fp16 "
    "--compress-tp none|bf16|fp16 --freeze-variance N --optex N --optex-history N --optex-length-scale X "
    "--optex-select last|lowest-loss|smallest-gradient --optex-tune N --optex-effective-dim N "
    "--device host|cuda|cuda:N --matmul f32|bf16 --cluster FILE";

[[noreturn]] inline void usage_error(const std::string& what) {
    throw loom::Error("train_gpt: " + what + " (flags: " + flag_list + ")");
}

// --help or -h in a flag's place (not a value: `--data -h` reads a file named -h).
inline bool help_asked(int argc, char** argv) {
    for (int i = 1; i < argc; i += 2)
        if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") return true;
    return false;
}

// Says so when the run's matrix products are not plain f32.
inline void print_matmul_precision(const Flags& flags) {
    if (flags.matmul == loom::kernels::MatmulPrecision::bf16)
        std::printf("matrix products: bf16 operands, f32 sums and outputs (--matmul bf16)\n");
}

inline std::int64_t parse_int(std::string_view flag, const char* text, std::int64_t low, std::int64_t high) {
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0' || value < low || value > high)
        usage_error(std::string(flag) + " " + text + " is not a whole number in " + std::to_string(low) + ".." +
                    std::to_string(high));
    return value;
}

// "host", "cuda" (cuda:0) or "cuda:N".
inline loom::Device parse_device(std::string_view text) {
    if (text == "host") return loom::host_device;
    if (text == "cuda") return loom::cuda_device(0);
    if (text.starts_with("cuda:")) {
        const std::string index(text.substr(5));
        char* end = nullptr;
        const long value = std::strtol(index.c_str(), &end, 10);
        if (!index.empty() && *end == '\0' && value >= 0 && value < 1024) return loom::cuda_device(static_cast<int>(value));
    }
    usage_error("--device " + std::string(text) + " is not host, cuda or cuda:N (N a device index)");
}

inline Flags parse(int argc, char** argv) {
    Flags f;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (i + 1 >= argc) usage_error("flag " + std::string(flag) + " needs a value");
        const char* value = argv[++i];
        if (flag == "--data") f.data = value;
        else if (flag == "--layers") f.model.layers = parse_int(flag, value, 1, 1024);
        else if (flag == "--width") f.model.width = parse_int(flag, value, 1, 65536);
        else if (flag == "--heads") f.model.heads = parse_int(flag, value, 1, 65536);
        else if (flag == "--seq") f.model.seq = parse_int(flag, value, 1, 1 << 20);
        else if (flag == "--batch") f.batch = parse_int(flag, value, 1, 1 << 20);
        else if (flag == "--vocab") f.model.vocab = parse_int(flag, value, 2, 256);
        else if (flag == "--steps") f.steps = parse_int(flag, value, 0, 1LL << 40);
        else if (flag == "--until") f.until = parse_int(flag, value, 0, 1LL << 40);
        else if (flag == "--seed") f.seed = static_cast<std::uint64_t>(parse_int(flag, value, 0, 1LL << 62));
        else if (flag == "--threads") f.threads = static_cast<int>(parse_int(flag, value, 1, 1024));
        else if (flag == "--dp") f.dp = static_cast<int>(parse_int(flag, value, 1, 4096));
        else if (flag == "--zero") f.zero = static_cast<int>(parse_int(flag, value, 0, 3));
        else if (flag == "--micro-batches") f.micro_batches = static_cast<int>(parse_int(flag, value, 1, 1 << 20));
        else if (flag == "--pp") f.pp = static_cast<int>(parse_int(flag, value, 1, 1024));
        else if (flag == "--tp") f.tp = static_cast<int>(parse_int(flag, value, 1, 1024));
        else if (flag == "--sp") f.sp = static_cast<int>(parse_int(flag, value, 1, 1024));
        else if (flag == "--sp-mode") {
            const std::string_view mode(value);
            if (mode != "ring" && mode != "ulysses" && mode != "hybrid")
                usage_error("--sp-mode " + std::string(value) +
                            " is not ring (RingAttention), ulysses (Ulysses) or hybrid (UlyssesRing, with --ulysses)");
            f.sp_ulysses = mode == "ulysses";
            f.sp_hybrid = mode == "hybrid";
        } else if (flag == "--ulysses") {
            f.ulysses = static_cast<int>(parse_int(flag, value, 2, 4));
            if (f.ulysses == 3) usage_error("--ulysses 3 is not a Ulysses group size this binary has; use 2 or 4");
        } else if (flag == "--sp-layout") {
            if (std::string_view(value) != "zigzag" && std::string_view(value) != "contiguous")
                usage_error("--sp-layout " + std::string(value) + " is not zigzag or contiguous");
            f.sp_contiguous = std::string_view(value) == "contiguous";
        }
        else if (flag == "--tp-mode") {
            if (std::string_view(value) != "1d" && std::string_view(value) != "2d")
                usage_error("--tp-mode " + std::string(value) + " is not 1d (Megatron) or 2d (Optimus)");
            f.tp_grid = std::string_view(value) == "2d";
        }
        else if (flag == "--chunks") f.chunks = static_cast<int>(parse_int(flag, value, 2, 4));
        else if (flag == "--partition") f.partition = value;
        else if (flag == "--schedule") {
            f.schedule_text = value;
            try {
                f.schedule = loom::parse_schedule(value);
            } catch (const loom::Error& e) {
                usage_error(std::string("--schedule: ") + e.message());
            }
        }
        else if (flag == "--sample") f.sample = parse_int(flag, value, 0, 1 << 20);
        else if (flag == "--compress" || flag == "--compress-pp" || flag == "--compress-tp") {
            loom::Compression c;
            try {
                c = loom::parse_compression(value);
            } catch (const loom::Error& e) {
                usage_error(std::string(flag) + ": " + e.message());
            }
            if (flag == "--compress") {
                f.compress = c;
            } else {
                if (c.on() && !c.is_cast())
                    usage_error(std::string(flag) + " " + value + ": activations take bf16, fp16 or none (no error "
                                "feedback recovers what a lossier compressor drops); --compress is for gradients");
                (flag == "--compress-pp" ? f.compress_pp : f.compress_tp) = c;
            }
        } else if (flag == "--compress-warmup") f.compress_warmup = parse_int(flag, value, 0, 1LL << 40);
        else if (flag == "--freeze-variance") f.freeze_variance = parse_int(flag, value, 1, 1LL << 40);
        else if (flag == "--optex") f.optex = static_cast<int>(parse_int(flag, value, 1, 1024));
        else if (flag == "--optex-history") f.optex_config.estimator.history = static_cast<int>(parse_int(flag, value, 2, 100000));
        else if (flag == "--optex-effective-dim") f.optex_config.effective_dim = parse_int(flag, value, 1, 1LL << 40);
        else if (flag == "--optex-tune") f.optex_tune = static_cast<int>(parse_int(flag, value, 0, 1 << 30));
        else if (flag == "--optex-length-scale") {
            char* end = nullptr;
            const double l = std::strtod(value, &end);
            if (end == value || *end != '\0' || !(l > 0) || !std::isfinite(l))
                usage_error(std::string("--optex-length-scale ") + value + " is not a finite number > 0");
            f.optex_config.estimator.length_scale = l;
        } else if (flag == "--optex-select") {
            const std::string_view rule(value);
            using loom::optim::OptExSelect;
            if (rule == "last") f.optex_config.select = OptExSelect::last;
            else if (rule == "lowest-loss") f.optex_config.select = OptExSelect::lowest_loss;
            else if (rule == "smallest-gradient") f.optex_config.select = OptExSelect::smallest_gradient;
            else usage_error("--optex-select " + std::string(value) + " is not last, lowest-loss or smallest-gradient");
        }
        else if (flag == "--metrics") f.metrics = value;
        else if (flag == "--save") f.save = value;
        else if (flag == "--resume") f.resume = value;
        else if (flag == "--trace") f.trace = value;
        else if (flag == "--cluster") f.cluster = value;
        else if (flag == "--device") {
            f.device = parse_device(value);
            f.device_per_process = std::string_view(value) == "cuda";
        }
        else if (flag == "--matmul") {
            try {
                f.matmul = loom::kernels::parse_matmul_precision(value);
            } catch (const loom::Error& e) {
                usage_error("--matmul: " + e.message());
            }
        }
        else if (flag == "--lr") {
            char* end = nullptr;
            f.lr = std::strtof(value, &end);
            if (end == value || *end != '\0' || !(f.lr > 0.0f) || f.lr > 10.0f)
                usage_error(std::string("--lr ") + value + " is not a number in (0, 10]");
        } else {
            usage_error("unknown flag " + std::string(flag));
        }
    }
    f.model.validate();
    if (f.pp == 1 && !f.schedule_text.empty())
        usage_error("--schedule " + f.schedule_text + " needs a pipeline; add --pp 2 or more");
    if (f.pp == 1 && !f.partition.empty()) usage_error("--partition " + f.partition + " needs a pipeline; add --pp 2 or more");
    if (f.chunks > 0 && f.schedule != loom::ScheduleKind::interleaved)
        usage_error("--chunks " + std::to_string(f.chunks) + " is for --schedule interleaved; " +
                    std::string(loom::name(f.schedule)) + " runs " + (f.schedule == loom::ScheduleKind::zero_bubble_v ? "2" : "1") +
                    " chunk(s) per rank");
    if (f.compress_warmup >= 0 && !f.compress.on())
        usage_error("--compress-warmup " + std::to_string(f.compress_warmup) + " needs a compressor; add --compress");
    if (f.compress_pp.on() && f.pp == 1) usage_error("--compress-pp needs a pipeline; add --pp 2 or more");
    if (f.compress_tp.on() && f.tp == 1) usage_error("--compress-tp needs tensor parallelism; add --tp 2 or more");
    if (f.compress_tp.on() && f.tp_grid)
        usage_error("--compress-tp casts Megatron's all-reduces; it is not supported with --tp-mode 2d");
    if (f.optex == 0) {
        const bool tuned = f.optex_tune >= 0 || f.optex_config.effective_dim > 0, default_history = f.optex_config.estimator.history == 50,
                   default_scale = f.optex_config.estimator.length_scale == 0.1,
                   default_select = f.optex_config.select == loom::optim::OptExSelect::last;
        if (tuned || !default_history || !default_scale || !default_select)
            usage_error("--optex-history, --optex-length-scale, --optex-select, --optex-tune and --optex-effective-dim set "
                        "up OptEx; add --optex N");
    } else {
        // OptEx runs its own loop over whole-model gradients: data parallelism
        // inside each worker, nothing that cuts the model or the exchange.
        const auto refuse = [&](bool given, const std::string& what) {
            if (given) usage_error("--optex " + std::to_string(f.optex) + " composes with --dp only; drop " + what);
        };
        refuse(f.pp > 1, "--pp " + std::to_string(f.pp));
        refuse(f.tp > 1, "--tp " + std::to_string(f.tp));
        refuse(f.sp > 1, "--sp " + std::to_string(f.sp));
        refuse(f.zero > 0, "--zero " + std::to_string(f.zero) + " (OptEx shards its own state over the workers)");
        refuse(f.micro_batches > 1, "--micro-batches " + std::to_string(f.micro_batches));
        refuse(f.compress.on(), "--compress " + f.compress.describe());
        refuse(f.freeze_variance >= 0, "--freeze-variance");
        refuse(!f.trace.empty(), "--trace (the step program is the executor's; OptEx steps outside it)");
        // Tuned by default: on the GPT the reference's l = 0.1 (chosen for its
        // synthetic functions) makes 4 workers worse than AdamW, and the
        // tuning picks 1 to 100 (docs/optex.md).
        const int history = f.optex_config.estimator.history;
        if (f.optex_tune > 0 && history < 3)
            usage_error("--optex-tune needs --optex-history 3 or more (one point held out, two fitted)");
        f.optex_config.tune_every = f.optex_tune >= 0 ? f.optex_tune : (history >= 3 ? 25 : 0);
        f.optex_config.holdout = std::max(1, std::min(f.optex_config.holdout, f.optex_config.estimator.history - 2));
        f.optex_config.workers = f.optex;
    }
    if (f.until < 0) f.until = f.steps;
    if (f.until > f.steps) usage_error("--until " + std::to_string(f.until) + " is past --steps " + std::to_string(f.steps));
    return f;
}
