// loom::comm::DeviceThreadWorld: several rank threads on one GPU. The
// collective suite every transport runs (host tensors staged through device
// memory), every collective compared bit for bit with the host ThreadWorld on
// the same inputs (f32 and bf16 sums in the same rank order, NaN and signed
// zeros through max), async variants, split, point to point, a rank that
// throws failing the others with the host's sentence, timeouts, and the
// refusals. The refusals that need no device are tagged [check] too, so the
// `--no-device` run exercises them.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/collective_suite.hpp"
#include "device_support.hpp"
#include "staged_collectives.hpp"
#include "loom/comm/device_thread_world.cuh"
#include "loom/comm/thread_world.hpp"
#include "loom/core/buffer_cuda.hpp"

namespace {

using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::comm::CommOptions;
using loom::comm::DeviceThreadComm;
using loom::comm::DeviceThreadWorld;
using loom::comm::ReduceOp;
using loom::comm::Request;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;

static_assert(loom::comm::Communicator<DeviceThreadComm>, "DeviceThreadComm must model loom::comm::Communicator");
static_assert(!std::is_copy_constructible_v<DeviceThreadComm> &&
                  std::is_nothrow_move_constructible_v<DeviceThreadComm>,
              "a DeviceThreadComm is one rank's handle: movable, not copyable");

// Short enough that a broken test fails instead of hanging ctest.
CommOptions test_options() { return CommOptions{.timeout = std::chrono::seconds(60), .check_calls = true}; }

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(message); }

using Bytes = std::vector<std::uint8_t>;

using Staged = loom_test::Staged<DeviceThreadComm>;  // staged_collectives.hpp

// ---- the same call on ThreadWorld and DeviceThreadWorld, bit for bit ------

// A collective under test: `call(comm, send, recv)` on either transport, with
// `send_count` and `recv_count` elements; in place, recv is send.
struct Case {
    std::string name;
    DType dtype = DType::f32;
    std::int64_t send_count = 0, recv_count = 0;
    bool in_place = false;
    std::function<void(ThreadComm&, const Tensor&, const Tensor&)> on_host;
    std::function<void(DeviceThreadComm&, const Tensor&, const Tensor&)> on_device;
};

template <class Call>
Case make_case(std::string name, DType dtype, std::int64_t send_count, std::int64_t recv_count, bool in_place,
               Call call) {
    return Case{std::move(name), dtype, send_count, recv_count, in_place,
                [call](ThreadComm& c, const Tensor& s, const Tensor& r) { call(c, s, r); },
                [call](DeviceThreadComm& c, const Tensor& s, const Tensor& r) { call(c, s, r); }};
}

