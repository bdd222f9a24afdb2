// generate_gpt: text from a GPT that train_gpt trained (--checkpoint FILE, a
// train_gpt --save file) or from freshly initialised weights (--random), with
// loom's inference engine (include/loom/infer/, docs/inference.md): each
// prompt goes through the model once, then every step decodes one token per
// running prompt from a paged KV cache; several --prompt flags are batched
// together without padding. Tokens are bytes, as train_gpt trains them: a
// prompt byte becomes token byte % --vocab, and tokens print as bytes, the
// unprintable ones as '.' (as gpt::sample prints them).
//
//   generate_gpt --checkpoint FILE [--layers L --width C --heads H --seq T --vocab V]
//                [--prompt TEXT]... [--max-new N] [--greedy | --temperature T --top-k K --top-p P]
//                [--seed S] [--stop TEXT]... [--max-batch N] [--block-size N] [--tp N] [--pp N]
//                [--prefill-tokens N] [--pool-blocks N [--prefetch K]]
//   generate_gpt --random [the same flags]
//   ... [--draft FILE | --draft-random] [--draft-layers L --draft-width C --draft-heads H] [--gamma G]
//       [--cape [--cape-bins K@P,...,K]] [--glide]
//
// With a draft model (a smaller GPT of the same --seq and --vocab, from its
// own train_gpt --save file, or random weights), the prompts are decoded
// speculatively (infer/speculative.hpp, docs/speculative.md): the draft
// proposes --gamma tokens, the target checks them in one pass. Greedy
// decoding then writes the target's own greedy text; sampling keeps the
// target's distribution. --max-batch works as without a draft: that many
// prompts run at once, a finished one's slot taken by the next at the next
// round (infer/speculative_batcher.hpp). The summary adds the acceptance figures.
// --cape (greedy only) makes each target pass check a tree of candidates
// (infer/cape.hpp): the draft's gamma greedy tokens and, at each step, more
// alternatives the less confident it is (--cape-bins). --glide makes the
// draft a GliDe draft (gpt/glide_draft.hpp, infer/cached_glide.hpp): its
// cross-attention reads the target's KV cache; --draft FILE is then a
// gpt::save_glide_draft file (bench_glide writes one), trained for this
// target's shape.
// --tp N serves the target tensor-parallel on N rank threads
// (infer/tensor_parallel_gpt.hpp): each holds its Megatron shard of the
// checkpoint and a KV cache of its heads, and all write the same text, the
// text of --tp 1; rank 0 prints it. A draft runs whole on every rank.
// --pp N serves the target pipeline-parallel on N rank threads
// (infer/pipeline_parallel_gpt.hpp: EnergonAI's non-blocking pipeline): stage
// s holds blocks [s L/N, (s+1) L/N) of the checkpoint and a KV cache of those
// blocks, the running prompts move through the stages in N + 1 groups, and the text
// is --pp 1's. It takes no draft. With --tp too, each stage is cut over --tp
// rank threads (tp x pp on --tp x --pp threads).
//
// Exit status: 0, 2 for a bad flag (one line naming it and what is valid), 1
// for anything else (a missing file, a checkpoint of another shape: the
// library's own message).
#include <loom/comm/any_comm.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/glide_checkpoint.hpp>
#include <loom/gpt/glide_draft.hpp>
#include <loom/gpt/model.hpp>
#include <loom/infer/generate.hpp>
#include <loom/infer/cape.hpp>
#include <loom/infer/cached_glide.hpp>
#include <loom/infer/pipeline_parallel_gpt.hpp>
#include <loom/infer/speculative_batcher.hpp>
#include <loom/infer/tensor_parallel_gpt.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>

#include "gpt_model_flags.hpp"

#include <chrono>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

