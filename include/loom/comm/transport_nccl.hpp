// The NCCL transport under loom::comm::Nccl, everything that needs no device
// code: the communicator handle bound to a device and a stream, fault handling
// (NCCL's asynchronous errors, the timeout that aborts), the event-backed
// Request, batching of point-to-point calls, the cross-rank call check, and
// the bootstrap of NCCL's unique id over any host communicator.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/buffer_cuda.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/core/check_nccl.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "loom::comm::Nccl needs NCCL 2.18 or newer (ncclCommSplit, ncclGetLastError)"
#endif

namespace loom::comm::detail {

// The stream a communicator enqueues on, owned or borrowed. Communicators
// split from one share it, so their operations keep program order and cannot
// deadlock each other by running concurrently.
class NcclStream {
public:
    // Borrows `stream`; without one, creates a blocking stream on `device`.
    // Blocking streams are ordered after the legacy default stream, where
    // Buffer<Cuda> allocates and zero-fills, so fresh buffers are ready.
    NcclStream(int device, std::optional<cudaStream_t> stream) {
        if (stream) {
            stream_ = *stream;
            return;
        }
        loom::detail::CudaDeviceScope scope(device);
        LOOM_CUDA_CHECK(cudaStreamCreate(&stream_));
        owned_ = true;
    }
    NcclStream(const NcclStream&) = delete;
    NcclStream& operator=(const NcclStream&) = delete;
    // Returns at once; work still queued on the stream finishes first.
    ~NcclStream() {
        if (owned_) cudaStreamDestroy(stream_);
    }

    [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }

private:
    cudaStream_t stream_ = nullptr;
    bool owned_ = false;
};

// A point in the stream after an operation. Point-to-point calls share their
// batch's completion, which gets its event when the batch is issued.
struct NcclCompletion {
    cudaEvent_t event = nullptr;  // null until issued
    std::chrono::steady_clock::time_point issued{};

    NcclCompletion() = default;
    NcclCompletion(const NcclCompletion&) = delete;
    NcclCompletion& operator=(const NcclCompletion&) = delete;
    ~NcclCompletion() {
        if (event != nullptr) cudaEventDestroy(event);
    }
};

// A send or recv waiting for its batch to be issued.
struct NcclP2p {
    OpKind kind = OpKind::send;
    Tensor buffer;
    int peer = 0;
    int tag = 0;
};

[[nodiscard]] inline ncclDataType_t nccl_type(DType dtype) {
    switch (dtype) {
        case DType::f32: return ncclFloat32;
        case DType::bf16: return ncclBfloat16;
        case DType::f16: return ncclFloat16;
        case DType::i32: return ncclInt32;
        case DType::i64: return ncclInt64;
    }
    LOOM_FAIL("invalid DType value ", static_cast<int>(dtype), "; valid dtypes are ", loom::detail::valid_dtype_list());
}

// One NCCL communicator with its device, stream and fault state. Shared by the
// Nccl handle and its pending Requests, so a Request outlives a moved handle.
// Not thread-safe: one thread drives a communicator at a time.
class NcclTransport {
public:
    // Adopts `comm`: destroyed with this object, or aborted on a fault.
    NcclTransport(ncclComm_t comm, int device, std::shared_ptr<NcclStream> stream, CommOptions options)
        : comm_(comm), device_(device), stream_(std::move(stream)), options_(options) {
        const ncclResult_t rank = ncclCommUserRank(comm_, &rank_);
        const ncclResult_t size = rank == ncclSuccess ? ncclCommCount(comm_, &size_) : rank;
        if (size != ncclSuccess) {
            ncclCommAbort(comm_);  // an error path: no barrier with the other ranks
            loom::detail::nccl_failed(size, "ncclCommUserRank/ncclCommCount(comm)", loom::SourceLocation::current());
        }
        // The checked calls' page-locked words, now rather than at the first
        // collective: cudaMallocHost synchronizes the device, which would
        // stall the other streams' work in the middle of a step.
        if (options_.check_calls) {
            loom::detail::CudaDeviceScope scope(device_);
            if (const cudaError_t status = cudaMallocHost(&host_words_, words_bytes()); status != cudaSuccess) {
                ncclCommAbort(comm_);
                loom::detail::cuda_failed(status, "cudaMallocHost(&host_words_, words_bytes())",
                                          loom::SourceLocation::current());
            }
        }
    }
    NcclTransport(const NcclTransport&) = delete;
    NcclTransport& operator=(const NcclTransport&) = delete;