// Rank r's input: uniform values in [-1, 1) (integers in [-1000, 1000)),
// rounded to `dtype`; with `specials`, NaNs of different payloads on
// different ranks and signed zeros, for max.
Bytes make_input(DType dtype, std::int64_t count, int rank, bool specials) {
    std::mt19937 rng(1234u + static_cast<unsigned>(rank) * 7919u + static_cast<unsigned>(dtype) * 31u);
    std::uniform_real_distribution<float> real(-1.0f, 1.0f);
    std::uniform_int_distribution<int> integer(-1000, 999);
    Bytes bytes(static_cast<std::size_t>(count) * loom::size_of(dtype));
    for (std::int64_t i = 0; i < count; ++i) {
        float value = real(rng);
        if (specials && i % 11 == 3) value = loom::detail::bit_cast<float>(0x7fc0'0000u | static_cast<std::uint32_t>(rank + 1));
        if (specials && i % 13 == 5) value = rank % 2 == 0 ? -0.0f : 0.0f;
        if (specials && i % 17 == 7) value = rank % 2 == 0 ? 0.0f : -0.0f;
        void* at = bytes.data() + static_cast<std::size_t>(i) * loom::size_of(dtype);
        switch (dtype) {
            case DType::f32: std::memcpy(at, &value, 4); break;
            case DType::bf16: { const loom::bf16 x(value); std::memcpy(at, &x, 2); break; }
            case DType::f16: { const loom::f16 x(value); std::memcpy(at, &x, 2); break; }
            case DType::i32: { const std::int32_t x = integer(rng); std::memcpy(at, &x, 4); break; }
            case DType::i64: { const std::int64_t x = integer(rng); std::memcpy(at, &x, 8); break; }
        }
    }
    return bytes;
}

// Each rank's result bytes (recv, or send when in place), from both worlds.
struct Results {
    std::vector<Bytes> host, device;
};

Results run_both(const Case& c, int ranks, bool specials) {
    const std::size_t width = loom::size_of(c.dtype);
    std::vector<Bytes> inputs;
    for (int r = 0; r < ranks; ++r) inputs.push_back(make_input(c.dtype, c.send_count, r, specials));
    const std::size_t out_bytes = static_cast<std::size_t>(c.in_place ? c.send_count : c.recv_count) * width;
    Results results{std::vector<Bytes>(static_cast<std::size_t>(ranks)), std::vector<Bytes>(static_cast<std::size_t>(ranks))};

    ThreadWorld(ranks, test_options()).run([&](ThreadComm& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        Bytes send = inputs[r];
        Bytes recv(static_cast<std::size_t>(c.recv_count) * width, 0xab);
        const Tensor s(send.data(), c.dtype, Shape{c.send_count});
        const Tensor o(recv.data(), c.dtype, Shape{c.recv_count});
        c.on_host(comm, s, c.in_place ? s : o);
        results.host[r] = c.in_place ? send : recv;
    });

    DeviceThreadWorld(ranks, 0, test_options()).run([&](DeviceThreadComm& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        loom::Buffer<loom::Cuda> send(c.dtype, Shape{c.send_count}, comm.device());
        loom::Buffer<loom::Cuda> recv(c.dtype, Shape{c.recv_count}, comm.device());
        const Tensor s = send.tensor(), o = recv.tensor();
        if (s.nbytes() != 0)
            LOOM_CUDA_CHECK(cudaMemcpyAsync(s.raw(), inputs[r].data(), s.nbytes(), cudaMemcpyHostToDevice, comm.stream()));
        if (o.nbytes() != 0) LOOM_CUDA_CHECK(cudaMemsetAsync(o.raw(), 0xab, o.nbytes(), comm.stream()));
        c.on_device(comm, s, c.in_place ? s : o);
        Bytes out(out_bytes);
        const Tensor& result = c.in_place ? s : o;
        if (!out.empty())
            LOOM_CUDA_CHECK(cudaMemcpyAsync(out.data(), result.raw(), out.size(), cudaMemcpyDeviceToHost, comm.stream()));
        LOOM_CUDA_CHECK(cudaStreamSynchronize(comm.stream()));
        results.device[r] = std::move(out);
    });
    return results;
}

void check_same_bits(const Case& c, int ranks, bool specials = false) {
    const Results results = run_both(c, ranks, specials);
    const std::size_t width = loom::size_of(c.dtype);
    for (int r = 0; r < ranks; ++r) {
        const Bytes& host = results.host[static_cast<std::size_t>(r)];
        const Bytes& device = results.device[static_cast<std::size_t>(r)];
        loom_test::Mismatches bad;
        if (host.size() != device.size()) bad.add("sizes differ");
        for (std::size_t i = 0; bad.count == 0 && i < host.size(); i += width) {
            if (std::memcmp(host.data() + i, device.data() + i, width) == 0) continue;
            std::uint64_t h = 0, d = 0;
            std::memcpy(&h, host.data() + i, width);
            std::memcpy(&d, device.data() + i, width);
            bad.add("element " + std::to_string(i / width) + ": device bits " + std::to_string(d) + ", host bits " +
                    std::to_string(h));
        }
        CHECK_NO_MISMATCHES(c.name + " on " + std::to_string(ranks) + " ranks, rank " + std::to_string(r), bad);
    }
}

}  // namespace