constexpr const char* usage =
    "usage: generate_gpt (--checkpoint FILE | --random) [flags]\n"
    "  --checkpoint FILE  a train_gpt --save checkpoint (one file, not a --sharded directory)\n"
    "  --random           freshly initialised weights (from --seed) instead of a checkpoint\n"
    "  --layers N --width N --heads N --seq N --vocab N\n"
    "                     the model's shape, as train_gpt's flags (defaults 4, 256, 4, 128, 256);\n"
    "                     a checkpoint must have been trained with the same\n"
    "  --prompt TEXT      a prompt (repeat the flag: the prompts are generated together; default \"The \")\n"
    "  --max-new N        new tokens per prompt, at most (default 64; prompt + N - 1 <= --seq)\n"
    "  --greedy           the most likely token every step (ignores --temperature, --top-k, --top-p)\n"
    "  --temperature T    logits are divided by T > 0 (default 1)\n"
    "  --top-k K          keep the K most likely tokens, 0: all (default 0)\n"
    "  --top-p P          keep the fewest most likely tokens whose probability reaches P in (0, 1] (default 1)\n"
    "  --seed S           sampling (and --random's weights) (default 1)\n"
    "  --stop TEXT        its first byte ends a prompt's generation when generated (repeatable)\n"
    "  --max-batch N      prompts running at once, 0: all (default 0)\n"
    "  --block-size N     positions per block of the paged KV cache (default 16)\n"
    "  --tp N             tensor-parallel on N rank threads, N dividing --heads (default 1: the whole model)\n"
    "  --pp N             pipeline-parallel on N rank threads, N dividing --layers (default 1: the whole model);\n"
    "                     with --tp, N stages of --tp threads each\n"
    "  --prefill-tokens N with --pp: the most prompt tokens a pipeline step admits, a longer prompt alone;\n"
    "                     spreads a wave of prefills over steps the stages overlap (default 0: no limit)\n";

constexpr const char* flag_list =
    "--checkpoint, --random, --layers, --width, --heads, --seq, --vocab, --prompt, --max-new, --greedy, "
    "--temperature, --top-k, --top-p, --seed, --stop, --max-batch, --block-size, --tp, --pp, --prefill-tokens, "
    "--pool-blocks, --prefetch, --draft, --draft-random, --draft-layers, --draft-width, --draft-heads, --gamma, --cape, --cape-bins, --glide, "
    "--help";

using gpt_flags::bad_flag;
using gpt_flags::FlagError;
using gpt_flags::real;
using gpt_flags::whole;

struct Flags {
    gpt_flags::ModelFlags target;
    std::vector<std::string> prompts;
    std::int64_t max_new = 64;
    loom::infer::Sampling sampling{.seed = 1};
    std::vector<std::string> stops;
    std::int64_t max_batch = 0;
    std::int64_t block_size = 16;
    std::int64_t tp = 1;  // rank threads the target is cut over
    std::int64_t pp = 1;  // pipeline stages (rank threads) the target's blocks are split over
    std::int64_t prefill_tokens = 0;  // the most prompt tokens a pipeline step admits (0: no limit)
    gpt_flags::PoolFlags pool;        // peer memory pooling of the target's last blocks
    gpt_flags::DraftFlags draft;  // speculative decoding, when on(); GliDe and CaPE too
};

