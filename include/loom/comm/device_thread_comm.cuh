// DeviceThreadComm: one rank's communicator in a DeviceThreadWorld, the
// single-GPU multi-rank world: ranks are threads of one process sharing one
// CUDA device, each with its own stream. Compile with nvcc, link loom::cuda.
//
// Rendezvous on the host, data on the device. Every collective runs the frame
// of the host ThreadComm, built from the same pieces (the rendezvous of
// thread_rendezvous.hpp, FaultState, GroupBarrier, Mailbox, ThreadWorker from
// thread_*.hpp, ArgumentCheck from arguments.hpp): each rank records its
// `ready` event on its stream and publishes its buffer addresses, the ranks
// meet at a barrier and compare their call signatures, each rank makes its
// stream wait for the ready events of the peers whose memory it touches and
// enqueues its share of the work (cudaMemcpyAsync device to device, or the
// reduction kernel of device_thread_reduce.cuh), records its `done` event,
// meets the others at a second barrier, and makes its stream wait for every
// peer's done event. No rank's host thread ever waits for the GPU inside a
// collective; streams only wait for events that were recorded before the
// wait was enqueued, so the device cannot deadlock.
//
// Stream order, as loom::comm::Nccl. The blocking forms (all_reduce, send,
// ...) return once the work is enqueued on stream(), not done: later work on
// stream() sees the results, the host sees them after synchronize(),
// barrier() or a Request's wait(). Inputs must be ready in stream() order.
// After a collective returns, stream() is ordered after every rank's work of
// that collective, so a rank may overwrite its buffers with later work on its
// own stream. The *_async forms rendezvous on a per-rank progress thread (a
// ThreadWorker, as ThreadComm's async calls do) and their Request's wait()
// returns once the work is enqueued and an event recorded after it has
// completed; until then the buffers belong to the communicator.
//
// Reductions, bit for bit with the host ThreadComm: every element is reduced
// over the ranks in member order (device_thread_reduce.cuh). all_reduce splits
// the elements over the ranks as ThreadComm does: rank r's kernel reduces its
// share from every rank's send buffer into every rank's recv buffer, so
// in-place calls are safe (each element is read, then written, by one GPU
// thread).
//
// Point to point: the receiver copies straight from the sender's buffer,
// ordered by events (device_thread_requests.cuh); messages match in order per
// (peer, tag). A blocking send returns once the receiver has matched it, with
// the sender's stream ordered after the copy; a blocking recv returns once the
// copy is enqueued on the receiver's stream.
//
// Faults, as ThreadComm: a rank that throws fails every other rank's pending
// and future calls with "rank R failed: <its message>"; a rank that never
// arrives fails the others after CommOptions::timeout, naming it; a Request
// or synchronize() whose device work does not finish within the timeout
// fails the world. Signatures are compared across ranks on every collective
// (free: they are already on the host after the barrier).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/comm/arguments.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/comm/device_thread_group.cuh"
#include "loom/comm/device_thread_reduce.cuh"
#include "loom/comm/device_thread_requests.cuh"
#include "loom/comm/thread_rendezvous.hpp"
#include "loom/comm/thread_worker.hpp"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

class DeviceThreadWorld;

// One rank's communicator inside a DeviceThreadWorld (or a group split from
// it). Used by its own rank thread; must outlive the Requests it returns.
class DeviceThreadComm {
public:
    DeviceThreadComm(DeviceThreadComm&&) noexcept = default;
    DeviceThreadComm& operator=(DeviceThreadComm&&) noexcept = default;
    // Finishes the async calls still queued before the rank's state goes.
    ~DeviceThreadComm() {
        if (state_ && owner_) state_->worker.reset();
    }

    [[nodiscard]] int rank() const noexcept { return state_->me; }
    [[nodiscard]] int size() const noexcept { return state_->group->barrier.size(); }
    [[nodiscard]] int world_rank() const { return state_->group->barrier.world_rank(state_->me); }
    [[nodiscard]] Device device() const noexcept { return cuda_device(state_->group->device); }
    [[nodiscard]] cudaStream_t stream() const noexcept { return state_->stream->get(); }