    ~NcclTransport() {
        int previous = 0;
        const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_;
        if (switched) cudaSetDevice(device_);
        // NCCL frees memory its kernels may still use: let the stream drain
        // first, within the timeout. Then abort, never destroy: ncclCommDestroy
        // ends in a barrier with the node's other ranks (NCCL's
        // commDestroySync) that has no timeout, and a rank that destroys while
        // another aborted (a failure, a timeout, an exception unwinding, a
        // split destroyed inside a body that failed elsewhere) waits for ever.
        // ncclCommAbort skips that barrier; once the stream has drained there
        // is nothing left for it to stop, so it frees what a destroy would.
        // (PyTorch's ProcessGroupNCCL aborts its communicators at teardown too.)
        if (comm_ != nullptr) {
            drain();
            ncclCommAbort(comm_);
        }
        if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream());
        if (words_ != nullptr) cudaFreeAsync(words_, stream());
        if (host_words_ != nullptr) cudaFreeHost(host_words_);
        if (switched) cudaSetDevice(previous);
    }

    [[nodiscard]] int rank() const noexcept { return rank_; }
    [[nodiscard]] int size() const noexcept { return size_; }
    [[nodiscard]] int device() const noexcept { return device_; }
    [[nodiscard]] ncclComm_t comm() const noexcept { return comm_; }
    [[nodiscard]] cudaStream_t stream() const noexcept { return stream_->get(); }
    [[nodiscard]] const std::shared_ptr<NcclStream>& shared_stream() const noexcept { return stream_; }
    [[nodiscard]] const CommOptions& options() const noexcept { return options_; }

    // "rank 1 of 4 on cuda:1", for messages.
    [[nodiscard]] std::string where() const {
        return loom::detail::concat("rank ", rank_, " of ", size_, " on ", cuda_device(device_));
    }

    // Aborts the communicator now, without throwing: NCCL's work on it
    // stops, and every later call throws `why`.
    void abort(std::string_view why) {
        if (comm_ != nullptr) ncclCommAbort(comm_);
        comm_ = nullptr;
        if (aborted_.empty()) aborted_ = std::string(why);
    }

    void check_usable() const {
        LOOM_CHECK(aborted_.empty(), "this NCCL communicator (", where(), ") was aborted and cannot be used: ",
                   aborted_);
    }

    // Every collective starts here: point-to-point calls posted earlier are
    // issued first, keeping program order, then the call is compared across
    // ranks when CommOptions::check_calls is on.
    void begin_collective(const CallSignature& signature) {
        check_usable();
        flush_p2p();
        if (options_.check_calls) compare_signatures(signature);
    }

    // Queues a send or recv for the next batch; see flush_p2p.
    [[nodiscard]] std::shared_ptr<NcclCompletion> post_p2p(const NcclP2p& call) {
        check_usable();
        if (!batch_done_) batch_done_ = std::make_shared<NcclCompletion>();
        batch_.push_back(call);
        return batch_done_;
    }

