// DeviceThreadComm: one rank's communicator in a DeviceThreadWorld, the
// single-GPU multi-rank world: ranks are threads of one process sharing one
// CUDA device, each with its own stream. Compile with nvcc, link loom::cuda.
//
// Rendezvous on the host, data on the device. Every collective runs the frame
// of the host ThreadComm, built from the same pieces (FaultState,
// GroupBarrier, Mailbox, ThreadWorker, ArgumentCheck from thread_*.hpp and
// arguments.hpp): each rank records its `ready` event on its stream and
// publishes its buffer addresses, the ranks meet at a barrier and compare
// their call signatures, each rank makes its stream wait for the ready events
// of the peers whose memory it touches and enqueues its share of the work
// (cudaMemcpyAsync device to device, or the reduction kernel below), records
// its `done` event, meets the others at a second barrier, and makes its
// stream wait for every peer's done event. No rank's host thread ever waits
// for the GPU inside a collective; streams only wait for events that were
// recorded before the wait was enqueued, so the device cannot deadlock.
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
// Reductions, bit for bit with the host ThreadComm. Every element is reduced
// over the ranks in member order 0, 1, ..., n-1, accumulating bf16/f16 in f32
// and rounding once, dividing once for avg (integers toward zero), max taking
// the first NaN (host_reduce.hpp's max_propagating_nan, not the NCCL path's
// order keys, which would canonicalise NaN payloads and order -0 below +0).
// all_reduce splits the elements over the ranks as ThreadComm does: rank r's
// kernel reduces its share from every rank's send buffer into every rank's
// recv buffer, so in-place calls are safe (each element is read, then written,
// by one GPU thread).
//
// Point to point: a send records an event on the sender's stream and posts a
// descriptor in the receiver's mailbox (thread_mailbox.hpp); the matching
// receive makes the receiver's stream wait for that event, copies straight
// from the sender's buffer and records a `copied` event. Messages match in
// order per (peer, tag). A blocking send returns once the receiver has
// matched it, with the sender's stream ordered after the copy; a blocking
// recv returns once the copy is enqueued on the receiver's stream.
//
// Faults, as ThreadComm: a rank that throws fails every other rank's pending
// and future calls with "rank R failed: <its message>"; a rank that never
// arrives fails the others after CommOptions::timeout, naming it; a Request
// or synchronize() whose device work does not finish within the timeout
// fails the world. Signatures are compared across ranks on every collective
// (free: they are already on the host after the barrier).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/arguments.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/comm/device_reduce.cuh"
#include "loom/comm/thread_comm.hpp"
#include "loom/comm/thread_mailbox.hpp"
#include "loom/comm/thread_sync.hpp"
#include "loom/comm/thread_worker.hpp"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/device.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/host_device.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

class DeviceThreadWorld;

