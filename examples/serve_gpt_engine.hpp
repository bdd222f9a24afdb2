// serve_gpt's engine thread: the one thread that owns the model, the KV
// cache and loom::infer::Batcher (or, with a draft model,
// loom::infer::SpeculativeBatcher: a step is then a speculative round and
// may give a request several tokens). HTTP connections (other threads) hand it
// jobs and cancellations through a queue under a mutex; between two packed
// forwards it takes them, so a request that arrives while others run joins
// the continuous batch at the next step. Each job's pieces of text go back
// through the job's own `deliver` (called on the engine thread; the HTTP
// side posts them to its own thread).
//
// Stop sequences are matched here, on the tokens, so that a request that
// hits one leaves the batch at once; the text is held back while it ends in
// the beginning of a stop sequence, so a streamed reply never shows part of
// one.
#pragma once

#include <loom/infer/batcher.hpp>
#include <loom/infer/cached_gpt.hpp>
#include <loom/infer/speculative_batcher.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

namespace serve_gpt {

// What a job hears back: new text of one choice, and its end.
struct Piece {
    std::size_t choice = 0;
    std::vector<std::int32_t> text;              // the choice's next tokens to show
    std::optional<loom::infer::Finish> finish;   // set on its last piece
    std::int64_t generated = 0;                  // tokens generated so far (stop sequences included)
    std::string error;                           // the engine failed this job (nothing else is set)
};

inline Piece failure(std::string why) {
    Piece piece;
    piece.error = std::move(why);
    return piece;
}

struct Job {
    std::vector<loom::infer::Request> choices;   // one request per choice
    std::vector<std::vector<std::int32_t>> stops;
    std::function<void(Piece)> deliver;          // called on the engine thread
};

class Engine {
public:
    explicit Engine(loom::infer::CachedGpt& model)
        : batcher_(std::in_place_type<loom::infer::Batcher>, model), thread_([this] { run(); }) {}
    // Speculative decoding: `draft` proposes `gamma` tokens per target pass.
    Engine(loom::infer::CachedGpt& target, loom::infer::CachedGpt& draft, std::int64_t gamma)
        : batcher_(std::in_place_type<loom::infer::SpeculativeBatcher>, target, draft, gamma),
          thread_([this] { run(); }) {}
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;
    ~Engine() { stop(); }

    void submit(std::shared_ptr<Job> job) {
        {
            const std::lock_guard lock(mutex_);
            incoming_.push_back(std::move(job));
        }
        wake_.notify_one();
    }

    // The job's choices leave the batch (or never join it) before the next
    // step; pieces delivered before that may still arrive.
    void cancel(std::shared_ptr<Job> job) {
        {
            const std::lock_guard lock(mutex_);
            cancels_.push_back(std::move(job));
        }
        wake_.notify_one();
    }

    // What the engine has done, for the summary line: steps run (forwards, or
    // speculative rounds), tokens generated, the most requests one step
    // carried, and with a draft what it proposed and the target accepted.
    struct Stats {
        std::int64_t steps = 0, tokens = 0;
        std::size_t widest = 0;
        std::optional<loom::infer::SpeculativeStats> speculative;
    };
    [[nodiscard]] Stats stats() const {
        const std::lock_guard lock(mutex_);
        return stats_;
    }

    // Ends the thread; jobs still running are dropped (the server stops only
    // once its connections have their answers).
    void stop() {
        {
            const std::lock_guard lock(mutex_);
            quit_ = true;
        }
        wake_.notify_one();
        if (thread_.joinable()) thread_.join();
    }

private:
    struct Running {
        std::shared_ptr<Job> job;
        std::size_t choice = 0;
        std::vector<std::int32_t> tokens;  // generated so far
        std::size_t shown = 0;             // of which delivered
    };

