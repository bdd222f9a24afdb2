// refused_everywhere: ranks that all refuse agree to stop quietly; ranks that
// partly refuse all throw, each with its reason.
#include <catch2/catch.hpp>

#include <loom/comm/thread_world.hpp>
#include <loom/train/setup_refusal.hpp>

#include <atomic>
#include <string>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("refused_everywhere: all refuse, none refuse, some refuse", "[train][setup_refusal]") {
    const auto refuse_if = [](bool refuse) {
        return loom::train::refusal_of([&] { LOOM_CHECK(!refuse, "data file x cannot be opened"); });
    };
    CHECK(refuse_if(false).empty());
    CHECK_THAT(refuse_if(true).message, Catch::StartsWith("data file x cannot be opened"));

    std::atomic<int> agreed{0}, refused_alone{0};  // counted on the rank threads, checked after them
    loom::comm::ThreadWorld(3).run([&](loom::comm::ThreadComm& comm) {
        if (loom::train::refused_everywhere(comm, refuse_if(true), loom::host_device)) ++agreed;
        if (loom::train::refused_everywhere(comm, refuse_if(false), loom::host_device)) ++refused_alone;
    });
    CHECK(agreed == 3);
    CHECK(refused_alone == 0);

    CHECK_THROWS_WITH(loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        (void)loom::train::refused_everywhere(comm, refuse_if(comm.rank() == 1), loom::host_device);
    }),
                      Catch::Contains("data file x cannot be opened") ||
                          Catch::Contains("1 of 2 ranks could not set the run up (rank 0 could); each names why"));
}

TEST_CASE("refuse_if_everywhere: remembers a refusal for the exit status", "[train][setup_refusal]") {
    const auto refuse_if = [](bool refuse) {
        return loom::train::refusal_of([&] { LOOM_CHECK(!refuse, "corpus too short"); });
    };
    std::atomic<int> refused{0};
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        if (loom::train::refuse_if_everywhere(comm, refuse_if(false), loom::host_device)) ++refused;
    });
    CHECK(refused == 0);
    CHECK_FALSE(loom::train::run_refused());
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        if (loom::train::refuse_if_everywhere(comm, refuse_if(true), loom::host_device)) ++refused;
    });
    CHECK(refused == 2);
    CHECK(loom::train::run_refused());
    loom::train::run_refused() = false;  // the flag is the process's: leave it as found
}

}  // namespace LOOM_TEST_FILE
