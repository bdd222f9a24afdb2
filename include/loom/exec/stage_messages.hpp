// How a pipeline stage's activation or gradient travels to its neighbour:
// a 64-byte header (dtype, rank, dims, cast) and then the tensor, so the receiver
// needs no knowledge of the model's shapes. A message is named by what
// travels and the chunk that sent it: each chunk sends its micro-batches in
// order and its neighbour receives them in the same order, so (payload,
// sender chunk) tags match them whatever else crosses the same link. Both
// travel in the pool's parcels, on the pool's device: the header is written
// there from the host and read back from there after it arrives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "loom/comm/communicator.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/exec/micro_batch_pool.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/schedule/program.hpp"

namespace loom::exec {

inline constexpr int stage_header_longs = 8;

[[nodiscard]] inline int stage_tag(schedule::Payload payload, int sender_chunk, bool body) {
    return (sender_chunk * 2 + (payload == schedule::Payload::gradient ? 1 : 0)) * 2 + (body ? 1 : 0);
}

[[nodiscard]] inline std::string describe_recv(const schedule::Instruction& in) {
    return loom::detail::concat("recv ", name(in.payload), " c", in.chunk, " mb", in.micro_batch, " from rank ",
                                in.peer);
}

struct SentStageTensor {
    comm::Request header, body;
};

// Copies the outbox tensor of `in` into its parcel (it must outlive the
// chunk's context: the send is waited at the end of the step) and sends it.
// With `cast` (GradCompress<Cast, PpAxis>) an f32 tensor travels as 16-bit
// values, two per word, and the header's last word says which cast.
template <comm::Communicator C>
[[nodiscard]] SentStageTensor send_stage_tensor(C& pp, MicroBatchPool& pool, const schedule::Instruction& in,
                                                std::optional<kernels::host::Cast> cast = {}) {
    constexpr int longs = stage_header_longs;
    const Tensor& t = pool.outbox(in.payload, in.chunk, in.micro_batch);
    LOOM_CHECK(t.rank() <= longs - 3, "Executor: ", t, " has more than ", longs - 3, " dimensions to send");
    const bool casting = cast.has_value() && t.dtype() == DType::f32;
    const Device where = pool.device();
    const std::int64_t words = kernels::host::cast_words(t.numel());
    const std::int64_t body_bytes = casting ? 4 * words : static_cast<std::int64_t>(t.nbytes());
    // One parcel: the header, then the body (64-byte aligned after it).
    auto* parcel =
        static_cast<std::byte*>(pool.outbox_parcel(in.payload, in.chunk, in.micro_batch, longs * 8 + body_bytes));
    const Tensor header(parcel, DType::i64, Shape{longs}, where);
    const Tensor body = casting ? Tensor(parcel + longs * 8, DType::i32, Shape{words}, where)
                                : Tensor(parcel + longs * 8, t.dtype(), t.shape(), where);
    std::int64_t h[longs] = {};
    h[0] = static_cast<std::int64_t>(t.dtype());
    h[1] = t.rank();
    for (int d = 0; d < t.rank(); ++d) h[2 + d] = t.dim(d);
    h[longs - 1] = casting ? 1 + static_cast<std::int64_t>(*cast) : 0;
    copy_tensor(header, Tensor::of(h, {longs}));
    if (casting)
        kernels::pack_cast(*cast, t, body);
    else
        copy_tensor(body, t);
    return {pp.send_async(header, in.peer, stage_tag(in.payload, in.chunk, false)),
            pp.send_async(body, in.peer, stage_tag(in.payload, in.chunk, true))};
}

// Blocks until the tensor `in` names has arrived, into the chunk's inbox
// (a cast one through the pool's cast parcel, widened back to f32).
template <comm::Communicator C>
void recv_stage_tensor(C& pp, MicroBatchPool& pool, const schedule::Instruction& in) {
    constexpr int longs = stage_header_longs;
    const int sender = in.chunk + (in.payload == schedule::Payload::activation ? -1 : 1);
    std::int64_t h[longs] = {};
    const Tensor header = pool.header_parcel(longs);
    // Through the Request: Nccl's blocking recv returns once queued, and the
    // copy home would then wait on the stream with no timeout.
    pp.recv_async(header, in.peer, stage_tag(in.payload, sender, false)).wait();
    copy_tensor(Tensor::of(h, {longs}), header);
    const std::int64_t cast = h[longs - 1];
    LOOM_CHECK(h[1] >= 0 && h[1] <= longs - 3 && h[0] >= 0 && h[0] <= static_cast<std::int64_t>(DType::i64) &&
                   cast >= 0 && cast <= 2 && (cast == 0 || h[0] == static_cast<std::int64_t>(DType::f32)),
               "Executor: ", describe_recv(in), " got a malformed header (dtype ", h[0], ", rank ", h[1], ", cast ",
               cast, ")");
    const Tensor body =
        pool.inbox_parcel(in.payload, in.chunk, in.micro_batch, static_cast<DType>(h[0]), Shape(h + 2, h + 2 + h[1]));
    if (cast == 0) {
        pp.recv(body, in.peer, stage_tag(in.payload, sender, true));
    } else {
        const Tensor words = pool.cast_parcel(kernels::host::cast_words(body.numel()));
        pp.recv(words, in.peer, stage_tag(in.payload, sender, true));
        kernels::unpack_cast(static_cast<kernels::host::Cast>(cast - 1), words, body);
    }
    pool.put_inbox(in.payload, in.chunk, in.micro_batch, body);
}

}  // namespace loom::exec
