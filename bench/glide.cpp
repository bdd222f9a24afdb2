// GliDe against a plain draft, both trained (issue 40): on a real English
// corpus, the Debian package base-files' licence texts (every file under
// /usr/share/common-licenses, sorted by name and concatenated; bytes are the
// tokens, vocabulary 256), this trains
//   - a target GPT (--target-layers/--target-width/--target-heads, sequence 128),
//   - a plain 1-layer draft GPT (width --draft-width, 4 heads), and
//   - a GliDe 1-layer draft of the same width (gpt/glide_draft.hpp: its
//     cross-attention reads the frozen target's last layer, stale mask 5),
// each with exec::SerialTrainer (AdamW, cosine schedule, batch 8 x 128, the
// same batches), on the first 90% of the text. The last 10% is held out:
// the evaluation losses and the prompts come from it. Then, batch 1, greedy,
// gamma 4, --tokens new tokens after each of --prompts 32-token prompts:
// mean accepted draft tokens per target pass (plain vs GliDe, and with
// CaPE), and tokens/s for autoregressive decoding, vanilla speculative with
// the plain draft, GliDe, and GliDe + CaPE (medians of --reps, paths
// interleaved), at batch 1 (one request after another) and at batch
// --batch (the prompts decoded together), on each GEMM thread count of
// --decode-threads (1: one core). Training uses --threads GEMM threads.
// Every greedy speculative run must give the target's tokens; the bench says
// whether they did. Not a test: it takes minutes.
//
//   bench_glide [--steps 400] [--target-layers 4] [--target-width 128] [--target-heads 4] [--draft-width 64]
//               [--prompts 8] [--tokens 64] [--reps 3] [--lr 2e-3] [--glide-lr 2e-3]
//               [--target FILE] [--plain FILE] [--glide FILE] (each loaded if it exists, else trained and saved there)
//               [--save-glide FILE] [--threads 1] [--decode-threads 1,2] [--batch 8]
//               [--cape-bins K@P,...,K (two more paths: CaPE with these bins, plain and GliDe)]
//               [--glide-zero-output 1] [--glide-stale 5] [--glide-recency 1] [--draft-batches N] [--log-every N] [--copyrights 1]
#include <loom/exec/serial_trainer.hpp>
#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/glide_checkpoint.hpp>
#include <loom/gpt/glide_draft.hpp>
#include <loom/gpt/model.hpp>
#include <loom/infer/cached_glide.hpp>
#include <loom/infer/generate.hpp>
#include <loom/infer/speculative.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_model.hpp"
#include "timing.hpp"