    // Issues the queued sends and recvs as one NCCL group, so an exchange
    // (send to one peer, receive from another) progresses concurrently instead
    // of deadlocking on a stream. NCCL has no tags: it pairs each direction's
    // messages in issue order, so the calls go out in the order they were
    // posted, and a sender's messages to a peer meet that peer's receives in
    // the order it posts them. (Sorting a batch by tag, as this did before it
    // ever ran, reordered a pipeline stage's header, body, header, body into
    // headers first whenever one batch held two messages: the receiver posts
    // them one by one.) The tag is not matched: a program whose two ranks post
    // one link's messages in different orders cannot run here (ZB-V's; see
    // docs/cuda.md).
    void flush_p2p() {
        if (batch_.empty()) return;
        std::vector<NcclP2p> calls = std::move(batch_);
        batch_.clear();
        const std::shared_ptr<NcclCompletion> done = std::move(batch_done_);
        batch_done_.reset();
        loom::detail::CudaDeviceScope scope(device_);
        group([&] {
            for (const NcclP2p& call : calls) {
                void* data = call.buffer.raw();
                const std::size_t bytes = call.buffer.nbytes();
                if (bytes == 0) continue;  // both sides skip empty messages, so the pairing holds
                if (call.kind == OpKind::send)
                    LOOM_NCCL_CHECK(ncclSend(data, bytes, ncclInt8, call.peer, comm_, stream()));
                else
                    LOOM_NCCL_CHECK(ncclRecv(data, bytes, ncclInt8, call.peer, comm_, stream()));
            }
        });
        record(*done);
    }

    // Runs `calls` between ncclGroupStart and ncclGroupEnd; the group is
    // closed even when a call throws, or every later NCCL call would join it.
    // Calls inside only throw (LOOM_NCCL_CHECK): aborting a communicator with
    // its group still open is not safe. Their failures reach ncclGroupEnd,
    // whose check aborts.
    template <class Calls>
    void group(Calls&& calls) {
        LOOM_NCCL_CHECK(ncclGroupStart());
        try {
            calls();
        } catch (...) {
            ncclGroupEnd();
            throw;
        }
        check(ncclGroupEnd(), "ncclGroupEnd");  // reports the grouped calls' failures
    }

    // A completion for everything enqueued on the stream so far.
    [[nodiscard]] std::shared_ptr<NcclCompletion> record() {
        auto done = std::make_shared<NcclCompletion>();
        record(*done);
        return done;
    }

    // True once `done` has completed. Checks NCCL's asynchronous error and
    // the timeout (counted from the issue) on the way, aborting the
    // communicator on either, so a failed peer becomes loom::Error, not a hang.
    [[nodiscard]] bool poll(NcclCompletion& done, std::string_view what) {
        check_usable();
        if (done.event == nullptr) flush_p2p();
        LOOM_CHECK(done.event != nullptr, what, " on ", where(),
                   " was never issued: an earlier NCCL call of its batch failed");
        const cudaError_t status = cudaEventQuery(done.event);
        if (status != cudaSuccess && status != cudaErrorNotReady)
            loom::detail::cuda_failed(status, "cudaEventQuery(event)", loom::SourceLocation::current());
        check_async_error(what);
        if (status == cudaSuccess) return true;
        if (std::chrono::steady_clock::now() - done.issued > options_.timeout)
            abort_and_fail(loom::detail::concat(what, " did not complete within ", options_.timeout.count(), " ms on ",
                                                where(), "; a peer failed or never made the matching call, so the "
                                                "NCCL communicator was aborted"));
        return false;
    }

    // Polls rather than cudaEventSynchronize, which could block forever on a dead peer.
    void wait(NcclCompletion& done, std::string_view what) {
        for (int round = 0; !poll(done, what); ++round) backoff(round);
    }

    // Waits for everything enqueued so far; `what` names the call in errors.
    void synchronize(std::string_view what) {
        flush_p2p();
        wait(*record(), what);
    }

    // Device memory for staged reductions. Reuse needs no waiting: every user
    // is on this stream, and growing frees the old block in stream order.
    [[nodiscard]] void* scratch(std::size_t bytes) {
        if (bytes <= scratch_bytes_) return scratch_;
        loom::detail::CudaDeviceScope scope(device_);
        const std::size_t grown = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
        if (scratch_ != nullptr) LOOM_CUDA_CHECK(cudaFreeAsync(scratch_, stream()));
        scratch_ = nullptr;
        scratch_bytes_ = 0;
        LOOM_CUDA_CHECK(cudaMallocAsync(&scratch_, grown, stream()));
        scratch_bytes_ = grown;
        return scratch_;
    }

