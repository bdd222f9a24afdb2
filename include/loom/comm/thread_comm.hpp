// ThreadComm: one rank's communicator in a ThreadWorld. Collectives work
// straight on the peers' buffers: each rank publishes its buffer addresses,
// one barrier later every rank reduces (or copies) its own share of the work
// from all peers' memory into all peers' results, and a second barrier
// releases the buffers. No staging copies except for an in-place all_to_all.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/arguments.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/comm/host_reduce.hpp"
#include "loom/comm/thread_mailbox.hpp"
#include "loom/comm/thread_sync.hpp"
#include "loom/comm/thread_worker.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

class ThreadWorld;

namespace detail {

// What one member publishes for a collective.
struct ThreadSlot {
    const void* send = nullptr;
    void* recv = nullptr;
    CallSignature signature;
    int color = 0;
    int key = 0;
    std::shared_ptr<struct ThreadGroup> child;  // split: the leader's new group
};

// The state the members of one group share.
struct ThreadGroup {
    ThreadGroup(std::shared_ptr<FaultState> fault_state, std::vector<int> world_ranks)
        : fault(std::move(fault_state)),
          barrier(*fault, std::move(world_ranks)),
          mailboxes(static_cast<std::size_t>(barrier.size())) {
        for (auto& parity : slots) parity = std::vector<Padded<ThreadSlot>>(static_cast<std::size_t>(barrier.size()));
    }

    std::shared_ptr<FaultState> fault;
    GroupBarrier barrier;
    // Double-buffered by call parity: a fast member may publish call k+1 while
    // a slow one still reads call k's slots.
    std::vector<Padded<ThreadSlot>> slots[2];
    std::vector<Mailbox> mailboxes;  // one per receiving member
};

[[nodiscard]] inline std::string exception_text(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const std::exception& e) {
        return e.what();
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

// Member `me`'s share [begin, end) of `count` elements split over `n`
// members, in whole cache lines so no two members write one line.
[[nodiscard]] inline std::pair<std::size_t, std::size_t> cache_line_share(std::size_t count, std::size_t element_size,
                                                                          int n, int me) {
    const std::size_t per_line = std::max<std::size_t>(1, 64 / element_size);
    const std::size_t lines = (count + per_line - 1) / per_line;
    const std::size_t share = (lines + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n) * per_line;
    const std::size_t begin = std::min(count, share * static_cast<std::size_t>(me));
    return {begin, std::min(count, begin + share)};
}

inline const void* offset_bytes(const void* base, std::size_t bytes) { return static_cast<const char*>(base) + bytes; }
inline void* offset_bytes(void* base, std::size_t bytes) { return static_cast<char*>(base) + bytes; }

}  // namespace detail

// One rank's communicator inside a ThreadWorld (or a group split from it).
// Used by its own rank thread; async collectives run on a per-rank progress
// thread in issue order. Must outlive the Requests it returns.
class ThreadComm {
public:
    ThreadComm(ThreadComm&&) noexcept = default;
    ThreadComm& operator=(ThreadComm&&) noexcept = default;
    // Finishes the async calls still queued before the rank's state goes.
    ~ThreadComm() {
        if (state_ && owner_) state_->worker.reset();
    }

    [[nodiscard]] int rank() const noexcept { return state_->me; }
    [[nodiscard]] int size() const noexcept { return state_->group->barrier.size(); }
    [[nodiscard]] int world_rank() const { return state_->group->barrier.world_rank(state_->me); }

    // all_reduce results of at least this many bytes bypass the caches.
    static constexpr std::size_t streaming_bytes = std::size_t{8} << 20;

