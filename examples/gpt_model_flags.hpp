// The flags generate_gpt and serve_gpt share: the target GPT (a train_gpt
// --save checkpoint or random weights, and its shape as train_gpt's flags)
// and the speculative draft (--draft FILE | --draft-random, its shape,
// --gamma, --glide, --cape [--cape-bins]), with their checks and messages,
// and loading a model's weights and a draft.
// A bad flag throws FlagError: one line naming the value and what is valid,
// which the programs print and exit 2 on.
#pragma once

#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/glide_checkpoint.hpp>
#include <loom/gpt/glide_draft.hpp>
#include <loom/gpt/model.hpp>
#include <loom/infer/block_prefetcher.hpp>
#include <loom/infer/cape.hpp>
#include <loom/infer/cached_gpt.hpp>
#include <loom/infer/pooled_gpt.hpp>
#include <loom/nn/param_arena.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gpt_flags {

struct FlagError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

template <class... Parts>
[[noreturn]] void bad_flag(const Parts&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    throw FlagError(out.str());
}

inline std::int64_t whole(std::string_view flag, const std::string& text, std::int64_t low, std::int64_t high,
                          std::string_view note = "") {
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno != 0 || value < low || value > high)
        bad_flag(flag, " ", text, " is not a whole number in ", low, "..", high, note);
    return value;
}

inline float real(std::string_view flag, const std::string& text) {
    char* end = nullptr;
    const float value = std::strtof(text.c_str(), &end);
    if (text.empty() || *end != '\0') bad_flag(flag, " ", text, " is not a number");
    return value;
}

// The divisors of n, "1, 2, 4 or 8", for a head count that does not divide a width.
inline std::string divisors(std::int64_t n) {
    std::vector<std::int64_t> found;
    for (std::int64_t d = 1; d <= n; ++d)
        if (n % d == 0) found.push_back(d);
    std::string text;
    for (std::size_t i = 0; i < found.size(); ++i)
        text += (i == 0 ? "" : i + 1 == found.size() ? " or " : ", ") + std::to_string(found[i]);
    return text;
}

// The model: --checkpoint FILE or --random, and its shape.
struct ModelFlags {
    loom::gpt::Config config;  // train_gpt's defaults: 4 layers, width 256, 4 heads, seq 128, vocab 256
    std::string checkpoint;
    bool random = false;

    static constexpr const char* names = "--checkpoint, --random, --layers, --width, --heads, --seq, --vocab";

    // Takes `flag` when it is one of the model's value flags.
    bool take(std::string_view flag, const std::string& value) {
        if (flag == "--checkpoint") checkpoint = value;
        else if (flag == "--layers") config.layers = whole(flag, value, 1, 1024);
        else if (flag == "--width") config.width = whole(flag, value, 1, 65536);
        else if (flag == "--heads") config.heads = whole(flag, value, 1, 65536);
        else if (flag == "--seq") config.seq = whole(flag, value, 1, 1 << 20);
        else if (flag == "--vocab") config.vocab = whole(flag, value, 2, 256, " (a byte vocabulary)");
        else return false;
        return true;
    }

    void check() const {
        if (random == !checkpoint.empty())
            bad_flag(random ? "--random and --checkpoint exclude each other; give one"
                            : "no model: give --checkpoint FILE (a train_gpt --save file) or --random");
        if (config.width % config.heads != 0)
            bad_flag("--heads ", config.heads, " does not divide --width ", config.width, "; use ",
                     divisors(config.width));
    }
};

// Peer memory pooling (infer/pooled_gpt.hpp): the last --pool-blocks blocks
// kept in a host pool outside the engine's weights, staged --prefetch blocks
// ahead by a copy thread (0: read in place). The whole model on one engine.
struct PoolFlags {
    std::int64_t blocks = 0;
    std::int64_t prefetch = -1;  // -1: not given (1, or 0 with one pooled block)

