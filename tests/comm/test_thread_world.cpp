// ThreadWorld: the collective suite for 1..8 ranks, splits, bad input, and
// faults (a rank that throws, a rank that never arrives, mismatched calls).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_suite.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/rng.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::DType;
using loom::Tensor;
using loom::comm::ReduceOp;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;

static_assert(loom::comm::Communicator<ThreadComm>);

namespace {

// Runs body on every rank and returns, per rank, the text of the exception
// the body threw ("" when it returned normally). run()'s own rethrow is
// swallowed: these tests look at what each rank saw.
template <class Body>
std::vector<std::string> messages_per_rank(int ranks, loom::comm::CommOptions options, Body body) {
    std::vector<std::string> seen(static_cast<std::size_t>(ranks));
    try {
        ThreadWorld(ranks, options).run([&](ThreadComm& comm) {
            try {
                body(comm);
            } catch (const std::exception& e) {
                seen[static_cast<std::size_t>(comm.rank())] = e.what();
                throw;
            }
        });
    } catch (const std::exception&) {
    }
    return seen;
}

}  // namespace

TEST_CASE("ThreadWorld passes the collective suite with 1, 2, 3, 4, 5, 7 and 8 ranks") {
    for (int ranks : {1, 2, 3, 4, 5, 7, 8}) {
        INFO("ranks " << ranks);
        CHECK_NOTHROW(ThreadWorld(ranks).run([](ThreadComm& comm) {
            for (std::int64_t count : {0, 1, 7, 1000, 4099}) loom_test::run_collective_suite(comm, count);
        }));
    }
}

TEST_CASE("ThreadWorld split groups ranks by color, ordered by key, and they pass the suite") {
    CHECK_NOTHROW(ThreadWorld(6).run([](ThreadComm& comm) {
        // Colors: rank % 2; keys reverse the order inside each color.
        ThreadComm half = comm.split(comm.rank() % 2, -comm.rank());
        if (half.size() != 3) throw std::runtime_error("split: size " + std::to_string(half.size()));
        const int expected_rank = 2 - comm.rank() / 2;
        if (half.rank() != expected_rank || half.world_rank() != comm.rank())
            throw std::runtime_error("split: world rank " + std::to_string(comm.rank()) + " became rank " +
                                     std::to_string(half.rank()));
        loom_test::run_collective_suite(half, 13);
        // A split of a split, then the parent again: groups stay independent.
        ThreadComm single = half.split(half.rank(), 0);
        loom_test::run_collective_suite(single, 5);
        loom_test::run_collective_suite(comm, 5);
    }));
}