    void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) {
        const auto signature = checked(check().all_reduce(send, recv, op), send, recv);
        run(signature, send.raw(), recv.raw(), [this, signature](auto& slots) {
            const auto [begin, end] = detail::cache_line_share(static_cast<std::size_t>(signature.count),
                                                               size_of(signature.dtype), size(), rank());
            if (begin == end) return;
            wait_ready_all();
            const std::size_t at = begin * size_of(signature.dtype);
            detail::RankPointers pointers{};
            for (std::size_t k = 0; k < slots.size(); ++k) {
                pointers.in[k] = detail::offset_bytes(slots[k].value.send, at);
                pointers.out[k] = detail::offset_bytes(slots[k].value.recv, at);
            }
            detail::launch_rank_order_reduce(signature.dtype, signature.op, pointers, size(), size(),
                                             static_cast<std::int64_t>(end - begin), stream());
        });
    }

    void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
        const auto signature = checked(check().reduce_scatter(send, recv, op), send, recv);
        run(signature, send.raw(), recv.raw(), [this, signature, recv](auto& slots) {
            if (recv.empty()) return;
            wait_ready_all();
            const std::size_t at = recv.nbytes() * static_cast<std::size_t>(rank());  // this rank's block
            detail::RankPointers pointers{};
            for (std::size_t k = 0; k < slots.size(); ++k) pointers.in[k] = detail::offset_bytes(slots[k].value.send, at);
            pointers.out[0] = recv.raw();
            detail::launch_rank_order_reduce(signature.dtype, signature.op, pointers, size(), 1, recv.numel(), stream());
        });
    }

    void all_gather(const Tensor& send, const Tensor& recv) {
        const auto signature = checked(check().all_gather(send, recv), send, recv);
        run(signature, send.raw(), recv.raw(), [this, send, recv](auto& slots) {
            const std::size_t block = send.nbytes();
            if (block == 0) return;
            wait_ready_all();
            for (std::size_t k = 0; k < slots.size(); ++k) {
                void* to = detail::offset_bytes(recv.raw(), block * k);
                if (to != slots[k].value.send) copy(to, slots[k].value.send, block);
            }
        });
    }

    void broadcast(const Tensor& buffer, int root) {
        const auto signature = checked(check().broadcast(buffer, root), buffer, buffer);
        run(signature, buffer.raw(), buffer.raw(), [this, buffer, root](auto& slots) {
            if (rank() == root || buffer.nbytes() == 0) return;
            wait_ready(root);
            copy(buffer.raw(), slots[static_cast<std::size_t>(root)].value.send, buffer.nbytes());
        });
    }

    void all_to_all(const Tensor& send, const Tensor& recv) {
        const auto signature = checked(check().all_to_all(send, recv), send, recv);
        // In place, peers would read blocks this rank is overwriting: they
        // read a copy in the rank's staging memory instead.
        const bool stage = send.raw() == recv.raw() && send.nbytes() != 0;
        run(signature, send.raw(), recv.raw(), [this, recv](auto& slots) {
            const std::size_t block = recv.nbytes() / slots.size();
            if (block == 0) return;
            wait_ready_all();
            const std::size_t me = static_cast<std::size_t>(rank());
            for (std::size_t k = 0; k < slots.size(); ++k)
                copy(detail::offset_bytes(recv.raw(), block * k), detail::offset_bytes(slots[k].value.send, block * me),
                     block);
        }, 0, 0, stage ? send.nbytes() : 0);
    }

    // Blocks until every rank has reached it and the work every rank enqueued
    // before it has completed (this rank's stream waits for every peer's).
    void barrier() {
        run(CallSignature{OpKind::barrier}, nullptr, nullptr, [](auto&) {});
        synchronize();
    }

    // Blocks until everything issued so far (async calls included) has
    // completed on stream(); after CommOptions::timeout, fails the world.
    void synchronize() {
        State& s = *state_;
        // Async calls still queued are enqueued first (an empty job behind them).
        detail::in_issue_order(s.worker.get(), [] {});
        loom::detail::CudaDeviceScope scope(s.group->device);
        if (!s.sync_event) s.sync_event = std::make_shared<detail::DeviceEvent>();
        LOOM_CUDA_CHECK(cudaEventRecord(s.sync_event->get(), stream()));
        detail::wait_for_event(*s.group->fault, s.sync_event->get(), "synchronize", world_rank(), s.group->device);
    }

    void send(const Tensor& buffer, int peer, int tag) {
        auto message = post(buffer, peer, tag);
        detail::await_receiver(*state_->group->fault, state_->group->barrier, *message, rank(), peer);
        // The sender may overwrite its buffer in stream order, after the copy.
        loom::detail::CudaDeviceScope scope(state_->group->device);
        LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream(), message->copied_event, 0));
    }

    void recv(const Tensor& buffer, int peer, int tag) {
        detail::DeviceRecvPending pending = expect(buffer, peer, tag);
        pending.match();
    }

    [[nodiscard]] Request send_async(const Tensor& buffer, int peer, int tag) {
        auto message = post(buffer, peer, tag);
        return Request(std::make_unique<detail::DeviceSendPending>(state_->group, std::move(message), rank(), peer));
    }

    [[nodiscard]] Request recv_async(const Tensor& buffer, int peer, int tag) {
        return Request(std::make_unique<detail::DeviceRecvPending>(expect(buffer, peer, tag)));
    }

    [[nodiscard]] Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        (void)checked(check().all_reduce(send, recv, op), send, recv);
        return async(OpKind::all_reduce, [=](DeviceThreadComm& c) { c.all_reduce(send, recv, op); });
    }
    [[nodiscard]] Request reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        (void)checked(check().reduce_scatter(send, recv, op), send, recv);
        return async(OpKind::reduce_scatter, [=](DeviceThreadComm& c) { c.reduce_scatter(send, recv, op); });
    }
    [[nodiscard]] Request all_gather_async(const Tensor& send, const Tensor& recv) {
        (void)checked(check().all_gather(send, recv), send, recv);
        return async(OpKind::all_gather, [=](DeviceThreadComm& c) { c.all_gather(send, recv); });
    }
    [[nodiscard]] Request broadcast_async(const Tensor& buffer, int root) {
        (void)checked(check().broadcast(buffer, root), buffer, buffer);
        return async(OpKind::broadcast, [=](DeviceThreadComm& c) { c.broadcast(buffer, root); });
    }
    [[nodiscard]] Request all_to_all_async(const Tensor& send, const Tensor& recv) {
        (void)checked(check().all_to_all(send, recv), send, recv);
        return async(OpKind::all_to_all, [=](DeviceThreadComm& c) { c.all_to_all(send, recv); });
    }

    // The ranks with the same color form a new group, ordered by (key, rank).
    // The new communicator shares this rank's stream, so work on the two
    // stays in program order.
    [[nodiscard]] DeviceThreadComm split(int color, int key) {
        detail::check_split_color(color);
        State& s = *state_;
        std::pair<std::shared_ptr<detail::DeviceGroup>, int> child;
        run(CallSignature{OpKind::split}, nullptr, nullptr, [&](auto& slots) {
            child = detail::split_members(s, slots, color, [&](std::vector<int> world_ranks) {
                return std::make_shared<detail::DeviceGroup>(s.group->fault, std::move(world_ranks), s.group->device);
            });
        }, color, key);
        return DeviceThreadComm(std::move(child.first), child.second, s.stream);
    }