    static constexpr const char* usage =
        "  --pool-blocks N    peer memory pooling: the last N blocks' weights kept outside the engine's (in a host\n"
        "                     pool), the engine holding the rest (default 0: every block in the engine's)\n"
        "  --prefetch K       with --pool-blocks: a copy thread stages each pooled block K blocks ahead of the one\n"
        "                     computing (default 1, 0 for one block: the engine then reads it in place)\n";

    bool take(std::string_view flag, const std::string& value) {
        if (flag == "--pool-blocks") blocks = whole(flag, value, 0, 1024, " (0: none pooled)");
        else if (flag == "--prefetch") prefetch = whole(flag, value, 0, 1024, " (0: read in place)");
        else return false;
        return true;
    }

    // What the flags must agree on; fills in --prefetch's default.
    void check(const loom::gpt::Config& target, std::int64_t tp, std::int64_t pp) {
        if (blocks == 0) {
            if (prefetch >= 0) bad_flag("--prefetch ", prefetch, " needs --pool-blocks; give the blocks to pool");
            return;
        }
        if (blocks > target.layers)
            bad_flag("--pool-blocks ", blocks, " is more than --layers ", target.layers, "; pool 1..", target.layers,
                     " blocks");
        if (tp > 1 || pp > 1)
            bad_flag("--pool-blocks with --tp ", tp, " --pp ", pp, ": pooling serves the whole model on one engine; "
                     "use --tp 1 --pp 1");
        if (prefetch < 0) prefetch = blocks >= 2 ? 1 : 0;
        if (prefetch > 0 && prefetch >= blocks)
            bad_flag("--prefetch ", prefetch, " is not below --pool-blocks ", blocks, "; use 0..", blocks - 1,
                     " (0: read the pooled blocks in place)");
    }
};

// The target's weights as PoolFlags ask: `model` itself, or a PooledGpt of its
// values with the last blocks pooled (and their prefetcher). One line says where.
class TargetWeights {
public:
    TargetWeights(const PoolFlags& flags, loom::gpt::Model& model, const loom::gpt::Config& config,
                  std::span<const float> values, std::string_view prefix)
        : model_(&model) {
        if (flags.blocks == 0) return;
        std::vector<std::int64_t> blocks;
        for (std::int64_t b = config.layers - flags.blocks; b < config.layers; ++b) blocks.push_back(b);
        pooled_.emplace(config, values, blocks);
        if (flags.prefetch > 0)
            prefetcher_.emplace(*pooled_, loom::infer::PrefetchOptions{.lookahead = flags.prefetch});
        model_ = &pooled_->model();
        std::cout << prefix << "weights: " << *pooled_;
        if (prefetcher_) std::cout << ", " << *prefetcher_;
        std::cout << "\n";
    }

    [[nodiscard]] loom::gpt::Model& model() const { return *model_; }
    // Gives `engine` (built on model()) the prefetcher, if there is one.
    void install(loom::infer::CachedGpt& engine) {
        if (prefetcher_) engine.prefetch_blocks(*prefetcher_);
    }

private:
    loom::gpt::Model* model_;
    std::optional<loom::infer::PooledGpt> pooled_;
    std::optional<loom::infer::BlockPrefetcher> prefetcher_;
};

// The draft of speculative decoding: --draft FILE or --draft-random, its
// shape, and --gamma. Its --seq and --vocab are the target's.
struct DraftFlags {
    loom::gpt::Config config{.layers = 1, .width = 128, .heads = 4};
    std::string checkpoint;
    bool random = false;
    std::int64_t gamma = 4;
    bool gamma_given = false;
    bool glide = false;                           // the draft is a GliDe draft
    std::optional<loom::infer::CapeConfig> cape;  // CaPE's rounds, with --cape
    std::string cape_bins;

