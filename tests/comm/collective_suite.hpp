// The communicator equivalence suite, written once and run on every transport:
// ThreadWorld (tests/comm), Mpi (tests/mpi), Nccl (tests/cuda, device buffers
// through a staging hook). Each check throws std::runtime_error naming the op,
// dtype, rank and element that went wrong; Catch2 is not thread-safe, so the
// callers turn the throw into a test failure on their own thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/buffer.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/tensor.hpp"

namespace loom_test {

using loom::DType;
using loom::Tensor;
using loom::comm::ReduceOp;

// Value of element i on rank r: small integers, exact in every dtype, with
// signs, so sum, avg and max of up to 8 ranks are exact before the final
// division of avg (which the reference performs exactly as the backends do).
inline double pattern(int rank, std::int64_t i) { return static_cast<double>((rank * 7 + i * 3) % 17 - 8); }

// Host memory of `count` elements of `dtype`, with per-element get/set in double.
class HostArray {
public:
    HostArray(DType dtype, std::int64_t count)
        : dtype_(dtype), count_(count), bytes_(static_cast<std::size_t>(count) * loom::size_of(dtype) + 64) {}

    [[nodiscard]] Tensor tensor() { return Tensor(bytes_.data(), dtype_, loom::Shape{count_}); }
    [[nodiscard]] Tensor tensor(std::int64_t offset, std::int64_t count) {
        return Tensor(bytes_.data() + offset * static_cast<std::int64_t>(loom::size_of(dtype_)), dtype_,
                      loom::Shape{count});
    }
    [[nodiscard]] std::int64_t count() const { return count_; }

