// Speculative decoding on GPT config A (4 layers, width 256, 4 heads,
// sequence 128, vocabulary 256), one core; batch 1: 100 new tokens after a
// 16-token prompt, by plain KV-cached generation (loom::infer::generate) and
// by loom::infer::speculative_generate at gamma 2 and 4 with
// - a 1-layer draft of width 64 (4 heads, same vocabulary), random weights:
//   an untrained draft agrees with an untrained target by chance only, so
//   few drafts are accepted and this is the cost side of the trade (a draft
//   trained on the target's data is issue 40's later work);
// - the target as its own draft: every draft accepted, the acceptance upper
//   bound (its drafting costs a full target step per token, so it is never
//   faster than plain decoding; it measures what verification costs).
// Greedy and temperature 1. Tokens/s count the new tokens over the whole call
// (prefill included); mean tokens per target pass is the accepted drafts plus
// the target's own token, per verification pass. Greedy speculative runs must
// write generate's greedy tokens; the bench says whether they did. Then batch
// 8 (greedy, all requests started together) beside generate's batched decode.
// The paths of a table run interleaved; median of --reps runs.
//
// CaPE (infer/cape.hpp, greedy only): the same drafts proposing gamma 4 greedy
// tokens plus confidence-binned alternatives (the paper's bins), the comb
// verified in one target pass; and a third draft for both vanilla and CaPE,
// the target's first layer (its embeddings, block 0, final LayerNorm and
// head, copied: width 256, ~1/4 of the target's step), which agrees with the
// random target often because random blocks add little to the residual
// stream -- an acceptance between the two extremes, not a trained draft.
//
//   bench_speculative [--reps 3] [--tokens 100]
#include <loom/gpt/model.hpp>
#include <loom/infer/generate.hpp>
#include <loom/infer/speculative.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>

#include <loom/core/reflect.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cpu_model.hpp"
#include "generation_flags.hpp"
#include "timing.hpp"

namespace {

const loom::gpt::Config config_a{.layers = 4, .width = 256, .heads = 4, .seq = 128, .vocab = 256};
const loom::gpt::Config draft_config{.layers = 1, .width = 64, .heads = 4, .seq = 128, .vocab = 256};
const loom::gpt::Config first_layer_config{.layers = 1, .width = 256, .heads = 4, .seq = 128, .vocab = 256};

// The draft's parameters from the target's of the same reflection path (its
// embeddings, block 0, ln_f, head: the paths do not depend on the block count).
void copy_first_layer(loom::gpt::Model& target, loom::gpt::Model& draft) {
    std::map<std::string, loom::Param*, std::less<>> by_path;
    loom::reflect::visit_params(target, [&](loom::Param& p, std::string_view path) { by_path[std::string(path)] = &p; });
    loom::reflect::visit_params(draft, [&](loom::Param& p, std::string_view path) {
        const loom::Param& from = *by_path.at(std::string(path));
        std::memcpy(p.value.data<float>(), from.value.data<float>(), static_cast<std::size_t>(p.numel()) * sizeof(float));
    });
}

}  // namespace

