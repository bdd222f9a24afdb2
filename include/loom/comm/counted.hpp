// Counted<C>: a communicator decorator that counts what goes through it, so a
// benchmark or a test can state "bytes communicated per step, counted by the
// communicator":
//
//   Counted counted(std::move(comm));         // any Communicator
//   counted.reset();
//   step(counted);                            // every call forwarded unchanged
//   std::cout << counted.counts();            // this rank's calls and bytes
//
// Every call goes to the wrapped communicator as it came, sync to sync and
// async to async, and its results are the wrapped communicator's, bit for bit;
// Counted adds no communication, not even to read the counts, which are this
// rank's own. A call is counted once the wrapped call returns: a synchronous
// one when it has completed, an async one when it has been issued (its
// Request is the wrapped one, unchanged). A call the wrapped communicator
// refuses by throwing is not counted; a refusal that a backend reports only
// at wait() (ThreadComm checks async collectives' arguments on its progress
// thread) comes after the call was counted.
//
// Per OpKind, three numbers:
//   calls       how many calls this rank made
//   bytes       payload bytes, the op's own size (as in nccl-tests):
//                 all_reduce      the buffer (send.nbytes() == recv.nbytes())
//                 reduce_scatter  the full input (send: size() blocks)
//                 all_gather      the full output (recv: size() blocks)
//                 broadcast       the buffer
//                 all_to_all      the buffer (send, size() blocks)
//                 send, recv      the buffer
//                 barrier, split  0
//   wire_bytes  the bytes this rank sends under the ring algorithms that
//               nccl-tests' bus bandwidth assumes, with n = size() of the group
//               that made the call:
//                 all_reduce      2(n-1)/n x bytes   (reduce-scatter, then all-gather, around the ring)
//                 reduce_scatter  (n-1)/n x bytes
//                 all_gather      (n-1)/n x bytes
//                 broadcast       bytes              (pipelined down the ring; 0 when n == 1)
//                 all_to_all      (n-1)/n x bytes    (one block to every peer)
//                 send            bytes
//                 recv            0
//                 barrier, split  0
//               So wire_bytes / time is nccl-tests' busbw. It is a model of
//               the algorithm, not a measurement: ThreadWorld moves data
//               differently (docs/communicators.md), MPI and NCCL choose their
//               own algorithms. The (n-1)/n factors make wire_bytes a double.
//
// Split groups. split() returns a Counted over the wrapped communicator's
// split, with counts of its own (starting at zero) and its own n; the split
// call itself is counted in the parent. The parent remembers its splits:
//   counts()             this group's calls only
//   counts_with_splits() this group's plus those of every group split from it,
//                        recursively, including groups already destroyed
//   reset()              zeroes this group and every group split from it
// so a Mesh over a Counted world reports a whole step's traffic, every axis
// included, from world.counts_with_splits(). A rank's Counted and its splits
// are meant for its own thread, like the communicators they wrap; the counters
// are relaxed atomics, so reading them from another thread is not a data race.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <memory>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

// One op's row: calls, payload bytes and modelled wire bytes sent by this rank.
struct OpCount {
    std::int64_t calls = 0;
    std::int64_t bytes = 0;
    double wire_bytes = 0;

    OpCount& operator+=(const OpCount& other) {
        calls += other.calls;
        bytes += other.bytes;
        wire_bytes += other.wire_bytes;
        return *this;
    }
    friend bool operator==(const OpCount&, const OpCount&) = default;
};

// Every OpKind's row, indexed by the OpKind, and their total. Prints itself as
// a table: a header, one row per op with calls (in OpKind order), a total
// row; wire bytes rounded to whole bytes.
struct CommCounts {
    static constexpr std::size_t kinds = static_cast<std::size_t>(OpKind::split) + 1;
    std::array<OpCount, kinds> ops{};

    [[nodiscard]] OpCount& operator[](OpKind kind) { return ops[static_cast<std::size_t>(kind)]; }
    [[nodiscard]] const OpCount& operator[](OpKind kind) const { return ops[static_cast<std::size_t>(kind)]; }

