// loom::comm::Mpi under mpirun: the collective equivalence suite on the world
// and on split communicators, NaN-propagating max, the blocking paths above
// 64 KiB and 32 MiB, argument errors, and mismatched calls caught by
// check_calls with the same sentence on every rank. Faults that end the job
// (a rank throws, a rank never arrives) live in test_mpi_faults.cpp.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <loom/comm/communicator_mpi.hpp>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "comm/collective_suite.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::comm::CallSignature;
using loom::comm::CommOptions;
using loom::comm::Mpi;
using loom::comm::MpiCollectiveError;
using loom::comm::OpKind;
using loom::comm::ReduceOp;

static_assert(loom::comm::Communicator<Mpi>);
static_assert(std::is_move_constructible_v<Mpi> && std::is_move_assignable_v<Mpi>);
static_assert(!std::is_copy_constructible_v<Mpi> && !std::is_copy_assignable_v<Mpi>);

namespace {

// A timeout, so that a rank failing a check cannot leave the others waiting
// forever: they fail too, after it.
CommOptions test_options(bool check_calls) { return CommOptions{std::chrono::seconds(60), check_calls}; }

std::uint64_t fnv1a(const std::string& text) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

// True when every process passed the same text.
bool same_on_every_rank(const std::string& text) {
    const std::uint64_t mine = fnv1a(text);
    std::uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

// Runs the suite inside Mpi::run, so a rank whose check fails releases the
// others at once; returns the failure text ("" when it passed).
std::string suite(Mpi& comm, std::int64_t count) {
    try {
        comm.run([&](Mpi& c) { loom_test::run_collective_suite(c, count); });
        return "";
    } catch (const std::exception& e) {
        return e.what();
    }
}

template <class T>
Tensor view(std::vector<T>& v) {
    return Tensor::of(v.data(), Shape{static_cast<std::int64_t>(v.size())});
}

}  // namespace

TEST_CASE("Mpi passes the collective suite on the world", "[comm]") {
    for (bool check_calls : {false, true}) {
        Mpi comm = Mpi::world(test_options(check_calls));
        // 20000 elements take the handshake + blocking path (64 KiB and up).
        for (std::int64_t count : {0, 1, 7, 1000, 4099, 20000}) {
            INFO("count " << count << ", check_calls " << check_calls);
            CHECK(suite(comm, count) == "");
        }
    }
    CHECK_FALSE(loom::comm::mpi_fault_happened());
}

TEST_CASE("Mpi all_reduce from 32 MiB (the nonblocking large path) matches the reference", "[comm]") {
    Mpi comm = Mpi::world(test_options(false));
    const std::int64_t count = (std::int64_t{32} << 20) / 4 + 5;
    loom_test::HostArray a(DType::f32, count), b(DType::f32, count);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        for (std::int64_t i = 0; i < count; ++i) a.set(i, loom_test::pattern(comm.rank(), i));
        comm.all_reduce(a.tensor(), b.tensor(), op);
        // pattern() repeats every 17 elements, and so does the reference.
        std::array<double, 17> expected{};
        for (std::int64_t i = 0; i < 17; ++i) expected[i] = loom_test::reference_reduce(DType::f32, op, comm.size(), i);
        std::int64_t wrong = 0, first = -1;
        for (std::int64_t i = 0; i < count; ++i)
            if (b.get(i) != expected[i % 17] && wrong++ == 0) first = i;
        INFO(loom::comm::name(op) << ": first wrong element " << first);
        CHECK(wrong == 0);
    }
}

TEST_CASE("Mpi max propagates NaN from any rank, on both paths", "[comm]") {
    Mpi comm = Mpi::world(test_options(false));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::int64_t count : {7, 30000}) {
        for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
            loom_test::HostArray a(dtype, count);
            for (std::int64_t i = 0; i < count; ++i) a.set(i, loom_test::pattern(comm.rank(), i));
            if (comm.rank() == 0) a.set(2, nan);
            if (comm.rank() == comm.size() - 1) a.set(count - 1, nan);
            comm.all_reduce(a.tensor(), a.tensor(), ReduceOp::max);
            INFO(loom::name(dtype) << " x" << count);
            CHECK(std::isnan(a.get(2)));
            CHECK(std::isnan(a.get(count - 1)));
            CHECK(a.get(3) == loom_test::reference_reduce(dtype, ReduceOp::max, comm.size(), 3));
        }
    }
}

