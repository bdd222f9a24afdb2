// ChunkEncoding: how a chunk of gradient (a rank's block of a bucket)
// becomes a fixed number of 32-bit words and back, for the data-parallel
// compressors that work chunk by chunk (parallel/chunk_codec.hpp): 16-bit casts,
// int8 with a scale per block, one sign bit per value with a scale per
// block, and top-k (index, value) pairs. A plain value, so the device kernel
// table (loom/kernels/kernel_list.hpp) can take it without knowing
// parallel/grad_compress.hpp; host::pack_chunk and host::unpack_chunk are the
// host's side, and what a device's implementation must equal.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/kernels/host/top_k.hpp"

namespace loom::kernels {

enum class ChunkKind : std::uint8_t { bf16, f16, int8, signs, top_k };

struct ChunkEncoding {
    ChunkKind kind = ChunkKind::bf16;
    std::int64_t block = 0;  // int8 and signs: values per scale
    double ratio = 0;        // top_k: the fraction of values sent

    // Pairs sent for a chunk of n values (top_k only).
    [[nodiscard]] std::int64_t top_k_count(std::int64_t n) const { return host::top_k_count(n, ratio); }

    // Words on the wire for a chunk of n values.
    [[nodiscard]] std::int64_t words(std::int64_t n) const {
        switch (kind) {
            case ChunkKind::bf16:
            case ChunkKind::f16: return host::cast_words(n);
            case ChunkKind::int8: return host::int8_words(n, block);
            case ChunkKind::signs: return host::sign_words(n, block);
            case ChunkKind::top_k: return host::top_k_words(top_k_count(n));
        }
        LOOM_FAIL("ChunkEncoding: kind ", static_cast<int>(kind), " is not one of bf16, f16, int8, signs, top_k");
    }

    friend std::ostream& operator<<(std::ostream& out, const ChunkEncoding& e) {
        switch (e.kind) {
            case ChunkKind::bf16: return out << "bf16";
            case ChunkKind::f16: return out << "fp16";
            case ChunkKind::int8: return out << "int8/" << e.block;
            case ChunkKind::signs: return out << "signs/" << e.block;
            case ChunkKind::top_k: return out << "topk:" << e.ratio;
        }
        return out << "chunk kind " << static_cast<int>(e.kind);
    }
};

namespace host {

// Encodes x[0, n) into e.words(n) words; with `residual` (which may be x
// itself), leaves there x minus what the words decode to. `scratch` is
// top-k's, kept by the caller so that a step allocates nothing.
inline void pack_chunk(const ChunkEncoding& e, const float* x, std::int64_t n, std::uint32_t* words, float* residual,
                       std::vector<std::int32_t>& scratch) {
    switch (e.kind) {
        case ChunkKind::bf16: pack_cast(Cast::bf16, x, n, words, residual); return;
        case ChunkKind::f16: pack_cast(Cast::f16, x, n, words, residual); return;
        case ChunkKind::int8: pack_int8(x, n, e.block, words, residual); return;
        case ChunkKind::signs: pack_signs(x, n, e.block, words, residual); return;
        case ChunkKind::top_k: pack_top_k(x, n, e.top_k_count(n), words, scratch, residual); return;
    }
    LOOM_FAIL("pack_chunk: no encoding ", e);
}

// pack_chunk with top-k's scratch kept per thread: the form of the kernel
// table's entry (a device keeps its own scratch), for a backend that runs
// the host's (the tests' fenced device).
inline void pack_chunk_own_scratch(const ChunkEncoding& e, const float* x, std::int64_t n, std::uint32_t* words,
                                   float* residual) {
    thread_local std::vector<std::int32_t> scratch;
    pack_chunk(e, x, n, words, residual, scratch);
}

// out[0, n) += weight * decoded (add) or = weight * decoded.
inline void unpack_chunk(const ChunkEncoding& e, const std::uint32_t* words, std::int64_t n, float* out, float weight,
                         bool add) {
    switch (e.kind) {
        case ChunkKind::bf16: unpack_cast(Cast::bf16, words, n, out, weight, add); return;
        case ChunkKind::f16: unpack_cast(Cast::f16, words, n, out, weight, add); return;
        case ChunkKind::int8: unpack_int8(words, n, e.block, out, weight, add); return;
        case ChunkKind::signs: unpack_signs(words, n, e.block, out, weight, add); return;
        case ChunkKind::top_k:
            if (!add) std::fill_n(out, n, 0.0f);
            unpack_top_k_add(words, e.top_k_count(n), n, out, weight);
            return;
    }
    LOOM_FAIL("unpack_chunk: no encoding ", e);
}

}  // namespace host

}  // namespace loom::kernels
