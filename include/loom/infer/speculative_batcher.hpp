// Speculative decoding continuously batched, one round at a time: Batcher's
// interface (infer/batcher.hpp: submit, cancel, step) where one step is one
// speculative round for every running request. The draft proposes up to
// gamma tokens for each, one packed draft forward per proposal, and the
// target verifies every running request's [last token, drafts] in ONE packed
// forward (infer/speculative_acceptance.hpp's rule), so a step yields 1 to
// gamma + 1 tokens per request. A request that finishes (or is cancelled)
// frees its slot in both caches at once, and the oldest waiting request takes
// it at the next step. speculative_generate (infer/speculative.hpp) is a loop
// over this; serve_gpt --draft feeds it from HTTP connections.
//
// Each request's draws, acceptance and roll-back are its own: its tokens
// depend on its seed, not on what it runs beside or when it starts (to the
// float rounding of a packed forward). A request occupies the same slot in
// both caches, and starts only when the blocks it needs at its longest in
// each cache are not promised to the running ones, so none runs out of
// blocks halfway (a round never needs more positions than generate() would:
// near the length limit it proposes fewer drafts).
//
// With a CapeConfig the round is CaPE's (infer/cape.hpp): each draft step
// also proposes alternatives, and the target checks the comb of candidates
// in its one pass, the cache compacted to the accepted path. Greedy requests
// only. A request's comb fits in the blocks promised to it: near its end it
// carries fewer alternatives (never changing its tokens).
//
// The target is any Engine: loom's GPT (CachedGpt), a user's model
// (CachedModel) or Kraken (CachedKraken). The draft is
// any DraftEngine (infer/draft_engine.hpp): a plain engine (wrapped as
// PlainDraft) or GliDe's CachedGlide, which reads a GPT target's cache of
// the same slot (at the draft steps it holds the sequence but its last
// token: up to the last verified token).
//
// Single-threaded by design, as Batcher.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/infer/batcher.hpp"
#include "loom/infer/cape.hpp"
#include "loom/infer/draft_engine.hpp"
#include "loom/infer/engine.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/infer/request_queue.hpp"
#include "loom/infer/speculative_acceptance.hpp"

namespace loom::infer {

class SpeculativeBatcher {
public:
    // What one request did in one round.
    struct Event {
        std::uint64_t id = 0;                  // submit's id
        std::span<const std::int32_t> tokens;  // its new tokens, 1 to gamma + 1 (fewer if it finished)
        std::optional<Finish> finish;          // set when the last of them is its last
        std::int64_t drafted = 0;              // drafts the target checked for it this round (CaPE: every candidate)
        std::int64_t accepted = 0;             // of which it accepted
        std::int64_t alternatives = 0;         // CaPE: of the accepted, off the greedy chain (0 or 1)
    };

    // Runs on slots [0, max_batch) of both engines' caches (0: every slot
    // both have), which must be empty; they are released when the batcher is
    // destroyed. Its blocks are those free in each cache now: slots past
    // max_batch may hold some, and must not grow while it runs.
    // With `cape`, CaPE's rounds (greedy requests only).
    SpeculativeBatcher(Engine& target, Engine& draft, std::int64_t gamma, std::int64_t max_batch = 0,
                       std::optional<CapeConfig> cape = std::nullopt)
        : SpeculativeBatcher(target, std::make_unique<PlainDraft>(draft), gamma, max_batch, std::move(cape)) {}
    // Any draft engine (infer/draft_engine.hpp): GliDe's (infer/cached_glide.hpp)
    // must read this target's cache.
    SpeculativeBatcher(Engine& target, DraftEngine& draft, std::int64_t gamma, std::int64_t max_batch = 0,
                       std::optional<CapeConfig> cape = std::nullopt)
        : target_(target), draft_(draft), tcache_(target.cache()), dcache_(draft.cache()), gamma_(gamma),
          cape_(std::move(cape)) {
        start(max_batch);
    }
    SpeculativeBatcher(const SpeculativeBatcher&) = delete;
    SpeculativeBatcher& operator=(const SpeculativeBatcher&) = delete;
    ~SpeculativeBatcher() {
        for (std::int64_t s = 0; s < slots_; ++s) {
            tcache_.release(s);
            dcache_.release(s);
        }
    }

