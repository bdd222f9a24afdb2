// ChunkCodec: one compressor's encoding of a chunk of gradient (a rank's
// block of a bucket) into a fixed number of 32-bit words, and back. Fixed,
// because every rank's chunks of a bucket are equally long (parallel/
// shard_layout.hpp), so a compressed reduce-scatter or all-gather is one
// equal-count collective of words, whatever the values. The words are what
// crosses the link, so the communicator's byte count is the compressed size.
// The encodings themselves are kernels/chunk_encoding.hpp's.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/chunk_encoding.hpp"
#include "loom/kernels/compression_ops.hpp"
#include "loom/parallel/grad_compress.hpp"

namespace loom::parallel {

// The chunk encoding of a chunk-by-chunk compressor.
[[nodiscard]] inline kernels::ChunkEncoding chunk_encoding_of(const Compression& c) {
    using kernels::ChunkKind;
    switch (c.kind) {
        case CompressorKind::bf16: return {ChunkKind::bf16};
        case CompressorKind::fp16: return {ChunkKind::f16};
        case CompressorKind::int8: return {ChunkKind::int8, c.block};
        case CompressorKind::one_bit: return {ChunkKind::signs, c.block};
        case CompressorKind::top_k: return {ChunkKind::top_k, 0, c.ratio};
        default: break;
    }
    LOOM_FAIL("ChunkCodec: ", c.describe(), " does not compress chunk by chunk");
}

// Packs and unpacks chunks in memory on `where` (the host by default), with
// the host's kernels or the device's table.
class ChunkCodec {
public:
    explicit ChunkCodec(const Compression& c, Device where = host_device) : c_(c), where_(where) {
        c_.validate();
        LOOM_CHECK(c.on() && c.kind != CompressorKind::power_sgd, "ChunkCodec: ", c.describe(),
                   " does not compress chunk by chunk");
        encoding_ = chunk_encoding_of(c);
    }

    // Words on the wire for a chunk of n values.
    [[nodiscard]] std::int64_t words(std::int64_t n) const { return encoding_.words(n); }

    // Encodes x[0, n) into words(n) words; with `residual` (which may be x
    // itself), leaves there x minus what the words decode to.
    void pack(const float* x, std::int64_t n, std::uint32_t* out, float* residual = nullptr) {
        kernels::pack_chunk(where_, encoding_, x, n, out, residual, scratch_);
    }

    // out[0, n) += weight * decoded (add) or = weight * decoded.
    void unpack(const std::uint32_t* in, std::int64_t n, float* out, float weight, bool add) const {
        kernels::unpack_chunk(where_, encoding_, in, n, out, weight, add);
    }

    [[nodiscard]] const Compression& compression() const noexcept { return c_; }
    [[nodiscard]] const kernels::ChunkEncoding& encoding() const noexcept { return encoding_; }

private:
    Compression c_;
    Device where_;
    kernels::ChunkEncoding encoding_;
    std::vector<std::int32_t> scratch_;  // top-k's candidate indices (on the host)
};

}  // namespace loom::parallel
