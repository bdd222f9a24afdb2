// Threads for one host GEMM: a small persistent pool that runs the parts of a
// product (column or row ranges of C, kernels/host/gemm_dispatch.hpp) side by
// side, for a rank that wants more than one core for its products rather than
// data parallelism. The thread count is a process-wide knob
// (set_gemm_threads), 1 by default: rank threads that each run their own
// products should keep it at 1, or at cores / rank threads
// (gemm_threads_for), so that rank threads x GEMM threads <= cores.
//
// The pool serves one product at a time; a product that finds it busy (two
// rank threads with GEMM threads > 1) runs its parts on its own thread, which
// gives the same result: the parts are disjoint ranges of C and each element's
// arithmetic does not depend on which thread computes it.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::kernels::host {

namespace gemm_detail {

inline std::atomic<int>& gemm_thread_setting() {
    static std::atomic<int> threads{1};
    return threads;
}

// Whether this thread is running a part of a pool job: a product or kernel
// called from inside one runs on this thread alone (the pool is serving the
// job that called it, and its caller holds the pool's busy lock, which a
// second try_lock by the same thread must not touch).
inline bool& inside_pool_part() {
    thread_local bool inside = false;
    return inside;
}

class GemmPool {
public:
    static GemmPool& instance() {
        static GemmPool pool;
        return pool;
    }

    GemmPool(const GemmPool&) = delete;
    GemmPool& operator=(const GemmPool&) = delete;

    ~GemmPool() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        for (std::thread& t : workers_) t.join();
    }

    // part(i) for i in [0, parts), on up to `parts` threads (the caller is
    // one of them); returns when all are done, rethrowing the first failure.
    void run(int parts, const std::function<void(int)>& part) {
        if (parts <= 1 || inside_pool_part()) {
            for (int i = 0; i < parts; ++i) part(i);
            return;
        }
        std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
        if (!busy.owns_lock()) {
            for (int i = 0; i < parts; ++i) part(i);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mutex_);
            while (static_cast<int>(workers_.size()) < parts - 1) workers_.emplace_back([this] { work(); });
            job_ = &part;
            parts_ = parts;
            finished_ = 0;
            failure_ = nullptr;
            ++generation_;
            next_.store((generation_ & 0xffffffffu) << 32);
        }
        wake_.notify_all();
        take_parts(generation_, &part, parts);
        std::unique_lock<std::mutex> lock(mutex_);
        done_.wait(lock, [&] { return finished_ == parts_; });
        job_ = nullptr;
        if (failure_) std::rethrow_exception(failure_);
    }

private:
    GemmPool() = default;

    // Claims parts of job `generation` until none are left, counting each one
    // finished. A claim names its job (the generation in the high half of
    // next_), so a worker still finishing one job never takes a part of the
    // next with the old job's function.
    void take_parts(std::uint64_t generation, const std::function<void(int)>* job, int parts) {
        for (;;) {
            std::uint64_t claim = next_.load();
            do {
                if ((claim >> 32) != (generation & 0xffffffffu) || static_cast<int>(claim & 0xffffffffu) >= parts)
                    return;
            } while (!next_.compare_exchange_weak(claim, claim + 1));
            std::exception_ptr failure;
            inside_pool_part() = true;
            try {
                (*job)(static_cast<int>(claim & 0xffffffffu));
            } catch (...) {
                failure = std::current_exception();
            }
            inside_pool_part() = false;
            std::lock_guard<std::mutex> lock(mutex_);
            if (failure && !failure_) failure_ = failure;
            if (++finished_ == parts_) done_.notify_all();
        }
    }

    void work() {
        std::uint64_t seen = 0;
        for (;;) {
            const std::function<void(int)>* job = nullptr;
            int parts = 0;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
                if (stopping_) return;
                seen = generation_;
                job = job_;
                parts = parts_;
            }
            if (job != nullptr) take_parts(seen, job, parts);
        }
    }

    std::mutex busy_;   // held by the product the pool is serving
    std::mutex mutex_;  // guards everything below
    std::condition_variable wake_, done_;
    std::vector<std::thread> workers_;
    const std::function<void(int)>* job_ = nullptr;
    int parts_ = 0;
    std::atomic<std::uint64_t> next_{0};  // generation << 32 | the next part to claim
    int finished_ = 0;
    std::exception_ptr failure_;
    std::uint64_t generation_ = 0;
    bool stopping_ = false;
};

}  // namespace gemm_detail

// Threads one host GEMM may use (loom's own GEMM; set_blas_threads sets the
// BLAS's and this together). At least 1.
inline void set_gemm_threads(int threads) {
    LOOM_CHECK(threads >= 1, "set_gemm_threads: threads = ", threads, "; pass at least 1");
    gemm_detail::gemm_thread_setting().store(threads);
}

[[nodiscard]] inline int gemm_threads() { return gemm_detail::gemm_thread_setting().load(); }

// body(part, begin, end): run_in_ranges with each range's part number, in
// [0, gemm_threads()), for a body that keeps scratch of its own per part
// (two parts never run at once with the same number).
template <class Body>
void run_in_parts(std::int64_t count, Body&& body, std::int64_t grain = 1) {
    const int parts = static_cast<int>(std::min<std::int64_t>(gemm_threads(), count / std::max<std::int64_t>(grain, 1)));
    if (parts <= 1) {
        if (count > 0) body(0, std::int64_t{0}, count);
        return;
    }
    gemm_detail::GemmPool::instance().run(parts, [&](int part) {
        body(part, count * part / parts, count * (part + 1) / parts);
    });
}

// body(begin, end) over [0, count) in up to gemm_threads() contiguous ranges
// of at least `grain` items, run side by side on the GEMM threads: for a
// kernel whose items (a head of attention, a row, a block of elements) are
// independent and each computed the same way wherever it runs, so the result
// does not depend on the thread count. `grain` keeps ranges worth a thread's
// wake-up. Called from inside a part, or while another rank thread's product
// holds the pool, it runs on the calling thread.
template <class Body>
void run_in_ranges(std::int64_t count, Body&& body, std::int64_t grain = 1) {
    run_in_parts(count, [&](int, std::int64_t begin, std::int64_t end) { body(begin, end); }, grain);
}

// The GEMM threads per rank that keep rank_threads x GEMM threads within this
// machine's hardware threads: at least 1.
[[nodiscard]] inline int gemm_threads_for(int rank_threads) {
    LOOM_CHECK(rank_threads >= 1, "gemm_threads_for: rank_threads = ", rank_threads, "; pass at least 1");
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    return std::max(1, cores / rank_threads);
}

}  // namespace loom::kernels::host