TEST_CASE("DeviceThreadWorld passes the collective suite", "[device][thread_world]") {
    for (int ranks : {1, 2, 3, 5}) {
        INFO(ranks << " ranks");
        CHECK_NOTHROW(DeviceThreadWorld(ranks, 0, test_options()).run([](DeviceThreadComm& comm) {
            Staged staged(comm);
            for (std::int64_t count : {0, 1, 7, 1000, 4099}) loom_test::run_collective_suite(staged, count);
        }));
    }
}

TEST_CASE("DeviceThreadWorld reduces bit for bit as ThreadWorld does", "[device][thread_world]") {
    constexpr std::int64_t n = 4099;  // odd: shares end mid cache line
    for (int ranks : {2, 3, 5}) {
        const std::int64_t all = ranks * n;
        std::vector<Case> cases;
        for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64})
            for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
                for (bool in_place : {false, true})
                    cases.push_back(make_case(std::string("all_reduce ") + std::string(loom::comm::name(op)) + " of " +
                                                  std::string(loom::name(dtype)) + (in_place ? " in place" : ""),
                                              dtype, n, n, in_place, [op](auto& comm, const Tensor& s, const Tensor& r) {
                                                  comm.all_reduce(s, r, op);
                                              }));
        for (DType dtype : {DType::f32, DType::bf16})
            for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
                cases.push_back(make_case(std::string("reduce_scatter ") + std::string(loom::comm::name(op)) + " of " +
                                              std::string(loom::name(dtype)),
                                          dtype, all, n, false, [op](auto& comm, const Tensor& s, const Tensor& r) {
                                              comm.reduce_scatter(s, r, op);
                                          }));
        cases.push_back(make_case("all_gather of bf16", DType::bf16, n, all, false,
                                  [](auto& comm, const Tensor& s, const Tensor& r) { comm.all_gather(s, r); }));
        cases.push_back(make_case("all_to_all of f32", DType::f32, all, all, false,
                                  [](auto& comm, const Tensor& s, const Tensor& r) { comm.all_to_all(s, r); }));
        cases.push_back(make_case("all_to_all of i64 in place", DType::i64, all, all, true,
                                  [](auto& comm, const Tensor& s, const Tensor& r) { comm.all_to_all(s, r); }));
        cases.push_back(make_case("broadcast of f16 from the last rank", DType::f16, n, n, true,
                                  [](auto& comm, const Tensor& s, const Tensor&) { comm.broadcast(s, comm.size() - 1); }));
        for (const Case& c : cases) {
            check_same_bits(c, ranks);
            if (c.name.find("max") != std::string::npos) check_same_bits(c, ranks, /*specials=*/true);
        }
    }
}

