// ThreadComm: one rank's communicator in a ThreadWorld. Collectives work
// straight on the peers' buffers: each rank publishes its buffer addresses,
// one barrier later every rank reduces (or copies) its own share of the work
// from all peers' memory into all peers' results, and a second barrier
// releases the buffers. No staging copies except for an in-place all_to_all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "loom/comm/arguments.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/comm/host_reduce.hpp"
#include "loom/comm/thread_mailbox.hpp"
#include "loom/comm/thread_rendezvous.hpp"
#include "loom/comm/thread_sync.hpp"
#include "loom/comm/thread_worker.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

class ThreadWorld;

namespace detail {

// The state the members of one group share (thread_rendezvous.hpp).
struct ThreadGroup : GroupCore<ThreadGroup> {
    using GroupCore::GroupCore;
};

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
        record_point_to_point(OpKind::send, buffer, peer);
        auto message = std::make_shared<PostedMessage>();
        detail::post_message(*state_, message, buffer, peer, tag);
        return Request(std::make_unique<SendPending>(state_->group, std::move(message), state_->me, peer));
    }

    [[nodiscard]] Request recv_async(const Tensor& buffer, int peer, int tag) {
        check().point_to_point(buffer, peer, tag, OpKind::recv);
        if (state_->group->fault->failed()) state_->group->fault->throw_failure();
        record_point_to_point(OpKind::recv, buffer, peer);
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
        detail::check_split_color(color);
        State& s = *state_;
        std::pair<std::shared_ptr<detail::ThreadGroup>, int> child;
        run(CallSignature{OpKind::split}, nullptr, nullptr, [&](auto& slots) {
            child = detail::split_members(s, slots, color, [&](std::vector<int> world_ranks) {
                return std::make_shared<detail::ThreadGroup>(s.group->fault, std::move(world_ranks));
            });
        }, color, key);
        return ThreadComm(std::move(child.first), child.second);
    }

private:
    friend class ThreadWorld;

    struct State : detail::RankState<detail::ThreadGroup> {
        std::vector<const void*> inputs;  // scratch, reused by every call
        std::vector<void*> outputs;
        std::vector<std::byte> staging;
    };

    ThreadComm(std::shared_ptr<detail::ThreadGroup> group, int me) : state_(std::make_shared<State>()) {
        state_->group = std::move(group);
        state_->me = me;
    }
    // A second handle on the same rank state, for the progress thread.
    explicit ThreadComm(std::shared_ptr<State> state) : state_(std::move(state)), owner_(false) {}

    [[nodiscard]] ArgumentCheck check() const { return ArgumentCheck{rank(), size(), host_device}; }

    // Into this rank's flight recorder, as Mpi does: no call number in the
    // group (point to point has no rendezvous), the peer's world rank.
    void record_point_to_point(OpKind kind, const Tensor& buffer, int peer) const {
        auto& group = *state_->group;
        group.fault->recorder(group.barrier.world_rank(state_->me))
            .record(group.flight_groups[static_cast<std::size_t>(state_->me)], -1,
                    CallSignature{kind, buffer.dtype(), buffer.numel()}, group.barrier.world_rank(peer));
    }

    // The common frame of every collective: publish, meet, agree, work, meet
    // (thread_rendezvous.hpp). `color` and `key` are published for split only.
    template <class Work>
    void run(const CallSignature& signature, const void* send, void* recv, Work&& work, int color = 0, int key = 0) {
        State& s = *state_;
        detail::in_issue_order(s.worker.get(), [&] {
            if (s.group->fault->failed()) s.group->fault->throw_failure();
            detail::rendezvous(s, signature, send, recv, work, color, key);
        });
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
        void wait() override { detail::await_receiver(*group_->fault, group_->barrier, *message_, me_, peer_); }
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
            detail::await_sender(*group_->fault, group_->barrier, [&] { return try_receive(); }, peer_, me_, tag_);
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
