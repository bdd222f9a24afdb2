// launch_rank_threads and launch_on_processes: each transport reaches the
// body as one AnyComm with its printed name and device; a device the program
// cannot use is refused as DeviceRefused, naming the device.
#include <catch2/catch.hpp>

#include <loom/comm/thread_world.hpp>
#include <loom/plan/cluster.hpp>
#include <loom/train/transport_launch.hpp>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::train::RankThreads;

// Every rank's world size, rank, transport and device, as the body saw them
// (recorded on the rank threads and checked after them: Catch's assertions
// are not thread-safe).
struct Seen {
    std::mutex mutex;
    std::set<int> ranks;
    std::set<std::string> transports;
    std::atomic<int> sizes{0}, off_host{0};
    loom::train::TransportBody body() {
        return [this](loom::comm::AnyComm& world, const char* transport, loom::Device device) {
            off_host += device == loom::host_device ? 0 : 1;
            // The world is a working communicator: a sum over it.
            float one = 1.0f, sum = 0.0f;
            world.all_reduce(loom::Tensor::of(&one, {1}), loom::Tensor::of(&sum, {1}), loom::comm::ReduceOp::sum);
            std::lock_guard lock(mutex);
            ranks.insert(world.rank());
            transports.insert(transport);
            sizes += sum == static_cast<float>(world.size()) ? 1 : 0;
        };
    }
};

TEST_CASE("launch_rank_threads: host threads, one or many, plain or over a cluster's links", "[train][transport_launch]") {
    Seen three;
    loom::train::launch_rank_threads({.ranks = 3}, three.body());
    CHECK(three.ranks == std::set<int>{0, 1, 2});
    CHECK(three.transports == std::set<std::string>{"rank threads"});
    CHECK(three.sizes == 3);
    CHECK(three.off_host == 0);

    Seen one;
    loom::train::launch_rank_threads({.ranks = 1}, one.body());
    CHECK(one.transports == std::set<std::string>{"rank thread"});

    const auto cluster = loom::plan::Cluster::uniform(1, 2, 1e12, 1e12, loom::comm::Link::unlimited(),
                                                      loom::comm::Link::unlimited());
    Seen shaped;
    loom::train::launch_rank_threads({.ranks = 2, .cluster = &cluster}, shaped.body());
    CHECK(shaped.ranks == std::set<int>{0, 1});
    CHECK(shaped.transports == std::set<std::string>{"rank threads"});
    CHECK(shaped.off_host == 0);
    CHECK_THROWS_WITH(loom::train::launch_rank_threads({.ranks = 3, .cluster = &cluster}, shaped.body()),
                      Catch::Contains("the cluster has 2 devices for 3 ranks"));
}

TEST_CASE("launch_on_processes: a host world runs the body as MPI processes", "[train][transport_launch]") {
    Seen seen;
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::AnyComm host = loom::comm::AnyComm::view(comm);
        loom::train::launch_on_processes(host, loom::host_device, false, false, seen.body());
    });
    CHECK(seen.ranks == std::set<int>{0, 1});
    CHECK(seen.transports == std::set<std::string>{"MPI processes"});
    CHECK(seen.off_host == 0);
}

TEST_CASE("a device this program cannot use is refused by name, before any rank runs", "[train][transport_launch]") {
    // These tests link no CUDA backend (or run where no GPU is visible), so cuda:0 cannot run.
    if (const auto* cuda = loom::find_device_runtime(loom::DeviceKind::cuda); cuda != nullptr && cuda->device_count() > 0) {
        WARN("skipped: a CUDA device is usable here, so nothing refuses cuda:0");
        return;
    }
    CHECK_THROWS_AS(loom::train::transport_name("rank threads", loom::cuda_device(0)), loom::train::DeviceRefused);
    CHECK_THROWS_WITH(loom::train::transport_name("rank threads", loom::cuda_device(0)), Catch::StartsWith("cuda:0: "));
    std::atomic<int> ran{0};
    const loom::train::TransportBody body = [&](loom::comm::AnyComm&, const char*, loom::Device) { ++ran; };
    CHECK_THROWS_AS(loom::train::launch_rank_threads({.ranks = 2, .device = loom::cuda_device(0)}, body),
                    loom::train::DeviceRefused);
    CHECK_THROWS_AS(loom::train::launch_rank_threads(
                        {.ranks = 2, .device = loom::cuda_device(0), .host_collectives = true}, body),
                    loom::train::DeviceRefused);
    CHECK(ran == 0);
    // A device named for every process is that device, whatever the launcher says.
    CHECK(loom::train::process_device(loom::cuda_device(1), false) == loom::cuda_device(1));
}

}  // namespace LOOM_TEST_FILE
