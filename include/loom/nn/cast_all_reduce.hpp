// The sum over a group of a tensor sent as bf16 or f16: GradCompress<Cast,
// TpAxis>, the mild half of hybrid compression, for the activations and
// activation gradients that tensor parallelism all-reduces. Two stages with
// f32 sums in between, as the data-parallel casts (exec/compressed_exchange.hpp):
// an all-to-all of 16-bit chunks, each rank sums its chunk in f32, then an
// all-gather of the 16-bit sums; every rank ends with the same values, each
// rounded twice. Half the bytes of an f32 all-reduce on every transport (a
// bf16 all-reduce would not do: MPI reduces 16-bit types in f32 buffers).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/quantize.hpp"

namespace loom::nn {

// Reused between calls, so a step allocates once.
struct CastScratch {
    std::vector<std::uint32_t> send, recv, gathered_send, gathered;
    std::vector<float> sums;
};

template <comm::Communicator C>
void cast_all_reduce_sum(C& comm, const Tensor& t, kernels::host::Cast cast, CastScratch& s) {
    LOOM_CHECK(t.dtype() == DType::f32, "cast_all_reduce_sum: ", t.dtype(), " tensor; it casts f32");
    namespace k = kernels::host;
    const std::int64_t n = t.numel(), ranks = comm.size();
    // Equal chunks of an even length: whole words, one per rank.
    const std::int64_t chunk = ((n + ranks - 1) / ranks + 1) / 2 * 2, words = chunk / 2;
    auto* x = t.data<float>();
    const auto length = [&](std::int64_t j) { return std::clamp<std::int64_t>(n - j * chunk, 0, chunk); };
    s.send.assign(static_cast<std::size_t>(ranks * words), 0u);
    for (std::int64_t j = 0; j < ranks; ++j) k::pack_cast(cast, x + j * chunk, length(j), s.send.data() + j * words);
    s.recv.resize(s.send.size());
    const auto words_of = [](std::vector<std::uint32_t>& v) {
        return Tensor(v.data(), DType::i32, Shape{static_cast<std::int64_t>(v.size())});
    };
    comm.all_to_all(words_of(s.send), words_of(s.recv));
    s.sums.resize(static_cast<std::size_t>(chunk));
    for (std::int64_t r = 0; r < ranks; ++r)
        k::unpack_cast(cast, s.recv.data() + r * words, chunk, s.sums.data(), 1.0f, r > 0);
    s.gathered_send.resize(static_cast<std::size_t>(words));
    k::pack_cast(cast, s.sums.data(), chunk, s.gathered_send.data());
    s.gathered.resize(static_cast<std::size_t>(ranks * words));
    comm.all_gather(words_of(s.gathered_send), words_of(s.gathered));
    for (std::int64_t j = 0; j < ranks; ++j)
        k::unpack_cast(cast, s.gathered.data() + j * words, length(j), x + j * chunk);
}

}  // namespace loom::nn
