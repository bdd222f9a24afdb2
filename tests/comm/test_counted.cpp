// Counted<Comm>: every op's calls, payload bytes and ring wire bytes on 1 to 4
// ranks, results equal to the wrapped communicator's, async calls counted at
// issue, split groups, reset, and the printed table.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/collective_suite.hpp"
#include "loom/comm/counted.hpp"
#include "loom/comm/mesh.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/dtype.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Tensor;
using loom::comm::CommCounts;
using loom::comm::Counted;
using loom::comm::Mesh;
using loom::comm::OpCount;
using loom::comm::OpKind;
using loom::comm::ReduceOp;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;

static_assert(loom::comm::Communicator<Counted<ThreadComm>>);
static_assert(loom::comm::Communicator<Counted<Counted<ThreadComm>>>);

namespace {

constexpr std::int64_t k = 6;  // elements per rank block

// Every op once or twice, in several dtypes, and an extra message from rank 0
// to rank 1 so that ranks' counts differ.
void exercise(Counted<ThreadComm>& c) {
    const int n = c.size();
    const int me = c.rank();
    std::vector<float> a(k, 1.0f), b(k), big(static_cast<std::size_t>(n * k), 1.0f);
    c.all_reduce(Tensor::of(a.data(), {k}), Tensor::of(b.data(), {k}), ReduceOp::sum);
    c.all_reduce(Tensor::of(a.data(), {k}), Tensor::of(a.data(), {k}), ReduceOp::avg);
    c.reduce_scatter(Tensor::of(big.data(), {n * k}), Tensor::of(b.data(), {k}), ReduceOp::sum);
    std::vector<loom::bf16> half(k), gathered(static_cast<std::size_t>(n * k));
    c.all_gather(Tensor::of(half.data(), {k}), Tensor::of(gathered.data(), {n * k}));
    std::vector<std::int64_t> words(k, me);
    c.broadcast(Tensor::of(words.data(), {k}), n - 1);
    std::vector<std::int32_t> blocks(static_cast<std::size_t>(n * k), me), swapped(static_cast<std::size_t>(n * k));
    c.all_to_all(Tensor::of(blocks.data(), {n * k}), Tensor::of(swapped.data(), {n * k}));
    c.barrier();
    c.barrier();
    if (n >= 2) {
        std::vector<loom::f16> out(k), in(k);
        auto sent = c.send_async(Tensor::of(out.data(), {k}), (me + 1) % n, 0);
        c.recv(Tensor::of(in.data(), {k}), (me + n - 1) % n, 0);
        sent.wait();
        std::vector<float> extra(3, 2.0f);
        if (me == 0) c.send(Tensor::of(extra.data(), {3}), 1, 5);
        if (me == 1) c.recv(Tensor::of(extra.data(), {3}), 0, 5);
    }
}

// What exercise() must leave in rank `me`'s counts, from the formulas.
CommCounts expected(int n, int me) {
    CommCounts e;
    const double f = static_cast<double>(n - 1) / n;
    e[OpKind::all_reduce] = {2, 2 * 4 * k, 2 * f * 2 * 4 * k};
    e[OpKind::reduce_scatter] = {1, 4 * n * k, f * 4 * n * k};
    e[OpKind::all_gather] = {1, 2 * n * k, f * 2 * n * k};
    e[OpKind::broadcast] = {1, 8 * k, n > 1 ? 8.0 * k : 0.0};
    e[OpKind::all_to_all] = {1, 4 * n * k, f * 4 * n * k};
    e[OpKind::barrier] = {2, 0, 0};
    if (n >= 2) {
        e[OpKind::send] = {1, 2 * k, 2.0 * k};
        e[OpKind::recv] = {1, 2 * k, 0};
        if (me == 0) e[OpKind::send] += {1, 12, 12};
        if (me == 1) e[OpKind::recv] += {1, 12, 0};
    }
    return e;
}

void check_counts(const CommCounts& got, const CommCounts& want, const std::string& where) {
    for (std::size_t i = 0; i < CommCounts::kinds; ++i) {
        INFO(where << ", op " << loom::comm::name(static_cast<OpKind>(i)));
        CHECK(got.ops[i].calls == want.ops[i].calls);
        CHECK(got.ops[i].bytes == want.ops[i].bytes);
        CHECK(got.ops[i].wire_bytes == Approx(want.ops[i].wire_bytes).margin(1e-9));
    }
}

// Values that are not exact in any sum, so a changed order would show.
float noisy(int rank, std::int64_t i) { return std::sin(static_cast<float>(rank * 131 + i)) * 1000.0f / 3.0f; }

}  // namespace

