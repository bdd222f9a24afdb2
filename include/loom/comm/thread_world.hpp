// ThreadWorld: N ranks as threads of one process, the embedded default every
// example runs without a launcher.
//
//   loom::comm::ThreadWorld(4).run([&](loom::comm::ThreadComm& comm) {
//       comm.all_reduce(grad, grad, loom::comm::ReduceOp::avg);
//   });
//
// run() returns when every rank has returned. If a rank throws, every other
// rank's pending and future calls fail with "rank R failed: <its message>",
// and run() rethrows the first rank's exception once all threads are joined.
// A rank that stops calling (returns early, loops, waits elsewhere) fails the
// others after CommOptions::timeout, naming it.
#pragma once

#include <exception>
#include <memory>
#include <numeric>
#include <thread>
#include <type_traits>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/thread_comm.hpp"
#include "loom/comm/thread_sync.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

class ThreadWorld {
public:
    explicit ThreadWorld(int ranks, CommOptions options = {}) : ranks_(ranks), options_(options) {
        LOOM_CHECK(ranks >= 1, "ThreadWorld: ", ranks, " ranks requested; a world has at least 1 rank");
        LOOM_CHECK(options.timeout.count() > 0, "ThreadWorld: timeout ", options.timeout.count(),
                   " ms must be positive");
    }

    [[nodiscard]] int size() const noexcept { return ranks_; }
    [[nodiscard]] const CommOptions& options() const noexcept { return options_; }

    // Runs body(ThreadComm&) once per rank, rank 0 on the calling thread.
    template <class Body>
        requires std::is_invocable_v<Body&, ThreadComm&>
    void run(Body&& body) const {
        auto fault = std::make_shared<FaultState>(ranks_, options_.timeout);
        std::vector<int> world_ranks(static_cast<std::size_t>(ranks_));
        std::iota(world_ranks.begin(), world_ranks.end(), 0);
        auto group = std::make_shared<detail::ThreadGroup>(fault, std::move(world_ranks));

        auto rank_main = [&](int rank) {
            ThreadComm comm(group, rank);
            try {
                body(comm);
            } catch (...) {
                const auto error = std::current_exception();
                fault->fail(loom::detail::concat("rank ", rank, " failed: ", detail::exception_text(error)), rank,
                            error);
            }
        };
        std::vector<std::thread> threads;
        threads.reserve(static_cast<std::size_t>(ranks_ - 1));
        for (int rank = 1; rank < ranks_; ++rank) threads.emplace_back(rank_main, rank);
        rank_main(0);
        for (auto& thread : threads) thread.join();

        if (!fault->failed()) return;
        if (auto cause = fault->cause()) std::rethrow_exception(cause);
        fault->throw_failure();  // a timeout: no rank threw first
    }

private:
    int ranks_;
    CommOptions options_;
};

}  // namespace loom::comm
