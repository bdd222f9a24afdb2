// FencedComm<C>: a communicator over the fenced test device
// (fenced_device.hpp). It unfences the pointers of tensors on that device
// and forwards every call to the wrapped host communicator, sync to sync and
// async to async, so rank threads can run the executor on "device" memory
// with ThreadComm moving the bytes. What a real device communicator
// (DeviceThreadComm, Nccl) does with real device memory, this does with the
// fenced kind, so the executor's device path is tested without a GPU.
// FencedRanks puts such ranks behind run_ranks_on(cuda_device(0), ...), and
// FencedProcesses joins "processes" (any host communicator) behind
// run_process_on(cuda_device(0), ...), as loom/cuda_backend_nccl.cuh does with NCCL.
// Test code only.
#pragma once

#include <functional>
#include <utility>

#include "loom/comm/any_comm.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/comm/device_processes.hpp"
#include "loom/comm/device_ranks.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "support/fenced_device.hpp"

namespace loom_test {

template <loom::comm::Communicator C>
class FencedComm {
public:
    explicit FencedComm(C inner) : inner_(std::move(inner)) {}

    [[nodiscard]] int rank() const { return inner_.rank(); }
    [[nodiscard]] int size() const { return inner_.size(); }

    void all_reduce(const loom::Tensor& s, const loom::Tensor& r, loom::comm::ReduceOp op) {
        inner_.all_reduce(host(s), host(r), op);
    }
    void reduce_scatter(const loom::Tensor& s, const loom::Tensor& r, loom::comm::ReduceOp op) {
        inner_.reduce_scatter(host(s), host(r), op);
    }
    void all_gather(const loom::Tensor& s, const loom::Tensor& r) { inner_.all_gather(host(s), host(r)); }
    void broadcast(const loom::Tensor& t, int root) { inner_.broadcast(host(t), root); }
    void all_to_all(const loom::Tensor& s, const loom::Tensor& r) { inner_.all_to_all(host(s), host(r)); }
    void send(const loom::Tensor& t, int peer, int tag) { inner_.send(host(t), peer, tag); }
    void recv(const loom::Tensor& t, int peer, int tag) { inner_.recv(host(t), peer, tag); }
    void barrier() { inner_.barrier(); }

    loom::comm::Request all_reduce_async(const loom::Tensor& s, const loom::Tensor& r, loom::comm::ReduceOp op) {
        return inner_.all_reduce_async(host(s), host(r), op);
    }
    loom::comm::Request reduce_scatter_async(const loom::Tensor& s, const loom::Tensor& r, loom::comm::ReduceOp op) {
        return inner_.reduce_scatter_async(host(s), host(r), op);
    }
    loom::comm::Request all_gather_async(const loom::Tensor& s, const loom::Tensor& r) {
        return inner_.all_gather_async(host(s), host(r));
    }
    loom::comm::Request broadcast_async(const loom::Tensor& t, int root) { return inner_.broadcast_async(host(t), root); }
    loom::comm::Request all_to_all_async(const loom::Tensor& s, const loom::Tensor& r) {
        return inner_.all_to_all_async(host(s), host(r));
    }
    loom::comm::Request send_async(const loom::Tensor& t, int peer, int tag) { return inner_.send_async(host(t), peer, tag); }
    loom::comm::Request recv_async(const loom::Tensor& t, int peer, int tag) { return inner_.recv_async(host(t), peer, tag); }

    [[nodiscard]] FencedComm split(int color, int key) { return FencedComm(inner_.split(color, key)); }

private:
    // The same elements as a host tensor: fenced device memory is host memory
    // behind a flipped bit. Host memory is refused, as DeviceThreadComm and
    // Nccl refuse it (comm/arguments.hpp), so the executor's device path is
    // held to moving device memory only.
    static loom::Tensor host(const loom::Tensor& t) {
        LOOM_CHECK(t.device().kind != loom::DeviceKind::host || t.numel() == 0, "FencedComm: a buffer ", t,
                   " is on host but this communicator moves cuda memory");
        if (t.device().kind == loom::DeviceKind::host) return t;
        return loom::Tensor(unfence(t.raw()), t.dtype(), t.shape(), t.strides(), loom::host_device);
    }

    C inner_;
};

// The fenced device's world of rank threads, installed for a scope as the
// DeviceRankRunner of cuda: ThreadWorld ranks whose communicators are
// FencedComm, handed to the body as AnyComm, as loom/cuda_backend.cuh does
// with DeviceThreadWorld on a GPU.
class FencedRanks final : public loom::comm::DeviceRankRunner {
public:
    FencedRanks() : scope_(loom::DeviceKind::cuda, this) {}

    void run(int ranks, loom::Device, const std::function<void(loom::comm::AnyComm&)>& body) const override {
        loom::comm::ThreadWorld(ranks).run([&](loom::comm::ThreadComm& comm) {
            FencedComm<loom::comm::ThreadComm> fenced(std::move(comm));
            loom::comm::AnyComm any = loom::comm::AnyComm::view(fenced);
            body(any);
        });
    }

private:
    loom::BackendScope<loom::comm::DeviceRankRunner> scope_;
};

// The fenced device's joiner of processes, installed for a scope as the
// DeviceProcessJoiner of cuda: the host communicator's ranks (split off, as
// NCCL's communicator is a new one) behind FencedComm, handed to the body as
// AnyComm. Counts its joins.
class FencedProcesses final : public loom::comm::DeviceProcessJoiner {
public:
    FencedProcesses() : scope_(loom::DeviceKind::cuda, this) {}

    void run(loom::comm::AnyComm& host, loom::Device, const std::function<void(loom::comm::AnyComm&)>& body) const override {
        FencedComm<loom::comm::AnyComm> fenced(host.split(0, host.rank()));
        loom::comm::AnyComm any = loom::comm::AnyComm::view(fenced);
        body(any);
    }

private:
    loom::BackendScope<loom::comm::DeviceProcessJoiner> scope_;
};

}  // namespace loom_test