namespace {

namespace gpt = loom::gpt;
namespace infer = loom::infer;

constexpr std::int64_t seq = 128, batch = 8;

std::string read_corpus(const std::filesystem::path& folder) {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(folder))
        if (entry.is_regular_file() && !entry.is_symlink()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& path : files) {
        std::ifstream in(path, std::ios::binary);
        text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return text;
}

// Every installed package's /usr/share/doc/<package>/copyright, sorted by
// package, each distinct text once (many packages ship the same licence).
std::string read_copyrights() {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator("/usr/share/doc")) {
        const auto file = entry.path() / "copyright";
        if (std::filesystem::is_regular_file(file)) files.push_back(file);
    }
    std::sort(files.begin(), files.end());
    std::vector<std::string> seen;
    std::string text;
    for (const auto& path : files) {
        std::ifstream in(path, std::ios::binary);
        std::string one((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (std::find(seen.begin(), seen.end(), one) != seen.end()) continue;
        text += one;
        seen.push_back(std::move(one));
    }
    return text;
}

// Batch `step`: rows at offsets from a fixed LCG over [begin, end - seq - 1).
void fill_batch(const std::string& text, std::size_t begin, std::size_t end, std::int64_t step,
                std::vector<std::int32_t>& inputs, std::vector<std::int32_t>& targets) {
    std::uint64_t state = 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(step + 1);
    for (std::int64_t r = 0; r < batch; ++r) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const std::size_t at = begin + static_cast<std::size_t>((state >> 17) % (end - begin - seq - 1));
        for (std::int64_t t = 0; t < seq; ++t) {
            inputs[static_cast<std::size_t>(r * seq + t)] = static_cast<unsigned char>(text[at + static_cast<std::size_t>(t)]);
            targets[static_cast<std::size_t>(r * seq + t)] = static_cast<unsigned char>(text[at + static_cast<std::size_t>(t) + 1]);
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    std::int64_t steps = 400, target_layers = 4, target_width = 128, target_heads = 4, draft_width = 64, prompts = 8,
                 tokens = 64, batch_decode = 8;
    int threads = 1;
    std::vector<int> decode_threads{1};
    std::string plain_file, glide_load_file;  // --plain FILE, --glide FILE: loaded if they exist, else saved there
    std::optional<infer::CapeConfig> other_bins;  // --cape-bins
    double lr = 2e-3, glide_lr = 2e-3;
    bool copyrights = false;         // --copyrights 1: /usr/share/doc/*/copyright instead of common-licenses
    std::int64_t log_every = 0;      // --log-every N: each model's training loss every N steps
    std::int64_t glide_stale = 5;    // the training mask's block (--glide-stale 1000: the draft never sees the target)
    bool glide_zero_output = false;  // --glide-zero-output 1: the cross-attention's output projection starts at 0
    bool glide_recency = false;      // --glide-recency 1: ALiBi's recency bias on the cross-attention's scores
    std::int64_t draft_batches = 0;  // --draft-batches N: the drafts train on batches N, N + 1, ... (the target on 0, 1, ...)
    std::string target_file, glide_file;  // --target FILE: load it if it exists, else save it there; --save-glide FILE
    int reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        const long long value = std::atoll(argv[i + 1]);
        if (flag == "--steps") steps = value;
        else if (flag == "--target-layers") target_layers = value;
        else if (flag == "--target-width") target_width = value;
        else if (flag == "--target-heads") target_heads = value;
        else if (flag == "--threads") threads = static_cast<int>(value);
        else if (flag == "--batch") batch_decode = value;
        else if (flag == "--plain") plain_file = argv[i + 1];
        else if (flag == "--glide") glide_load_file = argv[i + 1];
        else if (flag == "--cape-bins") other_bins = infer::parse_cape_bins(argv[i + 1]);
        else if (flag == "--decode-threads") {
            decode_threads.clear();
            std::stringstream list(argv[i + 1]);
            for (std::string item; std::getline(list, item, ',');) decode_threads.push_back(std::atoi(item.c_str()));
        }
        else if (flag == "--draft-width") draft_width = value;
        else if (flag == "--prompts") prompts = value;
        else if (flag == "--tokens") tokens = value;
        else if (flag == "--reps") reps = static_cast<int>(value);
        else if (flag == "--lr") lr = std::atof(argv[i + 1]);
        else if (flag == "--glide-lr") glide_lr = std::atof(argv[i + 1]);
        else if (flag == "--target") target_file = argv[i + 1];
        else if (flag == "--save-glide") glide_file = argv[i + 1];
        else if (flag == "--glide-zero-output") glide_zero_output = value != 0;
        else if (flag == "--glide-stale") glide_stale = value;
        else if (flag == "--glide-recency") glide_recency = value != 0;
        else if (flag == "--draft-batches") draft_batches = value;
        else if (flag == "--log-every") log_every = value;
        else if (flag == "--copyrights") copyrights = value != 0;
        else {
            std::fprintf(stderr, "bench_glide: unknown flag %s\n", flag.c_str());
            return 2;
        }
    }
    if (threads < 1 || target_heads < 1 || batch_decode < 1 || decode_threads.empty() ||
        std::any_of(decode_threads.begin(), decode_threads.end(), [](int t) { return t < 1; })) {
        std::fprintf(stderr, "bench_glide: --threads, --target-heads, --batch and each --decode-threads must be >= 1\n");
        return 2;
    }
    loom::kernels::host::set_blas_threads(threads);
    const std::string text = copyrights ? read_copyrights() : read_corpus("/usr/share/common-licenses");
    const std::size_t split = text.size() * 9 / 10;
    std::printf("CPU: %s; GEMM: loom host kernels at %s, %d training thread(s)\n", bench::cpu_model().c_str(),
                bench::cpu_level().c_str(), threads);
    std::printf("corpus: %s, %zu bytes; training on the first %zu\n",
                copyrights ? "/usr/share/doc/*/copyright (every installed package's, each distinct text once)"
                           : "/usr/share/common-licenses (Debian base-files)",
                text.size(), split);
    const gpt::Config tc{.layers = target_layers, .width = target_width, .heads = target_heads, .seq = seq, .vocab = 256};
    const gpt::Config dc{.layers = 1, .width = draft_width, .heads = 4, .seq = seq, .vocab = 256};

    // Each model is trained by a SerialTrainer (whose arena binds its Params
    // while it lives), then its trained values are copied into an arena of
    // its own that outlives the trainer: the GliDe draft's training reads the
    // trained target, and decoding reads all three.
    gpt::Model target = gpt::make_model(tc), plain = gpt::make_model(dc);
    const gpt::CrossScores scores = glide_recency ? gpt::CrossScores::recency : gpt::CrossScores::plain;
    gpt::GlideDraft glide = gpt::make_glide_draft(dc, tc, glide_stale, scores);
    glide.target = &target;
    // A zero output projection makes the untrained GliDe draft exactly a plain draft; it learns to use the target.
    if (glide_zero_output)
        for (std::size_t i = 0; i < glide.blocks.size(); ++i) glide.cross_attention(i).proj.weight.init = loom::Init::zeros();
    auto keep = [](auto& model, auto&& trained_run) {
        std::vector<float> values;
        trained_run(values);
        auto arena = std::make_unique<loom::nn::ParamArena>(model);
        std::copy(values.begin(), values.end(), arena->values().begin());
        return arena;
    };
    auto train_and_keep = [&](const char* name, auto& model, float peak, std::uint64_t seed, std::int64_t first_batch) {
        return keep(model, [&](std::vector<float>& values) {
            loom::exec::SerialTrainer trainer(model, loom::host_device, {.adamw = {.lr = peak}});
            trainer.initialize(seed);
            std::vector<std::int32_t> inputs(batch * seq), targets(batch * seq);
            const auto t0 = std::chrono::steady_clock::now();
            float loss = 0;
            for (std::int64_t s = 0; s < steps; ++s) {
                fill_batch(text, 0, split, first_batch + s, inputs, targets);
                loss = trainer.step(loom::Tensor::of(inputs.data(), {batch, seq}),
                                    loom::Tensor::of(targets.data(), {batch, seq}),
                                    loom::optim::cosine_lr(s + 1, steps, peak, std::max<std::int64_t>(1, steps / 20)));
                if (log_every > 0 && (s + 1) % log_every == 0)
                    std::printf("  %s step %lld: loss %.3f\n", name, static_cast<long long>(s + 1), loss);
            }
            const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            loom::nn::Context ctx;
            double held = 0;
            for (std::int64_t s = 0; s < 8; ++s) {
                fill_batch(text, split, text.size(), 1000000 + s, inputs, targets);
                held += loom::nn::evaluate(model, ctx, loom::Tensor::of(inputs.data(), {batch, seq}),
                                           loom::Tensor::of(targets.data(), {batch, seq}));
            }
            std::printf("%s: %lld parameters, %lld steps in %.0f s; last training loss %.3f, held-out loss %.3f\n",
                        name, static_cast<long long>(trainer.parameter_count()), static_cast<long long>(steps),
                        seconds, loss, held / 8);
            std::fflush(stdout);
            values.assign(trainer.arena().values().begin(), trainer.arena().values().end());
        });
    };
    std::unique_ptr<loom::nn::ParamArena> target_arena;
    if (!target_file.empty() && std::filesystem::exists(target_file)) {
        target_arena = std::make_unique<loom::nn::ParamArena>(target);
        std::vector<float> m(target_arena->values().size()), v(m.size());
        (void)gpt::load_checkpoint(target_file, tc, target_arena->values(), m, v);
        std::ostringstream shape;
        shape << tc;
        std::printf("target: %s loaded from %s\n", shape.str().c_str(), target_file.c_str());
    } else {
        target_arena = train_and_keep("target", target, static_cast<float>(lr), 1, 0);
        if (!target_file.empty()) {
            std::vector<float> zeros(target_arena->values().size());
            gpt::save_checkpoint(target_file, tc, target_arena->values(), zeros, zeros, 0, steps,
                                 "/usr/share/common-licenses");
        }
    }
    // A draft is loaded from FILE when it exists, else trained (and saved there when FILE is given).
    std::unique_ptr<loom::nn::ParamArena> plain_arena;
    if (!plain_file.empty() && std::filesystem::exists(plain_file)) {
        plain_arena = std::make_unique<loom::nn::ParamArena>(plain);
        std::vector<float> m(plain_arena->values().size()), v(m.size());
        (void)gpt::load_checkpoint(plain_file, dc, plain_arena->values(), m, v);
        std::printf("plain 1-layer draft: loaded from %s\n", plain_file.c_str());
    } else {
        plain_arena = train_and_keep("plain 1-layer draft", plain, static_cast<float>(lr), 2, draft_batches);
        if (!plain_file.empty()) {
            std::vector<float> zeros(plain_arena->values().size());
            gpt::save_checkpoint(plain_file, dc, plain_arena->values(), zeros, zeros, 0, steps, "bench_glide corpus");
        }
    }
    std::unique_ptr<loom::nn::ParamArena> glide_arena;
    if (!glide_load_file.empty() && std::filesystem::exists(glide_load_file)) {
        glide_arena = std::make_unique<loom::nn::ParamArena>(glide);
        gpt::load_glide_draft(glide_load_file, dc, tc, *glide_arena, scores);
        std::printf("GliDe 1-layer draft: loaded from %s\n", glide_load_file.c_str());
    } else {
        glide_arena = train_and_keep("GliDe 1-layer draft", glide, static_cast<float>(glide_lr), 3, draft_batches);
        if (!glide_load_file.empty()) gpt::save_glide_draft(glide_load_file, dc, tc, *glide_arena, scores);
    }
    if (!glide_file.empty()) gpt::save_glide_draft(glide_file, dc, tc, *glide_arena, scores);

    // Held-out prompts of 32 tokens.
    std::vector<infer::Request> requests;
    for (std::int64_t p = 0; p < prompts; ++p) {
        infer::Request r;
        const std::size_t at = split + static_cast<std::size_t>(p) * (text.size() - split - 64) / static_cast<std::size_t>(prompts);
        for (std::size_t t = 0; t < 32; ++t) r.prompt.push_back(static_cast<unsigned char>(text[at + t]));
        r.max_new_tokens = tokens;
        r.sampling.greedy = true;
        requests.push_back(r);
    }
    const std::int64_t together = std::min<std::int64_t>(batch_decode, prompts);
    infer::KvCache tcache(tc.layers, tc.width, together, seq), pcache(dc.layers, dc.width, together, seq),
        gcache(dc.layers, dc.width, together, seq);
    infer::CachedGpt te(target, tc, tcache), pe(plain, dc, pcache);
    infer::CachedGlide ge(glide, dc, gcache, tcache);
    struct Path {
        const char* name;
        infer::DraftEngine* draft;
        std::optional<infer::CapeConfig> cape;
        std::vector<double> seconds;
        std::int64_t passes = 0, accepted = 0, produced = 0;
        bool same = true;
    };
    infer::PlainDraft plain_draft(pe);
    // One table: the requests `width` at a time (1: one after another), every path `reps` times, interleaved.
    auto table = [&](std::int64_t width, int decode_threads_now) {
        loom::kernels::host::set_blas_threads(decode_threads_now);
        std::vector<Path> paths{{"autoregressive (infer::generate)", nullptr, std::nullopt, {}},
                                {"vanilla speculative, plain 1-layer draft", &plain_draft, std::nullopt, {}},
                                {"vanilla speculative + CaPE, plain 1-layer draft", &plain_draft, infer::CapeConfig{}, {}},
                                {"GliDe, 1-layer draft", &ge, std::nullopt, {}},
                                {"GliDe + CaPE, 1-layer draft", &ge, infer::CapeConfig{}, {}}};
        const std::string bins_name = other_bins ? " (bins " + infer::to_string(*other_bins) + ")" : "";
        const std::string plain_bins = "vanilla speculative + CaPE" + bins_name + ", plain 1-layer draft",
                          glide_bins = "GliDe + CaPE" + bins_name + ", 1-layer draft";
        if (other_bins) {
            paths.push_back({plain_bins.c_str(), &plain_draft, other_bins, {}});
            paths.push_back({glide_bins.c_str(), &ge, other_bins, {}});
        }
        std::vector<std::vector<std::int32_t>> reference(requests.size());
        for (int r = 0; r < reps; ++r)
            for (Path& path : paths) {
                path.passes = path.accepted = path.produced = 0;
                const auto t0 = std::chrono::steady_clock::now();
                for (std::size_t first = 0; first < requests.size(); first += static_cast<std::size_t>(width)) {
                    const std::size_t count = std::min(static_cast<std::size_t>(width), requests.size() - first);
                    const std::span<const infer::Request> group(requests.data() + first, count);
                    if (path.draft == nullptr) {
                        const auto out = infer::generate(te, group);
                        for (std::size_t i = 0; i < count; ++i) {
                            reference[first + i] = out[i].tokens;
                            path.produced += static_cast<std::int64_t>(out[i].tokens.size());
                        }
                        continue;
                    }
                    const auto out = infer::speculative_generate(te, *path.draft, group, 4, path.cape);
                    for (std::size_t i = 0; i < count; ++i) {
                        path.passes += out[i].stats.target_passes;
                        path.accepted += out[i].stats.accepted;
                        path.produced += static_cast<std::int64_t>(out[i].tokens.size());
                        path.same = path.same && out[i].tokens == reference[first + i];
                    }
                }
                path.seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            }
        std::printf("\nbatch %lld, greedy, gamma 4, %lld held-out prompts of 32 tokens, %lld new tokens each, "
                    "%d GEMM thread(s), median of %d\n\n",
                    static_cast<long long>(width), static_cast<long long>(prompts), static_cast<long long>(tokens),
                    decode_threads_now, reps);
        std::printf("| path | tokens/s | vs autoregressive | accepted drafts per target pass | tokens per target pass | "
                    "target's tokens |\n| --- | ---: | ---: | ---: | ---: | --- |\n");
        const double base = bench::median(paths[0].seconds);
        for (const Path& path : paths) {
            const double t = bench::median(path.seconds);
            if (path.draft == nullptr) {
                std::printf("| %s | %.0f | 1.00x | - | 1.00 | - |\n", path.name, static_cast<double>(path.produced) / t);
                continue;
            }
            std::printf("| %s | %.0f | %.2fx | %.2f | %.2f | %s |\n", path.name, static_cast<double>(path.produced) / t,
                        base / t, static_cast<double>(path.accepted) / static_cast<double>(path.passes),
                        static_cast<double>(path.accepted + path.passes) / static_cast<double>(path.passes),
                        path.same ? "yes" : "NO");
        }
        std::fflush(stdout);
    };
    for (int t : decode_threads) {
        table(1, t);
        if (together > 1) table(together, t);
    }
    return 0;
}
