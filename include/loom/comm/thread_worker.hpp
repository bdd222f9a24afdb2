// The progress thread behind a rank thread's async collectives: jobs run one at
// a time in issue order, so every rank's collectives meet in the same order.
// Started on the first async call; a rank that never goes async never pays.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "loom/comm/communicator.hpp"
#include <atomic>
#include <chrono>

namespace loom::comm {

class ThreadWorker {
    struct Job {
        std::function<void()> work;
        std::atomic<bool> done{false};
        Request::Timing timing;  // written before done is set
        std::exception_ptr error;
    };

    class Pending final : public Request::Pending {
    public:
        explicit Pending(std::shared_ptr<Job> job) : job_(std::move(job)) {}
        bool test() override {
            if (!job_->done.load(std::memory_order_acquire)) return false;
            if (job_->error) std::rethrow_exception(job_->error);
            return true;
        }
        void wait() override {
            // The job itself times out and fails the world when a peer never
            // arrives, so this wait needs no deadline of its own.
            while (!job_->done.load(std::memory_order_acquire)) {
                std::unique_lock lock(mutex_of_job());
                cv_of_job().wait_for(lock, std::chrono::milliseconds(1),
                                     [&] { return job_->done.load(std::memory_order_acquire); });
            }
            if (job_->error) std::rethrow_exception(job_->error);
        }
        [[nodiscard]] Request::Timing timing() const override {
            return job_->done.load(std::memory_order_acquire) ? job_->timing : Request::Timing{};
        }

    private:
        // Waiters on jobs are rare (one per rank); a shared cv keeps Job small.
        static std::mutex& mutex_of_job() {
            static std::mutex m;
            return m;
        }
        static std::condition_variable& cv_of_job() {
            static std::condition_variable cv;
            return cv;
        }
        friend class ThreadWorker;
        std::shared_ptr<Job> job_;
    };

public:
    ThreadWorker() : thread_([this] { loop(); }) {}
    ThreadWorker(const ThreadWorker&) = delete;
    ThreadWorker& operator=(const ThreadWorker&) = delete;
    ~ThreadWorker() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_one();
        thread_.join();
    }

    [[nodiscard]] Request submit(std::function<void()> work) {
        auto job = std::make_shared<Job>();
        job->work = std::move(work);
        {
            std::lock_guard lock(mutex_);
            queue_.push_back(job);
            ++outstanding_;
        }
        cv_.notify_one();
        return Request(std::make_unique<Pending>(std::move(job)));
    }

    [[nodiscard]] bool on_worker_thread() const noexcept { return std::this_thread::get_id() == thread_.get_id(); }

    // True while submitted jobs have not finished: a synchronous call must then
    // queue behind them to keep the issue order.
    [[nodiscard]] bool busy() const {
        std::lock_guard lock(mutex_);
        return outstanding_ != 0;
    }

private:
    void loop() {
        for (;;) {
            std::shared_ptr<Job> job;
            {
                std::unique_lock lock(mutex_);
                cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                if (queue_.empty()) return;
                job = std::move(queue_.front());
                queue_.pop_front();
            }
            job->timing.started = std::chrono::steady_clock::now();
            try {
                job->work();
            } catch (...) {
                job->error = std::current_exception();
            }
            job->timing.finished = std::chrono::steady_clock::now();
            job->timing.known = true;
            job->work = nullptr;  // release what the job captured, here and now
            {
                std::lock_guard lock(Pending::mutex_of_job());
                job->done.store(true, std::memory_order_release);
            }
            Pending::cv_of_job().notify_all();
            std::lock_guard lock(mutex_);
            --outstanding_;
        }
    }

    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    int outstanding_ = 0;
    bool stopping_ = false;
    std::thread thread_;  // last: starts after the members it uses exist
};

namespace detail {

// Runs a rank's synchronous call now, or, while async calls it issued
// earlier are still queued on its `worker` (null before the first async call),
// behind them on the worker, so the call keeps its place in the issue order.
template <class Call>
void in_issue_order(ThreadWorker* worker, Call&& call) {
    if (worker != nullptr && worker->busy() && !worker->on_worker_thread()) {
        worker->submit([&] { call(); }).wait();
        return;
    }
    call();
}

}  // namespace detail

}  // namespace loom::comm