TEST_CASE("Counted counts every op's calls, payload bytes and wire bytes on 1, 2, 3 and 4 ranks") {
    for (int n = 1; n <= 4; ++n) {
        std::vector<CommCounts> counts(static_cast<std::size_t>(n));
        ThreadWorld(n).run([&](ThreadComm& comm) {
            Counted<ThreadComm> counted(std::move(comm));
            exercise(counted);
            counts[static_cast<std::size_t>(counted.rank())] = counted.counts();
        });
        for (int me = 0; me < n; ++me)
            check_counts(counts[static_cast<std::size_t>(me)], expected(n, me),
                         std::to_string(n) + " ranks, rank " + std::to_string(me));
    }
}

TEST_CASE("Counted's wire bytes are the ring formulas: hand-computed values on 3 ranks") {
    std::vector<CommCounts> counts(3);
    ThreadWorld(3).run([&](ThreadComm& comm) {
        Counted<ThreadComm> counted(std::move(comm));
        exercise(counted);
        counts[static_cast<std::size_t>(counted.rank())] = counted.counts();
    });
    const CommCounts& c = counts[2];
    CHECK(c[OpKind::all_reduce] == OpCount{2, 48, 64});       // 2 x 24 bytes x 2(3-1)/3
    CHECK(c[OpKind::reduce_scatter] == OpCount{1, 72, 48});   // 3 blocks of 24 bytes x 2/3
    CHECK(c[OpKind::all_gather] == OpCount{1, 36, 24});       // 3 blocks of 6 bf16 x 2/3
    CHECK(c[OpKind::broadcast] == OpCount{1, 48, 48});        // 6 i64, pipelined: all of it
    CHECK(c[OpKind::all_to_all] == OpCount{1, 72, 48});
    CHECK(c[OpKind::barrier] == OpCount{2, 0, 0});
    CHECK(c[OpKind::send] == OpCount{1, 12, 12});
    CHECK(c[OpKind::recv] == OpCount{1, 12, 0});
    CHECK(c[OpKind::split] == OpCount{});
    CHECK(c.total() == OpCount{10, 300, 244});
    CHECK(counts[0][OpKind::send] == OpCount{2, 24, 24});  // the extra message to rank 1
    CHECK(counts[1][OpKind::recv] == OpCount{2, 24, 0});
}

TEST_CASE("Counted leaves results unchanged: the collective suite, and the wrapped communicator's bits") {
    for (int n = 1; n <= 4; ++n) {
        std::vector<std::string> failures(static_cast<std::size_t>(n));
        ThreadWorld(n).run([&](ThreadComm& comm) {
            Counted<ThreadComm> counted(std::move(comm));
            const int me = counted.rank();
            std::string& failure = failures[static_cast<std::size_t>(me)];
            try {
                for (std::int64_t count : {0, 7, 1000}) loom_test::run_collective_suite(counted, count);
                auto group = counted.split(me % 2, -me);
                loom_test::run_collective_suite(group, 5);
                // Same inputs through Counted and through the communicator it
                // wraps: the same bits.
                const std::int64_t count = 1001;
                std::vector<float> in(static_cast<std::size_t>(n * count));
                for (std::int64_t i = 0; i < n * count; ++i) in[static_cast<std::size_t>(i)] = noisy(me, i);
                auto compare = [&](const char* what, auto run) {
                    std::vector<float> via_counted(in.size()), via_inner(in.size());
                    run(counted, via_counted);
                    run(counted.inner(), via_inner);
                    if (std::memcmp(via_counted.data(), via_inner.data(), in.size() * sizeof(float)) != 0)
                        failure += std::string(what) + " differs; ";
                };
                auto t = [&](std::vector<float>& v, std::int64_t elements) { return Tensor::of(v.data(), {elements}); };
                compare("all_reduce sum", [&](auto& c, std::vector<float>& out) {
                    c.all_reduce(Tensor::of(in.data(), {count}), t(out, count), ReduceOp::sum);
                });
                compare("all_reduce avg async", [&](auto& c, std::vector<float>& out) {
                    c.all_reduce_async(Tensor::of(in.data(), {count}), t(out, count), ReduceOp::avg).wait();
                });
                compare("reduce_scatter", [&](auto& c, std::vector<float>& out) {
                    c.reduce_scatter(Tensor::of(in.data(), {n * count}), t(out, count), ReduceOp::sum);
                });
                compare("all_gather async", [&](auto& c, std::vector<float>& out) {
                    c.all_gather_async(Tensor::of(in.data(), {count}), t(out, n * count)).wait();
                });
                compare("all_to_all", [&](auto& c, std::vector<float>& out) {
                    c.all_to_all(Tensor::of(in.data(), {n * count}), t(out, n * count));
                });
                compare("broadcast", [&](auto& c, std::vector<float>& out) {
                    out = in;
                    c.broadcast(t(out, n * count), 0);
                });
                std::vector<loom::bf16> h(static_cast<std::size_t>(count)), via_counted(h.size()), via_inner(h.size());
                for (std::int64_t i = 0; i < count; ++i) h[static_cast<std::size_t>(i)] = loom::bf16(noisy(me, i));
                counted.all_reduce(Tensor::of(h.data(), {count}), Tensor::of(via_counted.data(), {count}), ReduceOp::avg);
                counted.inner().all_reduce(Tensor::of(h.data(), {count}), Tensor::of(via_inner.data(), {count}),
                                           ReduceOp::avg);
                if (std::memcmp(via_counted.data(), via_inner.data(), h.size() * sizeof(loom::bf16)) != 0)
                    failure += "bf16 all_reduce avg differs; ";
            } catch (const std::exception& e) {
                failure += e.what();
                throw;
            }
        });
        for (int me = 0; me < n; ++me) {
            INFO(n << " ranks, rank " << me);
            CHECK(failures[static_cast<std::size_t>(me)].empty());
        }
    }
}

