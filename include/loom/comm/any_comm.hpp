// AnyComm: a Communicator whose transport is chosen at run time, behind a
// virtual interface. The executor and user code are host C++ that nvcc cannot
// compile (docs/cuda.md), while the GPU communicators (DeviceThreadComm,
// Nccl) are .cuh headers with device code: a backend's .cu file wraps its
// communicator in an AnyComm, and host code holds only AnyComm. Every call is
// forwarded as it came, sync to sync and async to async; results are the
// wrapped communicator's, bit for bit. The cost is one virtual call per
// collective.
//
//   loom::comm::ThreadComm& comm = ...;
//   loom::comm::AnyComm any = loom::comm::AnyComm::view(comm);   // forwards to comm
//   loom::exec::Executor<loom::comm::AnyComm> exec(model, any, plan, options);
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

class AnyComm {
public:
    // What a concrete communicator provides, one virtual per operation.
    class Transport {
    public:
        virtual ~Transport() = default;
        [[nodiscard]] virtual int rank() const = 0;
        [[nodiscard]] virtual int size() const = 0;
        virtual void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) = 0;
        virtual void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) = 0;
        virtual void all_gather(const Tensor& send, const Tensor& recv) = 0;
        virtual void broadcast(const Tensor& buffer, int root) = 0;
        virtual void all_to_all(const Tensor& send, const Tensor& recv) = 0;
        virtual void send(const Tensor& buffer, int peer, int tag) = 0;
        virtual void recv(const Tensor& buffer, int peer, int tag) = 0;
        virtual void barrier() = 0;
        [[nodiscard]] virtual Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) = 0;
        [[nodiscard]] virtual Request reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) = 0;
        [[nodiscard]] virtual Request all_gather_async(const Tensor& send, const Tensor& recv) = 0;
        [[nodiscard]] virtual Request broadcast_async(const Tensor& buffer, int root) = 0;
        [[nodiscard]] virtual Request all_to_all_async(const Tensor& send, const Tensor& recv) = 0;
        [[nodiscard]] virtual Request send_async(const Tensor& buffer, int peer, int tag) = 0;
        [[nodiscard]] virtual Request recv_async(const Tensor& buffer, int peer, int tag) = 0;
        // The communicator of split(color, key), owned by the result.
        [[nodiscard]] virtual std::unique_ptr<Transport> split(int color, int key) = 0;
    };

    explicit AnyComm(std::unique_ptr<Transport> transport) : transport_(std::move(transport)) {
        LOOM_CHECK(transport_ != nullptr, "AnyComm: no transport");
    }

    // An AnyComm that owns `comm`.
    template <Communicator C>
    [[nodiscard]] static AnyComm of(C comm);
    // An AnyComm that forwards to `comm`, which must outlive it (a world's
    // own communicator, which the world destroys when its ranks are done).
    template <Communicator C>
    [[nodiscard]] static AnyComm view(C& comm);

    [[nodiscard]] int rank() const { return transport_->rank(); }
    [[nodiscard]] int size() const { return transport_->size(); }
    void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) { transport_->all_reduce(send, recv, op); }
    void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
        transport_->reduce_scatter(send, recv, op);
    }
    void all_gather(const Tensor& send, const Tensor& recv) { transport_->all_gather(send, recv); }
    void broadcast(const Tensor& buffer, int root) { transport_->broadcast(buffer, root); }
    void all_to_all(const Tensor& send, const Tensor& recv) { transport_->all_to_all(send, recv); }
    void send(const Tensor& buffer, int peer, int tag) { transport_->send(buffer, peer, tag); }
    void recv(const Tensor& buffer, int peer, int tag) { transport_->recv(buffer, peer, tag); }
    void barrier() { transport_->barrier(); }
    [[nodiscard]] Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return transport_->all_reduce_async(send, recv, op);
    }
    [[nodiscard]] Request reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        return transport_->reduce_scatter_async(send, recv, op);
    }
    [[nodiscard]] Request all_gather_async(const Tensor& send, const Tensor& recv) {
        return transport_->all_gather_async(send, recv);
    }
    [[nodiscard]] Request broadcast_async(const Tensor& buffer, int root) {
        return transport_->broadcast_async(buffer, root);
    }
    [[nodiscard]] Request all_to_all_async(const Tensor& send, const Tensor& recv) {
        return transport_->all_to_all_async(send, recv);
    }
    [[nodiscard]] Request send_async(const Tensor& buffer, int peer, int tag) {
        return transport_->send_async(buffer, peer, tag);
    }
    [[nodiscard]] Request recv_async(const Tensor& buffer, int peer, int tag) {
        return transport_->recv_async(buffer, peer, tag);
    }
    [[nodiscard]] AnyComm split(int color, int key) { return AnyComm(transport_->split(color, key)); }

