// The sum over a group of a tensor sent as bf16 or f16: GradCompress<Cast,
// TpAxis>, the mild half of hybrid compression, for the activations and
// activation gradients that tensor parallelism all-reduces. Two stages with
// f32 sums in between, as the data-parallel casts (parallel/compressed_exchange.hpp):
// an all-to-all of 16-bit chunks, each rank sums its chunk in f32, then an
// all-gather of the 16-bit sums; every rank ends with the same values, each
// rounded twice. Half the bytes of an f32 all-reduce on every transport (a
// bf16 all-reduce would not do: MPI reduces 16-bit types in f32 buffers).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "loom/comm/communicator.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/kernels/ops.hpp"

namespace loom::nn {

// Reused between calls, so a step allocates once; on the tensor's device.
struct CastScratch {
    DeviceBuffer send, recv, gathered_send, gathered, sums;

    // n elements of `dtype` of `b` on `where`, (re)allocated when b is too small or elsewhere.
    [[nodiscard]] static Tensor take(DeviceBuffer& b, DType dtype, std::int64_t n, Device where) {
        if (b.raw() == nullptr || b.numel() < n || b.dtype() != dtype || b.device() != where)
            b = DeviceBuffer(dtype, Shape{std::max<std::int64_t>(n, 1)}, where);
        return Tensor(b.raw(), dtype, Shape{n}, where);
    }
};

// t's elements may live on the host or a device; the communicator moves
// memory there, and the casts run there (kernels/ops.hpp).
template <comm::Communicator C>
void cast_all_reduce_sum(C& comm, const Tensor& t, kernels::host::Cast cast, CastScratch& s) {
    LOOM_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "cast_all_reduce_sum: ", t,
               "; it casts contiguous f32");
    const Device where = t.device();
    const std::int64_t n = t.numel(), ranks = comm.size();
    // Equal chunks of an even length: whole words, one per rank.
    const std::int64_t chunk = ((n + ranks - 1) / ranks + 1) / 2 * 2, words = chunk / 2;
    const auto length = [&](std::int64_t j) { return std::clamp<std::int64_t>(n - j * chunk, 0, chunk); };
    // `count` elements of the flat tensor `flat` from element `at` (none past its end).
    const auto part = [](const Tensor& flat, std::int64_t at, std::int64_t count) {
        return Tensor(static_cast<std::byte*>(flat.raw()) + at * static_cast<std::int64_t>(size_of(flat.dtype())),
                      flat.dtype(), Shape{count}, flat.device());
    };
    const Tensor x(t.raw(), DType::f32, Shape{n}, where);
    const Tensor send = CastScratch::take(s.send, DType::i32, ranks * words, where);
    fill_zero_bytes(send.raw(), where, send.nbytes());
    for (std::int64_t j = 0; j < ranks; ++j) kernels::pack_cast(cast, part(x, j * chunk, length(j)), part(send, j * words, words));
    const Tensor recv = CastScratch::take(s.recv, DType::i32, ranks * words, where);
    comm.all_to_all(send, recv);
    const Tensor sums = CastScratch::take(s.sums, DType::f32, chunk, where);
    for (std::int64_t r = 0; r < ranks; ++r)
        kernels::unpack_cast(cast, part(recv, r * words, words), sums, 1.0f, r > 0);
    const Tensor gathered_send = CastScratch::take(s.gathered_send, DType::i32, words, where);
    kernels::pack_cast(cast, sums, gathered_send);
    const Tensor gathered = CastScratch::take(s.gathered, DType::i32, ranks * words, where);
    comm.all_gather(gathered_send, gathered);
    for (std::int64_t j = 0; j < ranks; ++j)
        kernels::unpack_cast(cast, part(gathered, j * words, words), part(x, j * chunk, length(j)));
}

}  // namespace loom::nn