    void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) {
        const auto signature = check().all_reduce(send, recv, op);
        run(signature, send.raw(), recv.raw(), [this, signature](auto& slots) {
            State& s = *state_;
            const auto [begin, end] = detail::cache_line_share(static_cast<std::size_t>(signature.count),
                                                               size_of(signature.dtype), size(), s.me);
            if (begin == end) return;
            s.inputs.clear();
            s.outputs.clear();
            for (auto& slot : slots) {
                s.inputs.push_back(slot.value.send);
                s.outputs.push_back(slot.value.recv);
            }
            // Results larger than the caches are written around them.
            const bool streaming = static_cast<std::size_t>(signature.count) * size_of(signature.dtype) >= streaming_bytes;
            host_reduce(signature.dtype, signature.op, s.inputs, s.outputs, begin, end - begin, streaming);
        });
    }

    void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
        const auto signature = check().reduce_scatter(send, recv, op);
        run(signature, send.raw(), recv.raw(), [this, signature, recv](auto& slots) {
            State& s = *state_;
            const std::size_t block = recv.nbytes();
            s.inputs.clear();
            for (auto& slot : slots)
                s.inputs.push_back(detail::offset_bytes(slot.value.send, block * static_cast<std::size_t>(s.me)));
            void* out = recv.raw();
            host_reduce(signature.dtype, signature.op, s.inputs, std::span<void* const>(&out, 1), 0,
                        static_cast<std::size_t>(recv.numel()));
        });
    }

    void all_gather(const Tensor& send, const Tensor& recv) {
        const auto signature = check().all_gather(send, recv);
        run(signature, send.raw(), recv.raw(), [send, recv](auto& slots) {
            const std::size_t block = send.nbytes();
            for (std::size_t k = 0; k < slots.size(); ++k) {
                void* to = detail::offset_bytes(recv.raw(), block * k);
                if (block != 0 && to != slots[k].value.send) std::memcpy(to, slots[k].value.send, block);
            }
        });
    }

    void broadcast(const Tensor& buffer, int root) {
        const auto signature = check().broadcast(buffer, root);
        run(signature, buffer.raw(), buffer.raw(), [this, buffer, root](auto& slots) {
            if (state_->me != root && buffer.nbytes() != 0)
                std::memcpy(buffer.raw(), slots[static_cast<std::size_t>(root)].value.send, buffer.nbytes());
        });
    }

    void all_to_all(const Tensor& send, const Tensor& recv) {
        const auto signature = check().all_to_all(send, recv);
        const void* published = send.raw();
        if (send.raw() == recv.raw() && send.nbytes() != 0) {
            // In place, peers would read blocks this rank is overwriting: they
            // read a private copy instead.
            auto& staging = state_->staging;
            staging.resize(send.nbytes());
            std::memcpy(staging.data(), send.raw(), send.nbytes());
            published = staging.data();
        }
        run(signature, published, recv.raw(), [this, recv](auto& slots) {
            const std::size_t block = recv.nbytes() / slots.size();
            const std::size_t me = static_cast<std::size_t>(state_->me);
            if (block == 0) return;
            for (std::size_t k = 0; k < slots.size(); ++k)
                std::memcpy(detail::offset_bytes(recv.raw(), block * k),
                            detail::offset_bytes(slots[k].value.send, block * me), block);
        });
    }

    void barrier() {
        run(CallSignature{OpKind::barrier}, nullptr, nullptr, [](auto&) {});
    }

    // Point to point: the receiver copies straight from the sender's buffer.
    void send(const Tensor& buffer, int peer, int tag) { send_async(buffer, peer, tag).wait(); }
    void recv(const Tensor& buffer, int peer, int tag) { recv_async(buffer, peer, tag).wait(); }

    [[nodiscard]] Request send_async(const Tensor& buffer, int peer, int tag) {
        check().point_to_point(buffer, peer, tag, OpKind::send);
        auto& group = *state_->group;
        if (group.fault->failed()) group.fault->throw_failure();
        auto message = std::make_shared<PostedMessage>();
        message->source = state_->me;
        message->tag = tag;
        message->sequence = state_->sent[{peer, tag}]++;
        message->data = buffer.raw();
        message->dtype = buffer.dtype();
        message->count = buffer.numel();
        message->posted = std::chrono::steady_clock::now();
        group.mailboxes[static_cast<std::size_t>(peer)].post(message);
        group.fault->notify();
        return Request(std::make_unique<SendPending>(state_->group, std::move(message), state_->me, peer));
    }

    [[nodiscard]] Request recv_async(const Tensor& buffer, int peer, int tag) {
        check().point_to_point(buffer, peer, tag, OpKind::recv);
        if (state_->group->fault->failed()) state_->group->fault->throw_failure();
        const std::uint64_t sequence = state_->received[{peer, tag}]++;
        return Request(std::make_unique<RecvPending>(state_->group, buffer, state_->me, peer, tag, sequence));
    }

    [[nodiscard]] Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return async([=](ThreadComm& c) { c.all_reduce(send, recv, op); });
    }
    [[nodiscard]] Request reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return async([=](ThreadComm& c) { c.reduce_scatter(send, recv, op); });
    }
    [[nodiscard]] Request all_gather_async(const Tensor& send, const Tensor& recv) {
        return async([=](ThreadComm& c) { c.all_gather(send, recv); });
    }
    [[nodiscard]] Request broadcast_async(const Tensor& buffer, int root) {
        return async([=](ThreadComm& c) { c.broadcast(buffer, root); });
    }
    [[nodiscard]] Request all_to_all_async(const Tensor& send, const Tensor& recv) {
        return async([=](ThreadComm& c) { c.all_to_all(send, recv); });
    }

    // The ranks with the same color form a new group, ordered by (key, rank).
    [[nodiscard]] ThreadComm split(int color, int key) {
        LOOM_CHECK(color >= 0, "split: color ", color, " is negative; colors are 0 or more");
        State& s = *state_;
        std::shared_ptr<detail::ThreadGroup> child;
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
                    std::make_shared<detail::ThreadGroup>(s.group->fault, std::move(world_ranks));
            }
            s.group->barrier.arrive_and_wait(s.me, OpKind::split, -1);
            child = slots[static_cast<std::size_t>(leader)].value.child;
            for (std::size_t i = 0; i < members.size(); ++i)
                if (members[i].second == s.me) my_index = static_cast<int>(i);
        }, color, key);
        return ThreadComm(std::move(child), my_index);
    }

