// Shaped<Comm>: a communicator decorator that makes every operation take as
// long as it would over the configured Links, so slow and heterogeneous
// clusters can be studied on one machine:
//
//   Shaped shaped(std::move(comm), Links::nodes(8, 4, Link::unlimited(), Link::gbit(10, 5e-6)));
//
// Each collective first exchanges the ranks' arrival times (a one-element
// max all-reduce); the operation then ends, on every rank, at the last arrival
// plus the modelled cost (Links::cost), or when the real transfer ends if that
// is later. Collectives on one communicator queue: one starts no earlier than
// the previous one ended, as they would on shared links (an all-reduce per
// gradient bucket costs the sum, not the largest). A receive ends at max(send posted, receive posted) plus the link's
// time. Clocks are std::chrono::steady_clock, shared by the threads and the
// processes of one machine: across machines Shaped is not meaningful.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/links.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

namespace detail {

[[nodiscard]] inline std::int64_t steady_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Sleeps to within a margin of the deadline, then yields until it. A sleep
// alone ends late by the timer slack and the wake-up: a 10 us sleep took
// 81 us on the AMD EPYC VM (Zen 4, 2 cores), so every shaped message arrived
// ~70 us after its modelled time, and a serving pipeline's chain of small
// messages (a header, its meta, the hidden rows, the tokens back: four per
// group per step) spent more time in oversleeping than in the modelled link.
// Yielding rather than pausing gives the core away when other threads want it.
inline void sleep_until_ns(std::int64_t deadline) {
    constexpr std::int64_t margin_ns = 200'000;
    if (deadline - steady_now_ns() > margin_ns)
        std::this_thread::sleep_until(
            std::chrono::steady_clock::time_point(std::chrono::nanoseconds(deadline - margin_ns)));
    while (steady_now_ns() < deadline) std::this_thread::yield();
}

[[nodiscard]] inline std::int64_t seconds_to_ns(double seconds) {
    return static_cast<std::int64_t>(seconds * 1e9 + 0.5);
}

// When a shaped operation ends: at its start (the last arrival, or the
// send's posting time, filled in by the `timing` message) plus its modelled
// cost, and never before the collective issued before it on the same
// communicator has ended: collectives on one communicator share its links,
// so they queue (as NCCL's do on a stream) rather than overlap for free.
struct ShapedDeadline {
    std::unique_ptr<std::int64_t> start;
    Request timing;
    std::int64_t floor = 0, cost = 0;
    std::shared_ptr<ShapedDeadline> previous;  // dropped once this deadline is known
    std::optional<std::int64_t> known;

    [[nodiscard]] bool ready() {
        if (known) return true;
        if (!timing.test() || (previous && !previous->ready())) return false;
        (void)wait();
        return true;
    }
    std::int64_t wait() {
        if (!known) {
            timing.wait();
            const std::int64_t after = previous ? previous->wait() : 0;
            known = std::max({*start, floor, after}) + cost;
            previous.reset();
        }
        return *known;
    }
};

// Waits for the real operation and the deadline, then sleeps until it.
class ShapedPending final : public Request::Pending {
public:
    ShapedPending(std::shared_ptr<ShapedDeadline> deadline, Request operation)
        : deadline_(std::move(deadline)), operation_(std::move(operation)) {}

    bool test() override {
        if (!deadline_->ready() || !operation_.test()) return false;
        return steady_now_ns() >= deadline_->wait();
    }
    void wait() override {
        const std::int64_t until = deadline_->wait();
        operation_.wait();
        sleep_until_ns(until);
    }

private:
    std::shared_ptr<ShapedDeadline> deadline_;
    Request operation_;
};

}  // namespace detail

template <Communicator C>
class Shaped {
public:
    Shaped(C inner, Links links) : inner_(std::move(inner)), links_(std::make_shared<const Links>(std::move(links))) {
        LOOM_CHECK(links_->ranks() == inner_.size(), "Shaped: the links describe ", links_->ranks(),
                   " ranks but the communicator has ", inner_.size());
        members_.resize(static_cast<std::size_t>(inner_.size()));
        std::iota(members_.begin(), members_.end(), 0);
    }

    [[nodiscard]] int rank() const { return inner_.rank(); }
    [[nodiscard]] int size() const { return inner_.size(); }
    [[nodiscard]] C& inner() noexcept { return inner_; }
    [[nodiscard]] const Links& links() const noexcept { return *links_; }
    // World ranks (indices into links()) of this group's members, in order.
    [[nodiscard]] const std::vector<int>& members() const noexcept { return members_; }

