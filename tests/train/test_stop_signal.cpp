// SIGINT and SIGTERM become a flag the training loop polls, and every rank
// agrees on it, so all stop at the same step.
#include <catch2/catch.hpp>

#include <loom/comm/thread_world.hpp>
#include <loom/train/stop_signal.hpp>

#include <array>
#include <chrono>
#include <csignal>
#include <thread>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::train::StopSignal;

TEST_CASE("StopSignal turns SIGINT and SIGTERM into a flag and an exit code, then puts the old handlers back",
          "[stop]") {
    struct sigaction before {};
    ::sigaction(SIGINT, nullptr, &before);
    {
        const StopSignal stop;
        CHECK(StopSignal::received() == 0);
        CHECK(StopSignal::exit_code() == 0);
        std::raise(SIGINT);  // without the handler this would end the test binary
        CHECK(StopSignal::received() == SIGINT);
        CHECK(StopSignal::exit_code() == 130);
        CHECK(StopSignal::name() == "SIGINT");
        std::raise(SIGTERM);
        CHECK(StopSignal::exit_code() == 143);
        CHECK(StopSignal::name() == "SIGTERM");
    }
    struct sigaction after {};
    ::sigaction(SIGINT, nullptr, &after);
    CHECK(after.sa_handler == before.sa_handler);
    const StopSignal again;  // a new run starts with no signal
    CHECK(StopSignal::received() == 0);
}

TEST_CASE("agree_to_stop answers the same on every rank, whichever rank saw the signal", "[stop]") {
    const StopSignal stop;
    std::array<int, 3> answers{-1, -1, -1};
    loom::comm::ThreadWorld(3).run([&](loom::comm::ThreadComm& comm) {
        answers[static_cast<std::size_t>(comm.rank())] = loom::train::agree_to_stop(comm, loom::host_device) ? 1 : 0;
    });
    CHECK(answers == std::array<int, 3>{0, 0, 0});
    loom::comm::ThreadWorld(3).run([&](loom::comm::ThreadComm& comm) {
        // Rank 0 takes the signal late, most likely after the others have
        // read the flag; whatever the order, the maximum reaches every rank.
        if (comm.rank() == 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            std::raise(SIGTERM);
        }
        answers[static_cast<std::size_t>(comm.rank())] = loom::train::agree_to_stop(comm, loom::host_device) ? 1 : 0;
    });
    CHECK(answers == std::array<int, 3>{1, 1, 1});
}

}  // namespace LOOM_TEST_FILE
