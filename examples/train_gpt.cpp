// train_gpt: trains loom's reference GPT byte by byte, on a text file or on a
// built-in synthetic corpus: on one core, on --dp N rank threads of this
// process, or on the processes of `mpirun -np N train_gpt` (found from the
// launcher's environment), with ZeRO stage --zero S and --micro-batches M.
//
//   train_gpt [--data FILE] [--layers 4] [--width 256] [--heads 4] [--seq 128] [--batch 8]
//             [--vocab 256] [--steps 200] [--until N] [--lr 1e-3] [--seed 1] [--threads 1]
//             [--dp 1] [--zero 0] [--micro-batches 1] [--trace FILE.json]
//             [--metrics FILE.jsonl] [--save FILE.safetensors] [--resume FILE.safetensors]
//             [--sample N]
//
// --batch is the global batch per optimizer step: --dp 2 --batch 16 is 8
// sequences per rank, so the same flags with another --dp train the same
// model (up to the order of floating-point sums). Checkpoints hold the whole
// model whatever the strategy: save with --dp 4 --zero 3, resume serially.
// A progress bar on a terminal (plain lines otherwise), one JSON object per
// step with --metrics, checkpoints in safetensors written atomically, a
// Chrome/Perfetto trace of every rank with --trace, and a sample of
// generated text at the end with --sample.
#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/trace.hpp>
#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/model.hpp>
#include <loom/gpt/sample.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/schedule.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/progress.hpp>

#if LOOM_EXAMPLE_WITH_MPI
#include <loom/comm/communicator_mpi.hpp>
#include <loom/comm/session_mpi.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

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
    std::string data, metrics, save, resume, trace;
    std::int64_t sample = 0;
};

[[noreturn]] void usage_error(const std::string& what) {
    throw loom::Error("train_gpt: " + what +
                      " (flags: --data FILE --layers N --width N --heads N --seq N --batch N --vocab N --steps N --lr X "
                      "--until N --seed N --threads N --dp N --zero 0..3 --micro-batches N --trace FILE --metrics FILE "
                      "--save FILE --resume FILE --sample N)");
}

std::int64_t parse_int(std::string_view flag, const char* text, std::int64_t low, std::int64_t high) {
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (end == text || *end != '\0' || value < low || value > high)
        usage_error(std::string(flag) + " " + text + " is not a whole number in " + std::to_string(low) + ".." +
                    std::to_string(high));
    return value;
}

Flags parse(int argc, char** argv) {
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
        else if (flag == "--sample") f.sample = parse_int(flag, value, 0, 1 << 20);
        else if (flag == "--metrics") f.metrics = value;
        else if (flag == "--save") f.save = value;
        else if (flag == "--resume") f.resume = value;
        else if (flag == "--trace") f.trace = value;
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
    if (f.until < 0) f.until = f.steps;
    if (f.until > f.steps) usage_error("--until " + std::to_string(f.until) + " is past --steps " + std::to_string(f.steps));
    return f;
}

// The strategy --zero names, as the compile-time type a user would write.
template <int Stage>
using ZeroStrategy = std::conditional_t<Stage == 0, loom::Strategy<loom::DataParallel<>>,
                                        loom::Strategy<loom::DataParallel<>, loom::ZeroShard<Stage == 0 ? 1 : Stage>>>;

template <int Stage>
std::pair<loom::exec::ExecutionPlan, std::string> plan_for() {
    std::ostringstream name;
    name << ZeroStrategy<Stage>{};
    return {loom::exec::ExecutionPlan::of<ZeroStrategy<Stage>>(), name.str()};
}

std::pair<loom::exec::ExecutionPlan, std::string> strategy_for(int zero) {
    switch (zero) {
        case 1: return plan_for<1>();
        case 2: return plan_for<2>();
        case 3: return plan_for<3>();
        default: return plan_for<0>();
    }
}

