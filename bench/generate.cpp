// Generation on GPT config A (4 layers, width 256, 4 heads, sequence 128,
// vocabulary 256), batch 1, one core: 100 tokens after a 16-token prompt,
// with the KV cache (loom::infer::generate) beside re-running the whole
// window for every token (gpt::sample, the path loom had). Both sample at
// temperature 1 with the same seed and the same draw rule, so they should
// write the same text; the bench says whether they did. Tokens/s count the
// 100 new tokens over the whole call (prefill included); time to first token
// is the prefill of the prompt and the first draw. Then 16 requests of mixed
// prompt lengths: all batched, one at a time, and by gpt::sample. Last,
// tensor-parallel serving: the same two workloads at tp 1 (the whole model)
// and tp 2 (infer/tensor_parallel_gpt.hpp on two rank threads, one GEMM
// thread each), greedy, each tp 2 run checked against tp 1's tokens. Median
// of --reps runs.
//
//   bench_generate [--reps 3] [--tokens 100]
#include <loom/comm/any_comm.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/gpt/model.hpp>
#include <loom/gpt/sample.hpp>
#include <loom/infer/generate.hpp>
#include <loom/infer/tensor_parallel_gpt.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/param_arena.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_model.hpp"
#include "generation_flags.hpp"
#include "timing.hpp"

namespace {

const loom::gpt::Config config_a{.layers = 4, .width = 256, .heads = 4, .seq = 128, .vocab = 256};
constexpr std::uint64_t seed = 5;

// Tokens as gpt::sample writes them: bytes, unprintable ones as '.'.
std::string as_text(const std::vector<std::int32_t>& tokens) {
    std::string text;
    for (std::int32_t t : tokens) {
        const auto c = static_cast<unsigned char>(t);
        text += (c == '\n' || (c >= 32 && c < 127)) ? static_cast<char>(c) : '.';
    }
    return text;
}

// The median time of `reps` runs of generate(requests) at tp 2 on rank
// threads (each rank's shard cut and loaded off the clock; rank 0 times a
// run from a barrier to a barrier), and whether every run on every rank gave
// `expected`.
double tp2_seconds(const loom::nn::ParamArena& whole, const std::vector<loom::infer::Request>& requests,
                   const std::vector<loom::infer::Completion>& expected, int reps, bool& same) {
    std::vector<double> times;
    std::vector<int> agreed(2, 1);
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::AnyComm tp = loom::comm::AnyComm::view(comm);
        auto shard = loom::gpt::make_model(config_a);
        loom::infer::shard_for_serving(shard, tp.rank(), tp.size());
        loom::nn::ParamArena arena(shard);
        loom::infer::load_whole_values(shard, whole.values());
        for (int r = 0; r < reps; ++r) {
            tp.barrier();
            const auto start = std::chrono::steady_clock::now();
            const auto done = loom::infer::generate(shard, config_a, tp, requests);
            tp.barrier();
            if (tp.rank() == 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
            for (std::size_t i = 0; i < done.size(); ++i)
                if (done[i].tokens != expected[i].tokens) agreed[static_cast<std::size_t>(tp.rank())] = 0;
        }
    });
    same = agreed[0] == 1 && agreed[1] == 1;
    return bench::median(times);
}

// What tp 2's batch-1 decode spends waiting on its peer: the median time of
// `count` all-reduces of one position's width (a decode step's sums) on two
// rank threads, with no other work between them.
double all_reduce_seconds(int count, int reps) {
    std::vector<double> times;
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        std::vector<float> row(static_cast<std::size_t>(config_a.width), 1.0f);
        const auto t = loom::Tensor::of(row.data(), loom::Shape{config_a.width});
        for (int r = 0; r < reps; ++r) {
            comm.barrier();
            const auto start = std::chrono::steady_clock::now();
            for (int i = 0; i < count; ++i) comm.all_reduce(t, t, loom::comm::ReduceOp::max);
            comm.barrier();
            if (comm.rank() == 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
    });
    return bench::median(times);
}

}  // namespace

