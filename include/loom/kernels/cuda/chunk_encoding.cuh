// Device mirror of kernels/chunk_encoding.hpp: a chunk of gradient into its
// words and back, dispatched to the int8, sign, cast (kernels/cuda/
// quantize.cuh) and top-k (kernels/cuda/top_k.cuh) kernels. The words are the
// host's bit for bit, as those headers keep them, so one rank may pack on a
// GPU and another unpack on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "loom/core/check_cuda.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/chunk_encoding.hpp"
#include "loom/kernels/cuda/quantize.cuh"
#include "loom/kernels/cuda/top_k.cuh"

namespace loom::kernels::cuda {

// x[0, n) into e.words(n) words; with `residual` (may be x), x minus what the
// words decode to. All on the device, queued on `stream`.
inline void pack_chunk(const ChunkEncoding& e, const float* x, std::int64_t n, std::uint32_t* words, float* residual,
                       TopKScratch& scratch, cudaStream_t stream = nullptr) {
    switch (e.kind) {
        case ChunkKind::bf16: pack_cast(Cast::bf16, x, n, words, residual, stream); return;
        case ChunkKind::f16: pack_cast(Cast::f16, x, n, words, residual, stream); return;
        case ChunkKind::int8: pack_int8(x, n, e.block, words, residual, stream); return;
        case ChunkKind::signs: pack_signs(x, n, e.block, words, residual, stream); return;
        case ChunkKind::top_k: pack_top_k(x, n, e.top_k_count(n), words, scratch, residual, stream); return;
    }
    LOOM_FAIL("pack_chunk: no encoding ", e);
}

// out[0, n) = weight * decoded, or += with `add`. Top-k waits for `stream`
// (its index check is read back).
inline void unpack_chunk(const ChunkEncoding& e, const std::uint32_t* words, std::int64_t n, float* out, float weight,
                         bool add, cudaStream_t stream = nullptr) {
    switch (e.kind) {
        case ChunkKind::bf16: unpack_cast(Cast::bf16, words, n, out, weight, add, stream); return;
        case ChunkKind::f16: unpack_cast(Cast::f16, words, n, out, weight, add, stream); return;
        case ChunkKind::int8: unpack_int8(words, n, e.block, out, weight, add, stream); return;
        case ChunkKind::signs: unpack_signs(words, n, e.block, out, weight, add, stream); return;
        case ChunkKind::top_k:
            if (!add && n > 0)
                LOOM_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<std::size_t>(n) * sizeof(float), stream));
            unpack_top_k_add(words, e.top_k_count(n), n, out, weight, stream);
            return;
    }
    LOOM_FAIL("unpack_chunk: no encoding ", e);
}

}  // namespace loom::kernels::cuda