int main(int argc, char** argv) {
    const auto flags = bench::parse_generation_flags(argc, argv, "bench_speculative");
    if (!flags) return 2;
    const int reps = flags->reps;
    const std::int64_t count = flags->tokens;
    loom::kernels::host::set_blas_threads(1);
    std::printf("CPU: %s; GEMM: loom host kernels at %s, 1 thread; median of %d runs\n", bench::cpu_model().c_str(),
                bench::cpu_level().c_str(), reps);
    std::printf("target: GPT config A (L4 C256 H4 T128 V256); draft: L1 C64 H4 V256; random weights; batch 1, "
                "%lld new tokens after a 16-token prompt\n\n",
                static_cast<long long>(count));

    auto target = loom::gpt::make_model(config_a);
    loom::nn::ParamArena target_arena(target);
    target_arena.initialize(target, 1);
    auto draft = loom::gpt::make_model(draft_config);
    loom::nn::ParamArena draft_arena(draft);
    draft_arena.initialize(draft, 2);
    auto first = loom::gpt::make_model(first_layer_config);
    loom::nn::ParamArena first_arena(first);
    copy_first_layer(target, first);
    const loom::infer::CapeConfig cape;  // the paper's bins

    loom::infer::Request request;
    for (char c : std::string("The cache keeps ")) request.prompt.push_back(static_cast<std::int32_t>(c));
    request.max_new_tokens = count;
    const double n = static_cast<double>(count);

    // Engines built once, as a server would keep them; every call leaves slot 0 free.
    loom::infer::KvCache target_cache(config_a.layers, config_a.width, 1, config_a.seq);
    loom::infer::KvCache draft_cache(draft_config.layers, draft_config.width, 1, draft_config.seq);
    loom::infer::KvCache self_cache(config_a.layers, config_a.width, 1, config_a.seq);
    loom::infer::CachedGpt target_engine(target, config_a, target_cache);
    loom::infer::CachedGpt draft_engine(draft, draft_config, draft_cache);
    loom::infer::CachedGpt self_engine(target, config_a, self_cache);
    loom::infer::KvCache first_cache(first_layer_config.layers, first_layer_config.width, 1, config_a.seq);
    loom::infer::CachedGpt first_engine(first, first_layer_config, first_cache);

    // What a verification pass costs beside a decode step: the target's
    // forward of 1, 3 and 5 new positions after 64 cached ones (200 passes,
    // the cache cut back after each), and the draft's one-token step.
    {
        std::vector<std::int32_t> context(64), fed(5);
        for (std::size_t i = 0; i < context.size(); ++i) context[i] = static_cast<std::int32_t>((i * 37) % 256);
        for (std::size_t i = 0; i < fed.size(); ++i) fed[i] = static_cast<std::int32_t>((i * 11 + 3) % 256);
        const auto pass_ms = [&](loom::infer::CachedGpt& engine, std::size_t positions) {
            loom::infer::KvCache& cache = engine.cache();
            (void)engine.prefill(0, context);
            const loom::infer::Segment segment{0, std::span(fed).first(positions)};
            const auto which = positions == 1 ? loom::infer::Logits::last : loom::infer::Logits::every;
            const double t = bench::median_seconds(reps, [&] {
                for (int i = 0; i < 200; ++i) {
                    (void)engine.forward(std::span(&segment, 1), which);
                    cache.truncate(0, 64);
                }
            });
            cache.release(0);
            return t / 200 * 1e3;
        };
        const double one = pass_ms(target_engine, 1);
        const double three = pass_ms(target_engine, 3);
        const double five = pass_ms(target_engine, 5);
        const double step = pass_ms(draft_engine, 1);
        const double first_step = pass_ms(first_engine, 1);
        std::printf("one forward after 64 cached positions: target, 1 position %.3f ms; 3 positions (gamma 2) "
                    "%.3f ms (%.2fx); 5 positions (gamma 4) %.3f ms (%.2fx); draft, 1 position %.3f ms "
                    "(%.2fx the target's); first-layer draft %.3f ms (%.2fx)\n",
                    one, three, three / one, five, five / one, step, step / one, first_step, first_step / one);
        // A comb of the paper's size: gamma 4 and 2-8 alternatives per step (here 4 each: 21 nodes).
        std::vector<std::int32_t> comb(21), parents(21);
        for (std::size_t i = 0; i < comb.size(); ++i) {
            comb[i] = static_cast<std::int32_t>((i * 13 + 5) % 256);
            parents[i] = i <= 4 ? static_cast<std::int32_t>(i) - 1 : static_cast<std::int32_t>((i - 5) / 4);
        }
        (void)target_engine.prefill(0, context);
        const loom::infer::Segment tree{0, comb, parents};
        const double comb_ms = bench::median_seconds(reps, [&] {
                                   for (int i = 0; i < 200; ++i) {
                                       (void)target_engine.forward(std::span(&tree, 1), loom::infer::Logits::every);
                                       target_cache.truncate(0, 64);
                                   }
                               }) / 200 * 1e3;
        target_cache.release(0);
        std::printf("a CaPE comb of 21 nodes (gamma 4, 4 alternatives per step) after 64 cached positions: %.3f ms "
                    "(%.2fx one position)\n\n", comb_ms, comb_ms / one);
    }

    // The paths of a table run interleaved, one after another in each
    // repetition, so that load from other processes falls on all of them;
    // "vs autoregressive" is the median over repetitions of that
    // repetition's ratio.
    struct Path {
        const char* name;
        loom::infer::CachedGpt* draft;  // null: autoregressive
        std::int64_t gamma;
        std::vector<double> seconds, ratios;
        loom::infer::SpeculativeCompletion out;
        std::vector<std::int32_t> tokens;
        std::optional<loom::infer::CapeConfig> cape = std::nullopt;
    };
    for (const bool greedy : {true, false}) {
        request.sampling = greedy ? loom::infer::Sampling{.greedy = true} : loom::infer::Sampling{.seed = 5};
        const std::vector<loom::infer::Request> one{request};
        std::vector<Path> paths{{"autoregressive (infer::generate)", nullptr, 0, {}, {}, {}, {}},
                                {"speculative, 1-layer draft (random)", &draft_engine, 2, {}, {}, {}, {}},
                                {"speculative, 1-layer draft (random)", &draft_engine, 4, {}, {}, {}, {}},
                                {"speculative, target as draft (upper bound)", &self_engine, 2, {}, {}, {}, {}},
                                {"speculative, target as draft (upper bound)", &self_engine, 4, {}, {}, {}, {}}};
        if (greedy) {
            paths.push_back({"speculative, first-layer draft", &first_engine, 4, {}, {}, {}, {}});
            paths.push_back({"CaPE, 1-layer draft (random)", &draft_engine, 4, {}, {}, {}, {}, cape});
            paths.push_back({"CaPE, first-layer draft", &first_engine, 4, {}, {}, {}, {}, cape});
            paths.push_back({"CaPE, target as draft (upper bound)", &self_engine, 4, {}, {}, {}, {}, cape});
        }
        for (int r = 0; r < reps; ++r) {
            for (Path& path : paths) {
                path.seconds.push_back(bench::median_seconds(1, [&] {
                    if (path.draft == nullptr) {
                        path.tokens = loom::infer::generate(target_engine, one)[0].tokens;
                    } else {
                        path.out = loom::infer::speculative_generate(target_engine, *path.draft, request, path.gamma,
                                                                     path.cape);
                        path.tokens = path.out.tokens;
                    }
                }));
                path.ratios.push_back(paths[0].seconds.back() / path.seconds.back());
            }
        }
        std::printf("%s\n\n", greedy ? "greedy" : "sampled, temperature 1");
        std::printf("| path | gamma | time for %lld tokens | tokens/s | vs autoregressive | drafts accepted | "
                    "accepted per target pass | tokens per target pass |\n",
                    static_cast<long long>(count));
        std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        bool all_same = true;
        for (const Path& path : paths) {
            const double t = bench::median(path.seconds);
            if (path.draft == nullptr) {
                std::printf("| %s | - | %.1f ms | %.0f | 1.00x | - | 0.00 | 1.00 |\n", path.name, t * 1e3, n / t);
                continue;
            }
            all_same = all_same && path.tokens == paths[0].tokens;
            std::printf("| %s | %lld | %.1f ms | %.0f | %.2fx | %.1f%% | %.2f | %.2f |\n", path.name,
                        static_cast<long long>(path.gamma), t * 1e3, n / t, bench::median(path.ratios),
                        100.0 * path.out.stats.acceptance_rate(), path.out.stats.tokens_per_pass() - 1.0,
                        path.out.stats.tokens_per_pass());
        }
        if (greedy) std::printf("\ngreedy speculative tokens equal generate's: %s\n", all_same ? "yes" : "no");
        std::printf("\n");
    }
    // Batch 8: prompts of 4, 8, ..., 32 tokens, 48 new tokens each, greedy,
    // all started together (speculative_generate does not refill slots yet).
    {
        constexpr int batch = 8;
        const std::int64_t each = 48;
        std::vector<loom::infer::Request> requests(batch);
        for (int i = 0; i < batch; ++i) {
            auto& prompt = requests[static_cast<std::size_t>(i)].prompt;
            for (int t = 0; t < 4 * (i + 1); ++t) prompt.push_back('a' + (t * 7 + i) % 26);
            requests[static_cast<std::size_t>(i)].max_new_tokens = each;
            requests[static_cast<std::size_t>(i)].sampling.greedy = true;
        }
        loom::infer::KvCache tc(config_a.layers, config_a.width, batch, config_a.seq);
        loom::infer::KvCache dc(draft_config.layers, draft_config.width, batch, draft_config.seq);
        loom::infer::KvCache sc(config_a.layers, config_a.width, batch, config_a.seq);
        loom::infer::KvCache fc(first_layer_config.layers, first_layer_config.width, batch, config_a.seq);
        loom::infer::CachedGpt te(target, config_a, tc), de(draft, draft_config, dc), se(target, config_a, sc),
            fe(first, first_layer_config, fc);
        struct Batched {
            const char* name;
            loom::infer::CachedGpt* draft;
            std::int64_t gamma;
            std::vector<double> seconds, ratios;
            double tokens_per_pass = 0;
            bool same = true;
            std::optional<loom::infer::CapeConfig> cape = std::nullopt;
        };
        std::vector<Batched> paths{{"autoregressive (infer::generate, 8 batched)", nullptr, 0, {}, {}, 0, true},
                                   {"speculative, 1-layer draft (random)", &de, 2, {}, {}, 0, true},
                                   {"speculative, 1-layer draft (random)", &de, 4, {}, {}, 0, true},
                                   {"speculative, target as draft (upper bound)", &se, 2, {}, {}, 0, true},
                                   {"speculative, target as draft (upper bound)", &se, 4, {}, {}, 0, true},
                                   {"speculative, first-layer draft", &fe, 4, {}, {}, 0, true},
                                   {"CaPE, 1-layer draft (random)", &de, 4, {}, {}, 0, true, cape},
                                   {"CaPE, first-layer draft", &fe, 4, {}, {}, 0, true, cape},
                                   {"CaPE, target as draft (upper bound)", &se, 4, {}, {}, 0, true, cape}};
        std::vector<loom::infer::Completion> plain;
        for (int r = 0; r < reps; ++r) {
            for (Batched& path : paths) {
                path.seconds.push_back(bench::median_seconds(1, [&] {
                    if (path.draft == nullptr) {
                        plain = loom::infer::generate(te, requests);
                        return;
                    }
                    const auto out =
                        loom::infer::speculative_generate(te, *path.draft, requests, path.gamma, path.cape);
                    std::int64_t accepted = 0, passes = 0;
                    for (std::size_t i = 0; i < out.size(); ++i) {
                        accepted += out[i].stats.accepted;
                        passes += out[i].stats.target_passes;
                        path.same = path.same && out[i].tokens == plain[i].tokens;
                    }
                    path.tokens_per_pass = static_cast<double>(accepted + passes) / static_cast<double>(passes);
                }));
                path.ratios.push_back(paths[0].seconds.back() / path.seconds.back());
            }
        }
        const double produced = batch * static_cast<double>(each);
        std::printf("batch 8 (prompts of 4, 8, ..., 32 tokens, %lld new tokens each), greedy\n\n",
                    static_cast<long long>(each));
        std::printf("| path | gamma | time | tokens/s | vs autoregressive | tokens per request's target pass |\n");
        std::printf("| --- | ---: | ---: | ---: | ---: | ---: |\n");
        bool all_same = true;
        for (const Batched& path : paths) {
            const double t = bench::median(path.seconds);
            all_same = all_same && path.same;
            if (path.draft == nullptr)
                std::printf("| %s | - | %.1f ms | %.0f | 1.00x | 1.00 |\n", path.name, t * 1e3, produced / t);
            else
                std::printf("| %s | %lld | %.1f ms | %.0f | %.2fx | %.2f |\n", path.name,
                            static_cast<long long>(path.gamma), t * 1e3, produced / t, bench::median(path.ratios),
                            path.tokens_per_pass);
        }
        std::printf("\nbatched greedy speculative tokens equal generate's: %s\n", all_same ? "yes" : "no");
    }
    return 0;
}
