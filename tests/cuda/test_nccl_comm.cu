// loom::comm::Nccl on this machine's GPUs: the collective suite every
// transport runs (host tensors staged through device memory), bf16/f16 sums
// accumulated in f32 and rounded once, bootstrap over a host communicator,
// split, the timeout that aborts, the messages for buffers it cannot move, and
// the process joiner (cuda_backend_nccl.cuh) that train_gpt uses under mpirun.
#include <catch2/catch.hpp>

#if LOOM_TEST_NCCL
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/collective_suite.hpp"
#include "loom/comm/communicator_nccl.cuh"
#include "loom/comm/device_processes.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/cuda_backend_nccl.cuh"
#include "staged_collectives.hpp"
#include "support/message_of.hpp"

namespace {

using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::comm::CommOptions;
using loom::comm::Nccl;
using loom::comm::ReduceOp;
using loom::comm::Request;

static_assert(loom::comm::Communicator<Nccl>, "Nccl must model loom::comm::Communicator");
static_assert(!std::is_copy_constructible_v<Nccl> && std::is_nothrow_move_constructible_v<Nccl>,
              "an Nccl owns its NCCL communicator: movable, not copyable");

// Short enough that a broken test fails instead of hanging ctest; every
// collective compared across ranks, so the signature check runs too.
CommOptions test_options() { return CommOptions{.timeout = std::chrono::seconds(60), .check_calls = true}; }

std::vector<int> all_devices() {
    int count = 0;
    LOOM_CUDA_CHECK(cudaGetDeviceCount(&count));
    std::vector<int> devices(static_cast<std::size_t>(count));
    for (int d = 0; d < count; ++d) devices[static_cast<std::size_t>(d)] = d;
    return devices;
}

// Runs body(comm) on one thread per communicator; Catch2 is not thread-safe,
// so ranks throw and the failures are reported here, one per rank.
template <class Body>
void on_rank_threads(std::vector<Nccl>& comms, Body body) {
    std::vector<std::string> failures(comms.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < comms.size(); ++r)
        threads.emplace_back([&, r] {
            try {
                LOOM_CUDA_CHECK(cudaSetDevice(comms[r].device().index));
                body(comms[r]);
            } catch (const std::exception& e) {
                failures[r] = e.what();
            }
        });
    for (auto& thread : threads) thread.join();
    for (std::size_t r = 0; r < comms.size(); ++r) {
        INFO("rank " << r);
        CHECK(failures[r] == "");
    }
}

// Nccl on host tensors; each blocking call synchronizes before copying home.
using Staged = loom_test::Staged<Nccl, /*synchronize_each_call=*/true>;  // staged_collectives.hpp

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error(message); }

template <class T>
std::uint16_t bits_of(T value) {
    return value.bits;
}
template <class T>
bool same_or_both_nan(T a, T b) {
    return a.bits == b.bits || (std::isnan(loom::to_float(a)) && std::isnan(loom::to_float(b)));
}

// Rank 0 holds 1, the others `small`, half an ulp of 1 in T: rounding the
// running sum to T after every addition loses every `small` (each addition
// ties to even, back to 1), while one rounding of the f32 sum keeps them.
// Scaled by powers of two so several exponents are covered.
template <class T>
void check_f32_accumulation(Staged& comm, float small) {
    const int n = comm.size(), me = comm.rank();
    constexpr std::int64_t count = 64;
    auto value = [&](int rank, std::int64_t i) {
        return std::ldexp(rank == 0 ? 1.0f : small, static_cast<int>(i % 8) - 3);
    };
    std::vector<T> send(static_cast<std::size_t>(n * count)), recv(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < n * count; ++i) send[static_cast<std::size_t>(i)] = T(value(me, i));
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        for (bool scatter : {false, true}) {
            const Tensor in = Tensor::of(send.data(), Shape{scatter ? n * count : count});
            const Tensor out = Tensor::of(recv.data(), Shape{count});
            if (scatter)
                comm.reduce_scatter(in, out, op);
            else
                comm.all_reduce(in, out, op);
            for (std::int64_t i = 0; i < count; ++i) {
                const std::int64_t at = scatter ? me * count + i : i;
                float sum = 0, stepwise = 0;  // exact in f32 for these values
                for (int r = 0; r < n; ++r) {
                    sum += value(r, at);
                    stepwise = loom::to_float(T(stepwise + value(r, at)));
                }
                const T expected(op == ReduceOp::avg ? sum / static_cast<float>(n) : sum);
                const T got = recv[static_cast<std::size_t>(i)];
                if (got.bits != expected.bits)
                    fail(std::string(scatter ? "reduce_scatter " : "all_reduce ") + std::string(loom::comm::name(op)) +
                         " of " + std::string(loom::name(loom::dtype_of<T>)) + " element " + std::to_string(i) +
                         ": got " + std::to_string(loom::to_float(got)) + ", expected " +
                         std::to_string(loom::to_float(expected)));
                if (n >= 3 && op == ReduceOp::sum && loom::to_float(T(stepwise)) == loom::to_float(expected))
                    fail("test data: rounding every step would give the same sum; the check proves nothing");
            }
        }
    }
}

