// Kraken's validation loss against the standard GPT's after the same
// training budget on real English (issue 39: "within 3% of the standard
// GPT's"). Every model here has the same layers, width, heads, sequence and
// byte vocab, so the same matrix weights (gpt/kraken.hpp); each trains on one
// thread with the same init seed, the same batches in the same order, the same
// AdamW and the same warmup-then-cosine learning rate, on the first 90% of the
// corpus, and is scored on windows from the last 10%, which no batch touches.
//
// The corpus is a text file; bench/kraken_corpus.sh builds the one the docs
// report (the Debian Administrator's Handbook from package debian-handbook).
// The loop is nn::forward_backward and optim::AdamW on one ParamArena, the
// single-rank step the executor takes (tests/parallel/test_kraken_equivalence
// checks dp runs equal it), so both models run exactly the same optimizer code.
//
//   bench_kraken_quality CORPUS [--models gpt,kraken2,kraken4] [--layers 4] [--width 128] [--heads 4]
//                        [--seq 128] [--batch 16] [--steps 1000] [--lr 2e-3] [--every 100]
//                        [--probe-windows 64] [--seed 1] [--csv FILE]
//
// --models runs a subset (one process per model lets the runs share a
// machine's cores); the losses do not depend on which or how many run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <loom/core/rng.hpp>
#include <loom/core/tensor.hpp>
#include <loom/gpt/kraken.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/compose.hpp>
#include <loom/nn/context.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/schedule.hpp>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
    std::string corpus, models = "gpt,kraken2,kraken4", csv;
    std::int64_t layers = 4, width = 128, heads = 4, seq = 128, batch = 16, steps = 1000, every = 100;
    std::int64_t probe_windows = 64;  // the periodic validation points; the final one uses every window
    float lr = 2e-3f;
    std::uint64_t seed = 1;
};

// The corpus split once: training windows are drawn from `train` only, and
// validation windows are the non-overlapping windows of `valid`.
struct Split {
    std::string train, valid;
};

Split split_corpus(const std::string& path, std::int64_t seq) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "bench_kraken_quality: cannot read %s; build it with bench/kraken_corpus.sh\n",
                     path.c_str());
        std::exit(2);
    }
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t cut = text.size() / 10 * 9;
    Split s{text.substr(0, cut), text.substr(cut)};
    if (static_cast<std::int64_t>(s.valid.size()) < 4 * (seq + 1)) {
        std::fprintf(stderr, "bench_kraken_quality: %s has %zu bytes, too few for a held-out tenth of windows\n",
                     path.c_str(), text.size());
        std::exit(2);
    }
    return s;
}

std::int32_t byte_token(char c) { return static_cast<std::int32_t>(static_cast<unsigned char>(c)); }

// Batch `step` from the training text: row r starts at an offset drawn from
// RngStream{seed, step} (ByteCorpus's rule), so every model sees the same rows.
void training_batch(const std::string& text, std::uint64_t seed, std::int64_t step, std::int64_t rows,
                    std::int64_t seq, std::vector<std::int32_t>& x, std::vector<std::int32_t>& y) {
    const loom::RngStream rng{seed, static_cast<std::uint64_t>(step)};
    const auto starts = static_cast<std::uint64_t>(static_cast<std::int64_t>(text.size()) - seq);
    for (std::int64_t r = 0; r < rows; ++r) {
        const auto row = static_cast<std::uint64_t>(r);
        const std::uint64_t bits = (std::uint64_t{rng.bits(2 * row)} << 32) | rng.bits(2 * row + 1);
        const auto start = static_cast<std::size_t>(bits % starts);
        for (std::int64_t t = 0; t < seq; ++t) {
            const auto at = static_cast<std::size_t>(r * seq + t);
            x[at] = byte_token(text[start + static_cast<std::size_t>(t)]);
            y[at] = byte_token(text[start + static_cast<std::size_t>(t) + 1]);
        }
    }
}

// The starts of `count` validation windows spread evenly over the held-out
// text (count <= 0: every non-overlapping window).
std::vector<std::size_t> validation_starts(const std::string& valid, std::int64_t seq, std::int64_t count) {
    const auto windows = static_cast<std::int64_t>(valid.size() - 1) / seq;
    if (count <= 0 || count > windows) count = windows;
    std::vector<std::size_t> starts;
    for (std::int64_t i = 0; i < count; ++i) starts.push_back(static_cast<std::size_t>(i * windows / count * seq));
    return starts;
}