// Everything a run checks before it builds anything, the same on every rank.
void check_degrees(const Flags& flags, int world, int dp) {
    if (world % dp != 0)
        usage_error("--dp " + std::to_string(dp) + " does not divide the world size " + std::to_string(world) +
                    "; use a divisor of " + std::to_string(world));
    if (dp != world)
        usage_error("--dp " + std::to_string(dp) + " leaves " + std::to_string(world - dp) + " of the " +
                    std::to_string(world) + " ranks without work; data parallelism alone needs --dp " +
                    std::to_string(world));
    const std::int64_t split = static_cast<std::int64_t>(dp) * flags.micro_batches;
    if (flags.batch % split != 0)
        usage_error("--batch " + std::to_string(flags.batch) + " is not divisible by --dp " + std::to_string(dp) +
                    " x --micro-batches " + std::to_string(flags.micro_batches) + " = " + std::to_string(split) +
                    "; every rank needs the same whole number of sequences per micro-batch");
}

template <loom::comm::Communicator C>
void train(C& world, const Flags& flags, const char* transport) {
    const int dp_size = flags.dp > 0 ? flags.dp : world.size();
    check_degrees(flags, world.size(), dp_size);
    loom::kernels::host::set_blas_threads(flags.threads);
    const bool lead = world.rank() == 0;

    const auto corpus = flags.data.empty()
                            ? loom::data::ByteCorpus::synthetic(std::int64_t{1} << 20, flags.seed, static_cast<int>(flags.model.vocab))
                            : loom::data::ByteCorpus::from_file(flags.data, static_cast<int>(flags.model.vocab));
    {
        // A corpus too short for one sequence is refused before anything is built.
        std::vector<std::int32_t> probe(static_cast<std::size_t>(flags.model.seq)), probe_targets(probe.size());
        corpus.batch(flags.seed, 0, 1, flags.model.seq, probe, probe_targets);
    }

    loom::comm::Mesh<C> mesh(world, {{"dp", dp_size}});
    C& dp = mesh.axis("dp");
    loom::gpt::Model model = loom::gpt::make_model(flags.model);
    const auto [plan, strategy] = strategy_for(flags.zero);
    loom::exec::Executor<C> exec(model, dp, plan,
                                 {.micro_batches = flags.micro_batches,
                                  .adamw = loom::optim::AdamWConfig{flags.lr, 0.9f, 0.95f, 1e-8f, 0.1f},
                                  .trace = !flags.trace.empty(),
                                  .field_names = {"embed", "blocks", "ln_f", "head", "loss"}});
    const auto parameters = exec.layout().dense_size();
    std::int64_t first_step = 0;
    if (!flags.resume.empty()) {
        // Every rank reads the whole checkpoint and keeps what it owns.
        std::vector<float> values(static_cast<std::size_t>(parameters)), m(values.size()), v(values.size());
        const auto steps = loom::gpt::load_checkpoint(flags.resume, flags.model, values, m, v);
        exec.load_state(values, m, v, steps.optimizer_steps);
        first_step = steps.step;
    } else {
        exec.initialize(flags.seed);
    }

    if (lead) {
        std::ostringstream config;
        config << flags.model;
        std::printf("%s, %lld parameters, batch %lld x %lld tokens, %s\n", config.str().c_str(),
                    static_cast<long long>(parameters), static_cast<long long>(flags.batch),
                    static_cast<long long>(flags.model.seq), corpus.describe().c_str());
        std::printf("%s on %d %s, %d micro-batch%s, %d BLAS thread%s per rank\n", strategy.c_str(), dp_size, transport,
                    flags.micro_batches, flags.micro_batches == 1 ? "" : "es", flags.threads, flags.threads == 1 ? "" : "s");
        const unsigned cores = std::thread::hardware_concurrency();
        if (cores > 0 && std::string_view(transport) == "rank threads" &&
            static_cast<unsigned>(dp_size * flags.threads) > cores)
            std::printf("note: %d ranks x %d BLAS threads oversubscribe the %u cores; expect lower speed\n", dp_size,
                        flags.threads, cores);
        if (first_step > 0) std::printf("resumed from %s at step %lld\n", flags.resume.c_str(), static_cast<long long>(first_step));
    }

    const std::int64_t rows = flags.batch / dp_size;
    const std::int64_t tokens_per_step = flags.batch * flags.model.seq;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * flags.model.seq)), targets(inputs.size());
    const auto input_tensor = loom::Tensor::of(inputs.data(), {rows, flags.model.seq});
    const auto target_tensor = loom::Tensor::of(targets.data(), {rows, flags.model.seq});
    std::optional<loom::train::MetricsWriter> metrics;
    // A resumed run continues its metrics file instead of replacing it.
    if (lead && !flags.metrics.empty())
        metrics.emplace(flags.metrics, first_step > 0 ? loom::train::MetricsWriter::Mode::append
                                                      : loom::train::MetricsWriter::Mode::replace);
    const std::int64_t total = flags.steps, last = flags.until;
    LOOM_CHECK(first_step <= last, "train_gpt: the checkpoint ", flags.resume, " is at step ", first_step,
               ", past --until ", last);
    std::optional<loom::train::Progress> progress;
    if (lead) progress.emplace(last - first_step);
    float loss = 0;
    for (std::int64_t step = first_step; step < last; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        corpus.rows(flags.seed, step, dp.rank() * rows, rows, flags.model.seq, inputs, targets);
        const float lr = loom::optim::cosine_lr(step + 1, total, flags.lr, std::min<std::int64_t>(20, total / 10));
        loss = exec.step(input_tensor, target_tensor, lr);
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tokens_per_second = static_cast<double>(tokens_per_step) / seconds;
        if (progress) progress->update(step - first_step + 1, loss, tokens_per_second);
        if (metrics) metrics->write(step, loss, tokens_per_second);
    }
    if (progress) progress->finish();
    if (lead && last > first_step)
        std::printf("final loss %.4f after %lld steps\n", static_cast<double>(loss), static_cast<long long>(last));
    if (lead && dp_size > 1) {
        std::ostringstream report;
        report << exec.memory_report();
        std::printf("memory per rank: %s\n", report.str().c_str());
    }

    if (!flags.trace.empty()) {
        loom::exec::write_trace(dp, exec.trace(), flags.trace);
        if (lead) std::printf("trace of %d ranks written to %s (open in ui.perfetto.dev)\n", dp_size, flags.trace.c_str());
    }
    if (!flags.save.empty() || flags.sample > 0) {
        // The whole model on every rank (a collective), in the serial layout.
        std::vector<float> values(static_cast<std::size_t>(parameters)), m(values.size()), v(values.size());
        exec.gather_state(values, m, v);
        if (lead && !flags.save.empty()) {
            loom::gpt::save_checkpoint(flags.save, flags.model, values, m, v, exec.optimizer_steps(), last,
                                       corpus.describe());
            std::printf("saved %s (step %lld)\n", flags.save.c_str(), static_cast<long long>(last));
        }
        if (lead && flags.sample > 0) {
            loom::gpt::Model serial = loom::gpt::make_model(flags.model);
            loom::nn::ParamArena arena(serial);
            std::copy(values.begin(), values.end(), arena.values().begin());
            const std::string text = loom::gpt::sample(serial, flags.model, corpus.text().substr(0, 16), flags.sample, flags.seed);
            std::printf("sample:\n%s\n", text.c_str());
        }
    }
}

// mpirun and srun tell their processes who they are in the environment.
bool launched_by_mpi() {
    for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
        if (std::getenv(variable) != nullptr) return true;
    return false;
}

int run(int argc, char** argv) {
    const Flags flags = parse(argc, argv);
    if (launched_by_mpi()) {
#if LOOM_EXAMPLE_WITH_MPI
        loom::comm::MpiSession session(argc, argv);
        auto world = loom::comm::Mpi::world();
        try {
            world.run([&](loom::comm::Mpi& comm) { train(comm, flags, "MPI processes"); });
        } catch (const std::exception& e) {
            // Printed here, before the session ends the job with MPI_Abort.
            std::fprintf(stderr, "%s\n", e.what());
            return 1;
        }
        return 0;
#else
        usage_error("started by an MPI launcher, but this build has no MPI (configure with LOOM_WITH_MPI=ON)");
#endif
    }
    const int ranks = flags.dp > 0 ? flags.dp : 1;
    loom::comm::ThreadWorld(ranks).run([&](loom::comm::ThreadComm& comm) {
        train(comm, flags, ranks == 1 ? "rank thread" : "rank threads");
    });
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