    [[nodiscard]] OpCount total() const {
        OpCount sum;
        for (const auto& row : ops) sum += row;
        return sum;
    }

    CommCounts& operator+=(const CommCounts& other) {
        for (std::size_t i = 0; i < kinds; ++i) ops[i] += other.ops[i];
        return *this;
    }
    friend bool operator==(const CommCounts&, const CommCounts&) = default;

    friend std::ostream& operator<<(std::ostream& out, const CommCounts& counts) {
        std::ostringstream table;
        table << std::fixed << std::setprecision(0);
        auto line = [&table](std::string_view op, const OpCount& row) {
            table << std::left << std::setw(16) << op << std::right << std::setw(8) << row.calls << std::setw(16)
                  << row.bytes << std::setw(16) << row.wire_bytes << '\n';
        };
        table << std::left << std::setw(16) << "op" << std::right << std::setw(8) << "calls" << std::setw(16)
              << "bytes" << std::setw(16) << "wire bytes" << '\n';
        for (std::size_t i = 0; i < kinds; ++i)
            if (counts.ops[i].calls != 0) line(name(static_cast<OpKind>(i)), counts.ops[i]);
        line("total", counts.total());
        return out << table.str();
    }
};

namespace detail {

// Wire bytes per payload byte, as numerator / denominator, for a group of n.
struct WireFactor {
    std::int64_t numerator = 0, denominator = 1;
};

[[nodiscard]] constexpr WireFactor wire_factor(OpKind kind, int ranks) {
    const std::int64_t n = ranks;
    switch (kind) {
        case OpKind::all_reduce: return {2 * (n - 1), n};
        case OpKind::reduce_scatter:
        case OpKind::all_gather:
        case OpKind::all_to_all: return {n - 1, n};
        case OpKind::broadcast: return {n > 1 ? 1 : 0, 1};
        case OpKind::send: return {1, 1};
        case OpKind::recv:
        case OpKind::barrier:
        case OpKind::split: return {0, 1};
    }
    return {0, 1};
}

// One group's counters on one rank, and the groups split from it.
class CountNode {
public:
    explicit CountNode(int ranks) : ranks_(ranks) {}

    void note(OpKind kind, std::size_t bytes) {
        const auto i = static_cast<std::size_t>(kind);
        calls_[i].fetch_add(1, std::memory_order_relaxed);
        bytes_[i].fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
    }

    [[nodiscard]] std::shared_ptr<CountNode> add_split(int ranks) {
        auto child = std::make_shared<CountNode>(ranks);
        const std::lock_guard lock(mutex_);
        splits_.push_back(child);
        return child;
    }

    [[nodiscard]] CommCounts counts() const {
        CommCounts out;
        for (std::size_t i = 0; i < CommCounts::kinds; ++i) {
            OpCount& row = out.ops[i];
            row.calls = calls_[i].load(std::memory_order_relaxed);
            row.bytes = bytes_[i].load(std::memory_order_relaxed);
            const WireFactor f = wire_factor(static_cast<OpKind>(i), ranks_);
            row.wire_bytes = static_cast<double>(row.bytes) * static_cast<double>(f.numerator) /
                             static_cast<double>(f.denominator);
        }
        return out;
    }

    [[nodiscard]] CommCounts counts_with_splits() const {
        CommCounts out = counts();
        const std::lock_guard lock(mutex_);
        for (const auto& split : splits_) out += split->counts_with_splits();
        return out;
    }

    void reset() {
        for (std::size_t i = 0; i < CommCounts::kinds; ++i) {
            calls_[i].store(0, std::memory_order_relaxed);
            bytes_[i].store(0, std::memory_order_relaxed);
        }
        const std::lock_guard lock(mutex_);
        for (const auto& split : splits_) split->reset();
    }

private:
    int ranks_;
    std::array<std::atomic<std::int64_t>, CommCounts::kinds> calls_{}, bytes_{};
    mutable std::mutex mutex_;
    std::vector<std::shared_ptr<CountNode>> splits_;
};

}  // namespace detail