TEST_CASE("DeviceThreadWorld's async collectives match ThreadWorld's blocking ones", "[device][thread_world]") {
    constexpr std::int64_t n = 1000;
    for (int ranks : {2, 3, 4}) {
        const std::int64_t all = ranks * n;
        // Five results laid end to end: all_reduce (n), reduce_scatter (n),
        // all_gather (all), broadcast (n), all_to_all (all).
        const std::int64_t total = 3 * n + 2 * all;
        const std::size_t width = sizeof(float);
        std::vector<Bytes> inputs, host(static_cast<std::size_t>(ranks)), device(static_cast<std::size_t>(ranks));
        for (int r = 0; r < ranks; ++r) inputs.push_back(make_input(DType::f32, all, r, false));
        auto parts = [&](const Tensor& out) {
            return std::vector<Tensor>{out.slice(0, 0, n), out.slice(0, n, 2 * n), out.slice(0, 2 * n, 2 * n + all),
                                       out.slice(0, 2 * n + all, 3 * n + all), out.slice(0, 3 * n + all, total)};
        };

        ThreadWorld(ranks, test_options()).run([&](ThreadComm& comm) {
            const auto r = static_cast<std::size_t>(comm.rank());
            Bytes send = inputs[r], out(static_cast<std::size_t>(total) * width);
            const Tensor s(send.data(), DType::f32, Shape{all});
            const auto p = parts(Tensor(out.data(), DType::f32, Shape{total}));
            std::memcpy(p[3].raw(), send.data(), p[3].nbytes());  // the broadcast buffer starts as s[0, n)
            comm.all_reduce(s.slice(0, 0, n), p[0], ReduceOp::sum);
            comm.reduce_scatter(s, p[1], ReduceOp::avg);
            comm.all_gather(s.slice(0, n, 2 * n), p[2]);
            comm.broadcast(p[3], ranks - 1);
            comm.all_to_all(s, p[4]);
            host[r] = std::move(out);
        });

        DeviceThreadWorld(ranks, 0, test_options()).run([&](DeviceThreadComm& comm) {
            const auto r = static_cast<std::size_t>(comm.rank());
            loom::Buffer<loom::Cuda> send(DType::f32, Shape{all}, comm.device());
            loom::Buffer<loom::Cuda> out(DType::f32, Shape{total}, comm.device());
            const Tensor s = send.tensor();
            const auto p = parts(out.tensor());
            LOOM_CUDA_CHECK(cudaMemcpyAsync(s.raw(), inputs[r].data(), s.nbytes(), cudaMemcpyHostToDevice, comm.stream()));
            LOOM_CUDA_CHECK(cudaMemcpyAsync(p[3].raw(), s.raw(), p[3].nbytes(), cudaMemcpyDeviceToDevice, comm.stream()));
            // All five in flight at once (they only read s), waited in reverse order.
            Request r1 = comm.all_reduce_async(s.slice(0, 0, n), p[0], ReduceOp::sum);
            Request r2 = comm.reduce_scatter_async(s, p[1], ReduceOp::avg);
            Request r3 = comm.all_gather_async(s.slice(0, n, 2 * n), p[2]);
            Request r4 = comm.broadcast_async(p[3], ranks - 1);
            Request r5 = comm.all_to_all_async(s, p[4]);
            r5.wait();
            r4.wait();
            r3.wait();
            while (!r2.test()) {
            }
            r1.wait();
            if (!r1.done() || !r2.done() || !r5.done()) fail("a finished request is not done");
            // wait() means complete: a plain device-wide copy sees the results.
            Bytes result(static_cast<std::size_t>(total) * width);
            LOOM_CUDA_CHECK(cudaMemcpy(result.data(), out.tensor().raw(), result.size(), cudaMemcpyDeviceToHost));
            device[r] = std::move(result);
        });

        for (int r = 0; r < ranks; ++r) {
            INFO(ranks << " ranks, rank " << r);
            CHECK(host[static_cast<std::size_t>(r)] == device[static_cast<std::size_t>(r)]);
        }
    }
}

TEST_CASE("DeviceThreadWorld splits into groups that share the rank's stream", "[device][thread_world]") {
    CHECK_NOTHROW(DeviceThreadWorld(4, 0, test_options()).run([&](DeviceThreadComm& comm) {
        const int n = comm.size(), me = comm.rank();
        auto sum_of_ranks = [](DeviceThreadComm& c) {  // sum over the group of (world rank + 1)
            std::int64_t value = c.world_rank() + 1;
            Staged(c).all_reduce(Tensor::of(&value, Shape{1}), Tensor::of(&value, Shape{1}), ReduceOp::sum);
            return value;
        };
        DeviceThreadComm reversed = comm.split(0, n - 1 - me);
        if (reversed.size() != n || reversed.rank() != n - 1 - me) fail("split(0, n - 1 - rank) kept the old order");
        if (reversed.stream() != comm.stream()) fail("a split communicator has a stream of its own");
        DeviceThreadComm parity = comm.split(me % 2, me);
        if (parity.size() != 2 || parity.rank() != me / 2) fail("split by parity is wrong");
        const std::int64_t expected = me % 2 == 0 ? 1 + 3 : 2 + 4;
        if (sum_of_ranks(parity) != expected) fail("all_reduce on a split group is wrong");
        if (sum_of_ranks(reversed) != 10) fail("all_reduce on the reversed group is wrong");
        comm.barrier();
    }));
}

