// bench_compression's formulas: the bytes a compressed gradient exchange
// should send per step and rank (payload and ring wire bytes, per bucket and
// compressor; the table in bench/compression.cpp's opening comment), and how
// long that traffic holds one link when the collectives run one after the other.
#pragma once

#include <loom/comm/counted.hpp>
#include <loom/core/shape.hpp>
#include <loom/parallel/grad_compress.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "compression_runs.hpp"

namespace bench::compression {

struct Bytes {
    double payload = 0, wire = 0;
};

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The compressed words of a block of b values (kernels/host/quantize.hpp, top_k.hpp).
inline std::int64_t block_words(const Compression& c, std::int64_t b) {
    switch (c.kind) {
        case CompressorKind::bf16:
        case CompressorKind::fp16: return ceil_div(b, 2);
        case CompressorKind::int8: return ceil_div(b, c.block) + ceil_div(b, 4);
        case CompressorKind::one_bit: return ceil_div(b, c.block) + ceil_div(b, 32);
        case CompressorKind::top_k: {
            const auto k = static_cast<std::int64_t>(std::ceil(c.ratio * static_cast<double>(b) - 1e-9));
            return 2 * std::clamp<std::int64_t>(k, 1, b);
        }
        default: return 0;
    }
}

// PowerSGD's floats per bucket: P and Q of the matrices it compresses, the rest whole.
struct PowerSgdSizes {
    std::int64_t p = 0, q = 0, dense = 0;
};
inline PowerSgdSizes power_sgd_sizes(const std::vector<loom::Shape>& shapes, int rank) {
    PowerSgdSizes s;
    for (const auto& shape : shapes) {
        const std::int64_t n = shape.numel();
        if (n == 0) continue;
        const std::int64_t rows = shape.rank() >= 2 ? shape[0] : 1, cols = n / rows;
        if (shape.rank() >= 2 && rank <= std::min(rows, cols) && 2 * (rows + cols) * rank < rows * cols) {
            s.p += rows * rank;
            s.q += cols * rank;
        } else {
            s.dense += n;
        }
    }
    return s;
}

inline Bytes predicted_bytes(const Compression& c, int N, const StepRun& run) {
    Bytes out;
    const double n = N, ring = 2.0 * (n - 1) / n;
    for (std::size_t gi = 0; gi < run.groups.size(); ++gi) {
        const auto& g = run.groups[gi];
        const double P = static_cast<double>(g.padded);
        if (!c.on()) {
            out.payload += 4 * P;
            out.wire += ring * 4 * P;
        } else if (c.kind == CompressorKind::power_sgd) {
            const PowerSgdSizes s = power_sgd_sizes(run.group_shapes[gi], c.rank);
            const double floats = static_cast<double>(s.p + s.dense + s.q);
            out.payload += 4 * floats;
            out.wire += ring * 4 * floats;
        } else if (c.kind == CompressorKind::top_k) {
            const double w = static_cast<double>(block_words(c, g.block));
            out.payload += n * n * w * 4;
            out.wire += (n - 1) * n * w * 4;
        } else {
            const double w = static_cast<double>(block_words(c, g.block));
            out.payload += 2 * n * w * 4;
            out.wire += 2 * (n - 1) * w * 4;
        }
    }
    out.payload += 4;  // the loss
    out.wire += ring * 4;
    return out;
}

// Seconds the rank's collectives hold its link, one after the other (Links::cost summed).
inline double serial_link_seconds(const loom::comm::CommCounts& counts, int N, double gbit) {
    using loom::comm::OpKind;
    const double n = N;
    const double latency = latency_s * (2 * (n - 1) * static_cast<double>(counts[OpKind::all_reduce].calls) +
                                        (n - 1) * static_cast<double>(counts[OpKind::all_to_all].calls +
                                                                      counts[OpKind::all_gather].calls +
                                                                      counts[OpKind::reduce_scatter].calls));
    return latency + counts.total().wire_bytes * 8 / (gbit * 1e9);
}

}  // namespace bench::compression
