// Pipeline-parallel serving of loom's GPT with EnergonAI's non-blocking
// pipeline: `pp` ranks each hold a contiguous run of blocks
// (infer/pipeline_stage.hpp) and a KV cache of those blocks only, and the
// running requests are split into groups (pp of them by default) that move
// through the stages one after another, so while stage 1 runs group A's
// step, stage 0 runs group B's. No stage waits for a whole batch to drain:
// stage 0 waits only for the group whose tokens it needs next.
//
// Stage 0 is the controller: it admits requests into groups (continuous
// batching, as infer/batcher.hpp: a slot freed by a finished request is
// refilled at that group's next step), embeds the group's new tokens, runs
// its blocks and sends on, ahead of the hidden rows, the small meta message
// EnergonAI sends ahead of each activation: the slots to release, and per
// sequence its slot, token count, request and draw index, its Sampling, and
// its tokens.
// Each later stage receives, runs its blocks and passes on; the last samples
// each sequence's token (the Sampling and seed the meta carries, draw k for
// its k-th token, as Batcher does; the last stage needs no request list, so
// a batcher can admit requests while the pipeline runs:
// infer/pipelined_batcher.hpp) and sends the tokens back to stage 0, which
// decides who finished before the group's next step. Every stage processes
// messages in the order they came (one link each way, first in first out),
// so a slot's release always reaches a stage before the slot's next use.
//
// Every rank is given the same requests; the completions are broadcast from stage 0 at the end, so every
// rank returns them. Sends are asynchronous, their buffers kept until done,
// so no transport's rendezvous can deadlock stage 0's send against the last
// stage's send of tokens (MPI may hold a large send until it is received).
//
//   loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {   // or an Mpi rank
//       loom::comm::AnyComm pp = loom::comm::AnyComm::view(comm);
//       const auto where = loom::infer::pipeline_stage(config, pp.rank(), pp.size());
//       auto stage = loom::infer::make_stage_model(config, where);
//       loom::nn::ParamArena arena(stage);
//       loom::infer::load_stage_values(stage, config, where, whole);   // a checkpoint's values
//       auto done = loom::infer::generate_pipelined(stage, config, pp, requests);   // the same on every rank
//   });
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/error.hpp"
#include "loom/exec/trace.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/cached_gpt.hpp"
#include "loom/infer/generate.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pipeline_stage.hpp"
#include "loom/infer/sampler.hpp"

namespace loom::infer {

struct PipelineOptions {
    int groups = 0;                 // groups of requests in flight (0: one per stage)
    exec::Trace* trace = nullptr;   // this rank's compute and waits, when given (exec/trace.hpp)
};

// A pipeline stage's KV cache: `slots` sequences of `capacity` positions for
// its blocks only (KvCache's other arguments as there).
[[nodiscard]] inline KvCache pipeline_cache(const gpt::Config& config, const PipelineStage& where, std::int64_t slots,
                                            std::int64_t capacity, std::int64_t block_size = 16,
                                            std::int64_t blocks = 0) {
    return {where.count, config.width, slots, capacity, block_size, blocks};
}

namespace detail {

// The message kinds between stages, one tag each (a transport keeps one
// tag's messages between two ranks in order).
inline constexpr int pipeline_header_tag = 3901, pipeline_meta_tag = 3902, pipeline_hidden_tag = 3903,
                     pipeline_tokens_tag = 3904;
// header: [sequences (-1: stop, -2: nothing, keep waiting), releases, tokens, group]; meta:
// releases' slots, then per sequence [slot, count, request, draw, sampling (7 fields)], then every
// sequence's tokens.
inline constexpr std::size_t pipeline_header_size = 4, pipeline_fields_per_sequence = 11;
inline constexpr std::int32_t pipeline_stop = -1, pipeline_keep_alive = -2;

// A sequence's meta fields. The Sampling travels as int32s (64-bit fields in
// halves, floats as their bits), so the last stage draws with the very values
// stage 0 was given.
inline void put_sequence_fields(std::vector<std::int32_t>& meta, std::int64_t slot, std::size_t count,
                                std::size_t request, std::size_t draw, const Sampling& sampling) {
    const auto low = [](std::uint64_t v) { return static_cast<std::int32_t>(static_cast<std::uint32_t>(v)); };
    const auto high = [](std::uint64_t v) { return static_cast<std::int32_t>(static_cast<std::uint32_t>(v >> 32)); };
    const auto top_k = static_cast<std::uint64_t>(sampling.top_k);
    meta.insert(meta.end(), {static_cast<std::int32_t>(slot), static_cast<std::int32_t>(count),
                             static_cast<std::int32_t>(request), static_cast<std::int32_t>(draw),
                             sampling.greedy ? 1 : 0, std::bit_cast<std::int32_t>(sampling.temperature), low(top_k),
                             high(top_k), std::bit_cast<std::int32_t>(sampling.top_p), low(sampling.seed),
                             high(sampling.seed)});
}

[[nodiscard]] inline Sampling sampling_of_fields(const std::int32_t* f) {
    const auto join = [](std::int32_t low, std::int32_t high) {
        return (std::uint64_t{static_cast<std::uint32_t>(high)} << 32) | static_cast<std::uint32_t>(low);
    };
    return {.greedy = f[4] != 0, .temperature = std::bit_cast<float>(f[5]),
            .top_k = static_cast<std::int64_t>(join(f[6], f[7])), .top_p = std::bit_cast<float>(f[8]),
            .seed = join(f[9], f[10])};
}

// Asynchronous sends with the buffers they read: a buffer lives until its send is done.
class PipelineOutbox {
public:
    PipelineOutbox() = default;
    PipelineOutbox(const PipelineOutbox&) = delete;
    PipelineOutbox& operator=(const PipelineOutbox&) = delete;

