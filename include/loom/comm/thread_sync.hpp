// Synchronisation for rank threads: the world's fault state (first failure
// wins and is rethrown by every rank, word for word), a waiting discipline
// that spins while ranks fit on the cores and sleeps when they do not, the
// group barrier that names the rank that never arrived, and the loop that
// runs a world's rank threads and rethrows its failure (ThreadWorld and
// DeviceThreadWorld).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/flight_recorder.hpp"
#include "loom/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace loom::comm {

namespace detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// One cache line per hot atomic, so ranks spinning on different counters do
// not steal each other's lines.
template <class T>
struct alignas(64) Padded {
    T value{};
};

}  // namespace detail

// Shared by every group (and sub-group) of one ThreadWorld. The first failure
// is recorded; from then on every wait of every rank throws it, so a rank that
// threw, or never arrived, cannot leave the others hanging.
class FaultState {
public:
    explicit FaultState(int ranks, std::chrono::milliseconds timeout) : ranks_(ranks), timeout_(timeout) {
        const std::string directory = FlightRecorder::directory_from_environment();
        for (int r = 0; r < ranks; ++r) recorders_.push_back(std::make_unique<FlightRecorder>(directory, r, ranks));
    }

    // Each world rank's flight recorder (flight_recorder.hpp).
    [[nodiscard]] FlightRecorder& recorder(int world_rank) { return *recorders_[static_cast<std::size_t>(world_rank)]; }

    [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

    // Records the first failure; later ones are consequences and are dropped.
    void fail(const std::string& message, int rank, std::exception_ptr cause = nullptr) {
        {
            std::lock_guard lock(mutex_);
            if (failed_.load(std::memory_order_relaxed)) return;
            message_ = message;
            failed_rank_ = rank;
            cause_ = std::move(cause);
            failed_.store(true, std::memory_order_release);
        }
        epoch_.fetch_add(1, std::memory_order_seq_cst);
        cv_.notify_all();
        // Every rank lives in this process, so the first fault writes all their files.
        for (const auto& recorder : recorders_) recorder->write(message);
    }

    // Every rank's pending and future call fails here, with the same text.
    [[noreturn]] void throw_failure() const {
        std::string message;
        {
            std::lock_guard lock(mutex_);
            message = message_;
        }
        throw Error(message);
    }

    [[nodiscard]] int failed_rank() const {
        std::lock_guard lock(mutex_);
        return failed_rank_;
    }
    [[nodiscard]] std::exception_ptr cause() const {
        std::lock_guard lock(mutex_);
        return cause_;
    }

    // Wakes sleeping waiters after a state change they may be waiting for.
    void notify() {
        epoch_.fetch_add(1, std::memory_order_seq_cst);
        if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
        { std::lock_guard lock(mutex_); }
        cv_.notify_all();
    }

    // Waits until ready() holds. Spins first (a peer on another core answers
    // in well under a microsecond), then yields, then sleeps on the condition
    // variable; checks for failure throughout. After the timeout, on_timeout()
    // must record a failure (it names who is missing) and the wait throws it.
    template <class Ready, class OnTimeout>
    void wait(Ready&& ready, OnTimeout&& on_timeout) {
        const int spins = ranks_ <= hardware_threads() ? 20000 : 50;
        for (int i = 0; i < spins; ++i) {
            if (ready()) return;
            if (failed()) throw_failure();
            detail::cpu_relax();
        }
        for (int i = 0; i < 64; ++i) {
            if (ready()) return;
            if (failed()) throw_failure();
            std::this_thread::yield();
        }
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        struct Leave {
            std::atomic<int>& sleepers;
            ~Leave() { sleepers.fetch_sub(1, std::memory_order_seq_cst); }
        } leave{sleepers_};
        for (;;) {
            // ready() runs without the mutex (it may notify others itself); the
            // epoch read before it tells whether anything changed since.
            const std::uint64_t seen = epoch_.load(std::memory_order_seq_cst);
            if (ready()) return;
            if (failed()) throw_failure();
            const auto now = std::chrono::steady_clock::now();
            if (now >= deadline) {
                on_timeout();
                throw_failure();
            }
            std::unique_lock lock(mutex_);
            // Bounded slices keep the deadline honest.
            cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(20)), [&] {
                return epoch_.load(std::memory_order_seq_cst) != seen || failed_.load(std::memory_order_acquire);
            });
        }
    }

