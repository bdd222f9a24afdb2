// A device communicator on host tensors, so the host-memory collective suite
// (tests/comm/collective_suite.hpp) runs unchanged on Nccl
// (test_nccl_comm.cu) and DeviceThreadComm (test_device_thread_world.cu):
// each call's host buffers are mirrored in device memory on the
// communicator's stream, the call runs on the mirrors, and its result is
// copied home. Test code only, all inline; include it as
// "staged_collectives.hpp" from a file in tests/cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <utility>

#include "loom/comm/communicator.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"

namespace loom_test {

// Device bytes from the stream-ordered pool, freed in stream order.
class DeviceBytes {
public:
    DeviceBytes() = default;
    DeviceBytes(std::size_t bytes, cudaStream_t stream) : stream_(stream) {
        if (bytes > 0) LOOM_CUDA_CHECK(cudaMallocAsync(&data_, bytes, stream));
    }
    DeviceBytes(DeviceBytes&& other) noexcept { swap(other); }
    DeviceBytes& operator=(DeviceBytes&& other) noexcept {
        DeviceBytes(std::move(other)).swap(*this);
        return *this;
    }
    ~DeviceBytes() {
        if (data_ != nullptr) cudaFreeAsync(data_, stream_);
    }
    void swap(DeviceBytes& other) noexcept {
        std::swap(data_, other.data_);
        std::swap(stream_, other.stream_);
    }
    [[nodiscard]] char* get() const { return static_cast<char*>(data_); }

private:
    void* data_ = nullptr;
    cudaStream_t stream_ = nullptr;
};

// One call's host buffers mirrored in device memory. Buffers that overlap on
// the host share one allocation at the same offsets, so in-place calls (same
// buffer, or a block of the other) stay in place on the device.
class Staging {
public:
    template <class Comm>
    Staging(Comm& comm, std::optional<loom::Tensor> in, std::optional<loom::Tensor> out)
        : stream_(comm.stream()), device_(comm.device()), host_out_(out) {
        const bool shared = in && out && (in->raw() == out->raw() || overlaps(*in, *out));
        if (shared) {
            char* lo = std::min(begin(*in), begin(*out));
            char* hi = std::max(end(*in), end(*out));
            whole_ = DeviceBytes(static_cast<std::size_t>(hi - lo), stream_);
            upload(whole_.get(), lo, static_cast<std::size_t>(hi - lo));
            in_ = view(*in, whole_.get() + (begin(*in) - lo));
            out_ = view(*out, whole_.get() + (begin(*out) - lo));
            return;
        }
        if (in) {
            in_bytes_ = DeviceBytes(in->nbytes(), stream_);
            upload(in_bytes_.get(), begin(*in), in->nbytes());
            in_ = view(*in, in_bytes_.get());
        }
        if (out) {
            out_bytes_ = DeviceBytes(out->nbytes(), stream_);
            out_ = view(*out, out_bytes_.get());
        }
    }

    [[nodiscard]] const loom::Tensor& in() const { return in_; }
    [[nodiscard]] const loom::Tensor& out() const { return out_; }

    // Copies the result home, in stream order after the operation, and waits for it.
    void finish() {
        if (!host_out_ || host_out_->empty()) return;
        LOOM_CUDA_CHECK(
            cudaMemcpyAsync(host_out_->raw(), out_.raw(), host_out_->nbytes(), cudaMemcpyDeviceToHost, stream_));
        LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

private:
    static char* begin(const loom::Tensor& t) { return static_cast<char*>(t.raw()); }
    static char* end(const loom::Tensor& t) { return begin(t) + t.nbytes(); }
    static bool overlaps(const loom::Tensor& a, const loom::Tensor& b) {
        return begin(a) < end(b) && begin(b) < end(a);
    }

    void upload(char* to, const char* from, std::size_t bytes) {
        if (bytes > 0) LOOM_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyHostToDevice, stream_));
    }
    [[nodiscard]] loom::Tensor view(const loom::Tensor& host, char* at) const {
        return loom::Tensor(at, host.dtype(), host.shape(), device_);
    }