// Every 16-bit pattern through widen, reduce and narrow: every rank holds the
// same values, so max returns them (NaN as a NaN), sum returns n x rounded
// once (exact in f32 for n <= 8), avg that divided by n.
template <class T>
void check_every_pattern(Staged& comm) {
    const int n = comm.size();
    constexpr std::int64_t count = 1 << 16;
    std::vector<T> send(count), recv(count);
    for (std::int64_t i = 0; i < count; ++i)
        send[static_cast<std::size_t>(i)] = T::from_bits(static_cast<std::uint16_t>(i));
    const Tensor in = Tensor::of(send.data(), Shape{count});
    const Tensor out = Tensor::of(recv.data(), Shape{count});
    for (ReduceOp op : {ReduceOp::max, ReduceOp::sum, ReduceOp::avg}) {
        comm.all_reduce(in, out, op);
        for (std::int64_t i = 0; i < count; ++i) {
            const float x = loom::to_float(send[static_cast<std::size_t>(i)]);
            const float total = static_cast<float>(static_cast<double>(x) * n);
            const T expected = op == ReduceOp::max ? send[static_cast<std::size_t>(i)]
                                                   : T(op == ReduceOp::sum ? total : total / static_cast<float>(n));
            const T got = recv[static_cast<std::size_t>(i)];
            if (!same_or_both_nan(got, expected))
                fail(std::string(loom::comm::name(op)) + " of " + std::string(loom::name(loom::dtype_of<T>)) +
                     " bits " + std::to_string(i) + " gave bits " + std::to_string(bits_of(got)) + ", expected " +
                     std::to_string(bits_of(expected)));
        }
    }
}

__global__ void hold_stream(const volatile int* release, long long max_cycles) {
    const long long start = clock64();
    while (*release == 0 && clock64() - start < max_cycles) {
    }
}

}  // namespace

TEST_CASE("Nccl passes the collective suite on every visible GPU", "[nccl][device]") {
    auto comms = Nccl::in_process(all_devices(), test_options());
    on_rank_threads(comms, [](Nccl& nccl) {
        Staged staged(nccl);
        for (std::int64_t count : {0, 1, 7, 1000, 4099})
            loom_test::run_collective_suite(staged, count, loom_test::PointToPoint::in_posting_order);
    });
}

TEST_CASE("Nccl sums bf16 and f16 in f32 and rounds once", "[nccl][device]") {
    auto comms = Nccl::in_process(all_devices(), test_options());
    if (comms.size() < 3)
        WARN("with " << comms.size() << " GPU(s) a sum has at most one addition, so f32 accumulation is checked "
                     "against the reference only, not against per-step rounding");
    on_rank_threads(comms, [](Nccl& nccl) {
        Staged staged(nccl);
        check_f32_accumulation<loom::bf16>(staged, 0x1p-8f);
        check_f32_accumulation<loom::f16>(staged, 0x1p-11f);
        check_every_pattern<loom::bf16>(staged);
        check_every_pattern<loom::f16>(staged);
    });
}

TEST_CASE("Nccl pairs a link's messages in the order they were posted, batched or not, whatever their tags",
          "[nccl][device]") {
    auto comms = Nccl::in_process(all_devices(), test_options());
    if (comms.size() < 2) {
        WARN("needs 2 GPUs; " << comms.size() << " visible");
        return;
    }
    // Rank 0 posts tags 5, 3, 7 in one batch (issued by the last, blocking,
    // call), as a pipeline stage posts a header and a body per micro-batch;
    // rank 1 receives them one blocking call at a time, each its own batch.
    // Counts differ per message, so a message paired with the wrong one
    // cannot go unnoticed. (Sorting a batch by tag sent 3 first.)
    on_rank_threads(comms, [](Nccl& nccl) {
        if (nccl.rank() > 1) return;
        Staged staged(nccl);
        auto values = [](int tag) {
            std::vector<std::int32_t> v(static_cast<std::size_t>(tag));
            for (int i = 0; i < tag; ++i) v[static_cast<std::size_t>(i)] = 100 * tag + i;
            return v;
        };
        auto five = values(5), three = values(3), seven = values(7);
        auto tensor = [](std::vector<std::int32_t>& v) {
            return Tensor::of(v.data(), Shape{static_cast<std::int64_t>(v.size())});
        };
        if (nccl.rank() == 0) {
            Request a = staged.send_async(tensor(five), 1, 5);
            Request b = staged.send_async(tensor(three), 1, 3);
            staged.send(tensor(seven), 1, 7);
            a.wait();
            b.wait();
            return;
        }
        std::vector<std::int32_t> got3(3), got5(5), got7(7);
        staged.recv(tensor(got5), 0, 5);
        staged.recv(tensor(got3), 0, 3);
        staged.recv(tensor(got7), 0, 7);
        if (got3 != three || got5 != five || got7 != seven) fail("a message reached the wrong receive");
    });
}