template <Communicator C>
class Counted {
public:
    explicit Counted(C inner)
        : inner_(std::move(inner)), node_(std::make_shared<detail::CountNode>(inner_.size())) {}

    [[nodiscard]] int rank() const { return inner_.rank(); }
    [[nodiscard]] int size() const { return inner_.size(); }
    [[nodiscard]] C& inner() noexcept { return inner_; }
    [[nodiscard]] const C& inner() const noexcept { return inner_; }

    // This group's calls on this rank.
    [[nodiscard]] CommCounts counts() const { return node_->counts(); }
    // This group's calls plus those of every group split from it, recursively.
    [[nodiscard]] CommCounts counts_with_splits() const { return node_->counts_with_splits(); }
    // Zeroes this group's counts and those of every group split from it.
    void reset() { node_->reset(); }

    void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) {
        inner_.all_reduce(send, recv, op);
        node_->note(OpKind::all_reduce, send.nbytes());
    }
    void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
        inner_.reduce_scatter(send, recv, op);
        node_->note(OpKind::reduce_scatter, send.nbytes());
    }
    void all_gather(const Tensor& send, const Tensor& recv) {
        inner_.all_gather(send, recv);
        node_->note(OpKind::all_gather, recv.nbytes());
    }
    void broadcast(const Tensor& buffer, int root) {
        inner_.broadcast(buffer, root);
        node_->note(OpKind::broadcast, buffer.nbytes());
    }
    void all_to_all(const Tensor& send, const Tensor& recv) {
        inner_.all_to_all(send, recv);
        node_->note(OpKind::all_to_all, send.nbytes());
    }
    void send(const Tensor& buffer, int peer, int tag) {
        inner_.send(buffer, peer, tag);
        node_->note(OpKind::send, buffer.nbytes());
    }
    void recv(const Tensor& buffer, int peer, int tag) {
        inner_.recv(buffer, peer, tag);
        node_->note(OpKind::recv, buffer.nbytes());
    }
    void barrier() {
        inner_.barrier();
        node_->note(OpKind::barrier, 0);
    }

    [[nodiscard]] Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return noted(OpKind::all_reduce, send.nbytes(), inner_.all_reduce_async(send, recv, op));
    }
    [[nodiscard]] Request reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return noted(OpKind::reduce_scatter, send.nbytes(), inner_.reduce_scatter_async(send, recv, op));
    }
    [[nodiscard]] Request all_gather_async(const Tensor& send, const Tensor& recv) {
        return noted(OpKind::all_gather, recv.nbytes(), inner_.all_gather_async(send, recv));
    }
    [[nodiscard]] Request broadcast_async(const Tensor& buffer, int root) {
        return noted(OpKind::broadcast, buffer.nbytes(), inner_.broadcast_async(buffer, root));
    }
    [[nodiscard]] Request all_to_all_async(const Tensor& send, const Tensor& recv) {
        return noted(OpKind::all_to_all, send.nbytes(), inner_.all_to_all_async(send, recv));
    }
    [[nodiscard]] Request send_async(const Tensor& buffer, int peer, int tag) {
        return noted(OpKind::send, buffer.nbytes(), inner_.send_async(buffer, peer, tag));
    }
    [[nodiscard]] Request recv_async(const Tensor& buffer, int peer, int tag) {
        return noted(OpKind::recv, buffer.nbytes(), inner_.recv_async(buffer, peer, tag));
    }

    // A Counted over the wrapped split, counting on its own; the split call is
    // counted here, and counts_with_splits() and reset() reach the new group.
    [[nodiscard]] Counted split(int color, int key) {
        C part = inner_.split(color, key);
        node_->note(OpKind::split, 0);
        auto node = node_->add_split(part.size());
        return Counted(std::move(part), std::move(node));
    }

private:
    Counted(C inner, std::shared_ptr<detail::CountNode> node) : inner_(std::move(inner)), node_(std::move(node)) {}

    [[nodiscard]] Request noted(OpKind kind, std::size_t bytes, Request request) {
        node_->note(kind, bytes);
        return request;
    }

    C inner_;
    std::shared_ptr<detail::CountNode> node_;
};

}  // namespace loom::comm