    static constexpr const char* names =
        "--draft, --draft-random, --draft-layers, --draft-width, --draft-heads, --gamma, --cape, --cape-bins, --glide";
    static constexpr const char* usage =
        "  --draft FILE       a smaller GPT's train_gpt --save checkpoint: decode speculatively with it as the draft\n"
        "  --draft-random     a draft with freshly initialised weights (from --seed) instead of --draft FILE\n"
        "  --draft-layers N --draft-width N --draft-heads N\n"
        "                     the draft's shape (defaults 1, 128, 4); its --seq and --vocab are the target's\n"
        "  --gamma N          draft tokens the target checks per pass (default 4)\n"
        "  --cape             CaPE (needs a draft; greedy only): each target pass checks the draft's chain and, at\n"
        "                     each step, alternatives hanging off it, more the less confident the draft is\n"
        "  --cape-bins BINS   alternatives per confidence bin, K@P,...,K: K alternatives below confidence P (P\n"
        "                     increasing), the last K above every P (default 8@0.3,6@0.6,4@0.8,2)\n"
        "  --glide            the draft is a GliDe draft (its cross-attention reads the target's KV cache);\n"
        "                     --draft FILE is a gpt::save_glide_draft file trained for this target\n";

    [[nodiscard]] bool on() const { return random || !checkpoint.empty(); }

    // Takes `flag` when it is one of the draft's switches (no value).
    bool take_switch(std::string_view flag) {
        if (flag == "--draft-random") random = true;
        else if (flag == "--cape") cape.emplace();
        else if (flag == "--glide") glide = true;
        else return false;
        return true;
    }

    // Takes `flag` when it is one of the draft's value flags.
    bool take(std::string_view flag, const std::string& value) {
        if (flag == "--draft") checkpoint = value;
        else if (flag == "--draft-layers") config.layers = whole(flag, value, 1, 1024);
        else if (flag == "--draft-width") config.width = whole(flag, value, 1, 65536);
        else if (flag == "--draft-heads") config.heads = whole(flag, value, 1, 65536);
        else if (flag == "--cape-bins") cape_bins = value;
        else if (flag == "--gamma") {
            gamma = whole(flag, value, 1, 64);
            gamma_given = true;
        } else {
            return false;
        }
        return true;
    }

    // Checks the draft flags and gives the draft the target's --seq and
    // --vocab; `tp` is the target's tensor-parallel degree.
    void check(const loom::gpt::Config& target, std::int64_t tp = 1) {
        config.seq = target.seq;
        config.vocab = target.vocab;
        if (random && !checkpoint.empty()) bad_flag("--draft-random and --draft exclude each other; give one");
        if (!on() && gamma_given) bad_flag("--gamma ", gamma, " needs a draft model; give --draft FILE or --draft-random");
        if (on() && config.width % config.heads != 0)
            bad_flag("--draft-heads ", config.heads, " does not divide --draft-width ", config.width, "; use ",
                     divisors(config.width));
        if (glide && !on()) bad_flag("--glide needs a draft model; give --draft FILE or --draft-random");
        if (glide && config.layers > target.layers)
            bad_flag("--draft-layers ", config.layers, " is more than the target's ", target.layers,
                     " layers; a GliDe draft's block i reads target layer L - ", config.layers, " + i");
        if (glide && tp > 1)
            bad_flag("--glide with --tp ", tp, ": a GliDe draft reads the whole target's KV cache and a tp rank "
                     "caches its heads only; use --tp 1 with --glide");
        if (!cape_bins.empty() && !cape) bad_flag("--cape-bins ", cape_bins, " needs --cape");
        if (cape && !on()) bad_flag("--cape needs a draft model; give --draft FILE or --draft-random");
        if (!cape_bins.empty()) {
            try {
                cape = loom::infer::parse_cape_bins(cape_bins);
            } catch (const loom::Error& e) {
                bad_flag("--cape-bins ", e.message());
            }
        }
    }
};

