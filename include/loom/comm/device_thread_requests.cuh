// The Requests a DeviceThreadComm returns (device_thread_comm.cuh): its async
// collectives, and its sends and receives.
//
// An async collective runs on the rank's progress thread; its Request waits
// for that job, then for an event recorded after the work it enqueued.
//
// Point to point: a send records an event on the sender's stream and posts a
// descriptor in the receiver's mailbox (thread_mailbox.hpp); the matching
// receive makes the receiver's stream wait for that event, copies straight
// from the sender's buffer and records a `copied` event. Messages match in
// order per (peer, tag). A send's or a receive's Request completes once that
// copy has completed on the device. Compile with nvcc, link loom::cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "loom/comm/communicator.hpp"
#include "loom/comm/device_thread_group.cuh"
#include "loom/comm/thread_mailbox.hpp"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm::detail {

// An async collective: its job on the progress thread, then `finished`,
// recorded on the rank's stream after the work.
class DeviceAsyncPending final : public Request::Pending {
public:
    DeviceAsyncPending(Request job, std::shared_ptr<DeviceEvent> finished, std::shared_ptr<DeviceGroup> group,
                       OpKind kind, int world_rank)
        : job_(std::move(job)), finished_(std::move(finished)), group_(std::move(group)), kind_(kind),
          world_rank_(world_rank) {}
    bool test() override {
        if (!job_.test()) return false;
        if (event_done(finished_->get())) return true;
        if (group_->fault->failed()) group_->fault->throw_failure();
        return false;
    }
    void wait() override {
        job_.wait();
        wait_for_event(*group_->fault, finished_->get(), name(kind_), world_rank_, group_->device);
    }

private:
    Request job_;
    std::shared_ptr<DeviceEvent> finished_;
    std::shared_ptr<DeviceGroup> group_;
    OpKind kind_;
    int world_rank_;
};

class DeviceSendPending final : public Request::Pending {
public:
    DeviceSendPending(std::shared_ptr<DeviceGroup> group, std::shared_ptr<DeviceMessage> message, int me, int peer)
        : group_(std::move(group)), message_(std::move(message)), me_(me), peer_(peer) {}

    bool test() override {
        if (message_->done.load(std::memory_order_acquire) && event_done(message_->copied_event)) return true;
        if (group_->fault->failed()) group_->fault->throw_failure();
        return false;
    }
    void wait() override {
        await_receiver(*group_->fault, group_->barrier, *message_, me_, peer_);
        wait_for_event(*group_->fault, message_->copied_event, "send", group_->barrier.world_rank(me_),
                       group_->device);
    }

private:
    std::shared_ptr<DeviceGroup> group_;
    std::shared_ptr<DeviceMessage> message_;
    int me_, peer_;
};

class DeviceRecvPending final : public Request::Pending {
public:
    DeviceRecvPending(std::shared_ptr<DeviceGroup> group, Tensor buffer, int me, int peer, int tag,
                      std::uint64_t sequence, cudaStream_t stream)
        : group_(std::move(group)), buffer_(buffer), me_(me), peer_(peer), tag_(tag), sequence_(sequence),
          stream_(stream) {}

    // Host side: until the message is matched and its copy enqueued on this rank's stream.
    void match() {
        await_sender(*group_->fault, group_->barrier, [&] { return try_receive(); }, peer_, me_, tag_);
    }
    bool test() override {
        if (group_->fault->failed()) group_->fault->throw_failure();
        return try_receive() && event_done(message_->copied_event);
    }
    void wait() override {
        match();
        wait_for_event(*group_->fault, message_->copied_event, "recv", group_->barrier.world_rank(me_),
                       group_->device);
    }

private:
    bool try_receive() {
        if (message_) return true;
        auto posted = group_->mailboxes[static_cast<std::size_t>(me_)].take(peer_, tag_, sequence_);
        if (!posted) return false;
        auto message = std::static_pointer_cast<DeviceMessage>(std::move(posted));
        deliver(*message);
        message_ = std::move(message);
        return true;
    }

    // thread_mailbox.hpp's deliver(), with the copy on the device: the same
    // mismatch sentence, failing the world so the sender fails too.
    void deliver(DeviceMessage& message) {
        check_delivery(*group_->fault, group_->barrier, message, buffer_, me_);
        loom::detail::CudaDeviceScope scope(group_->device);
        LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, message.ready_event, 0));
        if (buffer_.nbytes() != 0)
            LOOM_CUDA_CHECK(
                cudaMemcpyAsync(buffer_.raw(), message.data, buffer_.nbytes(), cudaMemcpyDeviceToDevice, stream_));
        LOOM_CUDA_CHECK(cudaEventRecord(message.copied_event, stream_));
        mark_delivered(*group_->fault, message);  // enqueued, for traces
    }

    std::shared_ptr<DeviceGroup> group_;
    Tensor buffer_;
    int me_, peer_, tag_;
    std::uint64_t sequence_;
    cudaStream_t stream_;
    std::shared_ptr<DeviceMessage> message_;
};

}  // namespace loom::comm::detail