TEST_CASE("DeviceThreadWorld reports a send/recv mismatch on both sides", "[device][thread_world]") {
    std::vector<std::string> seen(2);
    const std::string expected = "send/recv mismatch: world rank 0 sent 4 x f32 with tag 3, world rank 1 expected 5 x f32";
    REQUIRE_THROWS_WITH(DeviceThreadWorld(2, 0, test_options()).run([&](DeviceThreadComm& comm) {
        loom::Buffer<loom::Cuda> buffer(DType::f32, Shape{5}, comm.device());
        try {
            if (comm.rank() == 0)
                comm.send(buffer.tensor().slice(0, 0, 4), 1, 3);
            else
                comm.recv(buffer.tensor(), 0, 3);
        } catch (const loom::Error& e) {
            seen[static_cast<std::size_t>(comm.rank())] = e.message();
            throw;
        }
    }), Catch::StartsWith(expected));
    CHECK(seen[0] == expected);
    CHECK(seen[1] == expected);
}

TEST_CASE("A DeviceThreadWorld rank that throws fails the others with its message", "[device][thread_world]") {
    std::vector<std::string> seen(3);
    REQUIRE_THROWS_WITH(DeviceThreadWorld(3, 0, test_options()).run([&](DeviceThreadComm& comm) {
        loom::Buffer<loom::Cuda> buffer(DType::f32, Shape{16}, comm.device());
        comm.all_reduce(buffer.tensor(), buffer.tensor(), ReduceOp::sum);  // one call that works
        if (comm.rank() == 1) throw std::runtime_error("boom at step 3");
        try {
            Request pending = comm.all_reduce_async(buffer.tensor(), buffer.tensor(), ReduceOp::sum);
            pending.wait();
        } catch (const loom::Error& e) {
            seen[static_cast<std::size_t>(comm.rank())] = e.message();
        }
    }), "boom at step 3");
    CHECK(seen[0] == "rank 1 failed: boom at step 3");
    CHECK(seen[2] == "rank 1 failed: boom at step 3");
}

TEST_CASE("A DeviceThreadWorld rank that never arrives is named after the timeout", "[device][thread_world]") {
    const CommOptions quick{.timeout = std::chrono::milliseconds(300), .check_calls = true};
    REQUIRE_THROWS_WITH(DeviceThreadWorld(2, 0, quick).run([](DeviceThreadComm& comm) {
        if (comm.rank() == 0) comm.barrier();
    }), Catch::StartsWith("barrier (call 0 of a 2-rank group) timed out after 300 ms: world rank 1 never arrived"));
}

TEST_CASE("DeviceThreadWorld reports a collective that differs between ranks on every rank", "[device][thread_world]") {
    std::vector<std::string> seen(2);
    CHECK_NOTHROW(DeviceThreadWorld(2, 0, test_options()).run([&](DeviceThreadComm& comm) {
        loom::Buffer<loom::Cuda> buffer(DType::f32, Shape{8}, comm.device());
        const Tensor mine = buffer.tensor().slice(0, 0, comm.rank() == 0 ? 4 : 5);
        try {
            comm.all_reduce(mine, mine, ReduceOp::sum);
        } catch (const loom::Error& e) {
            seen[static_cast<std::size_t>(comm.rank())] = e.message();
        }
        comm.barrier();  // still usable: nothing was enqueued
    }));
    const std::string expected = "collective call 0 differs between ranks: rank 0 called all_reduce of 4 x f32 (sum), "
                                 "rank 1 called all_reduce of 5 x f32 (sum)";
    CHECK(seen[0] == expected);
    CHECK(seen[1] == expected);
}