// Mean loss per token over the windows, `rows` at a time (a short last batch).
template <class Model>
double validation_loss(Model& model, loom::nn::Context& ctx, const std::string& valid,
                       const std::vector<std::size_t>& starts, std::int64_t rows, std::int64_t seq) {
    double total = 0;
    std::vector<std::int32_t> x, y;
    for (std::size_t first = 0; first < starts.size(); first += static_cast<std::size_t>(rows)) {
        const std::size_t end = std::min(starts.size(), first + static_cast<std::size_t>(rows));
        x.clear();
        y.clear();
        for (std::size_t w = first; w < end; ++w)
            for (std::int64_t t = 0; t < seq; ++t) {
                x.push_back(byte_token(valid[starts[w] + static_cast<std::size_t>(t)]));
                y.push_back(byte_token(valid[starts[w] + static_cast<std::size_t>(t) + 1]));
            }
        const auto n = static_cast<std::int64_t>(end - first);
        // CrossEntropy's loss is the mean over the batch's tokens; weigh by rows.
        total += static_cast<double>(loom::nn::evaluate(model, ctx, loom::Tensor::of(x.data(), {n, seq}),
                                                        loom::Tensor::of(y.data(), {n, seq}))) *
                 static_cast<double>(n);
    }
    return total / static_cast<double>(starts.size());
}

struct Point {
    std::int64_t step;
    double train, valid;
};

struct Result {
    std::string name;
    std::int64_t parameters = 0;
    std::vector<Point> curve;
    double final_valid = 0, seconds = 0;
};

template <class Model>
Result train(const std::string& name, Model model, const Split& data, const Options& o) {
    Result result{name, 0, {}, 0, 0};
    loom::nn::ParamArena arena(model);
    arena.initialize(model, o.seed);
    result.parameters = arena.size();
    // train_gpt's AdamW (examples/train_gpt.cpp): betas 0.9 / 0.95, weight decay 0.1.
    loom::optim::AdamW adamw(arena.size(), {.lr = o.lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                            .weight_decay = 0.1f});
    const std::int64_t warmup = std::max<std::int64_t>(1, o.steps / 20);
    const auto probe = validation_starts(data.valid, o.seq, o.probe_windows);
    loom::nn::Context ctx;
    std::vector<std::int32_t> x(static_cast<std::size_t>(o.batch * o.seq)), y(x.size());
    double train_sum = 0;
    std::int64_t train_count = 0;
    const auto t0 = Clock::now();
    for (std::int64_t step = 0; step < o.steps; ++step) {
        training_batch(data.train, o.seed, step, o.batch, o.seq, x, y);
        arena.zero_grads();
        const float loss = loom::nn::forward_backward(model, ctx, loom::Tensor::of(x.data(), {o.batch, o.seq}),
                                                      loom::Tensor::of(y.data(), {o.batch, o.seq}));
        adamw.set_lr(loom::optim::cosine_lr(step + 1, o.steps, o.lr, warmup));
        adamw.step(arena.values(), arena.grads());
        train_sum += static_cast<double>(loss);
        ++train_count;
        const bool last = step + 1 == o.steps;
        if ((step + 1) % o.every == 0 || last) {
            const double valid = validation_loss(model, ctx, data.valid, probe, o.batch, o.seq);
            // Train loss: the mean over the steps since the last point (one batch is noisy).
            result.curve.push_back({step + 1, train_sum / static_cast<double>(train_count), valid});
            std::printf("%-8s step %5lld  train %.4f  valid(%zu windows) %.4f  %.0f s\n", name.c_str(),
                        static_cast<long long>(step + 1), train_sum / static_cast<double>(train_count), probe.size(),
                        valid, std::chrono::duration<double>(Clock::now() - t0).count());
            std::fflush(stdout);
            train_sum = 0;
            train_count = 0;
        }
    }
    const auto every_window = validation_starts(data.valid, o.seq, 0);
    result.final_valid = validation_loss(model, ctx, data.valid, every_window, o.batch, o.seq);
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("%-8s final validation loss over all %zu held-out windows: %.4f (%.0f s)\n", name.c_str(),
                every_window.size(), result.final_valid, result.seconds);
    std::fflush(stdout);
    return result;
}

