// Continuous batching on a pipeline, one step at a time: Batcher's interface
// (submit, cancel, idle, step) for stage 0 of infer/pipeline_parallel_gpt.hpp's
// non-blocking pipeline, so that requests may arrive while the pipeline runs
// (a server's); generate_pipelined runs its fixed list through one. Stages 1..pp-1
// call serve_pipeline_stage and return when stage 0's PipelinedBatcher is
// closed (or destroyed).
//
// The running requests are split into groups (pp + 1 by default) that follow one
// another through the stages. step() sends on every
// group that has work and is not in flight (admitting waiting requests into
// it first), then waits for the oldest group in flight, reports its tokens,
// and sends it on again: so a step reports one group's requests, not all of
// them, and while it waits the other groups are in later stages. Everything
// the later stages need travels in the meta message ahead of each group's
// rows (slots, token counts, draw indices, each request's Sampling), so they
// need no request list and no agreement beyond the one link each way.
//
// A cancelled request that is in flight leaves when its group's tokens come
// back (they are dropped), so no stage ever holds a slot stage 0 has reused.
// While idle the later stages wait in a receive; keep_alive() sends them a
// message that restarts that wait, for callers (a server) idle longer than the
// communicator's timeout.
//
//   loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
//       loom::comm::AnyComm pp = loom::comm::AnyComm::view(comm);
//       ... stage model, KvCache cache = pipeline_cache(...), CachedGpt engine(stage, config, cache, where);
//       if (pp.rank() != 0) return loom::infer::serve_pipeline_stage(engine, pp);
//       loom::infer::PipelinedBatcher batcher(engine, pp);
//       auto id = batcher.submit(request);
//       while (!batcher.idle()) for (const auto& e : batcher.step()) ...;
//   });   // the batcher's destructor tells the stages to return
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/any_comm.hpp"
#include "loom/core/error.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/pipeline_messages.hpp"
#include "loom/infer/stage_engine.hpp"

namespace loom::infer {

// Stages 1..pp-1 of a PipelinedBatcher's pipeline: run groups until stage 0 closes.
inline void serve_pipeline_stage(StageEngine& engine, comm::AnyComm& pp, exec::Trace* trace = nullptr) {
    LOOM_CHECK(engine.stage().stage == pp.rank() && engine.stage().stages == pp.size() && pp.rank() > 0,
               "serve_pipeline_stage: the engine is stage ", engine.stage().stage, " of ", engine.stage().stages,
               " on rank ", pp.rank(), " of ", pp.size(),
               "; call it on ranks 1.. with that rank's stage (rank 0 runs the PipelinedBatcher)");
    detail::run_later_stage(engine, pp, trace);
}

class PipelinedBatcher {
public:
    using Event = Batcher::Event;

    // `engine` is stage 0 (CachedGpt given pipeline_stage(config, 0, pp.size()), or a CachedModel given
    // model_stage(model, 0, pp.size())); its cache's slots must be free.
    PipelinedBatcher(StageEngine& engine, comm::AnyComm& pp, const PipelineOptions& options = {})
        : engine_(engine), cache_(engine.cache()), pp_(pp), trace_(options.trace),
          prefill_tokens_(options.prefill_tokens) {
        const PipelineStage& where = engine.stage();
        LOOM_CHECK(pp.rank() == 0 && where.stage == 0 && where.stages == pp.size() && pp.size() >= 2,
                   "PipelinedBatcher: the engine is stage ", where.stage, " of ", where.stages, " on rank ", pp.rank(),
                   " of a group of ", pp.size(),
                   "; build it on rank 0 with stage 0 of a pipeline of 2 or more (a whole model takes Batcher)");
        LOOM_CHECK(options.groups >= 0, "PipelinedBatcher: groups = ", options.groups,
                   " is not valid; give at least 1 group in flight (0: one more than the stages, ", pp.size() + 1,
                   ")");
        LOOM_CHECK(options.prefill_tokens >= 0, "PipelinedBatcher: prefill_tokens = ", options.prefill_tokens,
                   " is not valid; give the most prompt tokens a step admits, or 0 for no limit");
        for (std::int64_t s = 0; s < cache_.slots(); ++s)
            LOOM_CHECK(cache_.length(s) == 0, "PipelinedBatcher: slot ", s, " of the cache holds ", cache_.length(s),
                       " positions; release it first");
        for (std::int64_t s = cache_.slots() - 1; s >= 0; --s) free_slots_.push_back(s);
        const int groups = groups_in_flight(options, pp.size());
        groups_.resize(static_cast<std::size_t>(groups));
        // Each group takes at most its share of the slots, so the groups stay near one size.
        per_group_ = (cache_.slots() + groups - 1) / groups;
    }
    PipelinedBatcher(const PipelinedBatcher&) = delete;
    PipelinedBatcher& operator=(const PipelinedBatcher&) = delete;
    ~PipelinedBatcher() {
        try {
            close();
        } catch (...) {  // a failed group: the communicator has told every rank already
        }
        for (std::int64_t s = 0; s < cache_.slots(); ++s) cache_.release(s);
    }