TEST_CASE("Nccl::bootstrap joins the ranks of a host communicator, and split groups them", "[nccl][device]") {
    const std::vector<int> devices = all_devices();
    loom::comm::ThreadWorld world(static_cast<int>(devices.size()));
    REQUIRE_NOTHROW(world.run([&](loom::comm::ThreadComm& host) {
        LOOM_CUDA_CHECK(cudaSetDevice(devices[static_cast<std::size_t>(host.rank())]));
        Nccl nccl = Nccl::bootstrap(host, devices[static_cast<std::size_t>(host.rank())], std::nullopt, test_options());
        if (nccl.rank() != host.rank() || nccl.size() != host.size()) fail("bootstrap changed the ranks");
        const int n = nccl.size(), me = nccl.rank();
        auto sum_of_ranks = [](Nccl& comm) {  // sum over the group of (rank + 1)
            std::int64_t value = comm.rank() + 1;
            Staged(comm).all_reduce(Tensor::of(&value, Shape{1}), Tensor::of(&value, Shape{1}), ReduceOp::sum);
            return value;
        };
        if (sum_of_ranks(nccl) != std::int64_t{n} * (n + 1) / 2) fail("all_reduce after bootstrap is wrong");
        Nccl reversed = nccl.split(0, n - 1 - me);  // one group, ordered by key
        if (reversed.size() != n || reversed.rank() != n - 1 - me) fail("split(0, n - 1 - rank) kept the old order");
        Nccl parity = nccl.split(me % 2, me);
        if (parity.size() != (n - me % 2 + 1) / 2 || parity.rank() != me / 2) fail("split by parity is wrong");
        const std::int64_t members = parity.size();
        if (sum_of_ranks(parity) != members * (members + 1) / 2) fail("all_reduce on a split group is wrong");
        nccl.barrier();
    }));
}

TEST_CASE("Nccl rejects buffers it cannot move, naming them", "[nccl][device]") {
    LOOM_CUDA_CHECK(cudaSetDevice(0));
    auto comms = Nccl::in_process({0}, test_options());
    Nccl& nccl = comms[0];
    std::vector<float> host(8);
    const Tensor h = Tensor::of(host.data(), Shape{8});
    loom::Buffer<loom::Cuda> buffer(DType::f32, Shape{8});
    const Tensor d = buffer.tensor();

    using Catch::StartsWith;
    REQUIRE_THROWS_WITH(nccl.all_reduce(h, h, ReduceOp::sum),
                        StartsWith("all_reduce: the send buffer is on host but this communicator moves cuda memory"));
    REQUIRE_THROWS_WITH(nccl.all_gather(d, h),
                        StartsWith("all_gather: the recv buffer is on host but this communicator moves cuda memory"));
    REQUIRE_THROWS_WITH(nccl.broadcast_async(h, 0), StartsWith("broadcast: the broadcast buffer is on host"));
    REQUIRE_THROWS_WITH(nccl.send_async(h, 0, 0), StartsWith("send: the send buffer is on host"));
    const Tensor elsewhere(d.raw(), DType::f32, Shape{8}, loom::cuda_device(1));
    REQUIRE_THROWS_WITH(nccl.all_reduce(d, elsewhere, ReduceOp::sum),
                        StartsWith("all_reduce: the recv buffer is on cuda:1 but this communicator runs on cuda:0"));
    REQUIRE_THROWS_WITH(nccl.broadcast(d, 1),
                        StartsWith("broadcast: root 1 is not a rank of this communicator (0..0)"));
    REQUIRE_THROWS_WITH(nccl.split(-1, 0), StartsWith("split: color -1 is negative"));
    REQUIRE_THROWS_WITH(Nccl::in_process({0, 0}),
                        Catch::Contains("NCCL cannot put two ranks of one communicator on one GPU"));
    REQUIRE_THROWS_WITH(Nccl::in_process({999}), StartsWith("Nccl: CUDA device 999 does not exist"));
    // Rejected calls touch nothing: the communicator still works.
    nccl.all_reduce(d, d, ReduceOp::sum);
    nccl.barrier();
}

