// loom::comm::Mpi: the Communicator over MPI, one rank per process, under any
// mpirun or srun. Data moves with MPI's own collectives and point-to-point
// calls on a private duplicate of the parent communicator; every wait also
// polls the control channel (control_mpi.hpp), so a failed or missing rank
// fails the others with one sentence instead of hanging them.
//
// Every collective is the nonblocking MPI call (MPI_Iallreduce, ...), polled
// until done (MpiControl::wait): a blocking MPI call cannot be timed out, so a
// peer that stalls inside one (SIGSTOP, a hung device, a debugger) would hold
// every other rank in it forever, spinning a core. Polling costs speed from 1
// to 16 MiB (libnbc is 25-70% slower than the tuned blocking collectives, see
// plan_mpi.hpp) and buys a bound on every wait.
// An Mpi and the communicators split from it share state: use them from one
// thread at a time (MpiSession asks MPI for MPI_THREAD_SERIALIZED).
//
// bf16 and f16 reductions convert to an f32 buffer, reduce in f32 and round
// once; avg divides the f32 (or integer) sum by the rank count; max propagates
// NaN. Results equal host_reduce's wherever the sums are exact.
#pragma once

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/arguments.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/comm/control_mpi.hpp"
#include "loom/comm/plan_mpi.hpp"
#include "loom/comm/session_mpi.hpp"
#include "loom/core/check_mpi.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

class Mpi {
public:
    // Every process of MPI_COMM_WORLD, on duplicates of it (collective).
    [[nodiscard]] static Mpi world(CommOptions options = {}) { return Mpi(MPI_COMM_WORLD, options); }

    // The processes of `parent`, on duplicates of it (collective over parent).
    // Every rank must pass the same options; a difference fails every rank.
    explicit Mpi(MPI_Comm parent, CommOptions options = {})
        : control_(std::make_shared<detail::MpiControl>(checked_parent(parent))), options_(options) {
        adopt(duplicate(parent));
        agree_on_options();
    }

    Mpi(Mpi&& other) noexcept
        : control_(std::move(other.control_)), comm_(std::exchange(other.comm_, MPI_COMM_NULL)), rank_(other.rank_),
          size_(other.size_), members_(std::move(other.members_)), options_(other.options_), calls_(other.calls_),
          flight_group_(other.flight_group_) {}
    Mpi& operator=(Mpi&& other) noexcept {
        if (this != &other) {
            release();
            control_ = std::move(other.control_);
            comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
            rank_ = other.rank_;
            size_ = other.size_;
            members_ = std::move(other.members_);
            options_ = other.options_;
            calls_ = other.calls_;
            flight_group_ = other.flight_group_;
        }
        return *this;
    }
    Mpi(const Mpi&) = delete;
    Mpi& operator=(const Mpi&) = delete;
    ~Mpi() { release(); }

    [[nodiscard]] int rank() const { return rank_; }
    [[nodiscard]] int size() const { return size_; }
    [[nodiscard]] const CommOptions& options() const noexcept { return options_; }
    // The data communicator, for interoperating with MPI code.
    [[nodiscard]] MPI_Comm native() const noexcept { return comm_; }