private:
    static int hardware_threads() {
        static const int n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
        return n;
    }

    int ranks_;
    std::chrono::milliseconds timeout_;
    std::atomic<bool> failed_{false};
    std::atomic<int> sleepers_{0};
    std::atomic<std::uint64_t> epoch_{0};  // bumped by every notify()
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    std::string message_;
    int failed_rank_ = -1;
    std::exception_ptr cause_;
    std::vector<std::unique_ptr<FlightRecorder>> recorders_;
};

// A reusable barrier for the members of one group. Each member counts the
// barriers it entered, so a waiter that times out can name who is behind.
class GroupBarrier {
public:
    GroupBarrier(FaultState& fault, std::vector<int> world_ranks)
        : fault_(fault), world_ranks_(std::move(world_ranks)), entered_(world_ranks_.size()) {}

    [[nodiscard]] int size() const noexcept { return static_cast<int>(world_ranks_.size()); }
    [[nodiscard]] int world_rank(int member) const { return world_ranks_[static_cast<std::size_t>(member)]; }
    [[nodiscard]] const std::vector<int>& world_ranks() const noexcept { return world_ranks_; }

    // `kind` and `call` only feed the timeout message.
    void arrive_and_wait(int member, OpKind kind, std::int64_t call) {
        const auto n = static_cast<std::uint64_t>(size());
        const std::uint64_t mine =
            entered_[static_cast<std::size_t>(member)].value.fetch_add(1, std::memory_order_relaxed) + 1;
        const std::uint64_t generation = generation_.value.load(std::memory_order_acquire);
        if (count_.value.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
            count_.value.store(0, std::memory_order_relaxed);
            generation_.value.store(generation + 1, std::memory_order_release);
            fault_.notify();
            return;
        }
        fault_.wait([&] { return generation_.value.load(std::memory_order_acquire) != generation; },
                    [&] { fault_.fail(missing_message(kind, call, mine), world_rank(member)); });
    }

private:
    [[nodiscard]] std::string missing_message(OpKind kind, std::int64_t call, std::uint64_t mine) const {
        std::string missing;
        for (int m = 0; m < size(); ++m) {
            if (entered_[static_cast<std::size_t>(m)].value.load(std::memory_order_relaxed) >= mine) continue;
            missing += (missing.empty() ? "" : ", ") + std::to_string(world_rank(m));
        }
        if (missing.empty()) missing = "(none: they arrived as the wait gave up)";
        return loom::detail::concat(kind, " (call ", call, " of a ", size(), "-rank group) timed out after ",
                                    fault_.timeout().count(), " ms: world rank ", missing, " never arrived");
    }

    FaultState& fault_;
    std::vector<int> world_ranks_;
    std::vector<detail::Padded<std::atomic<std::uint64_t>>> entered_;
    detail::Padded<std::atomic<std::uint64_t>> count_;
    detail::Padded<std::atomic<std::uint64_t>> generation_;
};

namespace detail {

[[nodiscard]] inline std::string exception_text(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

// The world ranks 0, 1, ..., ranks-1: a world's first group.
[[nodiscard]] inline std::vector<int> first_world_ranks(int ranks) {
    std::vector<int> world_ranks(static_cast<std::size_t>(ranks));
    std::iota(world_ranks.begin(), world_ranks.end(), 0);
    return world_ranks;
}

// In a rank thread's catch block: the rank's exception becomes the world's
// failure, "rank R failed: <its message>" (the first one wins).
inline void record_rank_failure(FaultState& fault, int rank) {
    const auto error = std::current_exception();
    fault.fail(loom::detail::concat("rank ", rank, " failed: ", exception_text(error)), rank, error);
}

// Runs rank_main(rank) once per rank, rank 0 on the calling thread and the
// others on threads of their own, joins them, and rethrows the world's
// failure: the first rank's exception, or the timeout no rank threw first.
// rank_main catches its rank's exception and passes it to
// record_rank_failure while its communicator still lives, so that the
// communicator's queued async calls fail at once instead of timing out.
template <class RankMain>
void run_rank_threads(FaultState& fault, int ranks, RankMain&& rank_main) {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(ranks - 1));
    for (int rank = 1; rank < ranks; ++rank) threads.emplace_back(rank_main, rank);
    rank_main(0);
    for (auto& thread : threads) thread.join();

    if (!fault.failed()) return;
    if (auto cause = fault.cause()) std::rethrow_exception(cause);
    fault.throw_failure();  // a timeout: no rank threw first
}

}  // namespace detail

}  // namespace loom::comm