Flags parse(int argc, char** argv) {
    Flags f;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (flag == "--help" || flag == "-h") {
            std::fputs(usage, stdout);
            std::fputs(gpt_flags::PoolFlags::usage, stdout);
            std::fputs(gpt_flags::DraftFlags::usage, stdout);
            std::exit(0);
        }
        if (flag == "--random") {
            f.target.random = true;
            continue;
        }
        if (f.draft.take_switch(flag)) continue;
        if (flag == "--greedy") {
            f.sampling.greedy = true;
            continue;
        }
        const bool known = flag == "--checkpoint" || flag == "--layers" || flag == "--width" || flag == "--heads" ||
                           flag == "--seq" || flag == "--vocab" || flag == "--prompt" || flag == "--max-new" ||
                           flag == "--temperature" || flag == "--top-k" || flag == "--top-p" || flag == "--seed" ||
                           flag == "--stop" || flag == "--max-batch" || flag == "--block-size" || flag == "--tp" ||
                           flag == "--pp" || flag == "--prefill-tokens" || flag == "--pool-blocks" ||
                           flag == "--prefetch" || flag == "--draft" || flag == "--draft-layers" || flag == "--draft-width" ||
                           flag == "--draft-heads" || flag == "--gamma" || flag == "--cape-bins";
        if (!known) bad_flag("unknown flag ", flag, "; flags are ", flag_list);
        if (i + 1 >= argc) bad_flag(flag, " needs a value (generate_gpt --help lists the flags)");
        const std::string value = argv[++i];
        if (f.target.take(flag, value) || f.draft.take(flag, value) || f.pool.take(flag, value)) continue;
        if (flag == "--prompt") f.prompts.push_back(value);
        else if (flag == "--max-new") f.max_new = whole(flag, value, 1, 1 << 20);
        else if (flag == "--temperature") f.sampling.temperature = real(flag, value);
        else if (flag == "--top-k") f.sampling.top_k = whole(flag, value, 0, 1 << 24, " (0 keeps every token)");
        else if (flag == "--top-p") f.sampling.top_p = real(flag, value);
        else if (flag == "--seed") f.sampling.seed = static_cast<std::uint64_t>(whole(flag, value, 0, std::int64_t{1} << 62));
        else if (flag == "--stop") f.stops.push_back(value);
        else if (flag == "--max-batch") f.max_batch = whole(flag, value, 0, 4096, " (0: every prompt at once)");
        else if (flag == "--tp") f.tp = whole(flag, value, 1, 64);
        else if (flag == "--pp") f.pp = whole(flag, value, 1, 64);
        else if (flag == "--prefill-tokens") f.prefill_tokens = whole(flag, value, 0, std::int64_t{1} << 30, " (0: no limit)");
        else f.block_size = whole(flag, value, 1, 1 << 20);
    }

    // What the flags must agree on, each named before anything is built.
    f.target.check();
    if (!(std::isfinite(f.sampling.temperature) && f.sampling.temperature > 0.0f))
        bad_flag("--temperature ", f.sampling.temperature, " is not valid; use a number > 0 (or --greedy)");
    if (!(f.sampling.top_p > 0.0f && f.sampling.top_p <= 1.0f))
        bad_flag("--top-p ", f.sampling.top_p, " is not valid; use a number in (0, 1] (1 keeps every token)");
    if (f.sampling.top_k > f.target.config.vocab)
        bad_flag("--top-k ", f.sampling.top_k, " is more than the vocabulary of ", f.target.config.vocab,
                 " tokens (--vocab); use 0..", f.target.config.vocab, " (0 keeps every token)");
    if (f.target.config.heads % f.tp != 0)
        bad_flag("--tp ", f.tp, " does not divide --heads ", f.target.config.heads, "; use a degree that divides ",
                 f.target.config.heads);
    gpt_flags::check_serving(f.target.config, f.draft, f.block_size, f.tp, f.pp, f.prefill_tokens);
    f.pool.check(f.target.config, f.tp, f.pp);
    if (f.draft.cape && !f.sampling.greedy)
        bad_flag("--cape is greedy only (its tree acceptance takes the target's argmax); add --greedy");
    for (const std::string& stop : f.stops)
        if (stop.empty()) bad_flag("--stop '' has no byte; give text whose first byte ends a generation");
    if (f.prompts.empty()) f.prompts.push_back("The ");
    for (const std::string& prompt : f.prompts) {
        const auto bytes = static_cast<std::int64_t>(prompt.size());
        if (bytes == 0) bad_flag("--prompt '' is empty; give at least one byte");
        // The prompt and every new token but the last sit in the cache, which
        // holds at most --seq positions (the position embedding's length).
        if (bytes > f.target.config.seq)
            bad_flag("--prompt '", prompt, "' has ", bytes, " bytes, more than --seq ", f.target.config.seq,
                     "; give a prompt of at most ", f.target.config.seq, " bytes");
        if (bytes + f.max_new - 1 > f.target.config.seq)
            bad_flag("--max-new ", f.max_new, " after the ", bytes, "-byte --prompt '", prompt, "' needs ",
                     bytes + f.max_new - 1, " positions but --seq is ", f.target.config.seq, "; use --max-new <= ",
                     f.target.config.seq - bytes + 1);
    }
    return f;
}

std::int32_t token_of(char byte, std::int64_t vocab) {
    return static_cast<std::int32_t>(static_cast<unsigned char>(byte) % vocab);
}

// Tokens as text, as gpt::sample prints them: printable bytes and newlines as
// they are, anything else as '.'.
void append_printable(std::string& text, const std::vector<std::int32_t>& tokens) {
    for (std::int32_t t : tokens) {
        const auto c = static_cast<unsigned char>(t);
        text += (c == '\n' || (c >= 32 && c < 127)) ? static_cast<char>(c) : '.';
    }
}

std::string describe(const loom::infer::Sampling& s) {
    std::ostringstream out;
    if (s.greedy) return "greedy";
    out << "temperature " << s.temperature << ", top-k " << s.top_k << ", top-p " << s.top_p << ", seed " << s.seed;
    return out.str();
}