    // Three words per rank: room for every rank's call signature, or the barrier's one element.
    [[nodiscard]] std::int64_t* words() {
        if (words_ == nullptr) {
            loom::detail::CudaDeviceScope scope(device_);
            LOOM_CUDA_CHECK(cudaMallocAsync(&words_, words_bytes(), stream()));
            LOOM_CUDA_CHECK(cudaMemsetAsync(words_, 0, words_bytes(), stream()));
        }
        return static_cast<std::int64_t*>(words_);
    }

    // A call on this communicator. NCCL's error table: after any failure but
    // an invalid argument the communicator may be broken and must be aborted,
    // or later calls can hang; so it is aborted, and every later call throws.
    void check(ncclResult_t code, const char* call,
               loom::SourceLocation location = loom::SourceLocation::current()) {
        if (code == ncclSuccess) [[likely]]
            return;
        if (code == ncclInvalidArgument) loom::detail::nccl_failed(code, call, location);
        abort_and_fail(loom::detail::concat(loom::detail::nccl_failure_text(code, call), " on ", where(),
                                            "; the NCCL communicator was aborted"),
                       location);
    }

    [[noreturn]] void abort_and_fail(const std::string& message,
                                     loom::SourceLocation location = loom::SourceLocation::current()) {
        abort(message);
        throw Error(message, location);
    }

private:
    [[nodiscard]] std::size_t words_bytes() const { return static_cast<std::size_t>(size_) * 3 * sizeof(std::int64_t); }

    void record(NcclCompletion& done) {
        loom::detail::CudaDeviceScope scope(device_);
        cudaEvent_t event = nullptr;
        LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        if (const cudaError_t status = cudaEventRecord(event, stream()); status != cudaSuccess) {
            cudaEventDestroy(event);  // an unrecorded event would read as complete
            loom::detail::cuda_failed(status, "cudaEventRecord(event, stream)", loom::SourceLocation::current());
        }
        done.event = event;
        done.issued = std::chrono::steady_clock::now();
    }

    void check_async_error(std::string_view what) {
        ncclResult_t state = ncclSuccess;
        LOOM_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
        if (state == ncclSuccess || state == ncclInProgress) return;
        const char* detail = ncclGetLastError(comm_);
        abort_and_fail(loom::detail::concat("NCCL failed during ", what, " on ", where(), ": ",
                                            ncclGetErrorString(state),
                                            (detail != nullptr && *detail != '\0') ? " - " : "",
                                            detail != nullptr ? detail : "", "; the communicator was aborted"));
    }

    // All-gathers (kind, dtype, op), count and root of this call, and throws
    // the same sentence on every rank when any rank differs from rank 0. The
    // page-locked host copy lets the wait keep its timeout.
    void compare_signatures(const CallSignature& s) {
        ++calls_;
        std::int64_t* device_words = words();
        loom::detail::CudaDeviceScope scope(device_);
        std::int64_t* mine = host_words_ + 3 * rank_;
        mine[0] = static_cast<std::int64_t>(s.kind) | static_cast<std::int64_t>(s.dtype) << 8 |
                  static_cast<std::int64_t>(s.op) << 16;
        mine[1] = s.count;
        mine[2] = s.root;
        LOOM_CUDA_CHECK(cudaMemcpyAsync(device_words + 3 * rank_, mine, 3 * sizeof(std::int64_t),
                                        cudaMemcpyHostToDevice, stream()));
        check(ncclAllGather(device_words + 3 * rank_, device_words, 3, ncclInt64, comm_, stream()), "ncclAllGather");
        LOOM_CUDA_CHECK(cudaMemcpyAsync(host_words_, device_words, words_bytes(), cudaMemcpyDeviceToHost, stream()));
        wait(*record(), name(s.kind));
        auto decode = [&](int r) {
            const std::int64_t* w = host_words_ + 3 * r;
            return CallSignature{static_cast<OpKind>(w[0] & 0xff), static_cast<DType>((w[0] >> 8) & 0xff), w[1],
                                 static_cast<std::int32_t>(w[2]), static_cast<ReduceOp>((w[0] >> 16) & 0xff)};
        };
        const CallSignature first = decode(0);
        for (int r = 1; r < size_; ++r)
            if (const CallSignature other = decode(r); !(other == first))
                throw Error(mismatch_message(calls_, 0, first, r, other));
    }