    void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) {
        execute(plan_reduction(args().all_reduce(send, recv, op), send, recv));
    }
    void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
        execute(plan_reduction(args().reduce_scatter(send, recv, op), send, recv));
    }
    void all_gather(const Tensor& send, const Tensor& recv) { execute(plan_gather(send, recv)); }
    void broadcast(const Tensor& buffer, int root) { execute(plan_broadcast(buffer, root)); }
    void all_to_all(const Tensor& send, const Tensor& recv) { execute(plan_all_to_all(send, recv)); }
    void barrier() { execute(detail::MpiPlan{CallSignature{OpKind::barrier}}); }
    void send(const Tensor& buffer, int peer, int tag) { send_async(buffer, peer, tag).wait(); }
    void recv(const Tensor& buffer, int peer, int tag) { recv_async(buffer, peer, tag).wait(); }

    [[nodiscard]] Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return start(plan_reduction(args().all_reduce(send, recv, op), send, recv));
    }
    [[nodiscard]] Request reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return start(plan_reduction(args().reduce_scatter(send, recv, op), send, recv));
    }
    [[nodiscard]] Request all_gather_async(const Tensor& send, const Tensor& recv) {
        return start(plan_gather(send, recv));
    }
    [[nodiscard]] Request broadcast_async(const Tensor& buffer, int root) { return start(plan_broadcast(buffer, root)); }
    [[nodiscard]] Request all_to_all_async(const Tensor& send, const Tensor& recv) {
        return start(plan_all_to_all(send, recv));
    }
    [[nodiscard]] Request send_async(const Tensor& buffer, int peer, int tag) {
        return point_to_point(buffer, peer, tag, OpKind::send);
    }
    [[nodiscard]] Request recv_async(const Tensor& buffer, int peer, int tag) {
        return point_to_point(buffer, peer, tag, OpKind::recv);
    }

    // The ranks with the same color, ordered by (key, rank); every rank calls
    // it. The result shares this communicator's control channel: a fault in
    // either breaks both.
    [[nodiscard]] Mpi split(int color, int key) {
        LOOM_CHECK(color >= 0, "split: color ", color, " is negative; colors must be >= 0");
        const std::int64_t call = enter_collective(CallSignature{OpKind::split});
        if (!options_.check_calls) handshake(OpKind::split, call);
        MPI_Comm sub = MPI_COMM_NULL;
        LOOM_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
        return Mpi(control_, sub, options_);
    }

    // Runs f(*this). If f throws, every other rank's pending and later calls
    // (on this communicator and every one split from the same root) fail with
    // "rank R failed: <what()>", R numbered in the root communicator; then
    // the exception continues. The communicator cannot be used after a fault;
    // MpiSession ends the job (see session_mpi.hpp).
    template <class F>
    decltype(auto) run(F&& f) {
        ready();
        try {
            return std::invoke(std::forward<F>(f), *this);
        } catch (const MpiCollectiveError& e) {
            control_->fail(e.message());  // every rank of this communicator threw it; tell the others too
            throw;
        } catch (const std::exception& e) {
            control_->fail(loom::detail::concat("rank ", control_->rank(), " failed: ", e.what()));
            throw;
        } catch (...) {
            control_->fail(loom::detail::concat("rank ", control_->rank(), " failed: an exception that is not a ",
                                                "std::exception"));
            throw;
        }
    }

