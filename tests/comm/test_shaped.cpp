// Shaped<Comm>: the link model's costs, results unchanged by shaping, and the
// emulated bandwidth within 20% of the configured one for large messages.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <vector>

#include "comm/collective_suite.hpp"
#include "loom/comm/shaped.hpp"
#include "loom/comm/thread_world.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Tensor;
using loom::comm::Link;
using loom::comm::Links;
using loom::comm::OpKind;
using loom::comm::ReduceOp;
using loom::comm::Shaped;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;

static_assert(loom::comm::Communicator<Shaped<ThreadComm>>);

TEST_CASE("Links price collectives as rings paced by their slowest edge") {
    const Link inter = Link::gbit(10, 5e-6);
    const Links links = Links::nodes(8, 4, Link::unlimited(), inter);
    const std::vector<int> all{0, 1, 2, 3, 4, 5, 6, 7};
    const double bytes = 64.0 * (1 << 20);
    // Two ring edges cross the node boundary; they set the pace of every step.
    CHECK(links.cost(OpKind::all_reduce, all, bytes) == Approx(14 * (5e-6 + bytes / 8 / 1.25e9)));
    CHECK(links.cost(OpKind::all_gather, all, bytes) == Approx(7 * (5e-6 + bytes / 8 / 1.25e9)));
    CHECK(links.cost(OpKind::all_reduce, {0, 1, 2, 3}, bytes) == 0);  // inside a node: unlimited
    CHECK(links.cost(OpKind::all_reduce, {0, 4}, bytes) == Approx(2 * (5e-6 + bytes / 2 / 1.25e9)));
    CHECK(links.cost(OpKind::broadcast, {0, 4}, bytes) == Approx(5e-6 + bytes / 1.25e9));
    CHECK(links.cost(OpKind::all_to_all, {0, 1, 4}, 3000) == Approx(2 * (5e-6 + 1000 / 1.25e9)));
    CHECK(links.cost(OpKind::all_reduce, {3}, bytes) == 0);
    std::ostringstream text;
    text << links;
    CHECK(text.str() == "Links(8 ranks; 12 pairs at unlimited; 16 pairs at 10 Gbit/s + 5 us)");
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(Links::nodes(6, 4, Link::unlimited(), inter), Contains("6 ranks do not split into nodes of 4"));
    CHECK_THROWS_WITH(Link::gbit(0), Contains("Link: bandwidth 0 bytes/s must be positive"));
    CHECK_THROWS_WITH(Links(2).set(0, 2, inter), Contains("Links: rank 2 is outside 0..1"));
}

TEST_CASE("Shaped changes timing only: the collective suite passes through it") {
    CHECK_NOTHROW(ThreadWorld(3).run([](ThreadComm& comm) {
        Shaped<ThreadComm> shaped(std::move(comm), Links(3, Link::gbytes(100, 1e-6)));
        for (std::int64_t count : {0, 7, 1000}) loom_test::run_collective_suite(shaped, count);
        auto pair = shaped.split(shaped.rank() == 2 ? 1 : 0, 0);
        if (pair.members() != (shaped.rank() == 2 ? std::vector<int>{2} : std::vector<int>{0, 1}))
            throw std::runtime_error("split lost the world ranks of its members");
        loom_test::run_collective_suite(pair, 5);
    }));
}

namespace {

// Best of three (the emulation can only be slowed by the machine, never sped
// up): seconds of `op` on rank 0.
template <class Op>
double best_seconds(int ranks, const Links& links, Op op) {
    double best = 1e9;
    for (int attempt = 0; attempt < 3; ++attempt) {
        double seconds = 0;
        ThreadWorld(ranks).run([&](ThreadComm& comm) {
            Shaped<ThreadComm> shaped(std::move(comm), links);
            shaped.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            op(shaped);
            if (shaped.rank() == 0) seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        });
        best = std::min(best, seconds);
    }
    return best;
}

}  // namespace

TEST_CASE("Shaped emulates the configured bandwidth within 20% for large messages") {
    // Slow links (2 Gbit/s = 0.25 GB/s), so the modelled time (67 ms) dwarfs the
    // real copy even on a loaded machine.
    const std::int64_t count = 4 << 20;  // 16 MiB of f32
    const double bytes = static_cast<double>(count) * 4;
    std::vector<std::vector<float>> buffers(4, std::vector<float>(static_cast<std::size_t>(count), 1.0f));

    // Point to point: 16 MiB take 67 ms.
    const double p2p = best_seconds(2, Links(2, Link::gbit(2)), [&](Shaped<ThreadComm>& c) {
        auto t = Tensor::of(buffers[static_cast<std::size_t>(c.rank())].data(), {count});
        if (c.rank() == 0) c.send(t, 1, 0);
        else c.recv(t, 0, 0);
    });
    CHECK(bytes / p2p / 1e9 == Approx(0.25).epsilon(0.2));

    // All-reduce on two nodes of two ranks joined by 2 Gbit/s: busbw = the link.
    const double all_reduce = best_seconds(4, Links::nodes(4, 2, Link::unlimited(), Link::gbit(2)), [&](Shaped<ThreadComm>& c) {
        auto t = Tensor::of(buffers[static_cast<std::size_t>(c.rank())].data(), {count});
        c.all_reduce(t, t, ReduceOp::sum);
    });
    const double busbw = bytes / all_reduce * 2 * 3 / 4;
    CHECK(busbw / 1e9 == Approx(0.25).epsilon(0.2));
}

TEST_CASE("Shaped queues the collectives of one communicator: two at once take the sum of their times") {
    // Two all-reduces of 1 MiB over 0.1 GB/s, issued together: 10.5 ms each
    // (2 x (n - 1) / n of the bytes). Overlapped they would end after 10.5 ms;
    // on shared links the second ends no earlier than 21 ms. Sleeping can
    // only make it later, so the bound cannot fail on a busy machine.
    const std::int64_t count = 1 << 18;
    const Links links(2, Link::gbytes(0.1));
    const double one = links.cost(OpKind::all_reduce, {0, 1}, static_cast<double>(count) * 4);
    std::vector<std::vector<float>> buffers(4, std::vector<float>(static_cast<std::size_t>(count), 1.0f));
    const double both = best_seconds(2, links, [&](Shaped<ThreadComm>& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        auto a = Tensor::of(buffers[2 * r].data(), {count});
        auto b = Tensor::of(buffers[2 * r + 1].data(), {count});
        auto first = c.all_reduce_async(a, a, ReduceOp::sum);
        auto second = c.all_reduce_async(b, b, ReduceOp::sum);
        second.wait();
        first.wait();
    });
    REQUIRE(one > 0.01);  // the modelled time dwarfs the real copies
    CHECK(both >= 2 * one);
}

}  // namespace LOOM_TEST_FILE
