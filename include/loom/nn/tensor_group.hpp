// TensorGroup: the ranks that share one layer's work under tensor
// parallelism (the tp axis), as a layer sees them. A sharded layer needs only
// two collectives, in place: Megatron's conjugate operators f (identity
// forward, all-reduce of the input gradient backward, before a
// column-parallel Linear) and g (all-reduce of the output forward, identity
// backward, after a row-parallel one), plus an all-gather for layers that
// must see a whole tensor and an all-reduce-max for a softmax over a
// vocabulary split across the group (its per-row maximum). Optimus 2D adds a
// reduce-scatter and broadcasts, on the rows and columns of its grid
// (nn/summa.hpp); sequence parallelism point-to-point and all-to-all on the
// sp axis (nn/ring_attention.hpp). Layers reach the group through their Context, which the
// executor points at its tp communicator; without one a layer runs whole.
// Type-erased so that nn/ does not depend on a communicator type.
#pragma once

#include <cstdint>
#include <optional>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/nn/cast_all_reduce.hpp"

namespace loom::nn {

// How a Linear is cut over the tp axis.
//   columns: W's output rows split; input whole, output a slice (f before it)
//   rows:    W's input columns split; input a slice, output summed (g after it)
//   grid:    Optimus 2D: W, input and output all in q x q blocks (SUMMA)
enum class Split : std::uint8_t { none, columns, rows, grid };

class TensorGroup {
public:
    virtual ~TensorGroup() = default;
    [[nodiscard]] virtual int rank() const = 0;
    [[nodiscard]] virtual int size() const = 0;
    virtual void all_reduce_sum(const Tensor& t) const = 0;                       // in place
    // The sum of every rank's `send` into `recv`, in the background: for a
    // layer that computes while its sum travels (Kraken's). Exact, never cast.
    [[nodiscard]] virtual comm::Request all_reduce_sum_async(const Tensor& send, const Tensor& recv) const = 0;
    // The sums of Megatron's f and g operators and the vocabulary-parallel
    // embedding: activations and their gradients, which GradCompress<Cast,
    // TpAxis> may send as 16-bit values. Statistics (a softmax's sums, a
    // norm's moments) use all_reduce_sum, always exact.
    virtual void all_reduce_activations(const Tensor& t) const { all_reduce_sum(t); }
    virtual void all_reduce_max(const Tensor& t) const = 0;                       // in place
    virtual void all_gather(const Tensor& local, const Tensor& whole) const = 0;  // rank r's block at r
    // Rank r gets the sum of every rank's block r of `whole` (size() blocks).
    virtual void reduce_scatter_sum(const Tensor& whole, const Tensor& local) const = 0;
    virtual void broadcast(const Tensor& t, int root) const = 0;
    [[nodiscard]] virtual comm::Request broadcast_async(const Tensor& t, int root) const = 0;
    // Sequence parallelism: ring attention passes blocks to a neighbour,
    // Ulysses exchanges one block with every rank (block r of send to rank r).
    [[nodiscard]] virtual comm::Request send_async(const Tensor& t, int peer, int tag) const = 0;
    [[nodiscard]] virtual comm::Request recv_async(const Tensor& t, int peer, int tag) const = 0;
    virtual void all_to_all(const Tensor& send, const Tensor& recv) const = 0;
};

// Any Communicator as a TensorGroup; `comm` must outlive it.
template <comm::Communicator C>
class TensorGroupOf final : public TensorGroup {
public:
    explicit TensorGroupOf(C& comm) : comm_(&comm) {}
    // With `cast`, all_reduce_activations sends 16-bit values (nn/cast_all_reduce.hpp).
    TensorGroupOf(C& comm, kernels::host::Cast cast) : comm_(&comm), cast_(cast) {}
    [[nodiscard]] int rank() const override { return comm_->rank(); }
    [[nodiscard]] int size() const override { return comm_->size(); }
    void all_reduce_sum(const Tensor& t) const override { comm_->all_reduce(t, t, comm::ReduceOp::sum); }
    [[nodiscard]] comm::Request all_reduce_sum_async(const Tensor& send, const Tensor& recv) const override {
        return comm_->all_reduce_async(send, recv, comm::ReduceOp::sum);
    }
    void all_reduce_activations(const Tensor& t) const override {
        if (cast_ && t.dtype() == DType::f32) cast_all_reduce_sum(*comm_, t, *cast_, scratch_);
        else all_reduce_sum(t);
    }
    void all_reduce_max(const Tensor& t) const override { comm_->all_reduce(t, t, comm::ReduceOp::max); }
    void all_gather(const Tensor& local, const Tensor& whole) const override { comm_->all_gather(local, whole); }
    void reduce_scatter_sum(const Tensor& whole, const Tensor& local) const override {
        comm_->reduce_scatter(whole, local, comm::ReduceOp::sum);
    }
    void broadcast(const Tensor& t, int root) const override { comm_->broadcast(t, root); }
    [[nodiscard]] comm::Request broadcast_async(const Tensor& t, int root) const override {
        return comm_->broadcast_async(t, root);
    }
    [[nodiscard]] comm::Request send_async(const Tensor& t, int peer, int tag) const override {
        return comm_->send_async(t, peer, tag);
    }
    [[nodiscard]] comm::Request recv_async(const Tensor& t, int peer, int tag) const override {
        return comm_->recv_async(t, peer, tag);
    }
    void all_to_all(const Tensor& send, const Tensor& recv) const override { comm_->all_to_all(send, recv); }

private:
    C* comm_;
    std::optional<kernels::host::Cast> cast_;
    mutable CastScratch scratch_;  // one rank's, used by its own thread
};

}  // namespace loom::nn
