// ChunkCodec: one compressor's encoding of a chunk of gradient (a rank's
// block of a bucket) into a fixed number of 32-bit words, and back. Fixed,
// because every rank's chunks of a bucket are equally long (parallel/
// shard_layout.hpp), so a compressed reduce-scatter or all-gather is one
// equal-count collective of words, whatever the values. The words are what
// crosses the link, so the communicator's byte count is the compressed size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/kernels/host/top_k.hpp"
#include "loom/parallel/grad_compress.hpp"

namespace loom::exec {

class ChunkCodec {
public:
    explicit ChunkCodec(const Compression& c) : c_(c) {
        c_.validate();
        LOOM_CHECK(c.on() && c.kind != CompressorKind::power_sgd, "ChunkCodec: ", c.describe(),
                   " does not compress chunk by chunk");
    }

    // Words on the wire for a chunk of n values.
    [[nodiscard]] std::int64_t words(std::int64_t n) const {
        switch (c_.kind) {
            case CompressorKind::bf16:
            case CompressorKind::fp16: return kernels::host::cast_words(n);
            case CompressorKind::int8: return kernels::host::int8_words(n, c_.block);
            case CompressorKind::one_bit: return kernels::host::sign_words(n, c_.block);
            case CompressorKind::top_k: return kernels::host::top_k_words(kernels::host::top_k_count(n, c_.ratio));
            default: break;
        }
        LOOM_FAIL("ChunkCodec: no chunk encoding for ", c_.describe());
    }

    // Encodes x[0, n) into words(n) words; with `residual` (which may be x
    // itself), leaves there x minus what the words decode to.
    void pack(const float* x, std::int64_t n, std::uint32_t* out, float* residual = nullptr) {
        namespace k = kernels::host;
        switch (c_.kind) {
            case CompressorKind::bf16: k::pack_cast(k::Cast::bf16, x, n, out, residual); return;
            case CompressorKind::fp16: k::pack_cast(k::Cast::f16, x, n, out, residual); return;
            case CompressorKind::int8: k::pack_int8(x, n, c_.block, out, residual); return;
            case CompressorKind::one_bit: k::pack_signs(x, n, c_.block, out, residual); return;
            case CompressorKind::top_k:
                k::pack_top_k(x, n, k::top_k_count(n, c_.ratio), out, scratch_, residual);
                return;
            default: break;
        }
        LOOM_FAIL("ChunkCodec: no chunk encoding for ", c_.describe());
    }

    // out[0, n) += weight * decoded (add) or = weight * decoded.
    void unpack(const std::uint32_t* in, std::int64_t n, float* out, float weight, bool add) const {
        namespace k = kernels::host;
        switch (c_.kind) {
            case CompressorKind::bf16: k::unpack_cast(k::Cast::bf16, in, n, out, weight, add); return;
            case CompressorKind::fp16: k::unpack_cast(k::Cast::f16, in, n, out, weight, add); return;
            case CompressorKind::int8: k::unpack_int8(in, n, c_.block, out, weight, add); return;
            case CompressorKind::one_bit: k::unpack_signs(in, n, c_.block, out, weight, add); return;
            case CompressorKind::top_k:
                if (!add) std::fill_n(out, n, 0.0f);
                k::unpack_top_k_add(in, k::top_k_count(n, c_.ratio), n, out, weight);
                return;
            default: break;
        }
        LOOM_FAIL("ChunkCodec: no chunk encoding for ", c_.describe());
    }

    [[nodiscard]] const Compression& compression() const noexcept { return c_; }

private:
    Compression c_;
    std::vector<std::int32_t> scratch_;  // top-k's candidate indices
};

}  // namespace loom::exec