TEST_CASE("Mpi split groups ranks by color and orders them by key", "[comm]") {
    Mpi world = Mpi::world(test_options(true));
    const int n = world.size(), me = world.rank();
    Mpi parity = world.split(me % 2, me);
    CHECK(parity.size() == (me % 2 == 0 ? (n + 1) / 2 : n / 2));
    CHECK(parity.rank() == me / 2);
    for (std::int64_t count : {0, 7, 1000}) {
        INFO("count " << count);
        CHECK(suite(parity, count) == "");
    }
    Mpi reversed = world.split(0, -me);
    CHECK(reversed.size() == n);
    CHECK(reversed.rank() == n - 1 - me);
    // The parent still works while its children exist.
    std::vector<std::int32_t> value{me};
    world.all_reduce(view(value), view(value), ReduceOp::sum);
    CHECK(value[0] == n * (n - 1) / 2);
    CHECK(suite(reversed, 7) == "");
}

TEST_CASE("Mpi moves, and a request completes through test()", "[comm]") {
    Mpi first = Mpi::world(test_options(false));
    Mpi comm = std::move(first);
    CHECK_THROWS_WITH(first.barrier(), Catch::StartsWith("Mpi: this communicator was moved from ["));  // NOLINT
    std::vector<float> v(100, 1.0f);
    loom::comm::Request request = comm.all_reduce_async(view(v), view(v), ReduceOp::sum);
    while (!request.test()) {
    }
    CHECK(request.done());
    CHECK(v[99] == static_cast<float>(comm.size()));
    first = Mpi::world(test_options(false));
    CHECK(first.size() == comm.size());
    CHECK(first.run([](Mpi& c) { return c.rank() + 100; }) == comm.rank() + 100);
}

TEST_CASE("Mpi argument errors name the value and what is valid", "[comm]") {
    Mpi comm = Mpi::world(test_options(true));
    const int n = comm.size(), me = comm.rank();
    const std::string last = std::to_string(n - 1);
    std::vector<float> four(4), five(5), two(2), odd(static_cast<std::size_t>(3 * n + 1)), block(4 * n);
    std::vector<std::int32_t> ints(4);
    auto starts = [](const std::string& message) { return Catch::StartsWith(message + " ["); };

    CHECK_THROWS_WITH(comm.all_reduce(view(four), view(five), ReduceOp::sum),
                      starts("all_reduce: send has 4 elements but recv has 5; they must be equal"));
    CHECK_THROWS_WITH(comm.all_reduce(view(four), view(ints), ReduceOp::sum),
                      starts("all_reduce: send is f32 but recv is i32; both must have the same dtype"));
    CHECK_THROWS_WITH((void)comm.reduce_scatter_async(view(five), view(two), ReduceOp::sum),
                      starts("reduce_scatter: send has 5 elements but must have " + std::to_string(n) +
                             " ranks x 2 (recv) = " + std::to_string(2 * n)));
    CHECK_THROWS_WITH(comm.all_gather(view(four), view(five)),
                      starts("all_gather: recv has 5 elements but must have " + std::to_string(n) +
                             " ranks x 4 (send) = " + std::to_string(4 * n)));
    CHECK_THROWS_WITH(comm.all_to_all(view(odd), view(odd)),
                      starts("all_to_all: " + std::to_string(3 * n + 1) + " elements do not split into " +
                             std::to_string(n) + " equal blocks, one per rank"));
    CHECK_THROWS_WITH(comm.broadcast(view(four), n),
                      starts("broadcast: root " + std::to_string(n) + " is not a rank of this communicator (0.." +
                             last + ")"));
    CHECK_THROWS_WITH(comm.send(view(four), -1, 0),
                      starts("send: peer -1 is not a rank of this communicator (0.." + last + ")"));
    CHECK_THROWS_WITH((void)comm.recv_async(view(four), me, 0),
                      starts("recv: rank " + std::to_string(me) + " cannot recv to itself"));
    CHECK_THROWS_WITH(comm.send(view(four), (me + 1) % n, 32768), starts("send: tag 32768 is outside [0, 32768)"));
    CHECK_THROWS_WITH((void)comm.split(-1, 0), starts("split: color -1 is negative; colors must be >= 0"));

    // A message shorter than the receive buffer (MPI itself accepts it).
    if (me == 0) comm.send(view(four), 1, 9);
    if (me == 1)
        CHECK_THROWS_WITH(comm.recv(view(odd).slice(0, 0, 6), 0, 9),
                          starts("recv: rank 0 sent 16 bytes with tag 9 but the buffer holds 6 x f32 (24 bytes); "
                                 "send and recv must move the same elements"));

    // Nothing was sent: the communicator still works, and its calls still match.
    std::vector<std::int64_t> sum{1};
    comm.all_reduce(view(sum), view(sum), ReduceOp::avg);
    CHECK(sum[0] == 1);
    CHECK_FALSE(loom::comm::mpi_fault_happened());
}