TEST_CASE("Nccl aborts and throws when an operation outlives the timeout", "[nccl][device]") {
    LOOM_CUDA_CHECK(cudaSetDevice(0));
    auto comms = Nccl::in_process({0}, CommOptions{.timeout = std::chrono::milliseconds(200), .check_calls = false});
    Nccl& nccl = comms[0];
    int* release = nullptr;
    LOOM_CUDA_CHECK(cudaHostAlloc(&release, sizeof(int), cudaHostAllocMapped));
    *release = 0;
    int* device_release = nullptr;
    LOOM_CUDA_CHECK(cudaHostGetDevicePointer(&device_release, release, 0));
    loom::Buffer<loom::Cuda> buffer(DType::f32, Shape{16});

    // The stream is held behind a kernel, as if a peer never arrived, and let
    // go after a second in case the abort waits for the stream. The request
    // is for no elements, so no NCCL work is queued behind the kernel: the
    // wait is for its event, which is what every Request waits for.
    hold_stream<<<1, 1, 0, nccl.stream()>>>(device_release, 20'000'000'000LL);
    LOOM_CUDA_CHECK(cudaGetLastError());
    std::thread releaser([release] {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        *static_cast<volatile int*>(release) = 1;
    });
    const Tensor nothing = buffer.tensor().slice(0, 0, 0);
    Request request = nccl.all_reduce_async(nothing, nothing, ReduceOp::sum);
    CHECK_THROWS_WITH(request.wait(),
                      Catch::StartsWith("all_reduce did not complete within 200 ms on rank 0 of 1 on cuda:0"));
    CHECK_THROWS_WITH(nccl.barrier(), Catch::Contains("was aborted and cannot be used"));
    releaser.join();
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    LOOM_CUDA_CHECK(cudaFreeHost(release));
}

TEST_CASE("Nccl reports a collective that differs between ranks on every rank", "[nccl][device]") {
    auto comms = Nccl::in_process(all_devices(), test_options());
    if (comms.size() < 2) {
        WARN("needs 2 GPUs; " << comms.size() << " visible");
        return;
    }
    on_rank_threads(comms, [](Nccl& nccl) {
        loom::Buffer<loom::Cuda> buffer(DType::f32, Shape{8}, nccl.device());
        const std::int64_t count = nccl.rank() == 0 ? 4 : 5;
        const Tensor mine = buffer.tensor().slice(0, 0, count);
        const std::string expected = "collective call 1 differs between ranks: rank 0 called all_reduce of 4 x f32 "
                                     "(sum), rank 1 called all_reduce of 5 x f32 (sum)";
        try {
            nccl.all_reduce(mine, mine, ReduceOp::sum);
        } catch (const loom::Error& e) {
            if (e.message() != expected) fail("wrong message: " + e.message());
            nccl.barrier();  // still usable: nothing was enqueued
            return;
        }
        fail("a count mismatch between ranks was not reported");
    });
}

TEST_CASE("run_process_on over NCCL runs the body on the GPU's communicator, and a failed body aborts it",
          "[nccl][device]") {
    // One process per GPU in train_gpt; here the ranks of a ThreadWorld on
    // every visible GPU. The body's error comes back on its rank, and the
    // other ranks, whose bodies finished, are told over the host
    // communicator that one failed.
    const std::vector<int> devices = all_devices();
    loom::comm::ThreadWorld world(static_cast<int>(devices.size()));
    REQUIRE_NOTHROW(world.run([&](loom::comm::ThreadComm& host_comm) {
        loom::comm::AnyComm host = loom::comm::AnyComm::view(host_comm);
        const loom::Device gpu = loom::cuda_device(devices[static_cast<std::size_t>(host_comm.rank())]);
        std::vector<float> sum;
        loom::comm::run_process_on(gpu, host, [&](loom::comm::AnyComm& gpus) {
            loom::Buffer<loom::Cuda> x(DType::f32, Shape{4}, gpu);
            loom::fill_floats(x.tensor(), static_cast<float>(gpus.rank() + 1));
            gpus.all_reduce(x.tensor(), x.tensor(), ReduceOp::sum);
            sum = loom::to_host<float>(x.tensor());
        });
        const float want = static_cast<float>(host_comm.size() * (host_comm.size() + 1) / 2);
        if (sum != std::vector<float>(4, want)) fail("run_process_on's all_reduce gave the wrong sum");
        const std::string message = loom_test::message_of([&] {
            loom::comm::run_process_on(gpu, host, [&](loom::comm::AnyComm&) {
                if (host_comm.rank() == 0) throw loom::Error("the body failed on rank 0");
            });
        });
        const std::string expected =
            host_comm.rank() == 0 ? "the body failed on rank 0"
                                  : "rank " + std::to_string(host_comm.rank()) + " of " +
                                        std::to_string(host_comm.size()) + " (cuda:" +
                                        std::to_string(gpu.index) + ") finished, but another rank failed";
        if (message.rfind(expected, 0) != 0) fail("a failed body gave: " + message);
    }));
}

#endif  // LOOM_TEST_NCCL
