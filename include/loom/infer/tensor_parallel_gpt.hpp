// Tensor-parallel serving of loom's GPT: `degree` ranks each hold their
// shard of every block (infer/tensor_parallel_shard.hpp: Megatron's cuts, as
// training's), a KV cache of their own heads only, and run the same
// continuous batcher (infer/batcher.hpp) over a CachedGpt given the tp
// group. Per block and step there are two sums over the group (after the
// attention projection and after the MLP's second Linear) and per step one
// all-gather of the last positions' logits.
//
// Every rank steps the same batch: each is given the same requests in the
// same order (and, for a server, the same submits and cancels between the
// same steps), so each Batcher admits, samples and retires alike. Sampling
// needs no broadcast: the gathered logits are the same bits on every rank
// and each request draws from its own seeded stream, so every rank picks the
// same token (the tests check that all ranks agree). Requests that differ
// between ranks are the caller's bug; a collective then fails or hangs until
// the communicator's timeout.
//
//   loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {   // or an Mpi rank
//       loom::comm::AnyComm tp = loom::comm::AnyComm::view(comm);
//       auto shard = loom::gpt::make_model(config);
//       loom::infer::shard_for_serving(shard, tp.rank(), tp.size());
//       loom::nn::ParamArena arena(shard);
//       loom::infer::load_whole_values(shard, whole);   // a checkpoint's values, or arena.initialize(shard, seed)
//       auto done = loom::infer::generate(shard, config, tp, requests);   // the same on every rank
//   });
//
// For a server's loop: KvCache cache = serving_cache(config, tp.size(), ...);
// CachedGpt engine(shard, config, cache, tp); Batcher batcher(engine); and
// the same submit/step calls on every rank.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/error.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/tensor_parallel_shard.hpp"

namespace loom::infer {

// A tp rank's KV cache: `slots` sequences of `capacity` positions for its
// config.heads / degree heads (KvCache's other arguments as there).
[[nodiscard]] inline KvCache serving_cache(const gpt::Config& config, int degree, std::int64_t slots,
                                           std::int64_t capacity, std::int64_t block_size = 16,
                                           std::int64_t blocks = 0) {
    LOOM_CHECK(degree >= 1 && config.heads % degree == 0, "serving_cache: a tp group of ", degree,
               " ranks does not divide the ", config.heads, " heads; use a degree that divides ", config.heads);
    return {config.layers, config.width / degree, slots, capacity, block_size, blocks};
}

// generate(model, config, requests, max_batch) on a tp group: `shard` is
// this rank's serving shard, bound and loaded; every rank calls it with the
// same requests and gets the same completions.
[[nodiscard]] inline std::vector<Completion> generate(gpt::Model& shard, const gpt::Config& config, comm::AnyComm& tp,
                                                      std::span<const Request> requests, std::int64_t max_batch = 0) {
    const CacheShape shape = cache_shape_for(config, requests, max_batch);
    KvCache cache = serving_cache(config, tp.size(), shape.slots, shape.capacity);
    CachedGpt engine(shard, config, cache, tp);
    return generate(engine, requests);
}

}  // namespace loom::infer