    // Queues a request (it starts at a round when a slot and its blocks in
    // both caches are free, after those submitted before it); returns its id,
    // 0, 1, 2, ... in submission order. One the caches can never run is refused here.
    std::uint64_t submit(Request request) {
        const std::uint64_t id = next_id_;
        const std::string who = "SpeculativeBatcher: request " + std::to_string(id);
        check_request(request, who, tcache_.capacity());
        LOOM_CHECK(!cape_ || request.sampling.greedy, who,
                   " is sampled but CaPE's tree acceptance is greedy only; set sampling.greedy or run without CaPE");
        const std::int64_t needed = positions_needed(request);
        LOOM_CHECK(needed <= dcache_.capacity(), who, " needs ", needed,
                   " cached positions but the draft's cache holds ", dcache_.capacity(),
                   " per sequence; build it (and the draft's Config::seq) at least that long");
        Entry e;
        e.id = id;
        e.request = std::move(request);
        e.tblocks = tcache_.blocks_for(needed);
        e.dblocks = dcache_.blocks_for(needed);
        for (const bool is_target : {true, false}) {
            const std::int64_t blocks = is_target ? e.tblocks : e.dblocks, budget = is_target ? tbudget_ : dbudget_;
            const KvCache& cache = is_target ? tcache_ : dcache_;
            LOOM_CHECK(blocks <= budget, who, " needs ", blocks, " blocks of ", cache.block_size(),
                       " positions in the ", is_target ? "target" : "draft", "'s cache but the batcher has ", budget,
                       " (those free when it was built); build the cache with more blocks");
        }
        ++next_id_;
        queue_.waiting.push_back(std::move(e));
        return id;
    }

    // Drops a waiting or running request (a running one frees its slot at
    // once); false if `id` is neither (finished, cancelled or never given).
    bool cancel(std::uint64_t id) {
        return queue_.cancel(id, [this](const Entry& e) { leave(e); });
    }

    [[nodiscard]] bool idle() const noexcept { return queue_.idle(); }
    [[nodiscard]] std::size_t running() const noexcept { return queue_.running.size(); }
    [[nodiscard]] std::size_t waiting() const noexcept { return queue_.waiting.size(); }
    [[nodiscard]] std::int64_t gamma() const noexcept { return gamma_; }
    [[nodiscard]] const std::optional<CapeConfig>& cape() const noexcept { return cape_; }
    // Every round's figures so far, summed over requests (a request's round is one target pass).
    [[nodiscard]] const SpeculativeStats& stats() const noexcept { return stats_; }

    // One round: the requests that start now join (their prompts but the last
    // token prefilled into the target's cache, packed in one forward), then
    // the draft's steps and the target's verification for every running
    // request, in that order of events (running first, then those that
    // started). Finished requests leave. Valid until the next call; empty when idle.
    std::span<const Event> step() {
        events_.clear();
        emitted_.clear();
        const std::size_t before_admission = queue_.running.size();
        while (!queue_.waiting.empty() && !free_slots_.empty() && tpromised_ + queue_.waiting.front().tblocks <= tbudget_ &&
               dpromised_ + queue_.waiting.front().dblocks <= dbudget_) {
            Entry& e = queue_.running.emplace_back(std::move(queue_.waiting.front()));
            queue_.waiting.pop_front();
            tpromised_ += e.tblocks;
            dpromised_ += e.dblocks;
            e.slot = free_slots_.back();
            free_slots_.pop_back();
            e.sequence = e.request.prompt;
        }
        if (queue_.running.empty()) return {};
        // Invariant at a round's start: the target's cache holds all of a
        // request's sequence but its last token (which the round feeds); the
        // draft's holds a prefix of it.
        segments_.clear();
        for (std::size_t j = before_admission; j < queue_.running.size(); ++j) {
            const std::span<const std::int32_t> prompt = queue_.running[j].sequence;
            if (prompt.size() > 1) segments_.push_back({queue_.running[j].slot, prompt.first(prompt.size() - 1)});
        }
        if (!segments_.empty()) (void)target_.forward(segments_);
        draft_round();
        verify_round();
        return events_;
    }

private:
    // Owns the wrapper when built from a plain engine as the draft.
    SpeculativeBatcher(Engine& target, std::unique_ptr<PlainDraft> plain, std::int64_t gamma,
                       std::int64_t max_batch, std::optional<CapeConfig> cape)
        : plain_(std::move(plain)), target_(target), draft_(*plain_), tcache_(target.cache()),
          dcache_(plain_->cache()), gamma_(gamma), cape_(std::move(cape)) {
        start(max_batch);
    }