    void run() {
        std::unique_lock lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] { return quit_ || !incoming_.empty() || !cancels_.empty() || !idle(); });
            if (quit_) return;
            std::vector<std::shared_ptr<Job>> incoming(incoming_.begin(), incoming_.end()), cancels;
            incoming_.clear();
            cancels.swap(cancels_);
            lock.unlock();
            for (std::shared_ptr<Job>& job : incoming) start(std::move(job));
            for (const std::shared_ptr<Job>& job : cancels) drop(job.get());
            try {
                if (!idle()) std::visit([this](auto& batcher) { step(batcher); }, batcher_);
            } catch (const std::exception& e) {  // not expected: requests are checked before they come here
                fail_all(e.what());
            }
            lock.lock();
        }
    }

    [[nodiscard]] bool idle() const {
        return std::visit([](const auto& batcher) { return batcher.idle(); }, batcher_);
    }
    std::uint64_t submit(const loom::infer::Request& request) {
        return std::visit([&](auto& batcher) { return batcher.submit(request); }, batcher_);
    }
    bool cancel(std::uint64_t id) {
        return std::visit([id](auto& batcher) { return batcher.cancel(id); }, batcher_);
    }

    void step(loom::infer::Batcher& batcher) {
        const auto events = batcher.step();
        for (const loom::infer::Batcher::Event& e : events) advance(e.id, std::span(&e.token, 1), e.finish);
        record(events.size(), static_cast<std::int64_t>(events.size()), std::nullopt);
    }

    void step(loom::infer::SpeculativeBatcher& batcher) {
        const auto events = batcher.step();
        std::int64_t tokens = 0;
        for (const loom::infer::SpeculativeBatcher::Event& e : events) {
            tokens += static_cast<std::int64_t>(e.tokens.size());
            advance(e.id, e.tokens, e.finish);
        }
        record(events.size(), tokens, batcher.stats());
    }

    void record(std::size_t requests, std::int64_t tokens, std::optional<loom::infer::SpeculativeStats> speculative) {
        const std::lock_guard lock(mutex_);
        stats_.steps += 1;
        stats_.tokens += tokens;
        stats_.widest = std::max(stats_.widest, requests);
        stats_.speculative = speculative;
    }

    void start(std::shared_ptr<Job> job) {
        std::vector<std::uint64_t> ids;
        try {
            for (std::size_t c = 0; c < job->choices.size(); ++c) ids.push_back(submit(job->choices[c]));
        } catch (const std::exception& e) {
            for (std::uint64_t id : ids) (void)cancel(id);
            job->deliver(failure(e.what()));
            return;
        }
        for (std::size_t c = 0; c < ids.size(); ++c) running_[ids[c]] = Running{job, c, {}, 0};
    }

    void drop(const Job* job) {
        for (auto it = running_.begin(); it != running_.end();) {
            if (it->second.job.get() == job) {
                (void)cancel(it->first);
                it = running_.erase(it);
            } else {
                ++it;
            }
        }
    }

    void fail_all(const std::string& why) {
        for (auto& [id, r] : running_) {
            (void)cancel(id);
            r.job->deliver(failure(why));
        }
        running_.clear();
    }

    // Length of the longest stop sequence that `tokens` ends with (0: none):
    // the text ends where the earliest-starting one begins.
    static std::size_t ends_with_stop(const std::vector<std::int32_t>& tokens, const Job& job) {
        std::size_t longest = 0;
        for (const auto& s : job.stops)
            if (s.size() > longest && s.size() <= tokens.size() &&
                std::equal(s.begin(), s.end(), tokens.end() - static_cast<std::ptrdiff_t>(s.size())))
                longest = s.size();
        return longest;
    }

    // Tokens at the end that begin some stop sequence: not shown yet.
    static std::size_t held_back(const std::vector<std::int32_t>& tokens, const Job& job) {
        std::size_t held = 0;
        for (const auto& s : job.stops)
            for (std::size_t k = std::min(s.size() - 1, tokens.size()); k > held; --k)
                if (std::equal(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k),
                               tokens.end() - static_cast<std::ptrdiff_t>(k))) {
                    held = k;
                    break;
                }
        return held;
    }

    // A step's tokens for request `id` (one, or a speculative round's
    // several); `finished` if the batcher says the last of them ends it.
    void advance(std::uint64_t id, std::span<const std::int32_t> tokens, std::optional<loom::infer::Finish> finished) {
        const auto it = running_.find(id);
        if (it == running_.end()) return;
        Running& r = it->second;
        std::optional<loom::infer::Finish> finish;
        std::size_t end = 0;
        for (const std::int32_t token : tokens) {  // a stop sequence may end before the round's last token
            r.tokens.push_back(token);
            if (const std::size_t stop = ends_with_stop(r.tokens, *r.job)) {
                finish = loom::infer::Finish::stop;
                end = r.tokens.size() - stop;
                if (!finished) (void)cancel(id);  // the tokens after it are dropped
                break;
            }
        }
        if (!finish) {
            finish = finished;
            end = r.tokens.size();
            if (!finish) end -= held_back(r.tokens, *r.job);
        }
        end = std::max(end, r.shown);
        Piece piece{.choice = r.choice, .text = {r.tokens.begin() + static_cast<std::ptrdiff_t>(r.shown),
                                                 r.tokens.begin() + static_cast<std::ptrdiff_t>(end)},
                    .finish = finish, .generated = static_cast<std::int64_t>(r.tokens.size()), .error = {}};
        r.shown = end;
        const std::shared_ptr<Job> job = r.job;
        if (finish) running_.erase(it);
        if (!piece.text.empty() || piece.finish) job->deliver(std::move(piece));
    }

    // The engine thread's alone, as is running_.
    std::variant<loom::infer::Batcher, loom::infer::SpeculativeBatcher> batcher_;
    std::map<std::uint64_t, Running> running_;
    mutable std::mutex mutex_;      // guards the four below
    std::condition_variable wake_;
    std::deque<std::shared_ptr<Job>> incoming_;
    std::vector<std::shared_ptr<Job>> cancels_;
    bool quit_ = false;
    Stats stats_;
    std::thread thread_;            // last: it starts once the rest is built
};

}  // namespace serve_gpt
