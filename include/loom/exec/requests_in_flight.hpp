// The step program's communication in flight, by the index of the
// instruction that issued it: what a wait instruction (Op::wait, its target)
// waits for. Sized once per program, so a step allocates nothing here.
#pragma once

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"

namespace loom::exec {

struct InFlight {
    comm::Request request;
    comm::Request second;  // a send's payload (request is its header)
    std::chrono::steady_clock::time_point issued;
    bool in_flight = false;
    bool accumulate = false;  // a slot reduction whose block is added to the shard when done
};

class RequestsInFlight {
public:
    void resize(std::size_t instructions) { flights_.resize(instructions); }

    // Instruction `index`'s request (and a send's payload), now in flight.
    void issue(int index, comm::Request request, comm::Request second = {}, bool accumulate = false) {
        flights_.at(static_cast<std::size_t>(index)) =
            InFlight{std::move(request), std::move(second), std::chrono::steady_clock::now(), true, accumulate};
    }

    // What a wait found: the communication (no longer in flight) and when
    // the wait began and ended, for the trace.
    struct Waited {
        const InFlight& flight;
        std::chrono::steady_clock::time_point began, ended;
    };

    // Waits for instruction `target`'s communication.
    Waited wait(int target) {
        LOOM_CHECK(target >= 0 && target < static_cast<int>(flights_.size()) &&
                       flights_[static_cast<std::size_t>(target)].in_flight,
                   "Executor: wait for #", target, ", which is not in flight");
        InFlight& flight = flights_[static_cast<std::size_t>(target)];
        const auto began = std::chrono::steady_clock::now();
        flight.request.wait();
        flight.second.wait();
        flight.in_flight = false;
        return {flight, began, std::chrono::steady_clock::now()};
    }

private:
    std::vector<InFlight> flights_;
};

}  // namespace loom::exec
