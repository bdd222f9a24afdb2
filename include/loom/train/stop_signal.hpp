// Stopping a run cleanly on SIGINT or SIGTERM. Killed at an arbitrary
// instruction, a run loses every step since its last save; so while a
// StopSignal lives, the two signals only raise a flag, and the training loop
// polls it between steps: it finishes the step it is in, saves, and exits
// 128 + the signal's number (130, 143), as a shell expects of a process the
// signal ended. A save in progress finishes (the file is renamed whole or
// its temporary removed), so no signal leaves a half-written checkpoint.
//
// Ranks must stop at the same step, or those that go on wait forever in a
// collective for those that stopped: `agree_to_stop` takes the maximum of
// every rank's flag over the world (one 4-byte all-reduce a step), and
// every rank acts on that answer, never on its own flag.
//
//   train::StopSignal stop;                       // handlers installed
//   for (step ...) { ...; if (train::agree_to_stop(world, device)) break; }
//   return stop.exit_code();                      // 130 after SIGINT
#pragma once

#include <csignal>
#include <string>

#include "loom/comm/staged.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::train {

namespace detail {

// Written by the handler, read by the loop: the only kind of object a signal
// handler may portably store to (a lock-free atomic would do as well).
inline volatile std::sig_atomic_t stop_signal_number = 0;

inline void record_stop_signal(int signal) { stop_signal_number = signal; }

}  // namespace detail

// Installs the handlers for SIGINT and SIGTERM; the destructor puts the old
// ones back. One at a time per process (the flag is the process's).
class StopSignal {
public:
    StopSignal() {
        detail::stop_signal_number = 0;
        struct sigaction action {};
        action.sa_handler = &detail::record_stop_signal;
        sigemptyset(&action.sa_mask);
        action.sa_flags = SA_RESTART;  // blocking reads and writes go on; the loop looks between steps
        LOOM_CHECK(::sigaction(SIGINT, &action, &old_int_) == 0 && ::sigaction(SIGTERM, &action, &old_term_) == 0,
                   "cannot install the SIGINT and SIGTERM handlers");
    }
    StopSignal(const StopSignal&) = delete;
    StopSignal& operator=(const StopSignal&) = delete;
    ~StopSignal() {
        ::sigaction(SIGINT, &old_int_, nullptr);
        ::sigaction(SIGTERM, &old_term_, nullptr);
    }

    // The signal received so far (SIGINT, SIGTERM), or 0.
    [[nodiscard]] static int received() noexcept { return static_cast<int>(detail::stop_signal_number); }
    // 128 + the signal's number, as a shell reports a process a signal ended.
    [[nodiscard]] static int exit_code() noexcept { return received() == 0 ? 0 : 128 + received(); }
    // "SIGINT", "SIGTERM" or "signal N".
    [[nodiscard]] static std::string name() {
        if (received() == SIGINT) return "SIGINT";
        if (received() == SIGTERM) return "SIGTERM";
        return "signal " + std::to_string(received());
    }

private:
    struct sigaction old_int_ {};
    struct sigaction old_term_ {};
};

// True on every rank if a stop signal reached any rank (a collective: every
// rank calls it at the same point of every step). `where` is where the
// communicator's buffers live (a device communicator moves device memory).
template <comm::Communicator C>
[[nodiscard]] bool agree_to_stop(C& world, Device where) {
    float flag = StopSignal::received() != 0 ? 1.0f : 0.0f;  // f32: every backend reduces it
    if (world.size() > 1)
        comm::staged_all_reduce(world, Tensor::of(&flag, {1}), comm::ReduceOp::max, where);
    return flag != 0.0f;
}

}  // namespace loom::train