    // Queues a request; ids 0, 1, 2, ... in submission order. A request the
    // cache can never run is refused here (as Batcher::submit).
    std::uint64_t submit(Request request) {
        LOOM_CHECK(!closed_, "PipelinedBatcher: submit after close()");
        const std::uint64_t id = next_id_;
        const std::string who = "PipelinedBatcher: request " + std::to_string(id);
        check_request(request, who, cache_.capacity());
        const std::int64_t blocks = cache_.blocks_for(positions_needed(request));
        LOOM_CHECK(blocks <= cache_.blocks(), who, " needs ", blocks, " blocks of ", cache_.block_size(),
                   " positions but the cache has ", cache_.blocks(), "; build it with more blocks");
        ++next_id_;
        waiting_tokens_ += static_cast<std::int64_t>(request.prompt.size());
        waiting_.push_back({id, std::move(request), blocks, -1, {}, true, false});
        return id;
    }

    // A waiting request leaves at once; a running one stops reporting and
    // leaves when its group's tokens come back. False if `id` is neither.
    bool cancel(std::uint64_t id) {
        const auto waiting = std::find_if(waiting_.begin(), waiting_.end(), [id](const Entry& e) { return e.id == id; });
        if (waiting != waiting_.end()) {
            waiting_tokens_ -= static_cast<std::int64_t>(waiting->request.prompt.size());
            waiting_.erase(waiting);
            return true;
        }
        for (Group& group : groups_)
            for (Entry& e : group.running)
                if (e.id == id && !e.cancelled) return e.cancelled = true;
        return false;
    }

    // Nothing waiting and nothing in the pipeline (a cancelled request still
    // in flight counts: its tokens are yet to come back).
    [[nodiscard]] bool idle() const noexcept {
        return waiting_.empty() &&
               std::all_of(groups_.begin(), groups_.end(), [](const Group& g) { return g.running.empty(); });
    }

    // Sends on every group with work that is not in flight, then reports the
    // oldest group in flight: one token per request of it that is not
    // cancelled; finished requests leave. Valid until the next call; empty
    // when idle.
    std::span<const Event> step() {
        LOOM_CHECK(!closed_, "PipelinedBatcher: step after close()");
        events_.clear();
        for (std::size_t g = 0; g < groups_.size(); ++g)
            if (!groups_[g].in_flight) launch(g);
        if (in_flight_.empty()) return {};
        const std::size_t g = in_flight_.front();
        in_flight_.pop_front();
        finish_step(g);
        launch(g);
        for (std::size_t h = 0; h < groups_.size(); ++h)  // slots g freed may start an idle group
            if (!groups_[h].in_flight) launch(h);
        return events_;
    }

    // Restarts the later stages' wait while idle (see the top of this file).
    void keep_alive() {
        LOOM_CHECK(!closed_, "PipelinedBatcher: keep_alive after close()");
        outbox_.send(pp_, std::vector<std::int32_t>{detail::pipeline_keep_alive, 0, 0, -1}, 1,
                     detail::pipeline_header_tag);
    }

    // Lets every group in flight come back (its tokens dropped), then tells
    // the later stages to return; the destructor calls it.
    void close() {
        if (closed_) return;
        closed_ = true;
        while (!in_flight_.empty()) {
            const std::size_t g = in_flight_.front();
            in_flight_.pop_front();
            for (Entry& e : groups_[g].running) e.cancelled = true;
            finish_step(g);
        }
        outbox_.send(pp_, std::vector<std::int32_t>{detail::pipeline_stop, 0, 0, -1}, 1, detail::pipeline_header_tag);
        outbox_.drain();
    }

private:
    struct Entry {
        std::uint64_t id;
        Request request;
        std::int64_t blocks;               // its whole need, held back for it while it runs
        std::int64_t slot;                 // -1 while waiting
        std::vector<std::int32_t> tokens;  // the new ones so far
        bool fresh;                        // its prompt not yet run
        bool cancelled;                    // leaves when its group comes back
    };
    struct Group {
        std::vector<Entry> running;
        bool in_flight = false;
    };