TEST_CASE("Mpi check_calls fails every rank with both signatures when calls differ", "[comm]") {
    Mpi comm = Mpi::world(test_options(true));
    const int n = comm.size(), me = comm.rank();
    std::vector<float> four(4, 1.0f), five(5, 1.0f);
    std::vector<std::int32_t> ints(4, 1);

    auto expect_mismatch = [&](auto&& call, const std::string& expected) {
        std::string what;
        try {
            call();
        } catch (const MpiCollectiveError& e) {
            CHECK(e.message() == expected);
            what = e.what();
        }
        CHECK_FALSE(what.empty());
        CHECK(same_on_every_rank(what));
    };

    // Call 0: rank 0 reduces 4 elements, every other rank 5.
    expect_mismatch([&] { comm.all_reduce(me == 0 ? view(four) : view(five), me == 0 ? view(four) : view(five), ReduceOp::sum); },
                    loom::comm::mismatch_message(0, 0, CallSignature{OpKind::all_reduce, DType::f32, 4, -1, ReduceOp::sum},
                                                 1, CallSignature{OpKind::all_reduce, DType::f32, 5, -1, ReduceOp::sum}));
    // Call 1: rank 1 passes i32, the others f32.
    std::vector<float> gathered(static_cast<std::size_t>(4 * n));
    std::vector<std::int32_t> gathered_ints(gathered.size());
    expect_mismatch([&] { me == 1 ? comm.all_gather(view(ints), view(gathered_ints)) : comm.all_gather(view(four), view(gathered)); },
                    loom::comm::mismatch_message(1, 0, CallSignature{OpKind::all_gather, DType::f32, 4, -1, ReduceOp::sum},
                                                 1, CallSignature{OpKind::all_gather, DType::i32, 4, -1, ReduceOp::sum}));
    // Call 2: the last rank calls barrier while the others reduce.
    expect_mismatch(
        [&] {
            if (me == n - 1)
                comm.barrier();
            else
                comm.all_reduce(view(four), view(four), ReduceOp::max);
        },
        loom::comm::mismatch_message(2, 0, CallSignature{OpKind::all_reduce, DType::f32, 4, -1, ReduceOp::max}, n - 1,
                                     CallSignature{OpKind::barrier, DType::f32, 0, -1, ReduceOp::sum}));
    // Call 3: different broadcast roots.
    expect_mismatch([&] { comm.broadcast(view(four), me == 0 ? 0 : 1); },
                    loom::comm::mismatch_message(3, 0, CallSignature{OpKind::broadcast, DType::f32, 4, 0, ReduceOp::sum},
                                                 1, CallSignature{OpKind::broadcast, DType::f32, 4, 1, ReduceOp::sum}));

    // No data moved: the communicator continues.
    std::vector<float> ones(3, 1.0f);
    comm.all_reduce(view(ones), view(ones), ReduceOp::sum);
    CHECK(ones[2] == static_cast<float>(n));
    CHECK_FALSE(loom::comm::mpi_fault_happened());
}

TEST_CASE("Mpi fails every rank when ranks pass different options", "[comm]") {
    const bool mine = Mpi::world(test_options(false)).rank() == 0;
    std::string what;
    try {
        Mpi comm = Mpi::world(test_options(mine));
    } catch (const MpiCollectiveError& e) {
        CHECK(e.message() == "Mpi: rank 1 has CommOptions {timeout 60000 ms, check_calls off} but rank 0 has "
                             "{timeout 60000 ms, check_calls on}; every rank must pass the same options");
        what = e.what();
    }
    CHECK_FALSE(what.empty());
    CHECK(same_on_every_rank(what));
}

}  // namespace LOOM_TEST_FILE
