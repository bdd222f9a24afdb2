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

#include <memory>
#include <type_traits>

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
        auto group = std::make_shared<detail::ThreadGroup>(fault, detail::first_world_ranks(ranks_));
        detail::run_rank_threads(*fault, ranks_, [&](int rank) {
            ThreadComm comm(group, rank);
            try {
                body(comm);
            } catch (...) {
                detail::record_rank_failure(*fault, rank);
            }
        });
    }

private:
    int ranks_;
    CommOptions options_;
};

}  // namespace loom::comm
