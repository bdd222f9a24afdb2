// The Communicator concept: what every transport (ThreadWorld, Mpi, Nccl, and
// decorators such as Shaped) offers the policies, plus the vocabulary they
// share: reduction operators, call signatures for cross-rank checks, options,
// and the Request handle of an operation in flight.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

// Element-wise reductions. `avg` divides the sum by the number of ranks
// (integer division, toward zero, for integer types); `max` propagates NaN so a
// diverged rank cannot hide. bf16 and f16 accumulate in f32 and round once.
enum class ReduceOp : std::uint8_t { sum, avg, max };

[[nodiscard]] constexpr std::string_view name(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum: return "sum";
        case ReduceOp::avg: return "avg";
        case ReduceOp::max: return "max";
    }
    return "?";
}
inline std::ostream& operator<<(std::ostream& out, ReduceOp op) { return out << name(op); }

// Every operation a communicator offers; used in messages and cross-rank checks.
enum class OpKind : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, barrier, send, recv, split };

[[nodiscard]] constexpr std::string_view name(OpKind kind) {
    switch (kind) {
        case OpKind::all_reduce: return "all_reduce";
        case OpKind::reduce_scatter: return "reduce_scatter";
        case OpKind::all_gather: return "all_gather";
        case OpKind::broadcast: return "broadcast";
        case OpKind::all_to_all: return "all_to_all";
        case OpKind::barrier: return "barrier";
        case OpKind::send: return "send";
        case OpKind::recv: return "recv";
        case OpKind::split: return "split";
    }
    return "?";
}
inline std::ostream& operator<<(std::ostream& out, OpKind kind) { return out << name(kind); }

// What one rank passed to a collective. All ranks must pass equal signatures;
// a mismatch is reported on every rank with both sides named.
struct CallSignature {
    OpKind kind = OpKind::barrier;
    DType dtype = DType::f32;
    std::int64_t count = 0;  // elements of the send buffer
    std::int32_t root = -1;  // broadcast root; -1 when the op has none
    ReduceOp op = ReduceOp::sum;

    friend bool operator==(const CallSignature&, const CallSignature&) = default;
};

inline std::ostream& operator<<(std::ostream& out, const CallSignature& s) {
    out << s.kind;
    if (s.kind == OpKind::barrier || s.kind == OpKind::split) return out;
    out << " of " << s.count << " x " << s.dtype;
    if (s.kind == OpKind::all_reduce || s.kind == OpKind::reduce_scatter) out << " (" << s.op << ")";
    if (s.kind == OpKind::broadcast) out << " from root " << s.root;
    return out;
}

// The one sentence every rank throws when two ranks disagree about a call.
[[nodiscard]] inline std::string mismatch_message(std::int64_t call, int rank_a, const CallSignature& a, int rank_b,
                                                  const CallSignature& b) {
    // Qualified: a backend header may open loom::comm::detail first, which
    // would hide loom::detail from a plain `detail::` here.
    return loom::detail::concat("collective call ", call, " differs between ranks: rank ", rank_a, " called ", a,
                                ", rank ", rank_b, " called ", b);
}

// How a communicator reacts to faults. The timeout bounds every wait for a
// peer: a rank that never arrives fails the others with its number.
struct CommOptions {
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};
    // Compare every collective's signature across ranks before touching data.
    // On by default in debug builds; LOOM_CHECK_COLLECTIVES=1 turns it on in
    // release builds, =0 off in debug ones.
    bool check_calls = default_check_calls();

    [[nodiscard]] static bool default_check_calls() {
        if (const char* env = std::getenv("LOOM_CHECK_COLLECTIVES"); env != nullptr && *env != '\0')
            return std::string_view(env) != "0";
#ifdef NDEBUG
        return false;
#else
        return true;
#endif
    }
};

// An operation in flight. wait() blocks until it completes (and rethrows its
// failure); test() reports completion without blocking. A default-constructed
// Request is already complete. Destroying an unfinished Request waits for it,
// so no buffer is released while a peer may still read it.
class Request {
public:
    struct Timing {
        std::chrono::steady_clock::time_point started, finished;
        bool known = false;
    };