    void send(comm::AnyComm& comm, std::vector<std::int32_t> ints, int peer, int tag) {
        reap();
        Pending& p = pending_.emplace_back();
        p.ints = std::move(ints);
        p.request = comm.send_async(Tensor::of(p.ints.data(), Shape{static_cast<std::int64_t>(p.ints.size())}), peer, tag);
    }
    void send(comm::AnyComm& comm, std::span<const float> floats, int peer, int tag) {
        reap();
        Pending& p = pending_.emplace_back();
        p.floats.assign(floats.begin(), floats.end());
        p.request = comm.send_async(Tensor::of(p.floats.data(), Shape{static_cast<std::int64_t>(p.floats.size())}), peer,
                                    tag);
    }
    void drain() {
        for (Pending& p : pending_) p.request.wait();
        pending_.clear();
    }

private:
    struct Pending {
        std::vector<std::int32_t> ints;
        std::vector<float> floats;
        comm::Request request;  // declared last: destroyed (finished quietly) before the buffers it reads
    };
    void reap() {
        pending_.remove_if([](Pending& p) { return p.request.test(); });
    }
    std::list<Pending> pending_;  // a list: a buffer never moves while its send reads it
};

// A trace event around `work` on this rank's lane (compute or communication).
template <class Work>
void traced(exec::Trace* trace, const std::string& name, const char* category, int lane, int group, Work&& work) {
    if (trace == nullptr) {
        work();
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    work();
    trace->add(name, category, lane, start, std::chrono::steady_clock::now(), -1, group);
}

inline void pipeline_recv(comm::AnyComm& comm, std::vector<std::int32_t>& ints, std::size_t n, int peer, int tag) {
    ints.resize(n);
    comm.recv(Tensor::of(ints.data(), Shape{static_cast<std::int64_t>(n)}), peer, tag);
}

// Stage 0: the groups' scheduler, their embeddings and first blocks.
class PipelineController {
public:
    PipelineController(CachedGpt& engine, comm::AnyComm& pp, std::span<const Request> requests, int groups,
                       exec::Trace* trace)
        : engine_(engine), cache_(engine.cache()), pp_(pp), requests_(requests), trace_(trace),
          groups_(static_cast<std::size_t>(groups)), done_(requests.size()) {
        for (std::int64_t s = cache_.slots() - 1; s >= 0; --s) free_slots_.push_back(s);
        for (std::size_t i = 0; i < requests.size(); ++i) waiting_.push_back(i);
        // Each group takes at most its share of the slots, so the groups stay near one size
        // and every stage's step takes about as long for each.
        per_group_ = (cache_.slots() + groups - 1) / groups;
    }

    std::vector<Completion> run() {
        for (std::size_t g = 0; g < groups_.size(); ++g) launch(g);
        while (!in_flight_.empty()) {
            const std::size_t g = in_flight_.front();
            in_flight_.pop_front();
            finish_step(g);
            launch(g);
            for (std::size_t h = 0; h < groups_.size(); ++h)  // slots g freed may start an idle group
                if (!groups_[h].in_flight) launch(h);
        }
        LOOM_CHECK(waiting_.empty(), "generate_pipelined: ", waiting_.size(),
                   " requests could not start on an empty cache; this is a bug");
        const std::vector<std::int32_t> stop{pipeline_stop, 0, 0, -1};
        outbox_.send(pp_, stop, 1, pipeline_header_tag);
        outbox_.drain();
        return std::move(done_);
    }

private:
    struct Running {
        std::size_t request;
        std::int64_t slot, blocks;
        std::vector<std::int32_t> tokens;  // the new ones so far
        bool fresh = true;                 // its prompt not yet run
    };
    struct Group {
        std::vector<Running> running;
        bool in_flight = false;
    };

    // Admits waiting requests into group g, runs its step on this stage and sends it on.
    void launch(std::size_t g) {
        Group& group = groups_[g];
        while (!waiting_.empty() && !free_slots_.empty() && static_cast<std::int64_t>(group.running.size()) < per_group_) {
            const std::size_t r = waiting_.front();
            const std::int64_t blocks = cache_.blocks_for(positions_needed(requests_[r]));
            if (promised_ + blocks > cache_.blocks()) break;  // as Batcher: no request runs out of blocks halfway
            waiting_.pop_front();
            promised_ += blocks;
            group.running.push_back({r, free_slots_.back(), blocks, {}, true});
            free_slots_.pop_back();
        }
        if (group.running.empty()) return;
        segments_.clear();
        std::vector<std::int32_t> meta = releases_;
        releases_.clear();
        std::vector<std::int32_t> tokens;
        for (Running& e : group.running) {
            const std::span<const std::int32_t> in =
                e.fresh ? std::span<const std::int32_t>(requests_[e.request].prompt) : std::span(&e.tokens.back(), 1);
            segments_.push_back({e.slot, in});
            put_sequence_fields(meta, e.slot, in.size(), e.request, e.tokens.size(), requests_[e.request].sampling);
            tokens.insert(tokens.end(), in.begin(), in.end());
        }
        const std::vector<std::int32_t> header{static_cast<std::int32_t>(group.running.size()),
                                               static_cast<std::int32_t>(meta.size() - pipeline_fields_per_sequence *
                                                                                           group.running.size()),
                                               static_cast<std::int32_t>(tokens.size()), static_cast<std::int32_t>(g)};
        meta.insert(meta.end(), tokens.begin(), tokens.end());
        std::span<const float> hidden;
        traced(trace_, "stage 0 group " + std::to_string(g), "forward", exec::compute_lane, static_cast<int>(g),
               [&] { hidden = engine_.forward_stage(segments_, {}); });
        for (Running& e : group.running) e.fresh = false;
        outbox_.send(pp_, header, 1, pipeline_header_tag);
        outbox_.send(pp_, std::move(meta), 1, pipeline_meta_tag);
        outbox_.send(pp_, hidden, 1, pipeline_hidden_tag);
        group.in_flight = true;
        in_flight_.push_back(g);
    }

    // Group g's tokens from the last stage: each request takes its token and those that finished leave.
    void finish_step(std::size_t g) {
        Group& group = groups_[g];
        traced(trace_, "tokens of group " + std::to_string(g), "wait", exec::communication_lane, static_cast<int>(g),
               [&] { pipeline_recv(pp_, tokens_, group.running.size(), pp_.size() - 1, pipeline_tokens_tag); });
        group.in_flight = false;
        std::vector<Running> still;
        for (std::size_t j = 0; j < group.running.size(); ++j) {
            Running& e = group.running[j];
            const Request& r = requests_[e.request];
            e.tokens.push_back(tokens_[j]);
            Completion& c = done_[e.request];
            const bool stopped = std::find(r.stop_tokens.begin(), r.stop_tokens.end(), tokens_[j]) != r.stop_tokens.end();
            if (!stopped && static_cast<std::int64_t>(e.tokens.size()) < r.max_new_tokens) {
                still.push_back(std::move(e));
                continue;
            }
            c.finish = stopped ? Finish::stop : Finish::length;
            c.tokens = std::move(e.tokens);
            cache_.release(e.slot);
            promised_ -= e.blocks;
            free_slots_.push_back(e.slot);
            releases_.push_back(static_cast<std::int32_t>(e.slot));  // travels ahead of the slot's next use
        }
        group.running.swap(still);
    }

    CachedGpt& engine_;
    KvCache& cache_;
    comm::AnyComm& pp_;
    std::span<const Request> requests_;
    exec::Trace* trace_;
    std::vector<Group> groups_;
    std::vector<Completion> done_;
    std::deque<std::size_t> waiting_;
    std::deque<std::size_t> in_flight_;   // groups sent on, in the order their tokens come back
    std::vector<std::int64_t> free_slots_;  // popped from the back: slot 0 first
    std::int64_t promised_ = 0, per_group_ = 1;
    std::vector<std::int32_t> releases_, tokens_;
    std::vector<Segment> segments_;
    PipelineOutbox outbox_;
};

// Stages 1..pp-1: receive a group, run its blocks, pass it on (or, on the
// last stage, sample and send the tokens back to stage 0), until stop.
inline void run_later_stage(CachedGpt& engine, comm::AnyComm& pp, exec::Trace* trace) {
    const int me = pp.rank(), previous = me - 1;
    const bool last = me == pp.size() - 1;
    const std::string name = "stage " + std::to_string(me) + " group ";
    const auto V = static_cast<std::size_t>(engine.config().vocab);
    KvCache& cache = engine.cache();
    PipelineOutbox outbox;
    Sampler sampler;
    std::vector<std::int32_t> header, meta, tokens;
    std::vector<float> hidden;
    std::vector<Segment> segments;
    while (true) {
        traced(trace, "receive", "wait", exec::communication_lane, -1,
               [&] { pipeline_recv(pp, header, pipeline_header_size, previous, pipeline_header_tag); });
        if (header[0] == pipeline_keep_alive) {  // stage 0 is idle: nothing to run, only the wait restarts
            if (!last) outbox.send(pp, std::move(header), me + 1, pipeline_header_tag);
            continue;
        }
        if (header[0] < 0) {
            if (!last) outbox.send(pp, std::move(header), me + 1, pipeline_header_tag);
            break;
        }
        const auto sequences = static_cast<std::size_t>(header[0]), releases = static_cast<std::size_t>(header[1]);
        const auto count = static_cast<std::size_t>(header[2]);
        const int group = header[3];
        pipeline_recv(pp, meta, releases + pipeline_fields_per_sequence * sequences + count, previous,
                      pipeline_meta_tag);
        hidden.resize(count * static_cast<std::size_t>(engine.config().width));
        pp.recv(Tensor::of(hidden.data(), Shape{static_cast<std::int64_t>(hidden.size())}), previous,
                pipeline_hidden_tag);
        for (std::size_t i = 0; i < releases; ++i) cache.release(meta[i]);
        segments.clear();
        const std::int32_t* fields = meta.data() + releases;
        const std::int32_t* next_token = fields + pipeline_fields_per_sequence * sequences;
        for (std::size_t i = 0; i < sequences; ++i) {
            const std::int32_t* f = fields + pipeline_fields_per_sequence * i;
            segments.push_back({f[0], std::span(next_token, static_cast<std::size_t>(f[1]))});
            next_token += f[1];
        }
        std::span<const float> out;
        traced(trace, name + std::to_string(group), "forward", exec::compute_lane, group,
               [&] { out = engine.forward_stage(segments, hidden); });
        if (!last) {
            outbox.send(pp, header, me + 1, pipeline_header_tag);
            outbox.send(pp, meta, me + 1, pipeline_meta_tag);
            outbox.send(pp, out, me + 1, pipeline_hidden_tag);
            continue;
        }
        tokens.resize(sequences);
        traced(trace, "sample group " + std::to_string(group), "sample", exec::compute_lane, group, [&] {
            for (std::size_t i = 0; i < sequences; ++i) {
                const std::int32_t* f = fields + pipeline_fields_per_sequence * i;
                tokens[i] = sampler.pick(out.subspan(i * V, V), sampling_of_fields(f), static_cast<std::uint64_t>(f[3]));
            }
        });
        outbox.send(pp, tokens, 0, pipeline_tokens_tag);
    }
    outbox.drain();
}

// Stage 0's completions to every rank: [finish, length] per request, then the tokens.
inline std::vector<Completion> broadcast_completions(comm::AnyComm& pp, std::vector<Completion> done,
                                                     std::size_t requests) {
    std::vector<std::int32_t> packed;
    if (pp.rank() == 0)
        for (const Completion& c : done) packed.insert(packed.end(), {static_cast<std::int32_t>(c.finish),
                                                                      static_cast<std::int32_t>(c.tokens.size())});
    if (pp.rank() == 0)
        for (const Completion& c : done) packed.insert(packed.end(), c.tokens.begin(), c.tokens.end());
    std::int32_t size = static_cast<std::int32_t>(packed.size());
    pp.broadcast(Tensor::of(&size, Shape{1}), 0);
    packed.resize(static_cast<std::size_t>(size));
    pp.broadcast(Tensor::of(packed.data(), Shape{size}), 0);
    if (pp.rank() == 0) return done;
    done.assign(requests, {});
    const std::int32_t* token = packed.data() + 2 * requests;
    for (std::size_t i = 0; i < requests; ++i) {
        done[i].finish = static_cast<Finish>(packed[2 * i]);
        done[i].tokens.assign(token, token + packed[2 * i + 1]);
        token += packed[2 * i + 1];
    }
    return done;
}

}  // namespace detail

// Runs the requests to completion on a pipeline: `engine` is this rank's
// stage (CachedGpt given pipeline_stage(config, pp.rank(), pp.size())),
// every rank calls it with the same requests and gets the same completions,
// which equal generate()'s on the whole model token for token. The cache's
// slots must be free; they are free again afterwards.
[[nodiscard]] inline std::vector<Completion> generate_pipelined(CachedGpt& engine, comm::AnyComm& pp,
                                                                std::span<const Request> requests,
                                                                const PipelineOptions& options = {}) {
    const PipelineStage& where = engine.stage();
    LOOM_CHECK(where.stage == pp.rank() && where.stages == pp.size(), "generate_pipelined: the engine is stage ",
               where.stage, " of ", where.stages, " but this is rank ", pp.rank(), " of a pipeline of ", pp.size(),
               "; build rank r's engine for pipeline_stage(config, r, ", pp.size(), ")");
    const int groups = options.groups == 0 ? pp.size() : options.groups;
    LOOM_CHECK(groups >= 1, "generate_pipelined: groups = ", options.groups,
               " is not valid; give at least 1 group in flight (0: one per stage, ", pp.size(), ")");
    if (pp.size() == 1) return generate(engine, requests);
    KvCache& cache = engine.cache();
    LOOM_CHECK(!requests.empty(), "generate_pipelined: no requests");
    for (std::size_t i = 0; i < requests.size(); ++i) {  // every rank checks every request before any runs
        check_request(requests[i], i, cache.capacity());
        const std::int64_t blocks = cache.blocks_for(positions_needed(requests[i]));
        LOOM_CHECK(blocks <= cache.blocks(), "generate_pipelined: request ", i, " needs ", blocks, " blocks of ",
                   cache.block_size(), " positions but the cache has ", cache.blocks(), "; build it with more blocks");
    }
    for (std::int64_t s = 0; s < cache.slots(); ++s)
        LOOM_CHECK(cache.length(s) == 0, "generate_pipelined: slot ", s, " of the cache holds ", cache.length(s),
                   " positions; release it first");
    struct ReleaseAll {  // however the run ends
        KvCache& cache;
        ~ReleaseAll() {
            for (std::int64_t s = 0; s < cache.slots(); ++s) cache.release(s);
        }
    } release_all{cache};
    std::vector<Completion> done;
    if (pp.rank() == 0) done = detail::PipelineController(engine, pp, requests, groups, options.trace).run();
    else detail::run_later_stage(engine, pp, options.trace);
    return detail::broadcast_completions(pp, std::move(done), requests.size());
}

// The one-call form: `stage_model` is this rank's (make_stage_model, bound,
// load_stage_values), with a cache of its own shaped as generate()'s
// (cache_shape_for: max_batch slots, 0 for one per request).
[[nodiscard]] inline std::vector<Completion> generate_pipelined(gpt::Model& stage_model, const gpt::Config& config,
                                                                comm::AnyComm& pp, std::span<const Request> requests,
                                                                std::int64_t max_batch = 0,
                                                                const PipelineOptions& options = {}) {
    const PipelineStage where = pipeline_stage(config, pp.rank(), pp.size());
    const CacheShape shape = cache_shape_for(config, requests, max_batch);
    KvCache cache = pipeline_cache(config, where, shape.slots, shape.capacity);
    CachedGpt engine(stage_model, config, cache, where);
    return generate_pipelined(engine, pp, requests, options);
}

}  // namespace loom::infer
