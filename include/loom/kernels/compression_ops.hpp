// The kernels of data-parallel gradient compression (parallel/compressed_exchange.hpp,
// parallel/power_sgd.hpp) on a device chosen at run time: kernels/host/ for host
// memory, the device backend's entries for a device's (kernels/kernel_table.hpp). Pointers with the
// device named, as in attention_block_ops.hpp: the exchange addresses chunks
// inside a bucket inside the gradient arena, which no Tensor describes.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/kernels/chunk_encoding.hpp"
#include "loom/kernels/kernel_list.hpp"
#include "loom/kernels/host/elementwise.hpp"
#include "loom/kernels/host/low_rank.hpp"

namespace loom::kernels {



// x[0, n) into e.words(n) words; with `residual` (may be x), x minus what
// the words decode to. `host_scratch` is top-k's on the host (a device keeps
// its own).
inline void pack_chunk(Device where, const ChunkEncoding& e, const float* x, std::int64_t n, std::uint32_t* words,
                       float* residual, std::vector<std::int32_t>& host_scratch) {
    if (where.kind == DeviceKind::host) host::pack_chunk(e, x, n, words, residual, host_scratch);
    else run<kernel::pack_chunk>(where, e, x, n, words, residual);
}

// out[0, n) = weight * decoded, or += with `add`.
inline void unpack_chunk(Device where, const ChunkEncoding& e, const std::uint32_t* words, std::int64_t n, float* out,
                         float weight, bool add) {
    run<kernel::unpack_chunk>(where, e, words, n, out, weight, add);
}

// into += x (error feedback gathering the step's gradient).
inline void accumulate(Device where, float* into, const float* x, std::int64_t n) {
    run<kernel::accumulate>(where, into, x, n);
}

// into -= x.
inline void subtract(Device where, float* into, const float* x, std::int64_t n) {
    run<kernel::subtract>(where, into, x, n);
}

// The columns of P [rows, cols] (row-major) made orthonormal (kernels/host/low_rank.hpp).
inline void orthonormalize_columns(Device where, float* p, std::int64_t rows, std::int64_t cols) {
    run<kernel::orthonormalize_columns>(where, p, rows, cols);
}

// 1-bit Adam's momentum exchange around a gradient exchange (kernels/host/elementwise.hpp).
inline void mix_momentum(Device where, float* grad, const float* m, std::int64_t n, float beta1) {
    run<kernel::mix_momentum>(where, grad, m, n, beta1);
}
inline void unmix_momentum(Device where, float* grad, const float* m, std::int64_t n, float beta1) {
    run<kernel::unmix_momentum>(where, grad, m, n, beta1);
}

}  // namespace loom::kernels
