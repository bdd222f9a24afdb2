// loom::comm::Nccl: the Communicator over NCCL, for buffers in CUDA device
// memory. A .cuh because bf16/f16 reductions run loom's own conversion
// kernels (device_reduce.cuh); the parts without device code live in
// transport_nccl.hpp. Compile with nvcc, link loom::nccl.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/comm/arguments.hpp"
#include "loom/comm/communicator.hpp"
#include "loom/comm/device_reduce.cuh"
#include "loom/comm/transport_nccl.hpp"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/check_nccl.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::comm {

// One rank of an NCCL communicator, bound to one GPU and one CUDA stream.
//
// Stream order, as in NCCL. Every call enqueues its work on stream() and
// returns; the blocking forms (all_reduce, send, ...) return once the work is
// enqueued, not done. Results are ready in stream order: a kernel enqueued
// later on the same stream sees them, the host sees them after synchronize(),
// barrier() or a Request's wait(). Input buffers must likewise be ready in
// that order (produce them on this stream, or make it wait on an event). The
// *_async forms return a Request whose test()/wait() query an event recorded
// after the operation; until then its buffers belong to NCCL.
//
// Point to point. NCCL has no tags and pairs each direction's messages in
// the order they are issued, and so does this communicator: a link's
// messages match in posting order, whatever their tags (the one departure
// from the Communicator contract, communicator.hpp). The calls posted since
// the last synchronising point (a sync send/recv, a wait or test of one of
// them, any collective) are issued together, in posting order, as one NCCL
// group, so an exchange (post every send and recv, then wait) progresses
// without deadlocking on the stream. A blocking send/recv is issued at once;
// like MPI_Send it can deadlock if both sides send first.
//
// Reductions. sum and max of f32, i32 and i64 run in NCCL. bf16 and f16 widen
// to f32 in scratch memory, NCCL sums the f32 values, and each result is
// rounded once (NCCL's own bf16 sum would round after every step). Float max
// runs on order-preserving integer keys, so NaN propagates (NCCL's fmaxf
// drops it). avg divides the sum by size() once, as the serial reference does.
//
// Faults. A Request's wait/test, barrier() and synchronize() poll the event
// and ncclCommGetAsyncError: an NCCL error, or no completion within
// CommOptions::timeout, aborts the communicator (ncclCommAbort) and throws
// loom::Error; every later call throws that the communicator was aborted.
// (Blocking forms do not wait, so their faults surface at the next of these.)
// Initialisation and split block until all ranks arrive, as in NCCL. The
// destructor lets the stream drain, within the timeout, then aborts the
// communicator: ncclCommDestroy would end in a barrier with the node's other
// ranks, which has no timeout and hangs when any of them aborted.
// With CommOptions::check_calls every collective first all-gathers its
// signature and waits for it, so a mismatch throws on every rank.
//
// Threads. One thread drives one communicator. A process driving several GPUs
// uses one thread per communicator (NCCL would otherwise need its calls from
// one thread grouped).
class Nccl {
public:
    // Adopts `comm`, an NCCL communicator on CUDA device `device`. Work goes on
    // `stream`; without one the communicator creates and owns a stream.
    Nccl(ncclComm_t comm, int device, std::optional<cudaStream_t> stream = std::nullopt, CommOptions options = {}) {
        LOOM_CHECK(comm != nullptr, "Nccl: the NCCL communicator is null; create it with ncclCommInitRank, "
                                    "Nccl::bootstrap or Nccl::in_process");
        std::shared_ptr<detail::NcclStream> owned;
        try {
            check_device(device);
            int comm_device = -1;
            LOOM_NCCL_CHECK(ncclCommCuDevice(comm, &comm_device));
            LOOM_CHECK(comm_device == device, "Nccl: the NCCL communicator runs on ", cuda_device(comm_device),
                       " but device ", device, " was given; pass ", comm_device);
            owned = std::make_shared<detail::NcclStream>(device, stream);
        } catch (...) {
            ncclCommAbort(comm);  // an error path: no barrier with the other ranks
            throw;
        }
        t_ = std::make_shared<detail::NcclTransport>(comm, device, std::move(owned), options);
    }

    // One rank per process (or per thread): rank 0 of `host`, any loom host
    // Communicator (Mpi, a ThreadWorld rank), creates NCCL's unique id and
    // broadcasts it; every rank then joins with ncclCommInitRank on `device`.
    // The NCCL ranks are the host communicator's.
    template <Communicator Host>
    [[nodiscard]] static Nccl bootstrap(Host& host, int device, std::optional<cudaStream_t> stream = std::nullopt,
                                        CommOptions options = {}) {
        check_device(device);
        const ncclUniqueId id = detail::share_unique_id(host);
        ncclComm_t comm = nullptr;
        {
            loom::detail::CudaDeviceScope scope(device);
            LOOM_NCCL_CHECK(ncclCommInitRank(&comm, host.size(), id, host.rank()));
        }
        return Nccl(comm, device, stream, options);
    }