private:
    friend class DeviceThreadWorld;

    struct State : detail::RankState<detail::DeviceGroup> {
        std::shared_ptr<detail::DeviceStream> stream;
        void* staging = nullptr;  // in-place all_to_all: a copy of the send buffer
        std::size_t staging_bytes = 0;
        std::shared_ptr<detail::DeviceEvent> sync_event;

        State() = default;
        State(const State&) = delete;
        State& operator=(const State&) = delete;
        // Stream-ordered: after the peers' reads, which the stream waited for.
        ~State() {
            if (staging != nullptr) {
                int previous = 0;
                if (cudaGetDevice(&previous) != cudaSuccess) return;
                if (previous != group->device) cudaSetDevice(group->device);
                cudaFreeAsync(staging, stream->get());
                if (previous != group->device) cudaSetDevice(previous);
            }
        }
    };

    DeviceThreadComm(std::shared_ptr<detail::DeviceGroup> group, int me, std::shared_ptr<detail::DeviceStream> stream)
        : state_(std::make_shared<State>()) {
        state_->group = std::move(group);
        state_->stream = std::move(stream);
        state_->me = me;
    }
    // A second handle on the same rank state, for the progress thread.
    explicit DeviceThreadComm(std::shared_ptr<State> state) : state_(std::move(state)), owner_(false) {}

    [[nodiscard]] ArgumentCheck check() const { return ArgumentCheck{rank(), size(), device()}; }

    // ArgumentCheck compares device kinds; the index must match too (Nccl's words).
    CallSignature checked(const CallSignature& signature, const Tensor& send, const Tensor& recv) const {
        const bool one = signature.kind == OpKind::broadcast;
        on_device(send, signature.kind, one ? "broadcast" : "send");
        on_device(recv, signature.kind, one ? "broadcast" : "recv");
        return signature;
    }
    void on_device(const Tensor& t, OpKind kind, std::string_view what) const {
        LOOM_CHECK(t.device().index == state_->group->device, kind, ": the ", what, " buffer is on ", t.device(),
                   " but this communicator runs on ", device());
    }

    void wait_ready(int member) {
        LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream(), state_->group->ready[static_cast<std::size_t>(member)], 0));
    }
    void wait_ready_all() {
        for (int m = 0; m < size(); ++m)
            if (m != rank()) wait_ready(m);
    }
    void copy(void* to, const void* from, std::size_t bytes) {
        LOOM_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream()));
    }

    // The common frame of every collective: record ready, publish, meet,
    // agree, enqueue, record done, meet (thread_rendezvous.hpp), wait for the
    // peers' done. With `stage` bytes, the send buffer is first copied to this
    // rank's staging memory, which is published instead. `color` and `key`
    // are for split.
    template <class Work>
    void run(const CallSignature& signature, const void* send, void* recv, Work&& work, int color = 0, int key = 0,
             std::size_t stage = 0) {
        detail::in_issue_order(state_->worker.get(), [&] { run_now(signature, send, recv, work, color, key, stage); });
    }

    template <class Work>
    void run_now(const CallSignature& signature, const void* send, void* recv, Work& work, int color, int key,
                 std::size_t stage) {
        State& s = *state_;
        detail::DeviceGroup& group = *s.group;
        if (group.fault->failed()) group.fault->throw_failure();
        loom::detail::CudaDeviceScope scope(group.device);
        const cudaStream_t stream = s.stream->get();
        if (stage != 0) send = staged(send, stage);
        const std::size_t me = static_cast<std::size_t>(s.me);
        LOOM_CUDA_CHECK(cudaEventRecord(group.ready[me], stream));
        auto enqueue = [&](auto& slots) {
            work(slots);
            LOOM_CUDA_CHECK(cudaEventRecord(group.done[me], stream));
        };
        detail::rendezvous(s, signature, send, recv, enqueue, color, key);
        // The peers' reads of this rank's buffers, and their writes into them
        // (all_reduce), come before anything this rank enqueues next. Safe
        // without double buffering: a peer records its next done event only
        // after the next first barrier, which this rank reaches after these waits.
        for (std::size_t m = 0; m < group.done.size(); ++m)
            if (m != me) LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, group.done[m], 0));
    }

    // A copy of `bytes` of `send` in this rank's staging memory, in stream order.
    const void* staged(const void* send, std::size_t bytes) {
        State& s = *state_;
        const cudaStream_t stream = s.stream->get();
        if (s.staging_bytes < bytes) {
            if (s.staging != nullptr) LOOM_CUDA_CHECK(cudaFreeAsync(s.staging, stream));
            s.staging = nullptr;
            s.staging_bytes = 0;
            LOOM_CUDA_CHECK(cudaMallocAsync(&s.staging, bytes, stream));
            s.staging_bytes = bytes;
        }
        LOOM_CUDA_CHECK(cudaMemcpyAsync(s.staging, send, bytes, cudaMemcpyDeviceToDevice, stream));
        return s.staging;
    }

    // Async collectives: the rendezvous and the enqueueing run on the rank's
    // progress thread in issue order; the Request then waits for an event
    // recorded after the work.
    template <class Call>
    [[nodiscard]] Request async(OpKind kind, Call&& call) {
        State& s = *state_;
        if (!s.worker) s.worker = std::make_unique<ThreadWorker>();
        auto finished = std::make_shared<detail::DeviceEvent>();
        // The job holds the rank state, not this handle, which may move.
        Request job = s.worker->submit([state = state_, finished, call = std::forward<Call>(call)]() mutable {
            DeviceThreadComm handle(state);
            call(handle);
            loom::detail::CudaDeviceScope scope(state->group->device);
            LOOM_CUDA_CHECK(cudaEventRecord(finished->get(), state->stream->get()));
        });
        return Request(std::make_unique<detail::DeviceAsyncPending>(std::move(job), std::move(finished), state_->group,
                                                                    kind, world_rank()));
    }

    // Posts a send: its data is ready once the event recorded now completes.
    [[nodiscard]] std::shared_ptr<detail::DeviceMessage> post(const Tensor& buffer, int peer, int tag) {
        check().point_to_point(buffer, peer, tag, OpKind::send);
        on_device(buffer, OpKind::send, "send");
        auto& group = *state_->group;
        if (group.fault->failed()) group.fault->throw_failure();
        loom::detail::CudaDeviceScope scope(group.device);
        auto message = std::make_shared<detail::DeviceMessage>();
        message->ready_event = detail::make_event();
        message->copied_event = detail::make_event();
        LOOM_CUDA_CHECK(cudaEventRecord(message->ready_event, stream()));
        detail::post_message(*state_, message, buffer, peer, tag);
        return message;
    }

    [[nodiscard]] detail::DeviceRecvPending expect(const Tensor& buffer, int peer, int tag) {
        check().point_to_point(buffer, peer, tag, OpKind::recv);
        on_device(buffer, OpKind::recv, "recv");
        if (state_->group->fault->failed()) state_->group->fault->throw_failure();
        const std::uint64_t sequence = state_->received[{peer, tag}]++;
        return detail::DeviceRecvPending(state_->group, buffer, rank(), peer, tag, sequence, stream());
    }

    std::shared_ptr<State> state_;
    bool owner_ = true;  // the rank's own handle, not the progress thread's
};

}  // namespace loom::comm
