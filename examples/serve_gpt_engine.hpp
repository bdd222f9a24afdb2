// serve_gpt's engine thread: the one thread that owns the model, the KV
// cache and loom::infer::Batcher. HTTP connections (other threads) hand it
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
#include <string>
#include <thread>
#include <utility>
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
    explicit Engine(loom::infer::CachedGpt& model) : batcher_(model), thread_([this] { run(); }) {}
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

    // What the engine has done, for the summary line: forwards run, tokens
    // generated, and the most requests one forward carried.
    struct Stats {
        std::int64_t steps = 0, tokens = 0;
        std::size_t widest = 0;
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
            wake_.wait(lock, [&] { return quit_ || !incoming_.empty() || !cancels_.empty() || !batcher_.idle(); });
            if (quit_) return;
            std::vector<std::shared_ptr<Job>> incoming(incoming_.begin(), incoming_.end()), cancels;
            incoming_.clear();
            cancels.swap(cancels_);
            lock.unlock();
            for (std::shared_ptr<Job>& job : incoming) start(std::move(job));
            for (const std::shared_ptr<Job>& job : cancels) drop(job.get());
            try {
                if (!batcher_.idle()) {
                    const auto events = batcher_.step();
                    for (const loom::infer::Batcher::Event& e : events) advance(e);
                    const std::lock_guard stats_lock(mutex_);
                    stats_.steps += 1;
                    stats_.tokens += static_cast<std::int64_t>(events.size());
                    stats_.widest = std::max(stats_.widest, events.size());
                }
            } catch (const std::exception& e) {  // not expected: requests are checked before they come here
                fail_all(e.what());
            }
            lock.lock();
        }
    }

    void start(std::shared_ptr<Job> job) {
        std::vector<std::uint64_t> ids;
        try {
            for (std::size_t c = 0; c < job->choices.size(); ++c) ids.push_back(batcher_.submit(job->choices[c]));
        } catch (const std::exception& e) {
            for (std::uint64_t id : ids) (void)batcher_.cancel(id);
            job->deliver(failure(e.what()));
            return;
        }
        for (std::size_t c = 0; c < ids.size(); ++c) running_[ids[c]] = Running{job, c, {}, 0};
    }

    void drop(const Job* job) {
        for (auto it = running_.begin(); it != running_.end();) {
            if (it->second.job.get() == job) {
                (void)batcher_.cancel(it->first);
                it = running_.erase(it);
            } else {
                ++it;
            }
        }
    }

    void fail_all(const std::string& why) {
        for (auto& [id, r] : running_) {
            (void)batcher_.cancel(id);
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

    void advance(const loom::infer::Batcher::Event& e) {
        const auto it = running_.find(e.id);
        if (it == running_.end()) return;
        Running& r = it->second;
        r.tokens.push_back(e.token);
        std::optional<loom::infer::Finish> finish = e.finish;
        std::size_t end = r.tokens.size();
        if (const std::size_t stop = ends_with_stop(r.tokens, *r.job)) {
            finish = loom::infer::Finish::stop;
            end -= stop;
            if (!e.finish) (void)batcher_.cancel(e.id);
        } else if (!finish) {
            end -= held_back(r.tokens, *r.job);
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

    loom::infer::Batcher batcher_;  // the engine thread's alone, as is running_
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