    // One process driving several GPUs: rank i on devices[i], each with its
    // own stream (ncclCommInitAll). Drive each from its own thread.
    [[nodiscard]] static std::vector<Nccl> in_process(const std::vector<int>& devices, CommOptions options = {}) {
        LOOM_CHECK(!devices.empty(), "Nccl::in_process: no devices given; pass the CUDA device of every rank");
        for (std::size_t i = 0; i < devices.size(); ++i) {
            check_device(devices[i]);
            for (std::size_t j = 0; j < i; ++j)
                LOOM_CHECK(devices[j] != devices[i], "Nccl::in_process: device ", devices[i], " is given for ranks ",
                           j, " and ", i, "; NCCL cannot put two ranks of one communicator on one GPU");
        }
        share_memory_pools(devices);
        std::vector<ncclComm_t> comms(devices.size(), nullptr);
        LOOM_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
        std::vector<Nccl> ranks;
        ranks.reserve(devices.size());
        for (std::size_t i = 0; i < comms.size(); ++i) {
            try {
                ranks.push_back(Nccl(comms[i], devices[i], std::nullopt, options));
            } catch (...) {
                for (std::size_t j = i + 1; j < comms.size(); ++j) ncclCommAbort(comms[j]);
                throw;
            }
        }
        return ranks;
    }

    Nccl(Nccl&&) noexcept = default;
    Nccl& operator=(Nccl&&) noexcept = default;
    Nccl(const Nccl&) = delete;
    Nccl& operator=(const Nccl&) = delete;
    ~Nccl() = default;

    [[nodiscard]] int rank() const { return t_->rank(); }
    [[nodiscard]] int size() const { return t_->size(); }
    [[nodiscard]] Device device() const { return cuda_device(t_->device()); }
    [[nodiscard]] cudaStream_t stream() const { return t_->stream(); }
    [[nodiscard]] ncclComm_t native_handle() const { return t_->comm(); }

    void all_reduce(const Tensor& send, const Tensor& recv, ReduceOp op) {
        begin(check().all_reduce(send, recv, op), send, recv);
        reduce(send, recv, op, /*scatter=*/false);
    }
    void reduce_scatter(const Tensor& send, const Tensor& recv, ReduceOp op) {
        begin(check().reduce_scatter(send, recv, op), send, recv);
        reduce(send, recv, op, /*scatter=*/true);
    }
    void all_gather(const Tensor& send, const Tensor& recv) {
        begin(check().all_gather(send, recv), send, recv);
        if (send.empty()) return;
        loom::detail::CudaDeviceScope scope(t_->device());
        // Bytes: data movement does not depend on the element type.
        t_->check(ncclAllGather(send.raw(), recv.raw(), send.nbytes(), ncclInt8, t_->comm(), t_->stream()),
                  "ncclAllGather");
    }
    void broadcast(const Tensor& buffer, int root) {
        begin(check().broadcast(buffer, root), buffer, buffer);
        if (buffer.empty()) return;
        loom::detail::CudaDeviceScope scope(t_->device());
        t_->check(ncclBroadcast(buffer.raw(), buffer.raw(), buffer.nbytes(), ncclInt8, root, t_->comm(), t_->stream()),
                  "ncclBroadcast");
    }
    void all_to_all(const Tensor& send, const Tensor& recv) {
        begin(check().all_to_all(send, recv), send, recv);
        if (send.empty()) return;
        exchange_blocks(send, recv);
    }
    void send(const Tensor& buffer, int peer, int tag) {
        (void)post(OpKind::send, buffer, peer, tag);
        t_->flush_p2p();
    }
    void recv(const Tensor& buffer, int peer, int tag) {
        (void)post(OpKind::recv, buffer, peer, tag);
        t_->flush_p2p();
    }