TEST_CASE("ThreadWorld all_reduce gives every rank the same bits, the rank-order sum") {
    const int ranks = 3;
    const std::int64_t count = 100003;
    std::vector<std::vector<float>> inputs(ranks, std::vector<float>(count));
    for (int r = 0; r < ranks; ++r) loom::RngStream(7, static_cast<std::uint64_t>(r)).fill_normal(inputs[static_cast<std::size_t>(r)], 0, 0.0f, 1.0f);
    std::vector<float> serial(count);
    for (std::int64_t i = 0; i < count; ++i) {
        float acc = inputs[0][static_cast<std::size_t>(i)];
        for (int r = 1; r < ranks; ++r) acc += inputs[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
        serial[static_cast<std::size_t>(i)] = acc;
    }
    std::vector<std::vector<float>> results(ranks, std::vector<float>(count));
    ThreadWorld(ranks).run([&](ThreadComm& comm) {
        auto r = static_cast<std::size_t>(comm.rank());
        comm.all_reduce(Tensor::of(inputs[r].data(), {count}), Tensor::of(results[r].data(), {count}), ReduceOp::sum);
    });
    for (int r = 0; r < ranks; ++r)
        CHECK(std::memcmp(results[static_cast<std::size_t>(r)].data(), serial.data(), count * sizeof(float)) == 0);
}

TEST_CASE("ThreadWorld rejects bad buffers with one line naming the value") {
    auto first_message = [](auto body) {
        auto seen = messages_per_rank(2, {}, body);
        return seen[0];
    };
    std::vector<float> a(12), b(12);
    std::vector<std::int32_t> ints(12);
    using Catch::Matchers::Contains;
    CHECK_THAT(first_message([&](ThreadComm& c) { c.all_reduce(Tensor::of(a.data(), {12}), Tensor::of(b.data(), {10}), ReduceOp::sum); }),
               Contains("all_reduce: send has 12 elements but recv has 10"));
    CHECK_THAT(first_message([&](ThreadComm& c) { c.all_reduce(Tensor::of(a.data(), {12}), Tensor::of(ints.data(), {12}), ReduceOp::sum); }),
               Contains("all_reduce: send is f32 but recv is i32"));
    CHECK_THAT(first_message([&](ThreadComm& c) { c.reduce_scatter(Tensor::of(a.data(), {12}), Tensor::of(b.data(), {5}), ReduceOp::sum); }),
               Contains("reduce_scatter: send has 12 elements but must have 2 ranks x 5 (recv) = 10"));
    CHECK_THAT(first_message([&](ThreadComm& c) { c.all_gather(Tensor::of(a.data(), {6}), Tensor::of(b.data(), {11}));  }),
               Contains("all_gather: recv has 11 elements but must have 2 ranks x 6 (send) = 12"));
    CHECK_THAT(first_message([&](ThreadComm& c) { c.broadcast(Tensor::of(a.data(), {12}), 2); }),
               Contains("broadcast: root 2 is not a rank of this communicator (0..1)"));
    CHECK_THAT(first_message([&](ThreadComm& c) { c.send(Tensor::of(a.data(), {12}), c.rank(), 0); }),
               Contains("send: rank 0 cannot send to itself"));
    CHECK_THAT(first_message([&](ThreadComm& c) { c.all_to_all(Tensor::of(a.data(), {11}), Tensor::of(b.data(), {11})); }),
               Contains("all_to_all: 11 elements do not split into 2 equal blocks"));
    CHECK_THAT(first_message([&](ThreadComm& c) { c.all_reduce(Tensor::of(a.data(), {8}), Tensor::of(a.data() + 4, {8}), ReduceOp::sum); }),
               Contains("all_reduce: send and recv overlap partially"));
    CHECK_THAT(first_message([&](ThreadComm& c) {
                   Tensor strided(a.data(), DType::f32, loom::Shape{6}, loom::Strides{2});
                   c.all_reduce(strided, strided, ReduceOp::sum);
               }),
               Contains("is not contiguous"));
    CHECK_THAT(first_message([&](ThreadComm& c) { (void)c.split(-1, 0); }), Contains("split: color -1 is negative"));
    CHECK_THROWS_WITH(ThreadWorld(0), Contains("0 ranks requested"));
}

TEST_CASE("ThreadWorld: mismatched collectives fail on every rank with both signatures") {
    std::vector<float> a(8);
    auto seen = messages_per_rank(3, {}, [&](ThreadComm& c) {
        std::vector<float> mine(c.rank() == 2 ? 7 : 8);
        auto t = Tensor::of(mine.data(), {static_cast<std::int64_t>(mine.size())});
        c.all_reduce(t, t, ReduceOp::sum);
    });
    for (const auto& message : seen) {
        CHECK_THAT(message, Catch::Matchers::Contains("collective call 0 differs between ranks: rank 0 called all_reduce of 8 x f32 (sum), rank 2 called all_reduce of 7 x f32 (sum)"));
        CHECK(message == seen[0]);
    }
    // Different operations meet: the kinds are named.
    seen = messages_per_rank(2, {}, [&](ThreadComm& c) {
        if (c.rank() == 0) c.barrier(); else c.broadcast(Tensor::of(a.data(), {8}), 0);
    });
    CHECK_THAT(seen[1], Catch::Matchers::Contains("rank 0 called barrier, rank 1 called broadcast of 8 x f32 from root 0"));
    CHECK(seen[0] == seen[1]);
}

TEST_CASE("ThreadWorld: a rank that throws fails every other rank's calls with its message") {
    std::vector<std::string> seen;
    std::string rethrown;
    seen.resize(4);
    try {
        ThreadWorld(4).run([&](ThreadComm& c) {
            std::vector<float> buffer(1000, 1.0f);
            auto t = Tensor::of(buffer.data(), {1000});
            try {
                c.all_reduce(t, t, ReduceOp::sum);  // all meet once
                if (c.rank() == 2) throw std::runtime_error("out of memory on rank two");
                auto pending = c.all_reduce_async(t, t, ReduceOp::sum);  // pending when rank 2 dies
                pending.wait();
            } catch (const std::exception& e) {
                seen[static_cast<std::size_t>(c.rank())] = e.what();
                if (c.rank() == 2) throw;
                // Future calls fail the same way, at once.
                try {
                    c.barrier();
                } catch (const std::exception& again) {
                    if (std::string(again.what()) != e.what()) seen[static_cast<std::size_t>(c.rank())] += " / differs";
                }
                throw;
            }
        });
    } catch (const std::exception& e) {
        rethrown = e.what();
    }
    CHECK(rethrown == "out of memory on rank two");  // run() rethrows the cause
    for (int r : {0, 1, 3}) {
        INFO("rank " << r);
        CHECK_THAT(seen[static_cast<std::size_t>(r)], Catch::Matchers::StartsWith("rank 2 failed: out of memory on rank two ["));
        CHECK(seen[static_cast<std::size_t>(r)] == seen[0]);
    }
}

TEST_CASE("ThreadWorld: a rank that never arrives fails the others after the timeout, named") {
    loom::comm::CommOptions options;
    options.timeout = std::chrono::milliseconds(200);
    std::vector<float> buffer(3 * 16);
    auto seen = messages_per_rank(3, options, [&](ThreadComm& c) {
        auto t = Tensor::of(buffer.data() + 16 * c.rank(), {16});
        if (c.rank() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(600));  // busy elsewhere
        }
        c.all_reduce(t, t, ReduceOp::sum);
    });
    for (const auto& message : seen) {
        CHECK_THAT(message, Catch::Matchers::StartsWith(
                                "all_reduce (call 0 of a 3-rank group) timed out after 200 ms: world rank 1 never arrived"));
        CHECK(message == seen[0]);  // the late rank gets the same sentence when it arrives
    }

    // Point to point: a receive whose sender never sends.
    seen = messages_per_rank(2, options, [&](ThreadComm& c) {
        if (c.rank() == 0) c.recv(Tensor::of(buffer.data(), {4}), 1, 3);
    });
    CHECK_THAT(seen[0], Catch::Matchers::StartsWith(
                            "recv on world rank 0 from world rank 1 (tag 3) timed out: world rank 1 never sent it"));
}