namespace detail {

// The most members one device group may have: the reduction kernel takes
// every member's input and output address as one by-value parameter.
inline constexpr int device_group_max_members = 64;

// Kernel parameter: the addresses of one reduction (1 KiB, well under the
// 4 KiB parameter limit of every architecture loom builds for).
struct RankPointers {
    const void* in[device_group_max_members];
    void* out[device_group_max_members];
};

template <class T>
using device_accumulator_t = std::conditional_t<std::is_same_v<T, bf16> || std::is_same_v<T, f16>, float, T>;

template <class T>
LOOM_HOST_DEVICE constexpr device_accumulator_t<T> widen_for_reduce(T value) noexcept {
    if constexpr (std::is_integral_v<T>)
        return value;
    else
        return widen_to_float(value);  // device_reduce.cuh
}

template <class T>
LOOM_HOST_DEVICE constexpr T narrow_from_reduce(device_accumulator_t<T> value) noexcept {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
        return T(value);
    else
        return value;
}

// host_reduce.hpp's max_propagating_nan, term for term: the first NaN wins
// (payload kept), otherwise `a < b ? b : a`, so ties of -0 and +0 resolve as
// on the host.
template <class A>
LOOM_HOST_DEVICE constexpr A max_like_host(A a, A b) noexcept {
    if constexpr (std::is_same_v<A, float>) {
        if ((loom::detail::bit_cast<std::uint32_t>(a) & 0x7fff'ffffu) > 0x7f80'0000u) return a;
        if ((loom::detail::bit_cast<std::uint32_t>(b) & 0x7fff'ffffu) > 0x7f80'0000u) return b;
    }
    return a < b ? b : a;
}

// out_m[i] = reduce over k = 0, 1, ..., inputs-1 of in_k[i], for i < count
// and every output m, in host_reduce's order and arithmetic. An output may
// alias an input element for element: each element is read, then written, by
// one thread.
template <class T>
__global__ void rank_order_reduce_kernel(RankPointers p, int inputs, int outputs, std::int64_t count, ReduceOp op) {
    using A = device_accumulator_t<T>;
    const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count; i += stride) {
        A acc = widen_for_reduce(static_cast<const T*>(p.in[0])[i]);
        for (int k = 1; k < inputs; ++k) {
            const A x = widen_for_reduce(static_cast<const T*>(p.in[k])[i]);
            acc = op == ReduceOp::max ? max_like_host(acc, x) : acc + x;
        }
        // Division, not multiplication by 1/n, as the host and the serial run.
        if (op == ReduceOp::avg) acc = acc / static_cast<A>(inputs);
        const T result = narrow_from_reduce<T>(acc);
        for (int m = 0; m < outputs; ++m) static_cast<T*>(p.out[m])[i] = result;
    }
}

inline void launch_rank_order_reduce(DType dtype, ReduceOp op, const RankPointers& pointers, int inputs, int outputs,
                                     std::int64_t count, cudaStream_t stream) {
    if (count == 0) return;
    with_element_type(dtype, [&](auto tag) {  // device_reduce.cuh
        using T = decltype(tag);
        rank_order_reduce_kernel<T><<<reduce_grid(count), reduce_block, 0, stream>>>(pointers, inputs, outputs, count, op);
    });
    LOOM_CUDA_CHECK(cudaGetLastError());
}

[[nodiscard]] inline cudaEvent_t make_event() {
    cudaEvent_t event = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
}

// One rank's stream, shared by the communicators split from its world
// communicator so that their work stays in program order. Blocking (not
// cudaStreamNonBlocking): Buffer<Cuda> allocates, zero-fills and frees on the
// legacy default stream, which then orders itself with this one.
class DeviceStream {
public:
    explicit DeviceStream(int device) : device_(device) {
        loom::detail::CudaDeviceScope scope(device);
        LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
    }
    DeviceStream(const DeviceStream&) = delete;
    DeviceStream& operator=(const DeviceStream&) = delete;
    // Drains first: no copy may still read a peer's buffer after its world returned.
    ~DeviceStream() {
        int previous = 0;
        if (cudaGetDevice(&previous) != cudaSuccess) return;
        if (previous != device_) cudaSetDevice(device_);
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
        if (previous != device_) cudaSetDevice(previous);
    }
    [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
    [[nodiscard]] int device() const noexcept { return device_; }

private:
    int device_;
    cudaStream_t stream_ = nullptr;
};

// What one member publishes for a collective (ThreadSlot's fields; the child
// of a split is a DeviceGroup).
struct DeviceSlot {
    const void* send = nullptr;
    void* recv = nullptr;
    CallSignature signature;
    int color = 0;
    int key = 0;
    std::shared_ptr<struct DeviceGroup> child;
};

// The state the members of one group share: ThreadGroup's, plus each
// member's ready and done events. The group owns the events, so a peer may
// still wait on a member's event after that member's communicator is gone.
struct DeviceGroup {
    DeviceGroup(std::shared_ptr<FaultState> fault_state, std::vector<int> world_ranks, int device_index)
        : fault(std::move(fault_state)),
          barrier(*fault, std::move(world_ranks)),
          mailboxes(static_cast<std::size_t>(barrier.size())),
          device(device_index) {
        for (auto& parity : slots) parity = std::vector<Padded<DeviceSlot>>(static_cast<std::size_t>(barrier.size()));
        loom::detail::CudaDeviceScope scope(device);
        try {
            for (int m = 0; m < barrier.size(); ++m) {
                ready.push_back(make_event());
                done.push_back(make_event());
            }
        } catch (...) {
            destroy_events();
            throw;
        }
    }
    DeviceGroup(const DeviceGroup&) = delete;
    DeviceGroup& operator=(const DeviceGroup&) = delete;
    ~DeviceGroup() { destroy_events(); }

    std::shared_ptr<FaultState> fault;
    GroupBarrier barrier;
    std::vector<Padded<DeviceSlot>> slots[2];  // by call parity, as ThreadGroup
    std::vector<Mailbox> mailboxes;            // one per receiving member
    int device;
    std::vector<cudaEvent_t> ready, done;  // one of each per member

private:
    void destroy_events() noexcept {
        for (cudaEvent_t e : ready) cudaEventDestroy(e);
        for (cudaEvent_t e : done) cudaEventDestroy(e);
    }
};

// A message between device ranks: the host mailbox's descriptor plus the
// events that order the copy against both streams.
struct DeviceMessage : PostedMessage {
    cudaEvent_t ready_event = nullptr;   // recorded on the sender's stream when posting
    cudaEvent_t copied_event = nullptr;  // recorded on the receiver's stream after the copy
    DeviceMessage() = default;
    DeviceMessage(const DeviceMessage&) = delete;
    DeviceMessage& operator=(const DeviceMessage&) = delete;
    ~DeviceMessage() {
        if (ready_event != nullptr) cudaEventDestroy(ready_event);
        if (copied_event != nullptr) cudaEventDestroy(copied_event);
    }
};

// Blocks until `event` has completed, throwing the world's failure if one is
// recorded meanwhile; after the timeout, fails the world naming `what`. Polls:
// yields for the first millisecond, then sleeps in 50 us steps.
inline void wait_for_event(FaultState& fault, cudaEvent_t event, std::string_view what, int world_rank, int device) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
        const cudaError_t status = cudaEventQuery(event);
        if (status == cudaSuccess) return;
        if (status != cudaErrorNotReady) LOOM_CUDA_CHECK(status);
        if (fault.failed()) fault.throw_failure();
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited >= fault.timeout()) {
            fault.fail(loom::detail::concat(what, " did not complete on the device within ", fault.timeout().count(),
                                            " ms on world rank ", world_rank, " (", cuda_device(device), ")"),
                       world_rank);
            fault.throw_failure();
        }
        if (waited < std::chrono::milliseconds(1))
            std::this_thread::yield();
        else
            std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

[[nodiscard]] inline bool event_done(cudaEvent_t event) {
    const cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) LOOM_CUDA_CHECK(status);
    return false;
}

}  // namespace detail

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
        if (s.worker && s.worker->busy() && !s.worker->on_worker_thread()) s.worker->submit([] {}).wait();
        loom::detail::CudaDeviceScope scope(s.group->device);
        if (!s.sync_event) s.sync_event = std::make_shared<Event>();
        LOOM_CUDA_CHECK(cudaEventRecord(s.sync_event->get(), stream()));
        detail::wait_for_event(*s.group->fault, s.sync_event->get(), "synchronize", world_rank(), s.group->device);
    }

    void send(const Tensor& buffer, int peer, int tag) {
        auto message = post(buffer, peer, tag);
        SendPending::await_match(*state_->group, *message, rank(), peer);
        // The sender may overwrite its buffer in stream order, after the copy.
        loom::detail::CudaDeviceScope scope(state_->group->device);
        LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream(), message->copied_event, 0));
    }

    void recv(const Tensor& buffer, int peer, int tag) {
        RecvPending pending = expect(buffer, peer, tag);
        pending.match();
    }

    [[nodiscard]] Request send_async(const Tensor& buffer, int peer, int tag) {
        auto message = post(buffer, peer, tag);
        return Request(std::make_unique<SendPending>(state_->group, std::move(message), rank(), peer));
    }

    [[nodiscard]] Request recv_async(const Tensor& buffer, int peer, int tag) {
        return Request(std::make_unique<RecvPending>(expect(buffer, peer, tag)));
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
        LOOM_CHECK(color >= 0, "split: color ", color, " is negative; colors are 0 or more");
        State& s = *state_;
        std::shared_ptr<detail::DeviceGroup> child;
        int my_index = 0;
        run(CallSignature{OpKind::split}, nullptr, nullptr, [&](auto& slots) {
            std::vector<std::pair<int, int>> members;  // (key, member)
            for (int m = 0; m < size(); ++m)
                if (slots[static_cast<std::size_t>(m)].value.color == color)
                    members.emplace_back(slots[static_cast<std::size_t>(m)].value.key, m);
            std::sort(members.begin(), members.end());
            const int leader = members.front().second;
            if (leader == s.me) {
                std::vector<int> world_ranks;
                for (auto [k, m] : members) world_ranks.push_back(s.group->barrier.world_rank(m));
                slots[static_cast<std::size_t>(s.me)].value.child =
                    std::make_shared<detail::DeviceGroup>(s.group->fault, std::move(world_ranks), s.group->device);
            }
            s.group->barrier.arrive_and_wait(s.me, OpKind::split, -1);
            child = slots[static_cast<std::size_t>(leader)].value.child;
            for (std::size_t i = 0; i < members.size(); ++i)
                if (members[i].second == s.me) my_index = static_cast<int>(i);
        }, color, key);
        return DeviceThreadComm(std::move(child), my_index, s.stream);
    }