    // Blocks until every rank has reached it and this rank's earlier work is done.
    void barrier() {
        t_->begin_collective(CallSignature{});
        {
            loom::detail::CudaDeviceScope scope(t_->device());
            std::int64_t* word = t_->words();
            t_->check(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, t_->comm(), t_->stream()), "ncclAllReduce");
        }
        t_->synchronize("barrier");
    }

    // Blocks until everything enqueued on this communicator so far is done.
    void synchronize() {
        t_->check_usable();
        t_->synchronize("synchronize");
    }

    Request all_reduce_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        all_reduce(send, recv, op);
        return in_flight(OpKind::all_reduce);
    }
    Request reduce_scatter_async(const Tensor& send, const Tensor& recv, ReduceOp op) {
        reduce_scatter(send, recv, op);
        return in_flight(OpKind::reduce_scatter);
    }
    Request all_gather_async(const Tensor& send, const Tensor& recv) {
        all_gather(send, recv);
        return in_flight(OpKind::all_gather);
    }
    Request broadcast_async(const Tensor& buffer, int root) {
        broadcast(buffer, root);
        return in_flight(OpKind::broadcast);
    }
    Request all_to_all_async(const Tensor& send, const Tensor& recv) {
        all_to_all(send, recv);
        return in_flight(OpKind::all_to_all);
    }
    Request send_async(const Tensor& buffer, int peer, int tag) {
        return Request(std::make_unique<detail::NcclPending>(t_, post(OpKind::send, buffer, peer, tag), OpKind::send));
    }
    Request recv_async(const Tensor& buffer, int peer, int tag) {
        return Request(std::make_unique<detail::NcclPending>(t_, post(OpKind::recv, buffer, peer, tag), OpKind::recv));
    }

    // ncclCommSplit: every rank calls it; ranks with the same color form the
    // new communicator, ordered by (key, rank). It shares this one's stream
    // and options, so work on the two stays in program order. Everything
    // issued on the parent finishes first (within the timeout): NCCL says a
    // split with operations outstanding on the communicator may deadlock.
    [[nodiscard]] Nccl split(int color, int key) {
        LOOM_CHECK(color >= 0, "split: color ", color, " is negative; use a color >= 0 (every rank joins one group)");
        t_->check_usable();
        t_->synchronize("split");
        loom::detail::CudaDeviceScope scope(t_->device());
        ncclComm_t child = nullptr;
        t_->check(ncclCommSplit(t_->comm(), color, key, &child, nullptr), "ncclCommSplit");
        LOOM_CHECK(child != nullptr, "split: NCCL returned no communicator for color ", color, " on ", t_->where());
        return Nccl(std::make_shared<detail::NcclTransport>(child, t_->device(), t_->shared_stream(), t_->options()));
    }

    // Aborts the communicator now, without throwing: NCCL's work on it stops
    // and every later call throws `why` (the process joiner's way to end a
    // communicator another rank's failure has made useless).
    void abort(std::string_view why) { t_->abort(why); }

