// AnyComm: the run-time communicator that host code holds for a backend's
// communicator. Over ThreadComm, owning and as a view, it passes the
// collective suite (written once, every op, dtype and count) on 1, 2 and 3
// ranks and through split; a mismatched call fails with the wrapped
// communicator's message on every rank; run_ranks_on(host) hands each rank
// thread one; a device without its backend's communicator is refused by name.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/collective_suite.hpp"
#include "loom/comm/any_comm.hpp"
#include "loom/comm/device_ranks.hpp"
#include "loom/comm/thread_world.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::comm::AnyComm;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;

TEST_CASE("AnyComm over ThreadComm passes the collective suite, owning and as a view, and through split") {
    for (const int ranks : {1, 2, 3}) {
        CAPTURE(ranks);
        CHECK_NOTHROW(ThreadWorld(ranks).run([](ThreadComm& comm) {
            AnyComm view = AnyComm::view(comm);
            for (std::int64_t count : {0, 7, 1000}) loom_test::run_collective_suite(view, count);
            AnyComm half = view.split(view.rank() % 2, 0);
            if (half.size() != (view.size() + 1 - view.rank() % 2) / 2) throw std::runtime_error("split size");
            loom_test::run_collective_suite(half, 5);
        }));
        CHECK_NOTHROW(ThreadWorld(ranks).run([](ThreadComm& comm) {
            AnyComm owning = AnyComm::of(std::move(comm));
            loom_test::run_collective_suite(owning, 9);
        }));
    }
}

TEST_CASE("AnyComm passes the wrapped communicator's errors through, the same on every rank") {
    std::vector<std::string> messages(2);
    try {
        ThreadWorld(2).run([&](ThreadComm& comm) {
            AnyComm any = AnyComm::view(comm);
            std::vector<float> x(any.rank() == 0 ? 3 : 4);
            const auto t = loom::Tensor::of(x.data(), {static_cast<std::int64_t>(x.size())});
            try {
                any.all_reduce(t, t, loom::comm::ReduceOp::sum);
            } catch (const std::exception& e) {
                messages[static_cast<std::size_t>(any.rank())] = e.what();
                throw;
            }
        });
    } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): the messages are checked below
    }
    CHECK_THAT(messages[0], Catch::Matchers::Contains("collective call 0 differs between ranks: rank 0 called all_reduce "
                                                      "of 3 x f32 (sum), rank 1 called all_reduce of 4 x f32 (sum)"));
    CHECK(messages[0] == messages[1]);
}

TEST_CASE("run_ranks_on the host gives every rank thread an AnyComm, and a device without its backend is refused") {
    std::vector<int> seen(3, -1);
    loom::comm::run_ranks_on(loom::host_device, 3, [&](AnyComm& comm) {
        seen[static_cast<std::size_t>(comm.rank())] = comm.size();
        comm.barrier();
    });
    CHECK(seen == std::vector<int>{3, 3, 3});
    CHECK(loom_test::message_of([] { loom::comm::run_ranks_on(loom::cuda_device(0), 2, [](AnyComm&) {}); }) ==
          "memory on cuda:0 needs the cuda backend, which this program was built without: compile one .cu file that "
          "includes loom/cuda_backend.cuh and link loom::cuda");
    CHECK(loom_test::message_of([] { loom::comm::run_ranks_on(loom::host_device, 0, [](AnyComm&) {}); }) ==
          "run_ranks_on: 0 ranks requested; a world has at least 1 rank");
}

}  // namespace LOOM_TEST_FILE