TEST_CASE("Counted counts async calls when they are issued, before they complete") {
    for (int n : {2, 4}) {
        std::vector<CommCounts> issued(static_cast<std::size_t>(n)), done(static_cast<std::size_t>(n));
        std::vector<int> recv_pending(static_cast<std::size_t>(n), -1);
        ThreadWorld(n).run([&](ThreadComm& comm) {
            Counted<ThreadComm> c(std::move(comm));
            const int me = c.rank();
            const auto i = static_cast<std::size_t>(me);
            std::vector<float> a(k, 1.0f), b(k), big(static_cast<std::size_t>(n * k), 1.0f),
                big2(static_cast<std::size_t>(n * k));
            std::vector<float> c1(k), c2(static_cast<std::size_t>(n * k)), c3(k), c4(static_cast<std::size_t>(n * k));
            loom::comm::Request r1 = c.all_reduce_async(Tensor::of(a.data(), {k}), Tensor::of(b.data(), {k}), ReduceOp::sum);
            loom::comm::Request r2 =
                c.reduce_scatter_async(Tensor::of(big.data(), {n * k}), Tensor::of(c1.data(), {k}), ReduceOp::max);
            loom::comm::Request r3 = c.all_gather_async(Tensor::of(a.data(), {k}), Tensor::of(c2.data(), {n * k}));
            loom::comm::Request r4 = c.broadcast_async(Tensor::of(c3.data(), {k}), 0);
            loom::comm::Request r5 = c.all_to_all_async(Tensor::of(big.data(), {n * k}), Tensor::of(c4.data(), {n * k}));
            // A receive whose send is posted only after the barrier below: it
            // cannot have completed when the counts are read.
            std::vector<float> msg(3);
            loom::comm::Request pending;
            if (me == 1) pending = c.recv_async(Tensor::of(msg.data(), {3}), 0, 7);
            issued[i] = c.counts();
            if (me == 1) recv_pending[i] = pending.test() ? 0 : 1;
            for (auto* r : {&r1, &r2, &r3, &r4, &r5}) r->wait();
            c.barrier();
            if (me == 0) c.send_async(Tensor::of(big2.data(), {3}), 1, 7).wait();
            if (me == 1) pending.wait();
            done[i] = c.counts();
        });
        const double f = static_cast<double>(n - 1) / n;
        for (int me = 0; me < n; ++me) {
            INFO(n << " ranks, rank " << me);
            const CommCounts& c = issued[static_cast<std::size_t>(me)];
            CHECK(c[OpKind::all_reduce] == OpCount{1, 4 * k, 2 * f * 4 * k});
            CHECK(c[OpKind::reduce_scatter] == OpCount{1, 4 * n * k, f * 4 * n * k});
            CHECK(c[OpKind::all_gather] == OpCount{1, 4 * n * k, f * 4 * n * k});
            CHECK(c[OpKind::broadcast] == OpCount{1, 4 * k, 4.0 * k});
            CHECK(c[OpKind::all_to_all] == OpCount{1, 4 * n * k, f * 4 * n * k});
            CHECK(c[OpKind::recv] == (me == 1 ? OpCount{1, 12, 0} : OpCount{}));
            CHECK(c[OpKind::barrier] == OpCount{});
            const CommCounts& d = done[static_cast<std::size_t>(me)];
            CHECK(d[OpKind::barrier] == OpCount{1, 0, 0});
            CHECK(d[OpKind::send] == (me == 0 ? OpCount{1, 12, 12} : OpCount{}));
            CHECK(d[OpKind::all_reduce] == c[OpKind::all_reduce]);  // waiting adds nothing
        }
        CHECK(recv_pending[1] == 1);
    }
}