    void set(std::int64_t i, double v) {
        void* p = bytes_.data() + i * static_cast<std::int64_t>(loom::size_of(dtype_));
        switch (dtype_) {
            case DType::f32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
            case DType::bf16: { loom::bf16 x(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
            case DType::f16: { loom::f16 x(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
            case DType::i32: { auto x = static_cast<std::int32_t>(v); std::memcpy(p, &x, 4); break; }
            case DType::i64: { auto x = static_cast<std::int64_t>(v); std::memcpy(p, &x, 8); break; }
        }
    }
    [[nodiscard]] double get(std::int64_t i) const {
        const void* p = bytes_.data() + i * static_cast<std::int64_t>(loom::size_of(dtype_));
        switch (dtype_) {
            case DType::f32: { float x; std::memcpy(&x, p, 4); return x; }
            case DType::bf16: { loom::bf16 x; std::memcpy(&x, p, 2); return loom::to_float(x); }
            case DType::f16: { loom::f16 x; std::memcpy(&x, p, 2); return loom::to_float(x); }
            case DType::i32: { std::int32_t x; std::memcpy(&x, p, 4); return x; }
            case DType::i64: { std::int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
        }
        return 0;
    }

private:
    DType dtype_;
    std::int64_t count_;
    std::vector<std::uint8_t> bytes_;
};

// The reference reduction: what the serial program computes for element i,
// rounded to `dtype` as the backend must round it.
inline double reference_reduce(DType dtype, ReduceOp op, int ranks, std::int64_t i) {
    double acc = pattern(0, i);
    for (int r = 1; r < ranks; ++r) acc = op == ReduceOp::max ? std::max(acc, pattern(r, i)) : acc + pattern(r, i);
    if (op == ReduceOp::avg) {
        if (dtype == DType::i32 || dtype == DType::i64)
            acc = static_cast<double>(static_cast<std::int64_t>(acc) / ranks);
        else
            acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(ranks));
    }
    HostArray rounded(dtype, 1);
    rounded.set(0, acc);
    return rounded.get(0);
}

[[noreturn]] inline void fail_at(const std::string& what, int rank, std::int64_t i, double got, double expected) {
    std::ostringstream out;
    out << what << ": rank " << rank << " element " << i << " is " << got << ", expected " << expected;
    throw std::runtime_error(out.str());
}

// How a transport pairs point-to-point messages: by (peer, tag), in order per
// tag (rank threads, MPI), or by peer in posting order whatever the tag (Nccl,
// as NCCL has no tags).
enum class PointToPoint { by_tag, in_posting_order };

// Every op in every dtype, out of place and in place, with `count` elements per
// rank block (odd counts, zero). `Comm` is any loom::comm::Communicator on host
// memory.
template <class Comm>
void run_collective_suite(Comm& comm, std::int64_t count, PointToPoint p2p = PointToPoint::by_tag) {
    const int n = comm.size();
    const int me = comm.rank();
    for (DType dtype : loom::all_dtypes) {
        const std::string tag = std::string(loom::name(dtype)) + " x" + std::to_string(count);
        // all_reduce, out of place and in place, every op.
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
            for (bool in_place : {false, true}) {
                HostArray send(dtype, count), recv(dtype, count);
                for (std::int64_t i = 0; i < count; ++i) send.set(i, pattern(me, i));
                if (in_place)
                    comm.all_reduce(send.tensor(), send.tensor(), op);
                else
                    comm.all_reduce(send.tensor(), recv.tensor(), op);
                HostArray& out = in_place ? send : recv;
                for (std::int64_t i = 0; i < count; ++i) {
                    double expected = reference_reduce(dtype, op, n, i);
                    if (out.get(i) != expected)
                        fail_at("all_reduce " + std::string(loom::comm::name(op)) + (in_place ? " in place " : " ") + tag,
                                me, i, out.get(i), expected);
                }
            }
        }
        // reduce_scatter: block r of the sum lands on rank r; in place = own block.
        for (bool in_place : {false, true}) {
            HostArray send(dtype, n * count), recv(dtype, count);
            for (std::int64_t i = 0; i < n * count; ++i) send.set(i, pattern(me, i));
            Tensor out = in_place ? send.tensor(me * count, count) : recv.tensor();
            comm.reduce_scatter(send.tensor(), out, ReduceOp::sum);
            for (std::int64_t i = 0; i < count; ++i) {
                double got = in_place ? send.get(me * count + i) : recv.get(i);
                double expected = reference_reduce(dtype, ReduceOp::sum, n, me * count + i);
                if (got != expected) fail_at("reduce_scatter " + tag, me, i, got, expected);
            }
        }
        // all_gather: block r comes from rank r; in place = own block as send.
        for (bool in_place : {false, true}) {
            HostArray send(dtype, count), recv(dtype, n * count);
            for (std::int64_t i = 0; i < count; ++i) {
                send.set(i, pattern(me, i));
                if (in_place) recv.set(me * count + i, pattern(me, i));
            }
            Tensor in = in_place ? recv.tensor(me * count, count) : send.tensor();
            comm.all_gather(in, recv.tensor());
            for (int r = 0; r < n; ++r)
                for (std::int64_t i = 0; i < count; ++i)
                    if (recv.get(r * count + i) != pattern(r, i))
                        fail_at("all_gather " + tag, me, r * count + i, recv.get(r * count + i), pattern(r, i));
        }
        // broadcast from every root.
        for (int root = 0; root < n; ++root) {
            HostArray buffer(dtype, count);
            for (std::int64_t i = 0; i < count; ++i) buffer.set(i, me == root ? pattern(root, i) : 99);
            comm.broadcast(buffer.tensor(), root);
            for (std::int64_t i = 0; i < count; ++i)
                if (buffer.get(i) != pattern(root, i))
                    fail_at("broadcast from " + std::to_string(root) + " " + tag, me, i, buffer.get(i), pattern(root, i));
        }
        // all_to_all: block j of rank i lands as block i of rank j; in place too.
        for (bool in_place : {false, true}) {
            HostArray send(dtype, n * count), recv(dtype, n * count);
            // Element i of block j on rank me encodes (me, j, i).
            auto value = [&](int from, int to, std::int64_t i) { return pattern(from, i + to); };
            for (int j = 0; j < n; ++j)
                for (std::int64_t i = 0; i < count; ++i) send.set(j * count + i, value(me, j, i));
            HostArray& out = in_place ? send : recv;
            comm.all_to_all(send.tensor(), out.tensor());
            for (int j = 0; j < n; ++j)
                for (std::int64_t i = 0; i < count; ++i)
                    if (out.get(j * count + i) != value(j, me, i))
                        fail_at(std::string("all_to_all") + (in_place ? " in place " : " ") + tag, me, j * count + i,
                                out.get(j * count + i), value(j, me, i));
        }
        // send/recv around a ring, both directions, with two tags in flight.
        if (n > 1) {
            const int next = (me + 1) % n, prev = (me + n - 1) % n;
            HostArray out_a(dtype, count), out_b(dtype, count), in_a(dtype, count), in_b(dtype, count);
            for (std::int64_t i = 0; i < count; ++i) {
                out_a.set(i, pattern(me, i));
                out_b.set(i, pattern(me, i + 1));
            }
            auto s1 = comm.send_async(out_a.tensor(), next, 1);
            auto s2 = comm.send_async(out_b.tensor(), prev, 2);
            if (p2p == PointToPoint::by_tag) {  // received in the other order than sent
                auto r2 = comm.recv_async(in_b.tensor(), next, 2);
                comm.recv(in_a.tensor(), prev, 1);
                r2.wait();
            } else {  // at n = 2 next == prev: received in the order sent
                auto r1 = comm.recv_async(in_a.tensor(), prev, 1);
                comm.recv(in_b.tensor(), next, 2);
                r1.wait();
            }
            s1.wait();
            s2.wait();
            for (std::int64_t i = 0; i < count; ++i) {
                if (in_a.get(i) != pattern(prev, i)) fail_at("send/recv tag 1 " + tag, me, i, in_a.get(i), pattern(prev, i));
                if (in_b.get(i) != pattern(next, i + 1))
                    fail_at("send/recv tag 2 " + tag, me, i, in_b.get(i), pattern(next, i + 1));
            }
        }
    }
    // Two async collectives in flight at once, on independent buffers (a pending
    // op's buffers belong to the transport until wait()).
    {
        HostArray a(DType::f32, count), c(DType::f32, count), b(DType::f32, n * count);
        for (std::int64_t i = 0; i < count; ++i) {
            a.set(i, pattern(me, i));
            c.set(i, pattern(me, i));
        }
        auto first = comm.all_reduce_async(a.tensor(), a.tensor(), ReduceOp::sum);
        auto second = comm.all_gather_async(c.tensor(), b.tensor());
        second.wait();
        first.wait();
        for (std::int64_t i = 0; i < count; ++i) {
            double expected = reference_reduce(DType::f32, ReduceOp::sum, n, i);
            if (a.get(i) != expected) fail_at("async all_reduce", me, i, a.get(i), expected);
        }
        for (int r = 0; r < n; ++r)
            for (std::int64_t i = 0; i < count; ++i)
                if (b.get(r * count + i) != pattern(r, i))
                    fail_at("async all_gather", me, r * count + i, b.get(r * count + i), pattern(r, i));
    }
    comm.barrier();
}

}  // namespace loom_test
