// The shared pieces of a DeviceThreadWorld's groups (device_thread_comm.cuh):
// events, a rank's stream, the state the members of one group share (the
// host rendezvous of thread_rendezvous.hpp plus each member's ready and done
// events), a point-to-point message with the events that order its copy, and
// the host's bounded wait for an event. Compile with nvcc, link loom::cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/thread_mailbox.hpp"
#include "loom/comm/thread_rendezvous.hpp"
#include "loom/comm/thread_sync.hpp"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"

namespace loom::comm::detail {

[[nodiscard]] inline cudaEvent_t make_event() {
    cudaEvent_t event = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
}

// One event, owned.
class DeviceEvent {
public:
    DeviceEvent() : event_(make_event()) {}
    DeviceEvent(const DeviceEvent&) = delete;
    DeviceEvent& operator=(const DeviceEvent&) = delete;
    ~DeviceEvent() { cudaEventDestroy(event_); }
    [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

private:
    cudaEvent_t event_;
};

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

// The state the members of one group share: GroupCore's (the slots, barrier
// and mailboxes of ThreadGroup, thread_rendezvous.hpp), plus the device and
// each member's ready and done events. The group owns the events, so a peer
// may still wait on a member's event after that member's communicator is gone.
struct DeviceGroup : GroupCore<DeviceGroup> {
    DeviceGroup(std::shared_ptr<FaultState> fault_state, std::vector<int> world_ranks, int device_index)
        : GroupCore(std::move(fault_state), std::move(world_ranks)), device(device_index) {
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

}  // namespace loom::comm::detail