TEST_CASE("Counted: a call the wrapped communicator refuses is not counted") {
    ThreadWorld(1).run([](ThreadComm& comm) {  // one rank: on this thread, so Catch2 may check here
        Counted<ThreadComm> c(std::move(comm));
        std::vector<float> a(4), b(3);
        CHECK_THROWS(c.all_reduce(Tensor::of(a.data(), {4}), Tensor::of(b.data(), {3}), ReduceOp::sum));
        CHECK_THROWS(c.send_async(Tensor::of(a.data(), {4}), 0, 0));  // to itself: refused at issue
        CHECK(c.counts() == CommCounts{});
        c.all_reduce(Tensor::of(a.data(), {4}), Tensor::of(a.data(), {4}), ReduceOp::sum);
        CHECK(c.counts()[OpKind::all_reduce] == OpCount{1, 16, 0});  // one rank: nothing on the wire
    });
}

TEST_CASE("Counted split groups count on their own; the parent adds them up in counts_with_splits") {
    constexpr int n = 4;
    struct Seen {
        CommCounts half, single, world, world_all, group_after_own_reset, world_all_after_group_reset,
            world_all_after_reset, group_after_world_reset, world_final, world_all_final;
    };
    std::vector<Seen> seen(n);
    ThreadWorld(n).run([&](ThreadComm& comm) {
        Counted<ThreadComm> world(std::move(comm));
        const int me = world.rank();
        Seen& s = seen[static_cast<std::size_t>(me)];
        std::vector<float> x(k, 1.0f);
        const Tensor t = Tensor::of(x.data(), {k});
        world.all_reduce(t, t, ReduceOp::sum);
        {
            auto half = world.split(me % 2, me);  // {0, 2} and {1, 3}
            half.all_reduce(t, t, ReduceOp::sum);
            half.barrier();
            auto single = half.split(half.rank(), 0);  // groups of one
            single.all_reduce(t, t, ReduceOp::sum);
            s.half = half.counts();
            s.single = single.counts();
        }  // the groups are gone; their counts stay in the world's totals
        s.world = world.counts();
        s.world_all = world.counts_with_splits();

        auto group = world.split(0, me);  // all four ranks
        group.broadcast(t, 0);
        group.reset();  // the group only
        s.group_after_own_reset = group.counts();
        s.world_all_after_group_reset = world.counts_with_splits();
        world.reset();  // the world and every group split from it
        s.world_all_after_reset = world.counts_with_splits();
        s.group_after_world_reset = group.counts();
        group.all_reduce(t, t, ReduceOp::sum);
        s.world_final = world.counts();
        s.world_all_final = world.counts_with_splits();
    });
    for (int me = 0; me < n; ++me) {
        INFO("rank " << me);
        const Seen& s = seen[static_cast<std::size_t>(me)];
        CommCounts half;  // 2 ranks: 2(2-1)/2 = 1 x bytes on the wire
        half[OpKind::all_reduce] = {1, 24, 24};
        half[OpKind::barrier] = {1, 0, 0};
        half[OpKind::split] = {1, 0, 0};  // the split into singles
        check_counts(s.half, half, "half");
        CommCounts single;  // 1 rank: nothing on the wire
        single[OpKind::all_reduce] = {1, 24, 0};
        check_counts(s.single, single, "single");
        CommCounts world;  // 4 ranks: 2(4-1)/4 = 1.5 x bytes
        world[OpKind::all_reduce] = {1, 24, 36};
        world[OpKind::split] = {1, 0, 0};
        check_counts(s.world, world, "world");
        CommCounts all;
        all[OpKind::all_reduce] = {3, 72, 60};
        all[OpKind::barrier] = {1, 0, 0};
        all[OpKind::split] = {2, 0, 0};
        check_counts(s.world_all, all, "world with splits");
        CHECK(s.group_after_own_reset == CommCounts{});
        all[OpKind::split] = {3, 0, 0};  // the group's broadcast is gone, its split is the world's
        check_counts(s.world_all_after_group_reset, all, "world with splits after the group's reset");
        CHECK(s.world_all_after_reset == CommCounts{});
        CHECK(s.group_after_world_reset == CommCounts{});
        CHECK(s.world_final == CommCounts{});
        CommCounts last;
        last[OpKind::all_reduce] = {1, 24, 36};
        check_counts(s.world_all_final, last, "world with splits, counting again after reset");
    }
}