TEST_CASE("ThreadWorld: a send and recv that disagree fail both sides with both sizes") {
    std::vector<float> a(8);
    auto seen = messages_per_rank(2, {}, [&](ThreadComm& c) {
        if (c.rank() == 0) c.send(Tensor::of(a.data(), {8}), 1, 0);
        else c.recv(Tensor::of(a.data(), {6}), 0, 0);
    });
    CHECK_THAT(seen[1], Catch::Matchers::StartsWith(
                            "send/recv mismatch: world rank 0 sent 8 x f32 with tag 0, world rank 1 expected 6 x f32"));
    CHECK(seen[0] == seen[1]);
}

TEST_CASE("ThreadWorld: a send knows when it was posted and when the receiver copied it") {
    // Checked on the main thread afterwards: Catch2's assertions are not thread-safe.
    loom::comm::Request::Timing timing;
    std::chrono::steady_clock::time_point before, after;
    float received = -1;
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        std::vector<float> data(64, static_cast<float>(comm.rank()));
        const auto t = loom::Tensor::of(data.data(), {64});
        if (comm.rank() == 0) {
            before = std::chrono::steady_clock::now();
            loom::comm::Request sent = comm.send_async(t, 1, 7);
            sent.wait();
            after = std::chrono::steady_clock::now();
            timing = sent.timing();
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the copy happens after this
            comm.recv(t, 0, 7);
            received = data[0];
        }
    });
    REQUIRE(timing.known);
    CHECK(timing.started >= before);
    CHECK(timing.finished >= timing.started);
    CHECK(timing.finished <= after);
    CHECK(received == 0.0f);
}

}  // namespace LOOM_TEST_FILE
