// Collectives on host arrays over a communicator that moves memory on
// `where`. A device communicator (DeviceThreadComm, Nccl, or AnyComm over
// one) refuses host memory, so the array goes to a device buffer there, the
// collective runs on it, and the result comes back; on the host these are the
// plain calls. For the small host-side exchanges around training (a
// checkpoint's arrays, profiled unit times, trace text), not for the step's
// traffic, which lives on the device already. Each waits for its collective
// through the Request, not through the copy home: a device communicator's
// blocking forms may return once the work is queued (Nccl's do), and the
// Request's wait keeps the communicator's timeout where the copy would wait
// on the stream for ever.
#pragma once

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

namespace detail {

// A device buffer shaped and typed as `t`, on `where`.
[[nodiscard]] inline DeviceBuffer staging_for(const Tensor& t, Device where) {
    return DeviceBuffer(t.dtype(), t.shape(), where);
}

}  // namespace detail

// recv = every rank's send, rank order; send and recv on the host.
template <Communicator C>
void staged_all_gather(C& comm, const Tensor& send, const Tensor& recv, Device where) {
    if (where.kind == DeviceKind::host) {
        comm.all_gather(send, recv);
        return;
    }
    const DeviceBuffer from = detail::staging_for(send, where), to = detail::staging_for(recv, where);
    copy_tensor(from.tensor(), send);
    comm.all_gather_async(from.tensor(), to.tensor()).wait();
    copy_tensor(recv, to.tensor());
}

// t = op over every rank's t, in place, on the host.
template <Communicator C>
void staged_all_reduce(C& comm, const Tensor& t, ReduceOp op, Device where) {
    if (where.kind == DeviceKind::host) {
        comm.all_reduce(t, t, op);
        return;
    }
    const DeviceBuffer staged = detail::staging_for(t, where);
    copy_tensor(staged.tensor(), t);
    comm.all_reduce_async(staged.tensor(), staged.tensor(), op).wait();
    copy_tensor(t, staged.tensor());
}

// t = root's t, on the host.
template <Communicator C>
void staged_broadcast(C& comm, const Tensor& t, int root, Device where) {
    if (where.kind == DeviceKind::host) {
        comm.broadcast(t, root);
        return;
    }
    const DeviceBuffer staged = detail::staging_for(t, where);
    copy_tensor(staged.tensor(), t);
    comm.broadcast_async(staged.tensor(), root).wait();
    copy_tensor(t, staged.tensor());
}

}  // namespace loom::comm