    void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) { all_reduce_async(send, recv, op).wait(); }
    void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
        reduce_scatter_async(send, recv, op).wait();
    }
    void all_gather(const Tensor& send, const Tensor& recv) { all_gather_async(send, recv).wait(); }
    void broadcast(const Tensor& buffer, int root) { broadcast_async(buffer, root).wait(); }
    void all_to_all(const Tensor& send, const Tensor& recv) { all_to_all_async(send, recv).wait(); }
    void send(const Tensor& buffer, int peer, int tag) { send_async(buffer, peer, tag).wait(); }
    void recv(const Tensor& buffer, int peer, int tag) { recv_async(buffer, peer, tag).wait(); }
    void barrier() {
        auto arrival = arrive();
        finish(OpKind::barrier, 0, 0, std::move(arrival), Request()).wait();
    }

    [[nodiscard]] Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        auto arrival = arrive();
        return finish(OpKind::all_reduce, send.nbytes(), 0, std::move(arrival), inner_.all_reduce_async(send, recv, op));
    }
    [[nodiscard]] Request reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        auto arrival = arrive();
        return finish(OpKind::reduce_scatter, send.nbytes(), 0, std::move(arrival),
                      inner_.reduce_scatter_async(send, recv, op));
    }
    [[nodiscard]] Request all_gather_async(const Tensor& send, const Tensor& recv) {
        auto arrival = arrive();
        return finish(OpKind::all_gather, recv.nbytes(), 0, std::move(arrival), inner_.all_gather_async(send, recv));
    }
    [[nodiscard]] Request broadcast_async(const Tensor& buffer, int root) {
        auto arrival = arrive();
        return finish(OpKind::broadcast, buffer.nbytes(), root, std::move(arrival), inner_.broadcast_async(buffer, root));
    }
    [[nodiscard]] Request all_to_all_async(const Tensor& send, const Tensor& recv) {
        auto arrival = arrive();
        return finish(OpKind::all_to_all, send.nbytes(), 0, std::move(arrival), inner_.all_to_all_async(send, recv));
    }

    // A small timing message (the send's posting time) travels ahead of the
    // payload on the same tag, so the receiver knows when the transfer began.
    [[nodiscard]] Request send_async(const Tensor& buffer, int peer, int tag) {
        const std::int64_t now = detail::steady_now_ns();
        auto posted = std::make_unique<std::int64_t>(now);
        Request timing = inner_.send_async(Tensor::of(posted.get(), {1}), peer, tag);
        Request payload = inner_.send_async(buffer, peer, tag);
        return point_to_point(std::move(posted), std::move(timing), std::move(payload), now, peer, buffer.nbytes());
    }
    [[nodiscard]] Request recv_async(const Tensor& buffer, int peer, int tag) {
        const std::int64_t now = detail::steady_now_ns();
        auto posted = std::make_unique<std::int64_t>(0);
        Request timing = inner_.recv_async(Tensor::of(posted.get(), {1}), peer, tag);
        Request payload = inner_.recv_async(buffer, peer, tag);
        return point_to_point(std::move(posted), std::move(timing), std::move(payload), now, peer, buffer.nbytes());
    }

    [[nodiscard]] Shaped split(int color, int key) {
        C part = inner_.split(color, key);
        std::int32_t mine = members_[static_cast<std::size_t>(rank())];
        std::vector<std::int32_t> members(static_cast<std::size_t>(part.size()));
        part.all_gather(Tensor::of(&mine, {1}), Tensor::of(members.data(), {part.size()}));
        return Shaped(std::move(part), links_, std::vector<int>(members.begin(), members.end()));
    }

private:
    Shaped(C inner, std::shared_ptr<const Links> links, std::vector<int> members)
        : inner_(std::move(inner)), links_(std::move(links)), members_(std::move(members)) {}

    struct Arrival {
        std::unique_ptr<std::int64_t> last;  // this rank's arrival, then everyone's latest
        Request exchange;
    };

    [[nodiscard]] Arrival arrive() {
        Arrival arrival{std::make_unique<std::int64_t>(detail::steady_now_ns()), Request()};
        const Tensor t = Tensor::of(arrival.last.get(), {1});
        arrival.exchange = inner_.all_reduce_async(t, t, ReduceOp::max);
        return arrival;
    }

    [[nodiscard]] Request finish(OpKind kind, std::size_t bytes, int root, Arrival arrival, Request operation) {
        const double seconds = links_->cost(kind, members_, static_cast<double>(bytes), root);
        auto deadline = std::make_shared<detail::ShapedDeadline>(detail::ShapedDeadline{
            std::move(arrival.last), std::move(arrival.exchange), 0, detail::seconds_to_ns(seconds), last_collective_, {}});
        last_collective_ = deadline;
        return Request(std::make_unique<detail::ShapedPending>(std::move(deadline), std::move(operation)));
    }

    // A transfer over one link: it starts when the send was posted (the
    // timing message says when) and does not queue behind collectives.
    [[nodiscard]] Request point_to_point(std::unique_ptr<std::int64_t> posted, Request timing, Request payload,
                                         std::int64_t now, int peer, std::size_t bytes) const {
        auto deadline = std::make_shared<detail::ShapedDeadline>(
            detail::ShapedDeadline{std::move(posted), std::move(timing), now, link_ns(peer, bytes), nullptr, {}});
        return Request(std::make_unique<detail::ShapedPending>(std::move(deadline), std::move(payload)));
    }

    [[nodiscard]] std::int64_t link_ns(int peer, std::size_t bytes) const {
        LOOM_CHECK(peer >= 0 && peer < size(), "Shaped: peer ", peer, " is not a rank of this communicator (0..",
                   size() - 1, ")");
        const Link& link = links_->between(members_[static_cast<std::size_t>(rank())], members_[static_cast<std::size_t>(peer)]);
        return detail::seconds_to_ns(link.seconds(static_cast<double>(bytes)));
    }

    C inner_;
    std::shared_ptr<const Links> links_;
    std::vector<int> members_;
    std::shared_ptr<detail::ShapedDeadline> last_collective_;  // what the next collective queues behind
};

}  // namespace loom::comm