Options parse(int argc, char** argv) {
    Options o;
    if (argc < 2 || argv[1][0] == '-') {
        std::fprintf(stderr, "usage: bench_kraken_quality CORPUS [--models gpt,kraken2,kraken4] [--layers N] "
                             "[--width N] [--heads N] [--seq N] [--batch N] [--steps N] [--lr X] [--every N] "
                             "[--probe-windows N] [--seed N] [--csv FILE]\n");
        std::exit(2);
    }
    o.corpus = argv[1];
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string flag = argv[i], value = argv[i + 1];
        const long long v = std::atoll(value.c_str());
        if (flag == "--models") o.models = value;
        else if (flag == "--csv") o.csv = value;
        else if (flag == "--layers") o.layers = v;
        else if (flag == "--width") o.width = v;
        else if (flag == "--heads") o.heads = v;
        else if (flag == "--seq") o.seq = v;
        else if (flag == "--batch") o.batch = v;
        else if (flag == "--steps") o.steps = v;
        else if (flag == "--every") o.every = v;
        else if (flag == "--probe-windows") o.probe_windows = v;
        else if (flag == "--seed") o.seed = static_cast<std::uint64_t>(v);
        else if (flag == "--lr") o.lr = std::strtof(value.c_str(), nullptr);
        else {
            std::fprintf(stderr, "bench_kraken_quality: unknown flag %s; run it without arguments for the flags\n",
                         flag.c_str());
            std::exit(2);
        }
    }
    if (o.steps < 1 || o.every < 1 || o.batch < 1) {
        std::fprintf(stderr, "bench_kraken_quality: --steps, --every and --batch must be at least 1\n");
        std::exit(2);
    }
    return o;
}

std::vector<std::string> model_names(const std::string& list) {
    std::vector<std::string> names;
    std::stringstream in(list);
    for (std::string name; std::getline(in, name, ',');) {
        if (name != "gpt" && name != "kraken2" && name != "kraken4") {
            std::fprintf(stderr, "bench_kraken_quality: unknown model %s; use gpt, kraken2 or kraken4\n",
                         name.c_str());
            std::exit(2);
        }
        names.push_back(name);
    }
    return names;
}

}  // namespace

int main(int argc, char** argv) {
    const Options o = parse(argc, argv);
    loom::kernels::host::set_blas_threads(1);
    const Split data = split_corpus(o.corpus, o.seq);
    const loom::gpt::Config gpt{o.layers, o.width, o.heads, o.seq, 256};
    std::printf("corpus %s: %zu bytes train, %zu bytes held out; %lld layers, width %lld, %lld heads, seq %lld, "
                "batch %lld, %lld steps (%lld tokens), peak lr %g, seed %llu\n",
                o.corpus.c_str(), data.train.size(), data.valid.size(), static_cast<long long>(o.layers),
                static_cast<long long>(o.width), static_cast<long long>(o.heads), static_cast<long long>(o.seq),
                static_cast<long long>(o.batch), static_cast<long long>(o.steps),
                static_cast<long long>(o.steps * o.batch * o.seq), static_cast<double>(o.lr),
                static_cast<unsigned long long>(o.seed));
    std::vector<Result> results;
    for (const std::string& name : model_names(o.models)) {
        if (name == "gpt") {
            results.push_back(train(name, loom::gpt::make_model(gpt), data, o));
        } else {
            const std::int64_t degree = name == "kraken2" ? 2 : 4;
            const loom::gpt::KrakenConfig kraken{o.layers, o.width, o.heads, o.seq, 256, degree};
            results.push_back(train(name, loom::gpt::make_kraken(kraken), data, o));
        }
    }
    std::printf("\n%-8s %12s %14s %16s\n", "model", "parameters", "final valid", "vs gpt");
    const Result* reference = nullptr;
    for (const Result& r : results)
        if (r.name == "gpt") reference = &r;
    for (const Result& r : results) {
        std::string ratio = "-";
        if (reference != nullptr && &r != reference) {
            const double q = r.final_valid / reference->final_valid;
            ratio = std::to_string(q).substr(0, 6) + (q <= 1.03 ? " (met)" : " (missed)");
        }
        std::printf("%-8s %12lld %14.4f %16s\n", r.name.c_str(), static_cast<long long>(r.parameters),
                    r.final_valid, ratio.c_str());
    }
    if (!o.csv.empty()) {
        std::ofstream out(o.csv);
        out << "model,step,tokens,train_loss,valid_loss\n";
        for (const Result& r : results)
            for (const Point& p : r.curve)
                out << r.name << ',' << p.step << ',' << p.step * o.batch * o.seq << ',' << p.train << ','
                    << p.valid << '\n';
    }
    return 0;
}
