// The rendezvous every rank-thread communicator is built on, shared by
// ThreadComm (host memory, thread_comm.hpp) and DeviceThreadComm (device
// memory, device_thread_comm.cuh): the slot a member publishes for a call, the
// state the members of one group share, a rank's own state, the meeting that
// publishes a slot and checks that every member made the same call, split's
// choice of the new groups, and the posting of a point-to-point message.
// Host code only: no CUDA here.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/thread_mailbox.hpp"
#include "loom/comm/thread_sync.hpp"
#include "loom/comm/thread_worker.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm::detail {

// What one member publishes for a collective.
template <class Group>
struct MemberSlot {
    const void* send = nullptr;
    void* recv = nullptr;
    CallSignature signature;
    int color = 0;
    int key = 0;
    std::shared_ptr<Group> child;  // split: the leader's new group
};

template <class Group>
using MemberSlots = std::vector<Padded<MemberSlot<Group>>>;

// The state the members of one group share (`Group` derives from it).
template <class Group>
struct GroupCore {
    GroupCore(std::shared_ptr<FaultState> fault_state, std::vector<int> world_ranks)
        : fault(std::move(fault_state)),
          barrier(*fault, std::move(world_ranks)),
          mailboxes(static_cast<std::size_t>(barrier.size())) {
        for (auto& parity : slots) parity = MemberSlots<Group>(static_cast<std::size_t>(barrier.size()));
        std::vector<int> members;
        for (int m = 0; m < barrier.size(); ++m) members.push_back(barrier.world_rank(m));
        for (int m : members) flight_groups.push_back(fault->recorder(m).group(members));
    }

    std::shared_ptr<FaultState> fault;
    GroupBarrier barrier;
    // Double-buffered by call parity: a fast member may publish call k+1 while
    // a slow one still reads call k's slots.
    MemberSlots<Group> slots[2];
    std::vector<Mailbox> mailboxes;  // one per receiving member
    std::vector<std::int32_t> flight_groups;  // per member: this group in its flight recorder
};

// One rank's state in one group, shared by its communicator handle and its
// progress thread's.
template <class Group>
struct RankState {
    std::shared_ptr<Group> group;
    int me = 0;
    std::int64_t calls = 0;
    std::map<std::pair<int, int>, std::uint64_t> sent, received;  // (peer, tag) -> next sequence
    std::unique_ptr<ThreadWorker> worker;
};

// The rendezvous of one collective: publish this rank's slot, meet, agree,
// work(slots), meet again. Every member compares every signature with member
// 0's, so all of them find the same first mismatch and throw the same
// sentence. (Free here: the slots are already in cache after the barrier.)
template <class Group, class Work>
void rendezvous(RankState<Group>& s, const CallSignature& signature, const void* send, void* recv, Work& work,
                int color, int key) {
    Group& group = *s.group;
    const std::int64_t call = s.calls++;
    FlightRecorder& recorder = group.fault->recorder(group.barrier.world_rank(s.me));
    recorder.record(group.flight_groups[static_cast<std::size_t>(s.me)], call, signature);
    auto& slots = group.slots[call & 1];
    auto& mine = slots[static_cast<std::size_t>(s.me)].value;
    mine.send = send;
    mine.recv = recv;
    mine.signature = signature;
    mine.color = color;
    mine.key = key;
    group.barrier.arrive_and_wait(s.me, signature.kind, call);
    for (int m = 1; m < group.barrier.size(); ++m) {
        const auto& other = slots[static_cast<std::size_t>(m)].value.signature;
        if (!(other == slots[0].value.signature)) {
            const std::string message = mismatch_message(call, group.barrier.world_rank(0), slots[0].value.signature,
                                                         group.barrier.world_rank(m), other);
            recorder.write(message);
            throw Error(message);
        }
    }
    work(slots);
    group.barrier.arrive_and_wait(s.me, signature.kind, call);
}

inline void check_split_color(int color) {
    LOOM_CHECK(color >= 0, "split: color ", color, " is negative; colors are 0 or more");
}

// split's work inside the rendezvous: the members of `color` in (key, member)
// order form the new group; the first of them, the leader, makes it with
// make_group(world_ranks) and publishes it, and after one more barrier every
// member takes it. Returns the new group and this rank's index in it.
template <class Group, class MakeGroup>
[[nodiscard]] std::pair<std::shared_ptr<Group>, int> split_members(RankState<Group>& s, MemberSlots<Group>& slots,
                                                                   int color, MakeGroup&& make_group) {
    std::vector<std::pair<int, int>> members;  // (key, member)
    for (int m = 0; m < s.group->barrier.size(); ++m)
        if (slots[static_cast<std::size_t>(m)].value.color == color)
            members.emplace_back(slots[static_cast<std::size_t>(m)].value.key, m);
    std::sort(members.begin(), members.end());
    const int leader = members.front().second;
    if (leader == s.me) {
        std::vector<int> world_ranks;
        for (auto [k, m] : members) world_ranks.push_back(s.group->barrier.world_rank(m));
        slots[static_cast<std::size_t>(s.me)].value.child = make_group(std::move(world_ranks));
    }
    s.group->barrier.arrive_and_wait(s.me, OpKind::split, -1);
    int my_index = 0;
    for (std::size_t i = 0; i < members.size(); ++i)
        if (members[i].second == s.me) my_index = static_cast<int>(i);
    return {slots[static_cast<std::size_t>(leader)].value.child, my_index};
}

// Describes `buffer` in `message` (the next of this rank's messages to `peer`
// with `tag`) and posts it in the peer's mailbox.
template <class Group>
void post_message(RankState<Group>& s, const std::shared_ptr<PostedMessage>& message, const Tensor& buffer, int peer,
                  int tag) {
    message->source = s.me;
    message->tag = tag;
    message->sequence = s.sent[{peer, tag}]++;
    message->data = buffer.raw();
    message->dtype = buffer.dtype();
    message->count = buffer.numel();
    message->posted = std::chrono::steady_clock::now();
    s.group->mailboxes[static_cast<std::size_t>(peer)].post(message);
    s.group->fault->notify();
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

}  // namespace loom::comm::detail