    // Waits for the stream to finish, for the destructor: until it does, the
    // timeout passes, or NCCL reports an error (nothing more will finish).
    void drain() noexcept {
        cudaEvent_t event = nullptr;
        if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) return;
        if (cudaEventRecord(event, stream()) == cudaSuccess) {
            const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
            for (int round = 0;; ++round) {
                const cudaError_t status = cudaEventQuery(event);
                ncclResult_t state = ncclSuccess;
                if (status != cudaErrorNotReady || std::chrono::steady_clock::now() > deadline) break;
                const bool failed = ncclCommGetAsyncError(comm_, &state) != ncclSuccess ||
                                    (state != ncclSuccess && state != ncclInProgress);
                if (failed) break;
                backoff(round);
            }
        }
        cudaEventDestroy(event);
    }

    // Yields at first (collectives often finish within microseconds), then
    // sleeps up to 1 ms a round so a long wait does not burn a core.
    static void backoff(int round) {
        if (round < 64)
            std::this_thread::yield();
        else
            std::this_thread::sleep_for(std::chrono::microseconds(10 * std::min(round - 63, 100)));
    }

    ncclComm_t comm_ = nullptr;
    int device_ = 0;
    int rank_ = 0;
    int size_ = 1;
    std::shared_ptr<NcclStream> stream_;
    CommOptions options_;
    std::string aborted_;  // why the communicator was aborted; empty while usable
    std::vector<NcclP2p> batch_;
    std::shared_ptr<NcclCompletion> batch_done_;
    void* scratch_ = nullptr;
    std::size_t scratch_bytes_ = 0;
    void* words_ = nullptr;                 // device: call signatures, barrier element
    std::int64_t* host_words_ = nullptr;    // page-locked host copy of the signatures
    std::int64_t calls_ = 0;                // collectives compared so far
};

// The Request of an operation in flight: an event after it on the stream.
class NcclPending final : public Request::Pending {
public:
    NcclPending(std::shared_ptr<NcclTransport> transport, std::shared_ptr<NcclCompletion> done, OpKind kind)
        : transport_(std::move(transport)), done_(std::move(done)), kind_(kind) {}

    bool test() override { return transport_->poll(*done_, name(kind_)); }
    void wait() override { transport_->wait(*done_, name(kind_)); }

private:
    std::shared_ptr<NcclTransport> transport_;
    std::shared_ptr<NcclCompletion> done_;
    OpKind kind_;
};

// NCCL's bootstrap token: rank 0 creates it and the host communicator carries
// it to every rank as i32 words. When rank 0 cannot create one it sends
// zeros, so the other ranks fail with a message instead of waiting for it.
template <Communicator Host>
[[nodiscard]] ncclUniqueId share_unique_id(Host& host) {
    static_assert(sizeof(ncclUniqueId) % sizeof(std::int32_t) == 0, "ncclUniqueId must be whole i32 words");
    std::array<std::int32_t, sizeof(ncclUniqueId) / sizeof(std::int32_t)> words{};
    std::string failure;
    if (host.rank() == 0) {
        try {
            ncclUniqueId id{};
            LOOM_NCCL_CHECK(ncclGetUniqueId(&id));
            std::memcpy(words.data(), &id, sizeof id);
        } catch (const Error& e) {
            failure = e.message();
        }
    }
    host.broadcast(Tensor::of(words.data(), Shape{static_cast<std::int64_t>(words.size())}), 0);
    if (!failure.empty()) throw Error(failure);
    LOOM_CHECK(std::any_of(words.begin(), words.end(), [](std::int32_t w) { return w != 0; }),
               "rank 0 could not create NCCL's unique id (ncclGetUniqueId failed there; see its error)");
    ncclUniqueId id{};
    std::memcpy(&id, words.data(), sizeof id);
    return id;
}

}  // namespace loom::comm::detail
