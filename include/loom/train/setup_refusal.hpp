// An error every rank finds alike while setting a run up (a data file that
// cannot be read, a corpus too short), agreed on instead of thrown: thrown
// inside an MPI communicator's run(), any error is a fault, and a fault ends
// the job with MPI_Abort after every process has printed it. When every rank
// refuses, the caller prints rank 0's message once and returns, and the
// processes end as a finished run does. When only some refuse (one node's
// copy of a file is missing), every rank throws: the others would wait for
// them, and the fault path is the way out.
//
//   const train::Refusal refusal = train::refusal_of([&] { corpus = load(...); });
//   if (train::refused_everywhere(world, refusal, device)) { if (lead) print(refusal.message); return; }
//   if (train::refuse_if_everywhere(world, refusal, device)) return;  // the same, printed; run_refused() then says so
#pragma once

#include <atomic>
#include <cstdio>
#include <exception>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/comm/staged.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::train {

// What a setup threw: its what() and the exception itself, or nothing.
struct Refusal {
    std::string message;
    std::exception_ptr error;
    [[nodiscard]] bool empty() const noexcept { return error == nullptr; }
};

template <class F>
[[nodiscard]] Refusal refusal_of(F&& setup) {
    try {
        setup();
    } catch (const std::exception& e) {
        return {e.what(), std::current_exception()};
    }
    return {};
}

// A collective: true on every rank when every rank's `refusal` is non-empty,
// false when none is; throws on every rank when only some refuse (its own
// message where it refused). `where` is where the communicator's buffers live.
template <comm::Communicator C>
[[nodiscard]] bool refused_everywhere(C& world, const Refusal& refusal, Device where) {
    float refusing = refusal.empty() ? 0.0f : 1.0f;  // f32: every backend sums it, exactly for any world size
    if (world.size() > 1) comm::staged_all_reduce(world, Tensor::of(&refusing, {1}), comm::ReduceOp::sum, where);
    const int count = static_cast<int>(refusing);
    if (count == 0) return false;
    if (count == world.size()) return true;
    if (!refusal.empty()) std::rethrow_exception(refusal.error);
    LOOM_FAIL(count, " of ", world.size(), " ranks could not set the run up (rank ", world.rank(),
              " could); each names why");
}

// Whether this process's ranks refused a run (refuse_if_everywhere), for its
// exit status once they have returned: a refusal is no fault, so the ranks
// return as from a finished run, and the process still exits 1.
[[nodiscard]] inline std::atomic<bool>& run_refused() {
    static std::atomic<bool> refused{false};
    return refused;
}

// refused_everywhere, and when every rank refuses: world rank 0 prints the
// message on standard error, once, and the process remembers (run_refused()).
template <comm::Communicator C>
[[nodiscard]] bool refuse_if_everywhere(C& world, const Refusal& refusal, Device where) {
    if (!refused_everywhere(world, refusal, where)) return false;
    if (world.rank() == 0) std::fprintf(stderr, "%s\n", refusal.message.c_str());
    run_refused() = true;
    return true;
}

}  // namespace loom::train