TEST_CASE("Counted under a Mesh: the world's counts_with_splits is a step's traffic on every axis") {
    constexpr int n = 8;
    std::vector<CommCounts> step(n), world_only(n);
    ThreadWorld(n).run([&](ThreadComm& comm) {
        Counted<ThreadComm> world(std::move(comm));
        Mesh<Counted<ThreadComm>> mesh(world, {{"dp", 2}, {"tp", 4}});
        world.reset();  // forget the mesh's splits
        std::vector<float> x(k, 1.0f), gathered(4 * k);
        const Tensor t = Tensor::of(x.data(), {k});
        mesh.axis("tp").all_reduce(t, t, ReduceOp::sum);
        mesh.axis("tp").all_gather(t, Tensor::of(gathered.data(), {4 * k}));
        mesh.axis("dp").all_reduce(t, t, ReduceOp::avg);
        mesh.axis("pp").barrier();
        step[static_cast<std::size_t>(world.rank())] = world.counts_with_splits();
        world_only[static_cast<std::size_t>(world.rank())] = world.counts();
    });
    CommCounts want;
    want[OpKind::all_reduce] = {2, 48, 24 * 1.5 + 24 * 1.0};  // tp: 4 ranks, dp: 2 ranks
    want[OpKind::all_gather] = {1, 96, 72};
    want[OpKind::barrier] = {1, 0, 0};
    for (int me = 0; me < n; ++me) {
        check_counts(step[static_cast<std::size_t>(me)], want, "rank " + std::to_string(me));
        CHECK(world_only[static_cast<std::size_t>(me)] == CommCounts{});
    }
}

TEST_CASE("Counted: reset zeroes the counts, which then start again") {
    std::vector<CommCounts> before(2), after(2), again(2);
    ThreadWorld(2).run([&](ThreadComm& comm) {
        Counted<ThreadComm> c(std::move(comm));
        exercise(c);
        const auto i = static_cast<std::size_t>(c.rank());
        before[i] = c.counts();
        c.reset();
        after[i] = c.counts();
        std::vector<float> x(10, 1.0f);
        c.all_reduce(Tensor::of(x.data(), {10}), Tensor::of(x.data(), {10}), ReduceOp::max);
        again[i] = c.counts();
    });
    for (std::size_t i = 0; i < 2; ++i) {
        check_counts(before[i], expected(2, static_cast<int>(i)), "before reset");
        CHECK(after[i] == CommCounts{});
        CommCounts one;
        one[OpKind::all_reduce] = {1, 40, 40};
        CHECK(again[i] == one);
    }
}

TEST_CASE("Counted's counts print as a table: header, the ops called, total") {
    std::string table;
    ThreadWorld(4).run([&](ThreadComm& comm) {
        Counted<ThreadComm> c(std::move(comm));
        exercise(c);
        if (c.rank() == 0) {
            std::ostringstream out;
            out << c.counts();
            table = out.str();
        }
    });
    const std::string want =
        "op                 calls           bytes      wire bytes\n"
        "all_reduce             2              48              72\n"
        "reduce_scatter         1              96              72\n"
        "all_gather             1              48              36\n"
        "broadcast              1              48              48\n"
        "all_to_all             1              96              72\n"
        "barrier                2               0               0\n"
        "send                   2              24              24\n"
        "recv                   1              12               0\n"
        "total                 11             372             324\n";
    CHECK(table == want);
    std::ostringstream empty;
    empty << CommCounts{};
    CHECK(empty.str() ==
          "op                 calls           bytes      wire bytes\n"
          "total                  0               0               0\n");
}

}  // namespace LOOM_TEST_FILE