    cudaStream_t stream_;
    loom::Device device_;
    std::optional<loom::Tensor> host_out_;
    DeviceBytes whole_, in_bytes_, out_bytes_;
    loom::Tensor in_, out_;
};

// Completes the device operation, then copies its result home.
class StagedPending final : public loom::comm::Request::Pending {
public:
    StagedPending(loom::comm::Request inner, std::unique_ptr<Staging> staging)
        : inner_(std::move(inner)), staging_(std::move(staging)) {}
    bool test() override {
        if (!inner_.test()) return false;
        staging_->finish();
        return true;
    }
    void wait() override {
        inner_.wait();
        staging_->finish();
    }

private:
    loom::comm::Request inner_;
    std::unique_ptr<Staging> staging_;
};

// `Comm` (with stream() and device()) on host tensors. With
// `synchronize_each_call`, a blocking call also waits for comm.synchronize()
// before its result is copied home (Nccl: so the call's device errors and
// timeouts surface from the call itself).
template <class Comm, bool synchronize_each_call = false>
class Staged {
public:
    using Tensor = loom::Tensor;
    using ReduceOp = loom::comm::ReduceOp;
    using Request = loom::comm::Request;

    explicit Staged(Comm& comm) : comm_(comm) {}

    [[nodiscard]] int rank() const { return comm_.rank(); }
    [[nodiscard]] int size() const { return comm_.size(); }

    void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) {
        now(send, recv, [&](Staging& s) { comm_.all_reduce(s.in(), s.out(), op); });
    }
    void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
        now(send, recv, [&](Staging& s) { comm_.reduce_scatter(s.in(), s.out(), op); });
    }
    void all_gather(const Tensor& send, const Tensor& recv) {
        now(send, recv, [&](Staging& s) { comm_.all_gather(s.in(), s.out()); });
    }
    void broadcast(const Tensor& buffer, int root) {
        now(buffer, buffer, [&](Staging& s) { comm_.broadcast(s.out(), root); });
    }
    void all_to_all(const Tensor& send, const Tensor& recv) {
        now(send, recv, [&](Staging& s) { comm_.all_to_all(s.in(), s.out()); });
    }
    void send(const Tensor& buffer, int peer, int tag) {
        now(buffer, std::nullopt, [&](Staging& s) { comm_.send(s.in(), peer, tag); });
    }
    void recv(const Tensor& buffer, int peer, int tag) {
        now(std::nullopt, buffer, [&](Staging& s) { comm_.recv(s.out(), peer, tag); });
    }
    void barrier() { comm_.barrier(); }

    Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return later(send, recv, [&](Staging& s) { return comm_.all_reduce_async(s.in(), s.out(), op); });
    }
    Request all_gather_async(const Tensor& send, const Tensor& recv) {
        return later(send, recv, [&](Staging& s) { return comm_.all_gather_async(s.in(), s.out()); });
    }
    Request send_async(const Tensor& buffer, int peer, int tag) {
        return later(buffer, std::nullopt, [&](Staging& s) { return comm_.send_async(s.in(), peer, tag); });
    }
    Request recv_async(const Tensor& buffer, int peer, int tag) {
        return later(std::nullopt, buffer, [&](Staging& s) { return comm_.recv_async(s.out(), peer, tag); });
    }

private:
    template <class Call>
    void now(std::optional<Tensor> in, std::optional<Tensor> out, Call&& call) {
        Staging staging(comm_, in, out);
        call(staging);
        if constexpr (synchronize_each_call) comm_.synchronize();
        staging.finish();
    }
    template <class Call>
    Request later(std::optional<Tensor> in, std::optional<Tensor> out, Call&& call) {
        auto staging = std::make_unique<Staging>(comm_, in, out);
        Request inner = call(*staging);
        return Request(std::make_unique<StagedPending>(std::move(inner), std::move(staging)));
    }

    Comm& comm_;
};

}  // namespace loom_test
