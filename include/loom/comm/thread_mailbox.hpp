// Point-to-point messages between rank threads. A send posts a descriptor of
// its buffer (no copy); the matching receive copies straight from the sender's
// memory and marks the descriptor done, which releases the sender. Messages
// match in order per (source, tag): the k-th send from A to B with tag t meets
// B's k-th receive from A with tag t, as in MPI.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "loom/comm/thread_sync.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

struct PostedMessage {
    int source = 0;  // member index in the group
    int tag = 0;
    std::uint64_t sequence = 0;
    const void* data = nullptr;
    DType dtype = DType::f32;
    std::int64_t count = 0;
    std::atomic<bool> done{false};
    // For traces: posted by the sender, copied by the receiver (written
    // before `done` is released, read after it is acquired).
    std::chrono::steady_clock::time_point posted, copied;
};

// The messages waiting for one receiving member.
class Mailbox {
public:
    void post(std::shared_ptr<PostedMessage> message) {
        std::lock_guard lock(mutex_);
        messages_.push_back(std::move(message));
    }

    // Removes and returns the message (source, tag, sequence) if it was posted.
    [[nodiscard]] std::shared_ptr<PostedMessage> take(int source, int tag, std::uint64_t sequence) {
        std::lock_guard lock(mutex_);
        for (auto it = messages_.begin(); it != messages_.end(); ++it) {
            if ((*it)->source == source && (*it)->tag == tag && (*it)->sequence == sequence) {
                auto message = std::move(*it);
                messages_.erase(it);
                return message;
            }
        }
        return nullptr;
    }

private:
    std::mutex mutex_;
    std::list<std::shared_ptr<PostedMessage>> messages_;
};

namespace detail {

// Fails the world when the two sides of a matched message disagree (a bug no
// retry can fix), so the sender fails too.
inline void check_delivery(FaultState& fault, const GroupBarrier& group, const PostedMessage& message,
                           const Tensor& buffer, int receiver) {
    if (message.dtype != buffer.dtype() || message.count != buffer.numel()) {
        fault.fail(loom::detail::concat("send/recv mismatch: world rank ", group.world_rank(message.source), " sent ",
                                        message.count, " x ", message.dtype, " with tag ", message.tag,
                                        ", world rank ", group.world_rank(receiver), " expected ", buffer.numel(),
                                        " x ", buffer.dtype()),
                   group.world_rank(receiver));
        fault.throw_failure();
    }
}

// The receiver's copy is done (on the device: enqueued): releases the sender.
inline void mark_delivered(FaultState& fault, PostedMessage& message) {
    message.copied = std::chrono::steady_clock::now();
    message.done.store(true, std::memory_order_release);
    fault.notify();
}

// Copies a matched message into the receive buffer, or fails the world when
// the two sides disagree.
inline void deliver(FaultState& fault, const GroupBarrier& group, PostedMessage& message, const Tensor& buffer,
                    int receiver) {
    check_delivery(fault, group, message, buffer, receiver);
    if (buffer.nbytes() != 0) std::memcpy(buffer.raw(), message.data, buffer.nbytes());
    mark_delivered(fault, message);
}

inline std::string never_received(const GroupBarrier& group, int sender, int receiver, int tag) {
    return loom::detail::concat("send from world rank ", group.world_rank(sender), " to world rank ",
                                group.world_rank(receiver), " (tag ", tag, ") timed out: world rank ",
                                group.world_rank(receiver), " never received it");
}

inline std::string never_sent(const GroupBarrier& group, int sender, int receiver, int tag) {
    return loom::detail::concat("recv on world rank ", group.world_rank(receiver), " from world rank ",
                                group.world_rank(sender), " (tag ", tag, ") timed out: world rank ",
                                group.world_rank(sender), " never sent it");
}

// The sender's wait on the host: until the receiver has matched `message`;
// after the timeout, fails the world naming the receiver.
inline void await_receiver(FaultState& fault, const GroupBarrier& group, const PostedMessage& message, int sender,
                           int receiver) {
    fault.wait([&] { return message.done.load(std::memory_order_acquire); },
               [&] { fault.fail(never_received(group, sender, receiver, message.tag), group.world_rank(sender)); });
}

// The receiver's wait on the host: until try_receive() has matched the
// message; after the timeout, fails the world naming the sender.
template <class TryReceive>
void await_sender(FaultState& fault, const GroupBarrier& group, TryReceive&& try_receive, int sender, int receiver,
                  int tag) {
    fault.wait(try_receive, [&] { fault.fail(never_sent(group, sender, receiver, tag), group.world_rank(receiver)); });
}

}  // namespace detail

}  // namespace loom::comm
