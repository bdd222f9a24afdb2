// StreamScratch: device memory a kernel launcher reuses from call to call,
// the device's equivalent of a caller-owned host vector (pack_top_k's
// magnitudes, the bf16 copies of a GEMM's operands). It comes from CUDA's
// stream-ordered pool, grows to the largest call and never shrinks, so a
// steady training step allocates nothing.
//
// Safe across streams: it remembers (with an event) the last work that used
// it, so a call on another stream waits for that work before reusing the
// memory, and its destructor frees the memory in stream order after it, on
// the legacy default stream of the memory's device (made current for the
// call: a rank thread on cuda:1 may end with another device current), so the
// scratch may outlive the streams it was used on. One scratch serves one
// device, and one call at a time; give concurrent streams a scratch each to
// let them overlap. Creating one touches no CUDA API; the first acquire
// allocates, on the device current then.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "loom/core/check_cuda.hpp"

namespace loom::kernels::cuda {

class StreamScratch {
public:
    StreamScratch() = default;
    StreamScratch(const StreamScratch&) = delete;
    StreamScratch& operator=(const StreamScratch&) = delete;
    // Frees in stream order after the last work that used the memory; cannot
    // throw, errors surface on the next CUDA call.
    ~StreamScratch() {
        if (last_use_ == nullptr && memory_ == nullptr) return;
        int current = device_;
        cudaGetDevice(&current);
        if (current != device_) cudaSetDevice(device_);
        if (memory_ != nullptr) {
            if (last_use_ != nullptr) cudaStreamWaitEvent(cudaStreamLegacy, last_use_, 0);
            cudaFreeAsync(memory_, cudaStreamLegacy);
        }
        if (last_use_ != nullptr) cudaEventDestroy(last_use_);
        if (current != device_) cudaSetDevice(current);
    }

    [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

    // For the launchers: at least `bytes` of device memory that work queued
    // on `stream` from now on may use; the previous use (on any stream) is
    // ordered before it. Pair with finished_on(stream) once the work is
    // queued (StreamScratchUse does it at the end of a scope).
    [[nodiscard]] void* acquire(std::size_t bytes, cudaStream_t stream) {
        if (last_use_ == nullptr) {
            LOOM_CUDA_CHECK(cudaGetDevice(&device_));
            LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&last_use_, cudaEventDisableTiming));
        } else
            LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, last_use_, 0));
        if (bytes > capacity_) {
            if (memory_ != nullptr) {
                void* old = memory_;
                memory_ = nullptr;
                capacity_ = 0;
                LOOM_CUDA_CHECK(cudaFreeAsync(old, stream));
            }
            LOOM_CUDA_CHECK(cudaMallocAsync(&memory_, bytes, stream));
            capacity_ = bytes;
        }
        return memory_;
    }

    // Marks the end of the work queued on `stream` that uses the memory.
    void finished_on(cudaStream_t stream) noexcept {
        if (last_use_ != nullptr) cudaEventRecord(last_use_, stream);  // errors surface on the next call
    }

private:
    void* memory_ = nullptr;
    std::size_t capacity_ = 0;
    cudaEvent_t last_use_ = nullptr;
    int device_ = 0;  // where the memory and the event live (current at the first acquire)
};

// Marks a scratch's use on a stream finished when the scope ends, however it
// ends (a launch that throws half-way still orders the next use after the
// work it did queue).
class StreamScratchUse {
public:
    StreamScratchUse(StreamScratch& scratch, cudaStream_t stream) : scratch_(scratch), stream_(stream) {}
    StreamScratchUse(const StreamScratchUse&) = delete;
    StreamScratchUse& operator=(const StreamScratchUse&) = delete;
    ~StreamScratchUse() { scratch_.finished_on(stream_); }

private:
    StreamScratch& scratch_;
    cudaStream_t stream_;
};

}  // namespace loom::kernels::cuda