// What generate_gpt's and serve_gpt's degrees and draft must agree on with
// the target (each front end checks --tp against the heads first, in its own
// words): the cache's block within a sequence, --pp dividing the layers,
// the draft's flags, and no draft on a pipeline (--tp with --pp is a pipeline
// of tp groups).
inline void check_serving(const loom::gpt::Config& target, DraftFlags& draft, std::int64_t block_size, std::int64_t tp,
                          std::int64_t pp, std::int64_t prefill_tokens) {
    if (block_size > target.seq)
        bad_flag("--block-size ", block_size, " is longer than a sequence (--seq ", target.seq, "); use 1..", target.seq);
    if (target.layers % pp != 0)
        bad_flag("--pp ", pp, " does not divide --layers ", target.layers, "; use ", divisors(target.layers));
    draft.check(target, tp);
    if (pp > 1 && draft.on())
        bad_flag("--pp ", pp, " with a draft model: the pipeline serves the target alone; use --pp 1 with --draft "
                 "or --draft-random");
    if (prefill_tokens > 0 && pp == 1)
        bad_flag("--prefill-tokens ", prefill_tokens, " budgets a pipeline's steps; use it with --pp 2 or more");
}

// A model's weights: from a checkpoint, or random from `seed` (empty path);
// one line says which, after `prefix`.
inline void load_weights(std::string_view prefix, loom::gpt::Model& model, loom::nn::ParamArena& arena,
                         const loom::gpt::Config& config, const std::string& checkpoint, std::uint64_t seed) {
    if (checkpoint.empty()) {
        arena.initialize(model, seed);
        std::cout << prefix << config << ", random weights (seed " << seed << ")\n";
        return;
    }
    // The checkpoint also holds AdamW's moments; they are read and dropped.
    std::vector<float> m(arena.values().size()), v(m.size());
    const auto steps = loom::gpt::load_checkpoint(checkpoint, config, arena.values(), m, v);
    std::cout << prefix << config << " from " << checkpoint << " (trained " << steps.step << " steps)\n";
}

// The draft, whole, when the flags ask for one: a plain GPT or a GliDe draft
// reading a target of `target`'s shape (built with the scoring its file
// records), its weights from --draft FILE or random from `seed`.
struct DraftModel {
    std::unique_ptr<loom::gpt::Model> plain;
    std::unique_ptr<loom::gpt::GlideDraft> glide;
    std::unique_ptr<loom::nn::ParamArena> arena;
};

inline DraftModel load_draft(const DraftFlags& d, const loom::gpt::Config& target, std::uint64_t seed) {
    DraftModel draft;
    if (!d.on()) return draft;
    if (!d.glide) {
        draft.plain = std::make_unique<loom::gpt::Model>(loom::gpt::make_model(d.config));
        draft.arena = std::make_unique<loom::nn::ParamArena>(*draft.plain);
        load_weights("draft: ", *draft.plain, *draft.arena, d.config, d.checkpoint, seed);
        return draft;
    }
    const loom::gpt::CrossScores scores =
        d.checkpoint.empty() ? loom::gpt::CrossScores::plain : loom::gpt::glide_cross_scores(d.checkpoint);
    draft.glide = std::make_unique<loom::gpt::GlideDraft>(loom::gpt::make_glide_draft(d.config, target, 5, scores));
    draft.arena = std::make_unique<loom::nn::ParamArena>(*draft.glide);
    if (d.checkpoint.empty()) {
        draft.arena->initialize(*draft.glide, seed);
        std::cout << "draft: GliDe " << d.config << ", random weights (seed " << seed << ")\n";
    } else {
        loom::gpt::load_glide_draft(d.checkpoint, d.config, target, *draft.arena, scores);
        std::cout << "draft: GliDe " << d.config << " (" << loom::gpt::name_of(scores)
                  << " cross-attention scores) from " << d.checkpoint << "\n";
    }
    return draft;
}

}  // namespace gpt_flags