    // What a backend implements for one kind of pending operation.
    class Pending {
    public:
        virtual ~Pending() = default;
        virtual bool test() = 0;  // true once complete; throws its failure
        virtual void wait() = 0;  // blocks until complete; throws its failure
        // When the operation really ran, for traces; backends that cannot tell
        // (MPI progresses inside its library) leave it unknown.
        [[nodiscard]] virtual Timing timing() const { return {}; }
    };

    Request() = default;
    explicit Request(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
    Request(Request&&) noexcept = default;
    Request& operator=(Request&& other) noexcept {
        if (this != &other) {
            finish_quietly();
            pending_ = std::move(other.pending_);
            timing_ = other.timing_;
        }
        return *this;
    }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    ~Request() { finish_quietly(); }

    void wait() {
        if (!pending_) return;
        auto pending = std::move(pending_);
        pending->wait();
        timing_ = pending->timing();
    }

    [[nodiscard]] bool test() {
        if (!pending_) return true;
        if (!pending_->test()) return false;
        timing_ = pending_->timing();
        pending_.reset();
        return true;
    }

    [[nodiscard]] bool done() const noexcept { return !pending_; }

    // After wait() or a true test(): when the operation ran, if the backend knows.
    [[nodiscard]] const Timing& timing() const noexcept { return timing_; }

private:
    void finish_quietly() noexcept {
        if (!pending_) return;
        try {
            pending_->wait();
        } catch (...) {  // NOLINT(bugprone-empty-catch): the failure already reached every rank's next call
        }
        pending_.reset();
    }

    std::unique_ptr<Pending> pending_;
    Timing timing_;
};

// The transport interface every policy is written against. Buffers are
// contiguous Tensors on the communicator's device; send and receive buffers of
// one call have the same dtype. Counts are elements:
//   all_reduce(send, recv, op)   send.numel == recv.numel (send == recv: in place)
//   reduce_scatter(send, recv)   send.numel == size() * recv.numel; rank r gets block r
//   all_gather(send, recv)       recv.numel == size() * send.numel; block r from rank r
//   all_to_all(send, recv)       both size() * k; block j of rank i -> block i of rank j
//   broadcast(buffer, root)      root's buffer to everyone
//   send / recv(buffer, peer, tag)  point to point, matched in order per (peer, tag)
//                                   (Nccl: in posting order per peer, whatever the tag)
// split(color, key) returns the communicator of the ranks with the same color,
// ordered by (key, rank); every rank of the parent must call it.
template <class C>
concept Communicator = requires(C& c, const C& cc, Tensor t, ReduceOp op, int peer) {
    { cc.rank() } -> std::same_as<int>;
    { cc.size() } -> std::same_as<int>;
    { c.all_reduce(t, t, op) } -> std::same_as<void>;
    { c.reduce_scatter(t, t, op) } -> std::same_as<void>;
    { c.all_gather(t, t) } -> std::same_as<void>;
    { c.broadcast(t, peer) } -> std::same_as<void>;
    { c.all_to_all(t, t) } -> std::same_as<void>;
    { c.send(t, peer, peer) } -> std::same_as<void>;
    { c.recv(t, peer, peer) } -> std::same_as<void>;
    { c.barrier() } -> std::same_as<void>;
    { c.all_reduce_async(t, t, op) } -> std::same_as<Request>;
    { c.reduce_scatter_async(t, t, op) } -> std::same_as<Request>;
    { c.all_gather_async(t, t) } -> std::same_as<Request>;
    { c.broadcast_async(t, peer) } -> std::same_as<Request>;
    { c.all_to_all_async(t, t) } -> std::same_as<Request>;
    { c.send_async(t, peer, peer) } -> std::same_as<Request>;
    { c.recv_async(t, peer, peer) } -> std::same_as<Request>;
    { c.split(peer, peer) } -> std::same_as<C>;
};

}  // namespace loom::comm