int run(const Flags& f) {
    // Rank threads x GEMM threads (loom's and the BLAS's) within the cores: a
    // BLAS left at its default would run every rank thread's products on all of them.
    loom::kernels::host::set_blas_threads(loom::kernels::host::gemm_threads_for(static_cast<int>(f.tp * f.pp)));
    const loom::gpt::Config& config = f.target.config;
    loom::gpt::Model model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model);
    gpt_flags::load_weights("", model, arena, config, f.target.random ? std::string{} : f.target.checkpoint,
                            f.sampling.seed);

    std::vector<loom::infer::Request> requests(f.prompts.size());
    std::int64_t capacity = 1;
    for (std::size_t i = 0; i < requests.size(); ++i) {
        for (char c : f.prompts[i]) requests[i].prompt.push_back(token_of(c, f.target.config.vocab));
        requests[i].max_new_tokens = f.max_new;
        for (const std::string& stop : f.stops) requests[i].stop_tokens.push_back(token_of(stop[0], f.target.config.vocab));
        requests[i].sampling = f.sampling;
        capacity = std::max(capacity, loom::infer::positions_needed(requests[i]));
    }
    const auto n = static_cast<std::int64_t>(requests.size());
    const std::int64_t slots = f.max_batch == 0 ? n : std::min(f.max_batch, n);
    std::cout << "sampling: " << describe(f.sampling) << "; " << n << " prompt" << (n == 1 ? "" : "s") << ", up to "
              << slots << " at once, KV cache in blocks of " << f.block_size << " positions";
    if (f.tp > 1) std::cout << "; tensor-parallel on " << f.tp << " rank threads";
    if (f.pp > 1) std::cout << "; pipeline-parallel in " << f.pp << " stages on rank threads";
    std::cout << "\n";

    std::vector<loom::infer::Completion> done;
    loom::infer::SpeculativeStats stats;
    const auto start = std::chrono::steady_clock::now();
    // The draft, whole (read by every rank): a plain GPT or a GliDe draft.
    const gpt_flags::DraftModel drafts = gpt_flags::load_draft(f.draft, config, f.sampling.seed);
    loom::gpt::Model* draft = drafts.plain.get();
    loom::gpt::GlideDraft* glide = drafts.glide.get();
    // The prompts on one engine (the whole target, or a tp rank's shard, with its KV cache): its
    // completions and, with a draft, stats.
    auto decode = [&](loom::infer::CachedGpt& engine, loom::infer::KvCache& cache,
                      std::vector<loom::infer::Completion>& out, loom::infer::SpeculativeStats& out_stats) {
        if (!draft && !glide) {
            out = loom::infer::generate(engine, requests);
            return;
        }
        // Continuously batched as generate() is: --max-batch prompts at a time, a finished one's slot
        // refilled at the next round.
        auto speculate = [&](loom::infer::DraftEngine& draft_engine) {
            loom::infer::SpeculativeBatcher batcher(engine, draft_engine, f.draft.gamma, 0, f.draft.cape);
            for (const loom::infer::Request& r : requests) (void)batcher.submit(r);  // ids: the prompts' indices
            out.resize(requests.size());
            while (!batcher.idle())
                for (const loom::infer::SpeculativeBatcher::Event& e : batcher.step()) {
                    loom::infer::Completion& c = out[static_cast<std::size_t>(e.id)];
                    c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
                    if (e.finish) c.finish = *e.finish;
                }
            out_stats = batcher.stats();
        };
        loom::infer::KvCache draft_cache(f.draft.config.layers, f.draft.config.width, slots, capacity, f.block_size);
        if (glide) {
            loom::infer::CachedGlide draft_engine(*glide, f.draft.config, draft_cache, cache);
            speculate(draft_engine);
        } else {
            loom::infer::CachedGpt draft_engine(*draft, f.draft.config, draft_cache);
            loom::infer::PlainDraft plain(draft_engine);
            speculate(plain);
        }
    };
    if (f.pp > 1) {
        // Every stage copies its blocks from the whole weights (with --tp, its shard of them); the
        // completions come back to every rank.
        loom::comm::ThreadWorld(static_cast<int>(f.pp * f.tp)).run([&](loom::comm::ThreadComm& comm) {
            loom::comm::Mesh<loom::comm::ThreadComm> mesh(comm, {{"pp", static_cast<int>(f.pp)}, {"tp", static_cast<int>(f.tp)}});
            loom::comm::AnyComm pp = loom::comm::AnyComm::view(mesh.axis("pp")), tp = loom::comm::AnyComm::view(mesh.axis("tp"));
            const loom::infer::PipelineStage where = loom::infer::pipeline_stage(config, pp.rank(), pp.size());
            loom::gpt::Model stage = loom::infer::make_stage_model(config, where);
            loom::infer::shard_for_serving(stage, tp.rank(), tp.size());  // a tp group of 1 keeps it whole
            loom::nn::ParamArena stage_arena(stage);
            loom::infer::load_stage_values(stage, config, where, arena.values());
            loom::infer::KvCache cache(where.count, config.width / tp.size(), slots, capacity, f.block_size);
            loom::infer::CachedGpt engine(stage, config, cache, tp, where);
            std::vector<loom::infer::Completion> mine =
                loom::infer::generate_pipelined(engine, pp, requests, {.prefill_tokens = f.prefill_tokens});
            if (comm.rank() == 0) done = std::move(mine);
        });
    } else if (f.tp == 1) {
        loom::infer::KvCache cache(config.layers, config.width, slots, capacity, f.block_size);
        gpt_flags::TargetWeights weights(f.pool, model, config, arena.values(), "");  // the last blocks pooled, if asked
        loom::infer::CachedGpt engine(weights.model(), config, cache);
        weights.install(engine);
        decode(engine, cache, done, stats);
    } else {
        // Every rank cuts its shard from the whole weights and runs the same prompts; rank 0 keeps what it wrote.
        loom::comm::ThreadWorld(static_cast<int>(f.tp)).run([&](loom::comm::ThreadComm& comm) {
            loom::comm::AnyComm tp = loom::comm::AnyComm::view(comm);
            loom::gpt::Model shard = loom::gpt::make_model(config);
            loom::infer::shard_for_serving(shard, tp.rank(), tp.size());
            loom::nn::ParamArena shard_arena(shard);
            loom::infer::load_whole_values(shard, arena.values());
            loom::infer::KvCache cache = loom::infer::serving_cache(config, tp.size(), slots, capacity, f.block_size);
            loom::infer::CachedGpt engine(shard, config, cache, tp);
            std::vector<loom::infer::Completion> mine;
            loom::infer::SpeculativeStats mine_stats;
            decode(engine, cache, mine, mine_stats);
            if (tp.rank() == 0) {
                done = std::move(mine);
                stats = mine_stats;
            }
        });
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::int64_t tokens = 0, at_length = 0, at_stop = 0;
    for (std::size_t i = 0; i < done.size(); ++i) {
        const bool stopped = done[i].finish == loom::infer::Finish::stop;
        tokens += static_cast<std::int64_t>(done[i].tokens.size());
        (stopped ? at_stop : at_length) += 1;
        std::string text;
        append_printable(text, requests[i].prompt);
        append_printable(text, done[i].tokens);
        std::printf("--- completion %zu: %zu new tokens, finished at %s ---\n%s\n", i + 1, done[i].tokens.size(),
                    stopped ? "a stop token" : "the length limit", text.c_str());
    }
    std::printf("generated %lld tokens in %.4f s: %.0f tokens/s (prompts' prefill included); finished: %lld at the "
                "length limit, %lld at a stop token\n",
                static_cast<long long>(tokens), seconds, seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0,
                static_cast<long long>(at_length), static_cast<long long>(at_stop));
    if (f.draft.cape)
        std::printf("CaPE: %lld candidates proposed (chain and alternatives), %lld accepted, %lld of them "
                    "alternatives; %.2f accepted tokens per target pass (%.2f tokens with the target's own)\n",
                    static_cast<long long>(stats.drafted), static_cast<long long>(stats.accepted),
                    static_cast<long long>(stats.alternatives),
                    stats.target_passes == 0 ? 0.0
                                             : static_cast<double>(stats.accepted) /
                                                   static_cast<double>(stats.target_passes),
                    stats.tokens_per_pass());
    if (f.draft.on())
        std::printf("speculative: gamma %lld; %lld target passes (each prompt's, summed), %lld draft tokens proposed, %lld accepted (%.0f%%); "
                    "%.2f tokens per target pass\n",
                    static_cast<long long>(f.draft.gamma), static_cast<long long>(stats.target_passes),
                    static_cast<long long>(stats.drafted), static_cast<long long>(stats.accepted),
                    100.0 * stats.acceptance_rate(), stats.tokens_per_pass());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Flags flags;
    try {
        flags = parse(argc, argv);
    } catch (const FlagError& e) {
        std::fprintf(stderr, "generate_gpt: %s\n", e.what());
        return 2;
    }
    try {
        return run(flags);
    } catch (const loom::Error& e) {
        std::fprintf(stderr, "generate_gpt: %s\n", e.message().c_str());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "generate_gpt: %s\n", e.what());
        return 1;
    }
}