    void start(std::int64_t max_batch) {
        LOOM_CHECK(gamma_ >= 1, "SpeculativeBatcher: gamma = ", gamma_, " draft tokens per pass; propose at least 1");
        if (cape_) cape_->validate();
        LOOM_CHECK(draft_.vocab() == target_.vocab(), "SpeculativeBatcher: the draft's vocabulary of ",
                   draft_.vocab(), " tokens is not the target's ", target_.vocab(),
                   "; the draft must share the target's tokens");
        LOOM_CHECK(&tcache_ != &dcache_,
                   "SpeculativeBatcher: the target and the draft share one KvCache; give each its own");
        const std::int64_t both = std::min(tcache_.slots(), dcache_.slots());
        LOOM_CHECK(max_batch >= 0 && max_batch <= both, "SpeculativeBatcher: max_batch = ", max_batch,
                   " but the target's cache has ", tcache_.slots(), " slots and the draft's ", dcache_.slots(),
                   "; give 0..", both, " (0: every slot both have)");
        slots_ = max_batch == 0 ? both : max_batch;
        for (KvCache* cache : {&tcache_, &dcache_})
            for (std::int64_t s = 0; s < slots_; ++s)
                LOOM_CHECK(cache->length(s) == 0, "SpeculativeBatcher: slot ", s, " of the ",
                           cache == &tcache_ ? "target" : "draft", "'s cache holds ", cache->length(s),
                           " positions; release it first");
        tbudget_ = tcache_.free_blocks();
        dbudget_ = dcache_.free_blocks();
        for (std::int64_t s = slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
        LOOM_CHECK(draft_.reads() == nullptr || draft_.reads() == &tcache_, "SpeculativeBatcher: the draft reads ",
                   "another target's KvCache; build its engine on the cache of the target it drafts for");
    }

    struct Entry {
        std::uint64_t id = 0;
        Request request;
        std::int64_t tblocks = 0, dblocks = 0;  // its whole need in each cache, held back for it while it runs
        std::int64_t slot = -1;                 // in both caches; -1 while waiting
        std::vector<std::int32_t> sequence;     // the prompt and every token so far
        std::int64_t generated = 0;             // new tokens so far
        // This round's:
        std::vector<std::int32_t> proposed;     // drafts
        std::vector<std::int32_t> fed;          // verification input: the last token, then the drafts
        std::vector<std::vector<double>> q;     // the draft's distribution at each proposal (sampled)
        std::int64_t g = 0;                     // drafts proposed
        std::int64_t before = 0;                // sequence length at the round's start
        // CaPE's: each step's alternatives, the candidates the comb may still take, the comb.
        std::vector<std::vector<std::int32_t>> alternatives;
        std::int64_t room = 0;
        CapeTree tree;
    };

    // Each request proposes g = min(gamma, tokens left - 1) drafts (a round
    // yields at most g + 1 tokens): it feeds what the draft's cache lacks,
    // then its own proposals, one packed forward per proposal.
    void draft_round() {
        const auto V = static_cast<std::size_t>(target_.vocab());
        std::int64_t most = 0;
        for (Entry& e : queue_.running) {
            e.g = std::min(gamma_, e.request.max_new_tokens - e.generated - 1);
            e.before = static_cast<std::int64_t>(e.sequence.size());
            e.proposed.clear();
            e.q.resize(static_cast<std::size_t>(e.g));
            e.alternatives.resize(static_cast<std::size_t>(e.g));
            // The comb's nodes sit at target positions before - 1 .. before - 1 + its size, within the
            // slot's promised blocks and capacity: what is left after the chain is the alternatives' room.
            const std::int64_t limit = std::min(tcache_.capacity(), e.tblocks * tcache_.block_size());
            e.room = limit - e.before - e.g;
            most = std::max(most, e.g);
        }
        for (std::int64_t i = 0; i < most; ++i) {
            segments_.clear();
            drafting_.clear();
            for (Entry& e : queue_.running) {
                if (e.g <= i) continue;
                const auto held = static_cast<std::size_t>(dcache_.length(e.slot));
                segments_.push_back(i == 0 ? Segment{e.slot, std::span(e.sequence).subspan(held)}
                                           : Segment{e.slot, std::span(&e.proposed.back(), 1)});
                drafting_.push_back(&e);
            }
            const std::span<const float> logits = draft_.forward(segments_);
            for (std::size_t j = 0; j < drafting_.size(); ++j) {
                Entry& e = *drafting_[j];
                const auto draw = static_cast<std::uint64_t>(e.generated + i);
                if (cape_) {
                    auto& alternatives = e.alternatives[static_cast<std::size_t>(i)];
                    e.proposed.push_back(cape_step(logits.subspan(j * V, V), *cape_, e.room, alternatives));
                    e.room -= static_cast<std::int64_t>(alternatives.size());
                    continue;
                }
                e.proposed.push_back(propose_draft(logits.subspan(j * V, V), e.request.sampling, draw,
                                                   e.q[static_cast<std::size_t>(i)]));
            }
        }
    }

    // The target's one pass over every request's [last token, drafts], logits
    // at every position; then each request's acceptance, roll-back and events.
    void verify_round() {
        const auto V = static_cast<std::size_t>(target_.vocab());
        segments_.clear();
        for (Entry& e : queue_.running) {
            if (cape_) {
                e.tree.build(e.sequence.back(), e.proposed, e.alternatives);
                segments_.push_back({e.slot, e.tree.tokens, e.tree.parents});
                continue;
            }
            e.fed.assign(1, e.sequence.back());
            e.fed.insert(e.fed.end(), e.proposed.begin(), e.proposed.end());
            segments_.push_back({e.slot, e.fed});
        }
        const std::span<const float> rows = target_.forward(segments_, Logits::every);
        std::size_t offset = 0;
        starts_.clear();
        still_.clear();
        for (Entry& e : queue_.running) {
            const auto count = static_cast<std::size_t>(cape_ ? e.tree.size() : e.g + 1);
            const std::span<const float> mine = rows.subspan(offset * V, count * V);
            offset += count;
            SpeculativeVerdict verdict;
            std::int64_t draft_kept = 0;  // of the accepted tokens, those the draft's cache holds (a prefix)
            if (cape_) {
                accept_tree_greedy(e.tree, mine, V, cape_verdict_);
                verdict = {static_cast<std::int64_t>(cape_verdict_.path.size()), cape_verdict_.own};
                draft_kept = cape_verdict_.chain_accepted;
                // The root's row stays where it is; the path's rows move up behind it.
                kept_.clear();
                for (const std::int64_t node : cape_verdict_.path) kept_.push_back(e.before - 1 + node);
                tcache_.keep(e.slot, e.before, kept_);
            } else {
                verdict = verify_drafts(e.proposed, e.q, mine, V, e.request.sampling,
                                        static_cast<std::uint64_t>(e.generated), p_, residual_);
                draft_kept = verdict.accepted;
                // Keep the accepted drafts' keys and values, drop the rest.
                tcache_.truncate(e.slot, e.before + verdict.accepted);
            }
            const auto drafted = static_cast<std::int64_t>(count) - 1;
            stats_.target_passes += 1;
            stats_.drafted += drafted;
            stats_.accepted += verdict.accepted;
            dcache_.truncate(e.slot, std::min(dcache_.length(e.slot), e.before + draft_kept));
            starts_.push_back(emitted_.size());
            stats_.alternatives += verdict.accepted - draft_kept;
            Event& event = events_.emplace_back(
                Event{e.id, {}, std::nullopt, drafted, verdict.accepted, verdict.accepted - draft_kept});
            for (std::int64_t i = 0; i <= verdict.accepted && !event.finish; ++i) {
                const std::int32_t token =
                    i == verdict.accepted ? verdict.own
                    : cape_ ? e.tree.tokens[static_cast<std::size_t>(cape_verdict_.path[static_cast<std::size_t>(i)])]
                            : e.proposed[static_cast<std::size_t>(i)];
                event.finish = emit(e, token);
            }
            if (event.finish) leave(e);
            else still_.push_back(std::move(e));
        }
        queue_.running.swap(still_);
        for (std::size_t j = 0; j < events_.size(); ++j) {
            const std::size_t end = j + 1 < events_.size() ? starts_[j + 1] : emitted_.size();
            events_[j].tokens = std::span(emitted_).subspan(starts_[j], end - starts_[j]);
        }
    }

    // Appends a token to the request and the round's events; its Finish if it is the last.
    std::optional<Finish> emit(Entry& e, std::int32_t token) {
        e.sequence.push_back(token);
        emitted_.push_back(token);
        ++e.generated;
        const auto& stops = e.request.stop_tokens;
        if (std::find(stops.begin(), stops.end(), token) != stops.end()) return Finish::stop;
        if (e.generated >= e.request.max_new_tokens) return Finish::length;
        return std::nullopt;
    }

    void leave(const Entry& e) {
        tcache_.release(e.slot);
        dcache_.release(e.slot);
        tpromised_ -= e.tblocks;
        dpromised_ -= e.dblocks;
        free_slots_.push_back(e.slot);
    }

    std::unique_ptr<PlainDraft> plain_;  // null unless built from a plain engine as the draft
    Engine& target_;
    DraftEngine& draft_;
    KvCache& tcache_;
    KvCache& dcache_;
    std::int64_t gamma_;
    std::optional<CapeConfig> cape_;
    std::int64_t slots_ = 0;
    std::int64_t tbudget_ = 0, dbudget_ = 0;      // blocks of each cache the batcher may use
    std::int64_t tpromised_ = 0, dpromised_ = 0;  // of those, held back for the running requests
    std::uint64_t next_id_ = 0;
    RequestQueue<Entry> queue_;
    std::vector<Entry> still_;  // step()'s: the running requests that go on
    std::vector<std::int64_t> free_slots_;  // popped from the back: slot 0 first
    std::vector<Segment> segments_;
    std::vector<Entry*> drafting_;
    std::vector<double> p_, residual_;
    CapeVerdict cape_verdict_;
    std::vector<std::int64_t> kept_;
    SpeculativeStats stats_;
    std::vector<Event> events_;
    std::vector<std::int32_t> emitted_;  // the round's tokens, every event's in turn
    std::vector<std::size_t> starts_;    // where each event's begin in emitted_
};

}  // namespace loom::infer