    // Admits waiting requests into group g, runs its step on this stage and
    // sends it on.
    void launch(std::size_t g) {
        Group& group = groups_[g];
        const std::int64_t budget = step_budget();
        std::int64_t admitted_tokens = 0;
        while (!waiting_.empty() && !free_slots_.empty() &&
               static_cast<std::int64_t>(group.running.size()) < per_group_ &&
               promised_ + waiting_.front().blocks <= cache_.blocks() &&  // no request runs out of blocks halfway
               within(budget, admitted_tokens, waiting_.front())) {
            admitted_tokens += static_cast<std::int64_t>(waiting_.front().request.prompt.size());
            waiting_tokens_ -= static_cast<std::int64_t>(waiting_.front().request.prompt.size());
            Entry& e = group.running.emplace_back(std::move(waiting_.front()));
            waiting_.pop_front();
            promised_ += e.blocks;
            e.slot = free_slots_.back();
            free_slots_.pop_back();
        }
        if (group.running.empty()) return;
        segments_.clear();
        std::vector<std::int32_t> meta = releases_;
        releases_.clear();
        std::vector<std::int32_t> tokens;
        for (const Entry& e : group.running) {
            const std::span<const std::int32_t> in =
                e.fresh ? std::span<const std::int32_t>(e.request.prompt) : std::span(&e.tokens.back(), 1);
            segments_.push_back({e.slot, in});
            // The request field is only a label downstream; the id's low bits serve.
            detail::put_sequence_fields(meta, e.slot, in.size(), static_cast<std::size_t>(e.id & 0x7fffffff),
                                        e.tokens.size(), e.request.sampling);
            tokens.insert(tokens.end(), in.begin(), in.end());
        }
        const std::vector<std::int32_t> header{
            static_cast<std::int32_t>(group.running.size()),
            static_cast<std::int32_t>(meta.size() - detail::pipeline_fields_per_sequence * group.running.size()),
            static_cast<std::int32_t>(tokens.size()), static_cast<std::int32_t>(g)};
        meta.insert(meta.end(), tokens.begin(), tokens.end());
        std::span<const float> hidden;
        detail::traced(trace_, "stage 0 group " + std::to_string(g), "forward", exec::compute_lane,
                       static_cast<int>(g), [&] { hidden = engine_.forward_stage(segments_, {}); });
        for (Entry& e : group.running) e.fresh = false;
        outbox_.send(pp_, header, 1, detail::pipeline_header_tag);
        outbox_.send(pp_, std::move(meta), 1, detail::pipeline_meta_tag);
        outbox_.send(pp_, hidden, 1, detail::pipeline_hidden_tag);
        group.in_flight = true;
        in_flight_.push_back(g);
    }

    // This step's prompt-token budget (0: no limit): prefill_tokens, or an
    // even share of the waiting prompts when they would not fill every
    // group's budget, so that the groups' last prefill steps of a wave are
    // alike: a group left with a long one would keep the other stages
    // waiting for it while the rest decode.
    [[nodiscard]] std::int64_t step_budget() const noexcept {
        if (prefill_tokens_ == 0) return 0;
        const auto groups = static_cast<std::int64_t>(groups_.size());
        return std::clamp<std::int64_t>((waiting_tokens_ + groups - 1) / groups, 1, prefill_tokens_);
    }

    // Whether `next` fits in `budget` after `admitted` tokens (the first
    // prompt of a step always does).
    [[nodiscard]] static bool within(std::int64_t budget, std::int64_t admitted, const Entry& next) noexcept {
        return budget == 0 || admitted == 0 || admitted + static_cast<std::int64_t>(next.request.prompt.size()) <= budget;
    }

    // Group g's tokens from the last stage: each request takes its token, and
    // those that finished or were cancelled leave (their slots released
    // downstream ahead of the slots' next use).
    void finish_step(std::size_t g) {
        Group& group = groups_[g];
        detail::traced(trace_, "tokens of group " + std::to_string(g), "wait", exec::communication_lane,
                       static_cast<int>(g), [&] {
                           detail::pipeline_recv(pp_, tokens_, group.running.size(), pp_.size() - 1,
                                                 detail::pipeline_tokens_tag);
                       });
        group.in_flight = false;
        still_.clear();
        for (std::size_t j = 0; j < group.running.size(); ++j) {
            Entry& e = group.running[j];
            std::optional<Finish> finish;
            if (!e.cancelled) {
                const Request& r = e.request;
                e.tokens.push_back(tokens_[j]);
                if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), tokens_[j]) != r.stop_tokens.end())
                    finish = Finish::stop;
                else if (static_cast<std::int64_t>(e.tokens.size()) >= r.max_new_tokens)
                    finish = Finish::length;
                events_.push_back({e.id, tokens_[j], finish});
            }
            if (!finish && !e.cancelled) {
                still_.push_back(std::move(e));
                continue;
            }
            cache_.release(e.slot);
            promised_ -= e.blocks;
            free_slots_.push_back(e.slot);
            releases_.push_back(static_cast<std::int32_t>(e.slot));  // travels ahead of the slot's next use
        }
        group.running.swap(still_);
    }

    StageEngine& engine_;
    KvCache& cache_;
    comm::AnyComm& pp_;
    exec::Trace* trace_;
    std::vector<Group> groups_;
    std::deque<Entry> waiting_;
    std::deque<std::size_t> in_flight_;     // groups sent on, in the order their tokens come back
    std::vector<std::int64_t> free_slots_;  // popped from the back: slot 0 first
    std::int64_t prefill_tokens_ = 0, waiting_tokens_ = 0;  // the budget; the waiting prompts' tokens
    std::int64_t promised_ = 0, per_group_ = 1;
    std::uint64_t next_id_ = 0;
    bool closed_ = false;
    std::vector<std::int32_t> releases_, tokens_;
    std::vector<Entry> still_;
    std::vector<Segment> segments_;
    std::vector<Event> events_;
    detail::PipelineOutbox outbox_;
};

}  // namespace loom::infer
