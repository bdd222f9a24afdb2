// What tensor-parallel serving's tests share on every transport (rank
// threads in tests/infer, processes in tests/mpi): a small scaled GPT, a
// rank's serving shard of it, and the requests. Test code only.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/tensor_parallel_gpt.hpp"
#include "loom/nn/param_arena.hpp"
#include "support/scaled_gpt.hpp"

namespace loom_test {

using loom::infer::Request;

// 4 heads (tp 1, 2, 4) and a vocabulary of 42: at tp 4 the head's runs are
// 11, 11, 11 and 9 rows, so the uneven last run is exercised.
struct SmallGpt : loom_test::ScaledGpt {
    explicit SmallGpt(std::uint64_t seed)
        : ScaledGpt({.layers = 2, .width = 32, .heads = 4, .seq = 32, .vocab = 42}, seed, 8.0f) {}
};

// One tp rank's model: the serving shard of `whole`, bound, with its values.
struct RankShard {
    loom::gpt::Model model;
    loom::nn::ParamArena arena;

    RankShard(const SmallGpt& whole, int rank, int degree)
        : model(cut(whole.config, rank, degree)), arena(model) {
        loom::infer::load_whole_values(model, whole.arena.values());
    }
    static loom::gpt::Model cut(const loom::gpt::Config& config, int rank, int degree) {
        auto model = loom::gpt::make_model(config);
        loom::infer::shard_for_serving(model, rank, degree);
        return model;
    }
};

inline Request request(std::vector<std::int32_t> prompt, std::int64_t count, bool greedy, std::uint64_t seed = 0) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_new_tokens = count;
    r.sampling.greedy = greedy;
    r.sampling.seed = seed;
    if (!greedy) r.sampling.temperature = 4.0f;  // flattened: the draws are not all the argmax
    return r;
}

// Prompts of 1 to 12 tokens with different lengths to go: finishing at
// different steps, so a batch of 2 slots refills continuously.
inline std::vector<Request> mixed_batch(bool greedy) {
    std::vector<Request> batch;
    const std::int64_t lengths[] = {3, 12, 1, 7, 5, 9};
    const std::int64_t counts[] = {10, 4, 14, 8, 6, 11};
    for (std::int32_t i = 0; i < 6; ++i)
        batch.push_back(request(prompt_of(lengths[i], 42, i), counts[i], greedy, 100 + static_cast<std::uint64_t>(i)));
    batch[2].stop_tokens = {5, 17};
    return batch;
}

// This rank's completions of `requests` at tp = tp.size(), on its shard of `whole`.
inline std::vector<loom::infer::Completion> serve_on(loom::comm::AnyComm& tp, const SmallGpt& whole,
                                                     const std::vector<Request>& requests, std::int64_t max_batch) {
    RankShard shard(whole, tp.rank(), tp.size());
    return loom::infer::generate(shard.model, whole.config, tp, requests, max_batch);
}

}  // namespace loom_test