TEST_CASE("DeviceThreadComm refuses buffers it cannot move, naming them", "[device][thread_world]") {
    std::vector<std::string> failures;
    CHECK_NOTHROW(DeviceThreadWorld(2, 0, test_options()).run([&](DeviceThreadComm& comm) {
        if (comm.rank() != 0) return;
        std::vector<float> host(8);
        const Tensor h = Tensor::of(host.data(), Shape{8});
        loom::Buffer<loom::Cuda> buffer(DType::f32, Shape{8}, comm.device());
        const Tensor d = buffer.tensor();
        const Tensor elsewhere(d.raw(), DType::f32, Shape{8}, loom::cuda_device(1));
        auto expect = [&](auto&& call, const std::string& start) {
            try {
                call();
                failures.push_back("no error; expected: " + start);
            } catch (const loom::Error& e) {
                if (e.message().rfind(start, 0) != 0) failures.push_back(e.message() + "; expected: " + start);
            }
        };
        expect([&] { comm.all_reduce(h, h, ReduceOp::sum); },
               "all_reduce: the send buffer is on host but this communicator moves cuda memory");
        expect([&] { comm.all_gather(d.slice(0, 0, 4), h); },
               "all_gather: the recv buffer is on host but this communicator moves cuda memory");
        expect([&] { (void)comm.broadcast_async(h, 0); }, "broadcast: the broadcast buffer is on host");
        expect([&] { (void)comm.send_async(h, 1, 0); }, "send: the send buffer is on host");
        expect([&] { comm.recv(h, 1, 0); }, "recv: the recv buffer is on host");
        expect([&] { comm.all_reduce(d, elsewhere, ReduceOp::sum); },
               "all_reduce: the recv buffer is on cuda:1 but this communicator runs on cuda:0");
        expect([&] { comm.broadcast(d, 2); }, "broadcast: root 2 is not a rank of this communicator (0..1)");
        expect([&] { (void)comm.split(-1, 0); }, "split: color -1 is negative");
    }));
    for (const std::string& failure : failures) FAIL_CHECK(failure);
}

// No device needed: the refusals before the first CUDA call, the device count
// (0 here without a GPU) and the memory floor's message.
TEST_CASE("DeviceThreadWorld refuses worlds it cannot hold", "[device][thread_world][check]") {
    using Catch::StartsWith;
    REQUIRE_THROWS_WITH(DeviceThreadWorld(0),
                        StartsWith("DeviceThreadWorld: 0 ranks requested; a world has at least 1 rank"));
    REQUIRE_THROWS_WITH(DeviceThreadWorld(65), StartsWith("DeviceThreadWorld: 65 ranks requested; at most 64 ranks "
                                                          "share one device"));
    REQUIRE_THROWS_WITH(DeviceThreadWorld(2, 0, CommOptions{.timeout = std::chrono::milliseconds(0)}),
                        StartsWith("DeviceThreadWorld: timeout 0 ms must be positive"));
    REQUIRE_THROWS_WITH(DeviceThreadWorld(2, 999), StartsWith("DeviceThreadWorld: CUDA device 999 does not exist"));
    constexpr std::size_t mib = std::size_t{1} << 20;
    REQUIRE_THROWS_WITH(loom::comm::detail::check_device_room(8, 0, 200 * mib, 1000 * mib,
                                                              DeviceThreadWorld::min_free_bytes_per_rank),
                        StartsWith("DeviceThreadWorld: 8 ranks on cuda:0 need at least 256 MiB free (32 MiB per rank); "
                                   "the device has 200 MiB free of 1000 MiB. Use fewer ranks or free device memory"));
    REQUIRE_NOTHROW(loom::comm::detail::check_device_room(8, 0, 256 * mib, 1000 * mib,
                                                          DeviceThreadWorld::min_free_bytes_per_rank));
}