private:
    friend class ThreadWorld;

    struct State {
        std::shared_ptr<detail::ThreadGroup> group;
        int me = 0;
        std::int64_t calls = 0;
        std::vector<const void*> inputs;  // scratch, reused by every call
        std::vector<void*> outputs;
        std::vector<std::byte> staging;
        std::map<std::pair<int, int>, std::uint64_t> sent, received;  // (peer, tag) -> next sequence
        std::unique_ptr<ThreadWorker> worker;
    };

    ThreadComm(std::shared_ptr<detail::ThreadGroup> group, int me) : state_(std::make_shared<State>()) {
        state_->group = std::move(group);
        state_->me = me;
    }
    // A second handle on the same rank state, for the progress thread.
    explicit ThreadComm(std::shared_ptr<State> state) : state_(std::move(state)), owner_(false) {}

    [[nodiscard]] ArgumentCheck check() const { return ArgumentCheck{rank(), size(), host_device}; }

    // The common frame of every collective: publish, meet, agree, work, meet.
    // `color` and `key` are published for split only.
    template <class Work>
    void run(const CallSignature& signature, const void* send, void* recv, Work&& work, int color = 0, int key = 0) {
        State& s = *state_;
        if (s.worker && s.worker->busy() && !s.worker->on_worker_thread()) {
            // Queue behind the async calls already issued, keeping the order.
            s.worker->submit([&] { run_now(signature, send, recv, work, color, key); }).wait();
            return;
        }
        run_now(signature, send, recv, work, color, key);
    }

    template <class Work>
    void run_now(const CallSignature& signature, const void* send, void* recv, Work& work, int color, int key) {
        State& s = *state_;
        detail::ThreadGroup& group = *s.group;
        if (group.fault->failed()) group.fault->throw_failure();
        const std::int64_t call = s.calls++;
        auto& slots = group.slots[call & 1];
        auto& mine = slots[static_cast<std::size_t>(s.me)].value;
        mine.send = send;
        mine.recv = recv;
        mine.signature = signature;
        mine.color = color;
        mine.key = key;
        group.barrier.arrive_and_wait(s.me, signature.kind, call);
        // Every member compares every signature with member 0's, so all of
        // them find the same first mismatch and throw the same sentence.
        // (Free here: the slots are already in cache after the barrier.)
        for (int m = 1; m < size(); ++m) {
            const auto& other = slots[static_cast<std::size_t>(m)].value.signature;
            if (!(other == slots[0].value.signature))
                throw Error(mismatch_message(call, group.barrier.world_rank(0), slots[0].value.signature,
                                             group.barrier.world_rank(m), other));
        }
        work(slots);
        group.barrier.arrive_and_wait(s.me, signature.kind, call);
    }

    template <class Call>
    [[nodiscard]] Request async(Call&& call) {
        State& s = *state_;
        if (!s.worker) s.worker = std::make_unique<ThreadWorker>();
        // The job holds the rank state, not this handle, which may move.
        return s.worker->submit([state = state_, call = std::forward<Call>(call)]() mutable {
            ThreadComm handle(std::move(state));
            call(handle);
        });
    }

    class SendPending final : public Request::Pending {
    public:
        SendPending(std::shared_ptr<detail::ThreadGroup> group, std::shared_ptr<PostedMessage> message, int me,
                    int peer)
            : group_(std::move(group)), message_(std::move(message)), me_(me), peer_(peer) {}
        bool test() override {
            if (message_->done.load(std::memory_order_acquire)) return true;
            if (group_->fault->failed()) group_->fault->throw_failure();
            return false;
        }
        void wait() override {
            group_->fault->wait([&] { return message_->done.load(std::memory_order_acquire); },
                                [&] {
                                    group_->fault->fail(detail::never_received(group_->barrier, me_, peer_, message_->tag),
                                                        group_->barrier.world_rank(me_));
                                });
        }
        // From posting to the receiver's copy: when the message really travelled.
        [[nodiscard]] Request::Timing timing() const override {
            if (!message_->done.load(std::memory_order_acquire)) return {};
            return {message_->posted, message_->copied, true};
        }

    private:
        std::shared_ptr<detail::ThreadGroup> group_;
        std::shared_ptr<PostedMessage> message_;
        int me_, peer_;
    };

    class RecvPending final : public Request::Pending {
    public:
        RecvPending(std::shared_ptr<detail::ThreadGroup> group, Tensor buffer, int me, int peer, int tag,
                    std::uint64_t sequence)
            : group_(std::move(group)), buffer_(buffer), me_(me), peer_(peer), tag_(tag), sequence_(sequence) {}
        bool test() override {
            if (group_->fault->failed()) group_->fault->throw_failure();
            return try_receive();
        }
        void wait() override {
            group_->fault->wait([&] { return try_receive(); },
                                [&] {
                                    group_->fault->fail(detail::never_sent(group_->barrier, peer_, me_, tag_),
                                                        group_->barrier.world_rank(me_));
                                });
        }

    private:
        bool try_receive() {
            auto message = group_->mailboxes[static_cast<std::size_t>(me_)].take(peer_, tag_, sequence_);
            if (!message) return false;
            detail::deliver(*group_->fault, group_->barrier, *message, buffer_, me_);
            return true;
        }
        std::shared_ptr<detail::ThreadGroup> group_;
        Tensor buffer_;
        int me_, peer_, tag_;
        std::uint64_t sequence_;
    };

    std::shared_ptr<State> state_;
    bool owner_ = true;  // the rank's own handle, not the progress thread's
};

}  // namespace loom::comm
