// train_gpt: trains loom's reference GPT byte by byte, on a text file or on a
// built-in synthetic corpus, on one core (or --threads BLAS threads).
//
//   train_gpt [--data FILE] [--layers 4] [--width 256] [--heads 4] [--seq 128] [--batch 8]
//             [--vocab 256] [--steps 200] [--until N] [--lr 1e-3] [--seed 1] [--threads 1]
//             [--metrics FILE.jsonl] [--save FILE.safetensors] [--resume FILE.safetensors]
//             [--sample N]
//
// A progress bar on a terminal (plain lines otherwise), one JSON object per
// step with --metrics, checkpoints in safetensors written atomically, and a
// sample of generated text at the end with --sample.
#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/model.hpp>
#include <loom/gpt/sample.hpp>
#include <loom/data/corpus.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/schedule.hpp>
#include <loom/train/metrics.hpp>
#include <loom/train/progress.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct Flags {
    loom::gpt::Config model;
    std::int64_t batch = 8;
    std::int64_t steps = 200;      // the schedule's length
    std::int64_t until = -1;       // stop after this step (default: steps)
    float lr = 1e-3f;
    std::uint64_t seed = 1;
    int threads = 1;
    std::string data, metrics, save, resume;
    std::int64_t sample = 0;
};

[[noreturn]] void usage_error(const std::string& what) {
    throw loom::Error("train_gpt: " + what +
                      " (flags: --data FILE --layers N --width N --heads N --seq N --batch N --vocab N --steps N --lr X "
                      "--until N --seed N --threads N --metrics FILE --save FILE --resume FILE --sample N)");
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
        else if (flag == "--sample") f.sample = parse_int(flag, value, 0, 1 << 20);
        else if (flag == "--metrics") f.metrics = value;
        else if (flag == "--save") f.save = value;
        else if (flag == "--resume") f.resume = value;
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

int run(int argc, char** argv) {
    const Flags flags = parse(argc, argv);
    loom::kernels::host::set_blas_threads(flags.threads);

    const auto corpus = flags.data.empty()
                            ? loom::data::ByteCorpus::synthetic(std::int64_t{1} << 20, flags.seed, static_cast<int>(flags.model.vocab))
                            : loom::data::ByteCorpus::from_file(flags.data, static_cast<int>(flags.model.vocab));
    {
        // A corpus too short for one sequence is refused before anything is built.
        std::vector<std::int32_t> probe(static_cast<std::size_t>(flags.model.seq)), probe_targets(probe.size());
        corpus.batch(flags.seed, 0, 1, flags.model.seq, probe, probe_targets);
    }
    loom::gpt::Model model = loom::gpt::make_model(flags.model);
    loom::nn::ParamArena arena(model);
    loom::optim::AdamW optimizer(arena.size(), loom::optim::AdamWConfig{flags.lr, 0.9f, 0.95f, 1e-8f, 0.1f});
    std::int64_t first_step = 0;
    if (!flags.resume.empty()) {
        first_step = loom::gpt::load_checkpoint(flags.resume, flags.model, arena, optimizer);
    } else {
        arena.initialize(model, flags.seed);
    }

    std::printf("%s, %lld parameters, batch %lld x %lld tokens, %s, %d BLAS thread%s\n",
                [&] { std::ostringstream s; s << flags.model; return s.str(); }().c_str(),
                static_cast<long long>(arena.size()), static_cast<long long>(flags.batch),
                static_cast<long long>(flags.model.seq), corpus.describe().c_str(), flags.threads,
                flags.threads == 1 ? "" : "s");
    if (first_step > 0) std::printf("resumed from %s at step %lld\n", flags.resume.c_str(), static_cast<long long>(first_step));

    const std::int64_t tokens_per_step = flags.batch * flags.model.seq;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(tokens_per_step)), targets(inputs.size());
    const auto input_tensor = loom::Tensor::of(inputs.data(), {flags.batch, flags.model.seq});
    const auto target_tensor = loom::Tensor::of(targets.data(), {flags.batch, flags.model.seq});
    std::optional<loom::train::MetricsWriter> metrics;
    // A resumed run continues its metrics file instead of replacing it.
    if (!flags.metrics.empty())
        metrics.emplace(flags.metrics, first_step > 0 ? loom::train::MetricsWriter::Mode::append
                                                      : loom::train::MetricsWriter::Mode::replace);
    const std::int64_t total = flags.steps, last = flags.until;
    LOOM_CHECK(first_step <= last, "train_gpt: the checkpoint ", flags.resume, " is at step ", first_step,
               ", past --until ", last);
    loom::train::Progress progress(last - first_step);
    loom::nn::Context ctx;
    float loss = 0;
    for (std::int64_t step = first_step; step < last; ++step) {
        const auto t0 = std::chrono::steady_clock::now();
        corpus.batch(flags.seed, step, flags.batch, flags.model.seq, inputs, targets);
        arena.zero_grads();
        loss = loom::nn::forward_backward(model, ctx, input_tensor, target_tensor);
        optimizer.set_lr(loom::optim::cosine_lr(step + 1, total, flags.lr, std::min<std::int64_t>(20, total / 10)));
        optimizer.step(arena.values(), arena.grads());
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double tokens_per_second = static_cast<double>(tokens_per_step) / seconds;
        progress.update(step - first_step + 1, loss, tokens_per_second);
        if (metrics) metrics->write(step, loss, tokens_per_second);
    }
    progress.finish();
    if (last > first_step) std::printf("final loss %.4f after %lld steps\n", static_cast<double>(loss), static_cast<long long>(last));

    if (!flags.save.empty()) {
        loom::gpt::save_checkpoint(flags.save, flags.model, arena, optimizer, last, corpus.describe());
        std::printf("saved %s (step %lld)\n", flags.save.c_str(), static_cast<long long>(last));
    }
    if (flags.sample > 0) {
        const std::string text = loom::gpt::sample(model, flags.model, corpus.text().substr(0, 16), flags.sample, flags.seed);
        std::printf("sample:\n%s\n", text.c_str());
    }
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