private:
    std::unique_ptr<Transport> transport_;
};

namespace detail {

// Forwards every operation to a C held by value (Owning) or by pointer (a view).
template <class C, bool Owning>
class TransportOf final : public AnyComm::Transport {
public:
    using Held = std::conditional_t<Owning, C, C*>;
    explicit TransportOf(Held held) : held_(std::move(held)) {}

    [[nodiscard]] int rank() const override { return comm().rank(); }
    [[nodiscard]] int size() const override { return comm().size(); }
    void all_reduce(const Tensor& s, const Tensor& r, ReduceOp op) override { comm().all_reduce(s, r, op); }
    void reduce_scatter(const Tensor& s, const Tensor& r, ReduceOp op) override { comm().reduce_scatter(s, r, op); }
    void all_gather(const Tensor& s, const Tensor& r) override { comm().all_gather(s, r); }
    void broadcast(const Tensor& b, int root) override { comm().broadcast(b, root); }
    void all_to_all(const Tensor& s, const Tensor& r) override { comm().all_to_all(s, r); }
    void send(const Tensor& b, int peer, int tag) override { comm().send(b, peer, tag); }
    void recv(const Tensor& b, int peer, int tag) override { comm().recv(b, peer, tag); }
    void barrier() override { comm().barrier(); }
    [[nodiscard]] Request all_reduce_async(const Tensor& s, const Tensor& r, ReduceOp op) override {
        return comm().all_reduce_async(s, r, op);
    }
    [[nodiscard]] Request reduce_scatter_async(const Tensor& s, const Tensor& r, ReduceOp op) override {
        return comm().reduce_scatter_async(s, r, op);
    }
    [[nodiscard]] Request all_gather_async(const Tensor& s, const Tensor& r) override {
        return comm().all_gather_async(s, r);
    }
    [[nodiscard]] Request broadcast_async(const Tensor& b, int root) override { return comm().broadcast_async(b, root); }
    [[nodiscard]] Request all_to_all_async(const Tensor& s, const Tensor& r) override {
        return comm().all_to_all_async(s, r);
    }
    [[nodiscard]] Request send_async(const Tensor& b, int peer, int tag) override {
        return comm().send_async(b, peer, tag);
    }
    [[nodiscard]] Request recv_async(const Tensor& b, int peer, int tag) override {
        return comm().recv_async(b, peer, tag);
    }
    // A split is a new communicator, owned whatever the parent is.
    [[nodiscard]] std::unique_ptr<AnyComm::Transport> split(int color, int key) override {
        return std::make_unique<TransportOf<C, true>>(comm().split(color, key));
    }

private:
    [[nodiscard]] C& comm() {
        if constexpr (Owning) return held_;
        else return *held_;
    }
    [[nodiscard]] const C& comm() const {
        if constexpr (Owning) return held_;
        else return *held_;
    }

    Held held_;
};

}  // namespace detail

template <Communicator C>
AnyComm AnyComm::of(C comm) {
    return AnyComm(std::make_unique<detail::TransportOf<C, true>>(std::move(comm)));
}

template <Communicator C>
AnyComm AnyComm::view(C& comm) {
    return AnyComm(std::make_unique<detail::TransportOf<C, false>>(&comm));
}

static_assert(Communicator<AnyComm>);

}  // namespace loom::comm
