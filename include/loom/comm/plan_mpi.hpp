// The pieces of an MPI call that do not need the communicator: MPI types for
// loom's dtypes, the plan of one collective (MPI arguments, scratch memory,
// the step that completes a reduction), and the Request of a call in flight.
// bf16 and f16 reductions run in f32 scratch and round once; avg divides the
// f32 (or integer) sum by the rank count, as host_reduce does.
#pragma once

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/control_mpi.hpp"
#include "loom/comm/host_reduce.hpp"
#include "loom/core/check_mpi.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

namespace detail {

// Measured with Open MPI 4.1.4, 2 processes, shared memory, f32 sum (medians):
// from 1 to 16 MiB libnbc's MPI_Iallreduce is 25-70% slower than the tuned
// MPI_Allreduce, from 32 MiB about 35% faster (64 MiB: 19 vs 29 ms). loom
// nevertheless polls the nonblocking form at every size: only a polled wait
// can end at CommOptions::timeout when a peer stalls (communicator_mpi.hpp).

// The MPI type that moves `dtype` unchanged (bf16 and f16 as raw 16 bits).
[[nodiscard]] inline MPI_Datatype mpi_type(DType dtype) {
    switch (dtype) {
        case DType::f32: return MPI_FLOAT;
        case DType::bf16:
        case DType::f16: return MPI_UINT16_T;
        case DType::i32: return MPI_INT32_T;
        case DType::i64: return MPI_INT64_T;
    }
    LOOM_FAIL("Mpi: unknown dtype ", static_cast<int>(dtype));
}

[[nodiscard]] inline int mpi_count(std::int64_t count, OpKind kind) {
    LOOM_CHECK(count <= INT_MAX, kind, ": ", count, " elements per rank exceed MPI's count limit of ", INT_MAX,
               "; split the buffer into several calls");
    return static_cast<int>(count);
}

[[nodiscard]] constexpr bool staged_in_f32(DType dtype) { return dtype == DType::bf16 || dtype == DType::f16; }

template <class T>
inline void widen_to_f32(const void* in, float* out, std::size_t count) {
    const T* src = static_cast<const T*>(in);
    for (std::size_t i = 0; i < count; ++i) out[i] = to_float(src[i]);
}

// out = acc (divided by `ranks` for avg), rounded to T once. `acc` holds the
// accumulator type (f32 for bf16/f16) and may be `out` itself.
template <class T>
inline void finish_typed(ReduceOp op, int ranks, const void* acc_base, void* out_base, std::size_t count) {
    using A = accumulator_t<T>;
    const A* acc = static_cast<const A*>(acc_base);
    T* out = static_cast<T*>(out_base);
    if (op == ReduceOp::avg) {
        const A divisor = static_cast<A>(ranks);  // division, as host_reduce (integers: toward zero)
        for (std::size_t i = 0; i < count; ++i) out[i] = narrow<T>(static_cast<A>(acc[i] / divisor));
    } else if constexpr (!std::is_same_v<T, A>) {
        for (std::size_t i = 0; i < count; ++i) out[i] = narrow<T>(acc[i]);
    } else if (acc_base != out_base) {
        std::memcpy(out, acc, count * sizeof(T));
    }
}

inline void finish_reduction(DType dtype, ReduceOp op, int ranks, const void* acc, void* out, std::size_t count) {
    switch (dtype) {
        case DType::f32: return finish_typed<float>(op, ranks, acc, out, count);
        case DType::bf16: return finish_typed<bf16>(op, ranks, acc, out, count);
        case DType::f16: return finish_typed<f16>(op, ranks, acc, out, count);
        case DType::i32: return finish_typed<std::int32_t>(op, ranks, acc, out, count);
        case DType::i64: return finish_typed<std::int64_t>(op, ranks, acc, out, count);
    }
}

[[nodiscard]] inline std::shared_ptr<std::byte[]> scratch(std::size_t bytes) {
    return std::shared_ptr<std::byte[]>(new std::byte[bytes]);  // uninitialised: it is written before read
}

// One call, ready to post: MPI's arguments, the scratch memory they may point
// into, and the step that completes it (avg, f32 -> bf16/f16, scratch -> recv;
// for a receive, the check that the message filled the buffer).
struct MpiPlan {
    explicit MpiPlan(const CallSignature& signature) : sig(signature) {}

    CallSignature sig;
    std::int64_t call = -1;  // collective call number; -1 for send/recv
    const void* send = nullptr;
    void* recv = nullptr;
    int count = 0;  // per rank block where MPI counts per block
    MPI_Datatype type = MPI_BYTE;
    MPI_Op op = MPI_OP_NULL;
    std::size_t bytes = 0;  // what one rank contributes: picks blocking or nonblocking
    std::shared_ptr<std::byte[]> scratch;
    bool finish = false;
    const void* acc = nullptr;
    void* out = nullptr;
    std::size_t out_count = 0;
    int ranks = 1;

    void complete(const MPI_Status& status) const {
        if (finish) finish_reduction(sig.dtype, sig.op, ranks, acc, out, out_count);
        if (sig.kind != OpKind::recv) return;
        // A longer message fails in MPI (truncation); a shorter one would
        // leave the end of the buffer stale without a word.
        int received = 0;
        LOOM_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &received));
        const std::size_t expected = static_cast<std::size_t>(sig.count) * size_of(sig.dtype);
        LOOM_CHECK(static_cast<std::size_t>(received) == expected, "recv: rank ", status.MPI_SOURCE, " sent ",
                   received, " bytes with tag ", status.MPI_TAG, " but the buffer holds ", sig.count, " x ", sig.dtype,
                   " (", expected, " bytes); send and recv must move the same elements");
    }
};

// A collective or point-to-point call in flight, behind loom's Request.
class MpiPending final : public Request::Pending {
public:
    MpiPending(std::shared_ptr<MpiControl> control, std::shared_ptr<const std::vector<int>> members,
               std::chrono::milliseconds timeout, MpiPlan plan, MPI_Request request)
        : control_(std::move(control)), members_(std::move(members)), timeout_(timeout), plan_(std::move(plan)),
          request_(request), status_() {}
    MpiPending(const MpiPending&) = delete;
    MpiPending& operator=(const MpiPending&) = delete;
    ~MpiPending() override {
        if (request_ != MPI_REQUEST_NULL) control_->bury(plan_.scratch);  // abandoned after a fault
    }

    bool test() override {
        control_->throw_if_faulted();
        control_->service(plan_.sig.kind, plan_.call);
        int done = 0;
        LOOM_MPI_CHECK(MPI_Test(&request_, &done, &status_));
        if (done != 0) plan_.complete(status_);
        return done != 0;
    }

    void wait() override {
        const auto group_size = static_cast<int>(members_->size());
        control_->wait(request_, MpiWaitSite{plan_.sig.kind, plan_.call, group_size, *members_, timeout_}, &status_);
        plan_.complete(status_);
    }

private:
    std::shared_ptr<MpiControl> control_;
    std::shared_ptr<const std::vector<int>> members_;
    std::chrono::milliseconds timeout_;
    MpiPlan plan_;
    MPI_Request request_;
    MPI_Status status_;
};

}  // namespace detail
}  // namespace loom::comm
