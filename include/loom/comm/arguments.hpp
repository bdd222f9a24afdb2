// Local validation of a communicator call's buffers, shared by every backend:
// the checks that need no peer (layout, dtype, counts against the group size,
// peer and root ranges). Each returns the call's signature, which backends
// compare across ranks when CommOptions::check_calls is on.
#pragma once

#include <cstdint>
#include <string_view>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

namespace detail {

inline void check_buffer(const Tensor& t, OpKind kind, std::string_view what, Device expected_device) {
    LOOM_CHECK(t.defined(), kind, ": the ", what, " buffer is null but has ", t.numel(), " elements");
    LOOM_CHECK(t.is_contiguous(), kind, ": the ", what, " buffer (shape ", t.shape(), ", strides ", t.strides(),
               ") is not contiguous; communicators move contiguous memory only");
    LOOM_CHECK(t.device().kind == expected_device.kind, kind, ": the ", what, " buffer is on ", t.device(),
               " but this communicator moves ", expected_device.kind, " memory");
}

inline void check_same_dtype(const Tensor& send, const Tensor& recv, OpKind kind) {
    LOOM_CHECK(send.dtype() == recv.dtype(), kind, ": send is ", send.dtype(), " but recv is ", recv.dtype(),
               "; both must have the same dtype");
}

// Partial overlap of send and recv is never meaningful; exact aliasing (or the
// in-place block layouts of reduce_scatter/all_gather) is checked by callers.
[[nodiscard]] inline bool overlaps(const Tensor& a, const Tensor& b) {
    if (a.empty() || b.empty()) return false;
    auto* a0 = static_cast<const char*>(a.raw());
    auto* b0 = static_cast<const char*>(b.raw());
    return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace detail

// The checks for each operation. `size` is the group size, `device` the kind of
// memory the backend moves.
struct ArgumentCheck {
    int rank;
    int size;
    Device device;

    [[nodiscard]] CallSignature all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) const {
        both(send, recv, OpKind::all_reduce);
        LOOM_CHECK(send.numel() == recv.numel(), "all_reduce: send has ", send.numel(), " elements but recv has ",
                   recv.numel(), "; they must be equal");
        LOOM_CHECK(send.raw() == recv.raw() || !detail::overlaps(send, recv),
                   "all_reduce: send and recv overlap partially; pass the same buffer twice for an in-place call");
        return {OpKind::all_reduce, send.dtype(), send.numel(), -1, op};
    }

    [[nodiscard]] CallSignature reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) const {
        both(send, recv, OpKind::reduce_scatter);
        LOOM_CHECK(send.numel() == size * recv.numel(), "reduce_scatter: send has ", send.numel(),
                   " elements but must have ", size, " ranks x ", recv.numel(), " (recv) = ", size * recv.numel());
        block_alias(send, recv, recv, OpKind::reduce_scatter);
        return {OpKind::reduce_scatter, send.dtype(), send.numel(), -1, op};
    }

    [[nodiscard]] CallSignature all_gather(const Tensor& send, const Tensor& recv) const {
        both(send, recv, OpKind::all_gather);
        LOOM_CHECK(recv.numel() == size * send.numel(), "all_gather: recv has ", recv.numel(),
                   " elements but must have ", size, " ranks x ", send.numel(), " (send) = ", size * send.numel());
        block_alias(recv, send, send, OpKind::all_gather);
        return {OpKind::all_gather, send.dtype(), send.numel(), -1, ReduceOp::sum};
    }

    [[nodiscard]] CallSignature all_to_all(const Tensor& send, const Tensor& recv) const {
        both(send, recv, OpKind::all_to_all);
        LOOM_CHECK(send.numel() == recv.numel(), "all_to_all: send has ", send.numel(), " elements but recv has ",
                   recv.numel(), "; they must be equal");
        LOOM_CHECK(send.numel() % size == 0, "all_to_all: ", send.numel(), " elements do not split into ", size,
                   " equal blocks, one per rank");
        LOOM_CHECK(send.raw() == recv.raw() || !detail::overlaps(send, recv),
                   "all_to_all: send and recv overlap partially; pass the same buffer twice for an in-place call");
        return {OpKind::all_to_all, send.dtype(), send.numel(), -1, ReduceOp::sum};
    }

    [[nodiscard]] CallSignature broadcast(const Tensor& buffer, int root) const {
        detail::check_buffer(buffer, OpKind::broadcast, "broadcast", device);
        check_rank(root, OpKind::broadcast, "root");
        return {OpKind::broadcast, buffer.dtype(), buffer.numel(), root, ReduceOp::sum};
    }

    void point_to_point(const Tensor& buffer, int peer, int tag, OpKind kind) const {
        detail::check_buffer(buffer, kind, kind == OpKind::send ? "send" : "recv", device);
        check_rank(peer, kind, "peer");
        LOOM_CHECK(peer != rank, kind, ": rank ", rank, " cannot ", kind, " to itself");
        LOOM_CHECK(tag >= 0 && tag < max_tag, kind, ": tag ", tag, " is outside [0, ", max_tag, ")");
    }

    // MPI guarantees tags up to 32767; loom keeps to that range everywhere.
    static constexpr int max_tag = 32768;

private:
    void both(const Tensor& send, const Tensor& recv, OpKind kind) const {
        detail::check_buffer(send, kind, "send", device);
        detail::check_buffer(recv, kind, "recv", device);
        detail::check_same_dtype(send, recv, kind);
    }

    void check_rank(int who, OpKind kind, std::string_view what) const {
        LOOM_CHECK(who >= 0 && who < size, kind, ": ", what, " ", who, " is not a rank of this communicator (0..",
                   size - 1, ")");
    }

    // `whole` holds size() blocks of `block`'s length; `part` may alias whole
    // only as this rank's block (the in-place layout NCCL and MPI accept).
    void block_alias(const Tensor& whole, const Tensor& part, const Tensor& block, OpKind kind) const {
        if (!detail::overlaps(whole, part)) return;
        auto* own = static_cast<const char*>(whole.raw()) + static_cast<std::size_t>(rank) * block.nbytes();
        LOOM_CHECK(part.raw() == own, kind, ": the buffers overlap; in place, the small buffer must be rank ", rank,
                   "'s block of the large one (element offset ", rank * block.numel(), ")");
    }
};

}  // namespace loom::comm