private:
    // A communicator split from a parent: shares its control channel.
    Mpi(std::shared_ptr<detail::MpiControl> control, MPI_Comm comm, CommOptions options)
        : control_(std::move(control)), options_(options) {
        adopt(comm);
    }

    static MPI_Comm checked_parent(MPI_Comm parent) {
        int initialized = 0;
        LOOM_MPI_CHECK(MPI_Initialized(&initialized));
        LOOM_CHECK(initialized != 0, "Mpi: MPI is not initialized; create a loom::comm::MpiSession first");
        LOOM_CHECK(parent != MPI_COMM_NULL, "Mpi: the parent communicator is MPI_COMM_NULL");
        return parent;
    }
    static MPI_Comm duplicate(MPI_Comm parent) {
        MPI_Comm comm = MPI_COMM_NULL;
        LOOM_MPI_CHECK(MPI_Comm_dup(parent, &comm));
        return comm;
    }

    // Takes ownership of `comm` and learns its ranks' numbers in the control
    // channel, whom a timed-out wait asks.
    void adopt(MPI_Comm comm) {
        comm_ = comm;
        LOOM_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
        LOOM_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
        LOOM_MPI_CHECK(MPI_Comm_size(comm_, &size_));
        MPI_Group mine = MPI_GROUP_NULL, root = MPI_GROUP_NULL;
        LOOM_MPI_CHECK(MPI_Comm_group(comm_, &mine));
        LOOM_MPI_CHECK(MPI_Comm_group(control_->comm(), &root));
        std::vector<int> ranks(static_cast<std::size_t>(size_)), members(ranks.size());
        for (int r = 0; r < size_; ++r) ranks[static_cast<std::size_t>(r)] = r;
        const int status = MPI_Group_translate_ranks(mine, size_, ranks.data(), root, members.data());
        MPI_Group_free(&mine);
        MPI_Group_free(&root);
        LOOM_MPI_CHECK(status);
        flight_group_ = control_->recorder().group(members);
        members_ = std::make_shared<const std::vector<int>>(std::move(members));
    }

    // Timeouts name ranks and check_calls changes the protocol, so every rank
    // must agree on both; checked once, when the communicator is made.
    void agree_on_options() {
        const std::array<std::int64_t, 2> mine{options_.check_calls ? 1 : 0, options_.timeout.count()};
        std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size_));
        LOOM_MPI_CHECK(MPI_Allgather(mine.data(), 2, MPI_INT64_T, all.data(), 2, MPI_INT64_T, comm_));
        auto describe = [&](int r) {
            return loom::detail::concat("{timeout ", all[2 * r + 1], " ms, check_calls ",
                                        all[2 * r] != 0 ? "on" : "off", "}");
        };
        for (int r = 1; r < size_; ++r) {
            if (all[2 * r] == all[0] && all[2 * r + 1] == all[1]) continue;
            const std::string message = loom::detail::concat("Mpi: rank ", r, " has CommOptions ", describe(r),
                                                             " but rank 0 has ", describe(0),
                                                             "; every rank must pass the same options");
            release();
            detail::raise_collective(message);
        }
    }

    void release() noexcept {
        // After a fault MPI may still use the communicator; the job aborts.
        if (comm_ != MPI_COMM_NULL && control_ && !control_->faulted() && !detail::mpi_finalized())
            MPI_Comm_free(&comm_);
        comm_ = MPI_COMM_NULL;
        control_.reset();
    }

    void ready() const { LOOM_CHECK(control_ != nullptr, "Mpi: this communicator was moved from"); }
    [[nodiscard]] ArgumentCheck args() const {
        ready();
        return ArgumentCheck{rank_, size_, host_device};
    }

    // Polls `request` (see MpiControl::wait). If the wait fails, MPI may still
    // write into `scratch`, which is therefore kept.
    void wait(MPI_Request& request, OpKind kind, std::int64_t call, const std::shared_ptr<std::byte[]>& scratch) {
        try {
            control_->wait(request, detail::MpiWaitSite{kind, call, size_, *members_, options_.timeout});
        } catch (...) {
            control_->bury(scratch);
            throw;
        }
    }

    void handshake(OpKind kind, std::int64_t call) {
        MPI_Request request = MPI_REQUEST_NULL;
        LOOM_MPI_CHECK(MPI_Ibarrier(comm_, &request));
        wait(request, kind, call, nullptr);
    }

    // Every collective starts here: a broken communicator fails at once, then
    // the call is counted and, with check_calls, its signature compared with
    // every rank's before any data moves. Returns the call's number.
    std::int64_t enter_collective(const CallSignature& sig) {
        ready();
        control_->throw_if_faulted();
        const std::int64_t call = calls_++;
        control_->service(sig.kind, call);
        control_->recorder().record(flight_group_, call, sig);  // after service: a faulted call never started
        if (!options_.check_calls) return call;
        const std::array<std::int64_t, 6> mine{call, static_cast<std::int64_t>(sig.kind),
                                               static_cast<std::int64_t>(sig.dtype), sig.count, sig.root,
                                               static_cast<std::int64_t>(sig.op)};
        auto all = detail::scratch(6 * sizeof(std::int64_t) * static_cast<std::size_t>(size_));
        auto* words = reinterpret_cast<std::int64_t*>(all.get());
        MPI_Request request = MPI_REQUEST_NULL;
        LOOM_MPI_CHECK(MPI_Iallgather(mine.data(), 6, MPI_INT64_T, words, 6, MPI_INT64_T, comm_, &request));
        wait(request, sig.kind, call, all);
        auto signature = [&](int r) {
            const std::int64_t* w = words + 6 * r;
            return CallSignature{static_cast<OpKind>(w[1]), static_cast<DType>(w[2]), w[3],
                                 static_cast<std::int32_t>(w[4]), static_cast<ReduceOp>(w[5])};
        };
        for (int r = 1; r < size_; ++r)
            if (signature(r) != signature(0)) {
                const std::string message = mismatch_message(words[0], 0, signature(0), r, signature(r));
                control_->recorder().write(message);  // the communicator stays usable, but the ranks disagree
                detail::raise_collective(message);
            }
        return call;
    }

    void execute(detail::MpiPlan plan) {
        plan.call = enter_collective(plan.sig);
        MPI_Request request = MPI_REQUEST_NULL;
        post(plan, &request);
        wait(request, plan.sig.kind, plan.call, plan.scratch);
        plan.complete(MPI_Status{});
    }

    [[nodiscard]] Request start(detail::MpiPlan plan) {
        plan.call = enter_collective(plan.sig);
        MPI_Request request = MPI_REQUEST_NULL;
        post(plan, &request);
        return Request(
            std::make_unique<detail::MpiPending>(control_, members_, options_.timeout, std::move(plan), request));
    }

    void post(const detail::MpiPlan& p, MPI_Request* request) {
        switch (p.sig.kind) {
            case OpKind::all_reduce:
                LOOM_MPI_CHECK(MPI_Iallreduce(p.send, p.recv, p.count, p.type, p.op, comm_, request));
                return;
            case OpKind::reduce_scatter:
                LOOM_MPI_CHECK(MPI_Ireduce_scatter_block(p.send, p.recv, p.count, p.type, p.op, comm_, request));
                return;
            case OpKind::all_gather:
                LOOM_MPI_CHECK(MPI_Iallgather(p.send, p.count, p.type, p.recv, p.count, p.type, comm_, request));
                return;
            case OpKind::broadcast:
                LOOM_MPI_CHECK(MPI_Ibcast(p.recv, p.count, p.type, p.sig.root, comm_, request));
                return;
            case OpKind::all_to_all:
                LOOM_MPI_CHECK(MPI_Ialltoall(p.send, p.count, p.type, p.recv, p.count, p.type, comm_, request));
                return;
            case OpKind::barrier: LOOM_MPI_CHECK(MPI_Ibarrier(comm_, request)); return;
            default: LOOM_FAIL("Mpi: ", p.sig.kind, " is not a collective");
        }
    }


    // all_reduce and reduce_scatter. bf16/f16 go through an f32 copy of send
    // (reduced in place) and round once into recv. reduce_scatter in place
    // (recv is this rank's block of send) reduces into scratch: MPI forbids
    // aliased buffers and its MPI_IN_PLACE layout puts the result elsewhere.
    [[nodiscard]] detail::MpiPlan plan_reduction(const CallSignature& sig, const Tensor& send, const Tensor& recv) {
        detail::MpiPlan p{sig};
        const bool scatter = sig.kind == OpKind::reduce_scatter;
        const bool staged = detail::staged_in_f32(sig.dtype);
        const auto in_count = static_cast<std::size_t>(send.numel());
        const auto out_count = static_cast<std::size_t>(recv.numel());
        p.count = detail::mpi_count(recv.numel(), sig.kind);
        p.type = staged ? MPI_FLOAT : detail::mpi_type(sig.dtype);
        p.op = sig.op != ReduceOp::max ? MPI_SUM : (is_floating(sig.dtype) ? control_->max_op() : MPI_MAX);
        const std::size_t acc_size = staged ? sizeof(float) : send.element_size();
        p.bytes = in_count * acc_size;
        if (staged) {
            p.scratch = detail::scratch((in_count + (scatter ? out_count : 0)) * sizeof(float));
            auto* stage = reinterpret_cast<float*>(p.scratch.get());
            if (sig.dtype == DType::bf16)
                detail::widen_to_f32<bf16>(send.raw(), stage, in_count);
            else
                detail::widen_to_f32<f16>(send.raw(), stage, in_count);
            p.send = scatter ? stage : MPI_IN_PLACE;
            p.recv = scatter ? stage + in_count : stage;
        } else if (scatter ? detail::overlaps(send, recv) : send.raw() == recv.raw()) {
            if (scatter) p.scratch = detail::scratch(out_count * acc_size);
            p.send = scatter ? send.raw() : MPI_IN_PLACE;
            p.recv = scatter ? static_cast<void*>(p.scratch.get()) : recv.raw();
        } else {
            p.send = send.raw();
            p.recv = recv.raw();
        }
        p.acc = p.recv;
        p.out = recv.raw();
        p.out_count = out_count;
        p.ranks = size_;
        p.finish = staged || sig.op == ReduceOp::avg || p.acc != p.out;
        return p;
    }

    [[nodiscard]] detail::MpiPlan plan_gather(const Tensor& send, const Tensor& recv) {
        detail::MpiPlan p{args().all_gather(send, recv)};
        p.count = detail::mpi_count(send.numel(), OpKind::all_gather);
        p.type = detail::mpi_type(p.sig.dtype);
        p.bytes = recv.nbytes();
        const auto* own = static_cast<const std::byte*>(recv.raw()) + static_cast<std::size_t>(rank_) * send.nbytes();
        p.send = !send.empty() && send.raw() == own ? MPI_IN_PLACE : send.raw();  // MPI's in-place layout
        p.recv = recv.raw();
        return p;
    }

    [[nodiscard]] detail::MpiPlan plan_broadcast(const Tensor& buffer, int root) {
        detail::MpiPlan p{args().broadcast(buffer, root)};
        p.count = detail::mpi_count(buffer.numel(), OpKind::broadcast);
        p.type = detail::mpi_type(p.sig.dtype);
        p.bytes = buffer.nbytes();
        p.recv = buffer.raw();
        return p;
    }

    // In place, send is copied first: MPI_IN_PLACE for all-to-all is missing
    // from some nonblocking implementations.
    [[nodiscard]] detail::MpiPlan plan_all_to_all(const Tensor& send, const Tensor& recv) {
        detail::MpiPlan p{args().all_to_all(send, recv)};
        p.count = detail::mpi_count(send.numel() / size_, OpKind::all_to_all);
        p.type = detail::mpi_type(p.sig.dtype);
        p.bytes = send.nbytes();
        p.send = send.raw();
        if (!send.empty() && send.raw() == recv.raw()) {
            p.scratch = detail::scratch(send.nbytes());
            std::memcpy(p.scratch.get(), send.raw(), send.nbytes());
            p.send = p.scratch.get();
        }
        p.recv = recv.raw();
        return p;
    }

    [[nodiscard]] Request point_to_point(const Tensor& buffer, int peer, int tag, OpKind kind) {
        args().point_to_point(buffer, peer, tag, kind);
        control_->throw_if_faulted();
        control_->service(kind, -1);
        control_->recorder().record(flight_group_, -1, CallSignature{kind, buffer.dtype(), buffer.numel()},
                                    (*members_)[static_cast<std::size_t>(peer)]);
        const int count = detail::mpi_count(buffer.numel(), kind);
        MPI_Request request = MPI_REQUEST_NULL;
        if (kind == OpKind::send)
            LOOM_MPI_CHECK(MPI_Isend(buffer.raw(), count, detail::mpi_type(buffer.dtype()), peer, tag, comm_, &request));
        else
            LOOM_MPI_CHECK(MPI_Irecv(buffer.raw(), count, detail::mpi_type(buffer.dtype()), peer, tag, comm_, &request));
        detail::MpiPlan plan{CallSignature{kind, buffer.dtype(), buffer.numel()}};
        return Request(
            std::make_unique<detail::MpiPending>(control_, members_, options_.timeout, std::move(plan), request));
    }

    std::shared_ptr<detail::MpiControl> control_;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0;
    int size_ = 1;
    std::shared_ptr<const std::vector<int>> members_;
    CommOptions options_;
    std::int64_t calls_ = 0;  // collectives so far, named in mismatch messages
    std::int32_t flight_group_ = 0;  // this communicator's group in the flight recorder
};

static_assert(Communicator<Mpi>);

}  // namespace loom::comm