private:
    explicit Nccl(std::shared_ptr<detail::NcclTransport> transport) : t_(std::move(transport)) {}

    static void check_device(int device) {
        int count = 0;
        LOOM_CUDA_CHECK(cudaGetDeviceCount(&count));
        LOOM_CHECK(device >= 0 && device < count, "Nccl: CUDA device ", device, " does not exist; this process sees ",
                   count, " device(s), 0..", count - 1);
    }

    // Within one process NCCL's kernels read and write the peers' user
    // buffers directly (P2P direct). Buffer<Cuda> comes from each device's
    // current cudaMallocAsync pool, which peer access (cudaDeviceEnablePeerAccess)
    // does not cover: each pool must grant it itself. Devices that cannot
    // reach each other are left alone; NCCL then moves data another way.
    static void share_memory_pools(const std::vector<int>& devices) {
        for (const int owner : devices) {
            std::vector<cudaMemAccessDesc> grants;
            for (const int peer : devices) {
                int reachable = 0;
                if (peer == owner) continue;
                LOOM_CUDA_CHECK(cudaDeviceCanAccessPeer(&reachable, peer, owner));
                if (reachable == 0) continue;
                cudaMemAccessDesc grant{};
                grant.location.type = cudaMemLocationTypeDevice;
                grant.location.id = peer;
                grant.flags = cudaMemAccessFlagsProtReadWrite;
                grants.push_back(grant);
            }
            if (grants.empty()) continue;
            cudaMemPool_t pool = nullptr;  // the pool cudaMallocAsync draws from now (the default unless set)
            LOOM_CUDA_CHECK(cudaDeviceGetMemPool(&pool, owner));
            LOOM_CUDA_CHECK(cudaMemPoolSetAccess(pool, grants.data(), grants.size()));
        }
    }

    [[nodiscard]] ArgumentCheck check() const { return ArgumentCheck{rank(), size(), device()}; }

    // ArgumentCheck compares device kinds; the index must match too.
    void on_device(const Tensor& t, OpKind kind, std::string_view what) const {
        LOOM_CHECK(t.device().index == t_->device(), kind, ": the ", what, " buffer is on ", t.device(),
                   " but this communicator runs on ", device());
    }

    void begin(const CallSignature& signature, const Tensor& send, const Tensor& recv) {
        on_device(send, signature.kind, signature.kind == OpKind::broadcast ? "broadcast" : "send");
        on_device(recv, signature.kind, signature.kind == OpKind::broadcast ? "broadcast" : "recv");
        t_->begin_collective(signature);
    }

    [[nodiscard]] std::shared_ptr<detail::NcclCompletion> post(OpKind kind, const Tensor& buffer, int peer, int tag) {
        check().point_to_point(buffer, peer, tag, kind);
        on_device(buffer, kind, kind == OpKind::send ? "send" : "recv");
        return t_->post_p2p(detail::NcclP2p{kind, buffer, peer, tag});
    }

    [[nodiscard]] Request in_flight(OpKind kind) {
        return Request(std::make_unique<detail::NcclPending>(t_, t_->record(), kind));
    }

    // f32, i32 and i64 sums and integer maxes go to NCCL as they are. bf16
    // and f16 are widened into scratch (f32 values, or int32 order keys for
    // max), reduced there and narrowed once; f32 max goes through keys too.
    void reduce(const Tensor& send, const Tensor& recv, ReduceOp op, bool scatter) {
        const std::int64_t n = recv.numel();  // elements each rank ends with
        if (n == 0) return;
        const DType dtype = send.dtype();
        const cudaStream_t stream = t_->stream();
        loom::detail::CudaDeviceScope scope(t_->device());
        const bool keys = op == ReduceOp::max && is_floating(dtype);
        if (!keys && (dtype == DType::f32 || dtype == DType::i32 || dtype == DType::i64)) {
            nccl_reduce(send.raw(), recv.raw(), n, detail::nccl_type(dtype), op == ReduceOp::max ? ncclMax : ncclSum,
                        scatter);
            if (op == ReduceOp::avg) detail::launch_divide(dtype, recv.raw(), n, size(), stream);
            return;
        }
        // 4-byte accumulators: f32 and int32 keys are both 4 bytes wide.
        constexpr std::size_t wide = 4;
        auto* staged = static_cast<char*>(t_->scratch(static_cast<std::size_t>(send.numel()) * wide));
        detail::launch_widen(dtype, send.raw(), staged, send.numel(), keys, stream);
        char* own = scatter ? staged + static_cast<std::size_t>(rank()) * static_cast<std::size_t>(n) * wide : staged;
        nccl_reduce(staged, own, n, keys ? ncclInt32 : ncclFloat32, keys ? ncclMax : ncclSum, scatter);
        const float divisor = op == ReduceOp::avg ? static_cast<float>(size()) : 1.0f;
        detail::launch_narrow(dtype, own, recv.raw(), n, keys, divisor, stream);
    }

    // In place when `out` is this rank's block of `in` (reduce_scatter), as NCCL defines it.
    void nccl_reduce(const void* in, void* out, std::int64_t n, ncclDataType_t type, ncclRedOp_t op, bool scatter) {
        const auto count = static_cast<std::size_t>(n);
        if (scatter)
            t_->check(ncclReduceScatter(in, out, count, type, op, t_->comm(), t_->stream()), "ncclReduceScatter");
        else
            t_->check(ncclAllReduce(in, out, count, type, op, t_->comm(), t_->stream()), "ncclAllReduce");
    }

    // all_to_all as one group of sends and recvs, one block per peer. In
    // place, the input is copied first: a block may land before it is sent.
    void exchange_blocks(const Tensor& send, const Tensor& recv) {
        const cudaStream_t stream = t_->stream();
        loom::detail::CudaDeviceScope scope(t_->device());
        const std::size_t block = send.nbytes() / static_cast<std::size_t>(size());
        const bool in_place = send.raw() == recv.raw();
        const char* from = static_cast<const char*>(send.raw());
        char* to = static_cast<char*>(recv.raw());
        if (in_place) {
            void* copy = t_->scratch(send.nbytes());
            LOOM_CUDA_CHECK(cudaMemcpyAsync(copy, from, send.nbytes(), cudaMemcpyDeviceToDevice, stream));
            from = static_cast<const char*>(copy);
        }
        const std::size_t own = static_cast<std::size_t>(rank()) * block;
        if (!in_place) LOOM_CUDA_CHECK(cudaMemcpyAsync(to + own, from + own, block, cudaMemcpyDeviceToDevice, stream));
        t_->group([&] {
            for (int peer = 0; peer < size(); ++peer) {
                if (peer == rank()) continue;
                const std::size_t at = static_cast<std::size_t>(peer) * block;
                LOOM_NCCL_CHECK(ncclSend(from + at, block, ncclInt8, peer, t_->comm(), stream));
                LOOM_NCCL_CHECK(ncclRecv(to + at, block, ncclInt8, peer, t_->comm(), stream));
            }
        });
    }

    std::shared_ptr<detail::NcclTransport> t_;
};

}  // namespace loom::comm
