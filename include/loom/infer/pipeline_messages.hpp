// The messages between the stages of infer/pipeline_parallel_gpt.hpp's
// non-blocking pipeline, and what the later stages do with them. Stage 0
// (PipelinedBatcher, infer/pipelined_batcher.hpp) sends each group of
// requests on as a header, the small meta message EnergonAI sends ahead of
// each activation (the slots to release, and per sequence its slot, token
// count, request and draw index, its Sampling, and its tokens), and the
// hidden rows. Each later stage receives, runs its blocks and passes on; the
// last samples each sequence's token (the Sampling and seed the meta carries,
// draw k for its k-th token, as Batcher does) and sends the tokens back to
// stage 0. The later stages need no request list, so stage 0 may admit
// requests while the pipeline runs. Every stage processes messages in the
// order they came (one link each way, first in first out), so a slot's
// release always reaches a stage before the slot's next use. Sends are
// asynchronous, their buffers kept until done, so no transport's rendezvous
// can deadlock stage 0's send against the last stage's send of tokens (MPI
// may hold a large send until it is received).
#pragma once

#include <bit>
#include <chrono>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/error.hpp"
#include "loom/exec/trace.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/sampler.hpp"
#include "loom/infer/stage_engine.hpp"

namespace loom::infer {

struct PipelineOptions {
    // Groups of requests in flight (0: one more than the stages). Why one
    // more: with exactly one per stage a round lasts twice the longer of two
    // groups' steps, so any difference between them (a group admitting a
    // prompt while the other decodes) idles every stage; a spare group gives
    // each stage work while a longer step finishes downstream (measured:
    // docs/inference.md, "A spare group in flight").
    int groups = 0;
    exec::Trace* trace = nullptr;   // this rank's compute and waits, when given (exec/trace.hpp)
    // Most prompt tokens one group's step admits (0: no limit); a prompt
    // longer than this is admitted alone. Why: a group that admits all its
    // requests at once (the whole first batch, or every slot that a wave of
    // requests finishing together freed) runs one long prefill step on each
    // stage in turn, and every other stage idles through it: the pipeline's
    // fill bubble at each wave. Admitting a budget of prompt tokens per step
    // spreads the prefill over steps that the stages overlap (Sarathi-Serve's
    // token budget, at the granularity of whole prompts).
    std::int64_t prefill_tokens = 0;
};

// The groups in flight `options` asks for on a pipeline of `stages`.
[[nodiscard]] constexpr int groups_in_flight(const PipelineOptions& options, int stages) noexcept {
    return options.groups == 0 ? stages + 1 : options.groups;
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

// Stages 1..pp-1: receive a group, run its blocks, pass it on (or, on the
// last stage, sample and send the tokens back to stage 0), until stop.
inline void run_later_stage(StageEngine& engine, comm::AnyComm& pp, exec::Trace* trace) {
    const int me = pp.rank(), previous = me - 1;
    const bool last = me == pp.size() - 1;
    const std::string name = "stage " + std::to_string(me) + " group ";
    const auto V = static_cast<std::size_t>(engine.vocab());
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
        hidden.resize(count * static_cast<std::size_t>(engine.hidden_width()));
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

}  // namespace detail

}  // namespace loom::infer