private:
    friend class DeviceThreadWorld;

    class Event {
    public:
        Event() : event_(detail::make_event()) {}
        Event(const Event&) = delete;
        Event& operator=(const Event&) = delete;
        ~Event() { cudaEventDestroy(event_); }
        [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

    private:
        cudaEvent_t event_;
    };

    struct State {
        std::shared_ptr<detail::DeviceGroup> group;
        std::shared_ptr<detail::DeviceStream> stream;
        int me = 0;
        std::int64_t calls = 0;
        void* staging = nullptr;  // in-place all_to_all: a copy of the send buffer
        std::size_t staging_bytes = 0;
        std::shared_ptr<Event> sync_event;
        std::map<std::pair<int, int>, std::uint64_t> sent, received;  // (peer, tag) -> next sequence
        std::unique_ptr<ThreadWorker> worker;

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
    // agree, enqueue, record done, meet, wait for the peers' done. With
    // `stage` bytes, the send buffer is first copied to this rank's staging
    // memory, which is published instead. `color` and `key` are for split.
    template <class Work>
    void run(const CallSignature& signature, const void* send, void* recv, Work&& work, int color = 0, int key = 0,
             std::size_t stage = 0) {
        State& s = *state_;
        if (s.worker && s.worker->busy() && !s.worker->on_worker_thread()) {
            // Queue behind the async calls already issued, keeping the order.
            s.worker->submit([&] { run_now(signature, send, recv, work, color, key, stage); }).wait();
            return;
        }
        run_now(signature, send, recv, work, color, key, stage);
    }

    template <class Work>
    void run_now(const CallSignature& signature, const void* send, void* recv, Work& work, int color, int key,
                 std::size_t stage) {
        State& s = *state_;
        detail::DeviceGroup& group = *s.group;
        if (group.fault->failed()) group.fault->throw_failure();
        loom::detail::CudaDeviceScope scope(group.device);
        const cudaStream_t stream = s.stream->get();
        if (stage != 0) {
            if (s.staging_bytes < stage) {
                if (s.staging != nullptr) LOOM_CUDA_CHECK(cudaFreeAsync(s.staging, stream));
                s.staging = nullptr;
                s.staging_bytes = 0;
                LOOM_CUDA_CHECK(cudaMallocAsync(&s.staging, stage, stream));
                s.staging_bytes = stage;
            }
            LOOM_CUDA_CHECK(cudaMemcpyAsync(s.staging, send, stage, cudaMemcpyDeviceToDevice, stream));
            send = s.staging;
        }
        const std::size_t me = static_cast<std::size_t>(s.me);
        LOOM_CUDA_CHECK(cudaEventRecord(group.ready[me], stream));
        const std::int64_t call = s.calls++;
        auto& slots = group.slots[call & 1];
        auto& mine = slots[me].value;
        mine.send = send;
        mine.recv = recv;
        mine.signature = signature;
        mine.color = color;
        mine.key = key;
        group.barrier.arrive_and_wait(s.me, signature.kind, call);
        // As ThreadComm: everyone compares with member 0, so all throw the same sentence.
        for (int m = 1; m < size(); ++m) {
            const auto& other = slots[static_cast<std::size_t>(m)].value.signature;
            if (!(other == slots[0].value.signature))
                throw Error(mismatch_message(call, group.barrier.world_rank(0), slots[0].value.signature,
                                             group.barrier.world_rank(m), other));
        }
        work(slots);
        LOOM_CUDA_CHECK(cudaEventRecord(group.done[me], stream));
        group.barrier.arrive_and_wait(s.me, signature.kind, call);
        // The peers' reads of this rank's buffers, and their writes into them
        // (all_reduce), come before anything this rank enqueues next. Safe
        // without double buffering: a peer records its next done event only
        // after the next first barrier, which this rank reaches after these waits.
        for (std::size_t m = 0; m < slots.size(); ++m)
            if (m != me) LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, group.done[m], 0));
    }

    // Async collectives: the rendezvous and the enqueueing run on the rank's
    // progress thread in issue order; the Request then waits for an event
    // recorded after the work.
    template <class Call>
    [[nodiscard]] Request async(OpKind kind, Call&& call) {
        State& s = *state_;
        if (!s.worker) s.worker = std::make_unique<ThreadWorker>();
        auto finished = std::make_shared<Event>();
        // The job holds the rank state, not this handle, which may move.
        Request job = s.worker->submit([state = state_, finished, call = std::forward<Call>(call)]() mutable {
            DeviceThreadComm handle(state);
            call(handle);
            loom::detail::CudaDeviceScope scope(state->group->device);
            LOOM_CUDA_CHECK(cudaEventRecord(finished->get(), state->stream->get()));
        });
        return Request(std::make_unique<AsyncPending>(std::move(job), std::move(finished), state_->group, kind,
                                                      world_rank()));
    }

    class AsyncPending final : public Request::Pending {
    public:
        AsyncPending(Request job, std::shared_ptr<Event> finished, std::shared_ptr<detail::DeviceGroup> group,
                     OpKind kind, int world_rank)
            : job_(std::move(job)), finished_(std::move(finished)), group_(std::move(group)), kind_(kind),
              world_rank_(world_rank) {}
        bool test() override {
            if (!job_.test()) return false;
            if (detail::event_done(finished_->get())) return true;
            if (group_->fault->failed()) group_->fault->throw_failure();
            return false;
        }
        void wait() override {
            job_.wait();
            detail::wait_for_event(*group_->fault, finished_->get(), name(kind_), world_rank_, group_->device);
        }

    private:
        Request job_;
        std::shared_ptr<Event> finished_;
        std::shared_ptr<detail::DeviceGroup> group_;
        OpKind kind_;
        int world_rank_;
    };

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
        message->source = state_->me;
        message->tag = tag;
        message->sequence = state_->sent[{peer, tag}]++;
        message->data = buffer.raw();
        message->dtype = buffer.dtype();
        message->count = buffer.numel();
        message->posted = std::chrono::steady_clock::now();
        group.mailboxes[static_cast<std::size_t>(peer)].post(message);
        group.fault->notify();
        return message;
    }

    class SendPending final : public Request::Pending {
    public:
        SendPending(std::shared_ptr<detail::DeviceGroup> group, std::shared_ptr<detail::DeviceMessage> message, int me,
                    int peer)
            : group_(std::move(group)), message_(std::move(message)), me_(me), peer_(peer) {}

        // Host side: until the receiver has matched the message and enqueued the copy.
        static void await_match(detail::DeviceGroup& group, const detail::DeviceMessage& message, int me, int peer) {
            group.fault->wait([&] { return message.done.load(std::memory_order_acquire); },
                              [&] {
                                  group.fault->fail(detail::never_received(group.barrier, me, peer, message.tag),
                                                    group.barrier.world_rank(me));
                              });
        }
        bool test() override {
            if (message_->done.load(std::memory_order_acquire) && detail::event_done(message_->copied_event)) return true;
            if (group_->fault->failed()) group_->fault->throw_failure();
            return false;
        }
        void wait() override {
            await_match(*group_, *message_, me_, peer_);
            detail::wait_for_event(*group_->fault, message_->copied_event, "send", group_->barrier.world_rank(me_),
                                   group_->device);
        }

    private:
        std::shared_ptr<detail::DeviceGroup> group_;
        std::shared_ptr<detail::DeviceMessage> message_;
        int me_, peer_;
    };

    class RecvPending final : public Request::Pending {
    public:
        RecvPending(std::shared_ptr<detail::DeviceGroup> group, Tensor buffer, int me, int peer, int tag,
                    std::uint64_t sequence, cudaStream_t stream)
            : group_(std::move(group)), buffer_(buffer), me_(me), peer_(peer), tag_(tag), sequence_(sequence),
              stream_(stream) {}

        // Host side: until the message is matched and its copy enqueued on this rank's stream.
        void match() {
            group_->fault->wait([&] { return try_receive(); },
                                [&] {
                                    group_->fault->fail(detail::never_sent(group_->barrier, peer_, me_, tag_),
                                                        group_->barrier.world_rank(me_));
                                });
        }
        bool test() override {
            if (group_->fault->failed()) group_->fault->throw_failure();
            return try_receive() && detail::event_done(message_->copied_event);
        }
        void wait() override {
            match();
            detail::wait_for_event(*group_->fault, message_->copied_event, "recv", group_->barrier.world_rank(me_),
                                   group_->device);
        }

    private:
        bool try_receive() {
            if (message_) return true;
            auto posted = group_->mailboxes[static_cast<std::size_t>(me_)].take(peer_, tag_, sequence_);
            if (!posted) return false;
            auto message = std::static_pointer_cast<detail::DeviceMessage>(std::move(posted));
            deliver(*message);
            message_ = std::move(message);
            return true;
        }

        // thread_mailbox.hpp's deliver(), with the copy on the device: the
        // same mismatch sentence, failing the world so the sender fails too.
        void deliver(detail::DeviceMessage& message) {
            FaultState& fault = *group_->fault;
            const GroupBarrier& members = group_->barrier;
            if (message.dtype != buffer_.dtype() || message.count != buffer_.numel()) {
                fault.fail(loom::detail::concat("send/recv mismatch: world rank ", members.world_rank(message.source),
                                                " sent ", message.count, " x ", message.dtype, " with tag ",
                                                message.tag, ", world rank ", members.world_rank(me_), " expected ",
                                                buffer_.numel(), " x ", buffer_.dtype()),
                           members.world_rank(me_));
                fault.throw_failure();
            }
            loom::detail::CudaDeviceScope scope(group_->device);
            LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, message.ready_event, 0));
            if (buffer_.nbytes() != 0)
                LOOM_CUDA_CHECK(
                    cudaMemcpyAsync(buffer_.raw(), message.data, buffer_.nbytes(), cudaMemcpyDeviceToDevice, stream_));
            LOOM_CUDA_CHECK(cudaEventRecord(message.copied_event, stream_));
            message.copied = std::chrono::steady_clock::now();  // enqueued, for traces
            message.done.store(true, std::memory_order_release);
            fault.notify();
        }

        std::shared_ptr<detail::DeviceGroup> group_;
        Tensor buffer_;
        int me_, peer_, tag_;
        std::uint64_t sequence_;
        cudaStream_t stream_;
        std::shared_ptr<detail::DeviceMessage> message_;
    };

    [[nodiscard]] RecvPending expect(const Tensor& buffer, int peer, int tag) {
        check().point_to_point(buffer, peer, tag, OpKind::recv);
        on_device(buffer, OpKind::recv, "recv");
        if (state_->group->fault->failed()) state_->group->fault->throw_failure();
        const std::uint64_t sequence = state_->received[{peer, tag}]++;
        return RecvPending(state_->group, buffer, rank(), peer, tag, sequence, stream());
    }

    std::shared_ptr<State> state_;
    bool owner_ = true;  // the rank's own handle, not the progress thread's
};

}  // namespace loom::comm