int main(int argc, char** argv) {
    const auto flags = bench::parse_generation_flags(argc, argv, "bench_generate");
    if (!flags) return 2;
    const int reps = flags->reps;
    const std::int64_t count = flags->tokens;
    loom::kernels::host::set_blas_threads(1);
    std::printf("CPU: %s; GEMM: loom host kernels at %s, 1 thread; median of %d runs\n", bench::cpu_model().c_str(),
                bench::cpu_level().c_str(), reps);
    std::printf("GPT config A (L4 C256 H4 T128 V256), batch 1, %lld new tokens after a 16-token prompt, "
                "temperature 1\n\n",
                static_cast<long long>(count));

    auto model = loom::gpt::make_model(config_a);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, 1);
    const std::string prompt = "The cache keeps ";  // 16 bytes
    loom::infer::Request request;
    for (char c : prompt) request.prompt.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(c)));
    request.max_new_tokens = count;
    request.sampling = loom::infer::Sampling{.seed = seed};
    const std::vector<loom::infer::Request> one{request};

    std::vector<std::int32_t> cached_tokens;
    std::string recomputed_text;
    const double cached = bench::median_seconds(reps, [&] {
        cached_tokens = loom::infer::generate(model, config_a, one)[0].tokens;
    });
    // The same with the whole sequence in one block: what paging costs.
    loom::infer::KvCache whole(config_a.layers, config_a.width, 1, config_a.seq, /*block_size=*/config_a.seq);
    loom::infer::CachedGpt unpaged(model, config_a, whole);
    const double one_block = bench::median_seconds(reps, [&] { (void)loom::infer::generate(unpaged, one); });
    const double recomputed = bench::median_seconds(reps, [&] {
        recomputed_text = loom::gpt::sample(model, config_a, prompt, count, seed);
    });
    // Time to first token: the prompt's prefill and one draw.
    loom::infer::Request first = request;
    first.max_new_tokens = 1;
    const std::vector<loom::infer::Request> first_only{first};
    const double ttft = bench::median_seconds(reps, [&] { (void)loom::infer::generate(model, config_a, first_only); });

    std::vector<std::int32_t> all = request.prompt;
    all.insert(all.end(), cached_tokens.begin(), cached_tokens.end());
    const bool same = as_text(all) == recomputed_text;
    const double n = static_cast<double>(count);
    std::printf("| path | time for %lld tokens | tokens/s | vs re-running |\n", static_cast<long long>(count));
    std::printf("| --- | ---: | ---: | ---: |\n");
    std::printf("| KV cache, blocks of 16 (infer::generate) | %.1f ms | %.0f | %.1fx |\n", cached * 1e3, n / cached,
                recomputed / cached);
    std::printf("| KV cache in one block of %lld (unpaged) | %.1f ms | %.0f | %.1fx |\n",
                static_cast<long long>(config_a.seq), one_block * 1e3, n / one_block, recomputed / one_block);
    std::printf("| re-running the window (gpt::sample) | %.1f ms | %.0f | 1.0x |\n", recomputed * 1e3,
                n / recomputed);
    std::printf("\ntime to first token (16-token prefill + draw): %.2f ms\n", ttft * 1e3);
    std::printf("same text as gpt::sample: %s\n", same ? "yes" : "no");

    // 16 requests of prompt lengths 4, 8, ..., 64, 32 new tokens each, each with its own seed.
    std::vector<loom::infer::Request> mixed;
    std::vector<std::string> texts;
    for (int i = 0; i < 16; ++i) {
        loom::infer::Request r;
        std::string text;
        for (int t = 0; t < 4 * (i + 1); ++t) text += static_cast<char>('a' + (t * 7 + i) % 26);
        for (char c : text) r.prompt.push_back(static_cast<std::int32_t>(c));
        r.max_new_tokens = 32;
        r.sampling = loom::infer::Sampling{.seed = seed + static_cast<std::uint64_t>(i)};
        mixed.push_back(std::move(r));
        texts.push_back(std::move(text));
    }
    const double all_at_once =
        bench::median_seconds(reps, [&] { (void)loom::infer::generate(model, config_a, mixed); });
    const double one_at_a_time =
        bench::median_seconds(reps, [&] { (void)loom::infer::generate(model, config_a, mixed, 1); });
    const double resampled = bench::median_seconds(reps, [&] {
        for (std::size_t i = 0; i < texts.size(); ++i)
            (void)loom::gpt::sample(model, config_a, texts[i], 32, seed + static_cast<std::uint64_t>(i));
    });
    const double produced = 16.0 * 32.0;
    std::printf("\n16 requests, prompts of 4, 8, ..., 64 tokens, 32 new tokens each (%.0f in all)\n\n", produced);
    std::printf("| path | time | tokens/s | vs re-running |\n| --- | ---: | ---: | ---: |\n");
    std::printf("| KV cache, all 16 batched (no padding) | %.1f ms | %.0f | %.1fx |\n", all_at_once * 1e3,
                produced / all_at_once, resampled / all_at_once);
    std::printf("| KV cache, one request at a time | %.1f ms | %.0f | %.1fx |\n", one_at_a_time * 1e3,
                produced / one_at_a_time, resampled / one_at_a_time);
    std::printf("| re-running the window (gpt::sample), one at a time | %.1f ms | %.0f | 1.0x |\n", resampled * 1e3,
                produced / resampled);

    // Tensor-parallel serving, greedy: tp 1 (the whole model, this thread) and tp 2 (two rank threads).
    std::printf("\ntensor-parallel serving, greedy: tp 1 (whole model, 1 thread) vs tp 2 (2 rank threads, 1 GEMM "
                "thread each)\n\n| workload | tp 1 | tp 2 | tp 2 / tp 1 | same tokens |\n| --- | ---: | ---: | ---: | "
                "--- |\n");
    std::vector<loom::infer::Request> greedy_one = one, greedy_mixed = mixed;
    for (auto* list : {&greedy_one, &greedy_mixed})
        for (loom::infer::Request& r : *list) r.sampling.greedy = true;
    for (const auto& [name, requests, tokens] :
         {std::tuple{"batch 1, decode after a 16-token prompt", &greedy_one, n},
          std::tuple{"16 requests of mixed lengths, batched", &greedy_mixed, produced}}) {
        std::vector<loom::infer::Completion> expected;
        const double tp1 = bench::median_seconds(reps, [&] { expected = loom::infer::generate(model, config_a, *requests); });
        bool agree = false;
        const double tp2 = tp2_seconds(arena, *requests, expected, reps, agree);
        std::printf("| %s | %.1f ms, %.0f tokens/s | %.1f ms, %.0f tokens/s | %.2fx | %s |\n", name, tp1 * 1e3,
                    tokens / tp1, tp2 * 1e3, tokens / tp2, tp1 / tp2, agree ? "yes" : "no");
    }
    // A decode step at tp 2 is 2 sums per layer and one gather: 9 collectives for config A.
    const int collectives = static_cast<int>(count) * static_cast<int>(2 * config_a.layers + 1);
    const double waiting = all_reduce_seconds(collectives, reps);
    std::printf("\n%d all-reduces of %lld floats alone on 2 rank threads (the collectives of %lld decode steps): "
                "%.1f ms, %.1f us each\n",
                collectives, static_cast<long long>(config_a.width), static_cast<long long>(count), waiting * 1e3,
                waiting / collectives * 1e6);
    return 0;
}
