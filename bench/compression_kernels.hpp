// bench_compression's kernel rows: ChunkCodec pack and unpack over a
// gradient-like buffer, chunk by chunk as the exchange packs it (error
// feedback in place where the compressor keeps one); PowerSGD's buckets
// (start + finish, as the exchange runs them) and its kernels alone on one
// matrix. Each row is the median of --reps, in GB/s of f32 processed.
#pragma once

#include <loom/comm/thread_world.hpp>
#include <loom/core/rng.hpp>
#include <loom/parallel/chunk_codec.hpp>
#include <loom/parallel/power_sgd.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/kernels/host/low_rank.hpp>
#include <loom/nn/units.hpp>
#include <loom/parallel/grad_compress.hpp>
#include <loom/parallel/shard_layout.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "gpt_bench_configs.hpp"
#include "timing.hpp"

namespace bench::compression {

using loom::Compression;
using loom::CompressorKind;
using loom::comm::ThreadComm;

struct KernelRow {
    std::string what;
    double pack_gbs = 0, unpack_gbs = 0;
    double pack_ms = 0, unpack_ms = 0;
    std::size_t compressor = 0;  // its index in the compressor list
    bool whole_exchange = false;  // PowerSGD's buckets row: pack_ms is one step's work
    bool estimate = true;         // contributes a per-step codec estimate
};

// A gradient-like buffer: normal values of mixed scales (a few large ones, as real gradients have).
inline void fill_gradient(std::vector<float>& x, std::uint64_t seed) {
    const loom::RngStream rng{seed, loom::stream_id("bench_compression")};
    rng.fill_normal(x, 0, 0.0f, 1e-3f);
    for (std::size_t i = 0; i < x.size(); i += 97) x[i] *= 30.0f;
}

inline KernelRow chunk_codec_row(const Compression& c, const std::string& spelling, std::vector<float>& x,
                                 const std::vector<float>& pristine, std::vector<float>& out, std::int64_t chunk, int N,
                                 int reps) {
    loom::parallel::ChunkCodec codec(c);
    const auto n = static_cast<std::int64_t>(x.size());
    const std::int64_t chunks = n / chunk, words = codec.words(chunk);
    std::vector<std::uint32_t> packed(static_cast<std::size_t>(chunks * words));
    const bool feedback = c.error_feedback();
    const auto restore = [&] {
        if (feedback) std::memcpy(x.data(), pristine.data(), x.size() * sizeof(float));
    };
    const double t_pack = median_seconds(
        reps,
        [&] {
            for (std::int64_t j = 0; j < chunks; ++j) {
                float* in = x.data() + j * chunk;
                codec.pack(in, chunk, packed.data() + j * words, feedback ? in : nullptr);
            }
            keep_memory(packed.data());
            keep_memory(x.data());
        },
        restore);
    std::fill(out.begin(), out.end(), 0.0f);
    const float weight = 1.0f / static_cast<float>(N);
    const double t_unpack = median_seconds(reps, [&] {
        for (std::int64_t j = 0; j < chunks; ++j)
            codec.unpack(packed.data() + j * words, chunk, out.data() + j * chunk, weight, true);
        keep_memory(out.data());
    });
    const double bytes = 4.0 * static_cast<double>(chunks * chunk);
    return {spelling, bytes / t_pack / 1e9, bytes / t_unpack / 1e9, 1e3 * t_pack, 1e3 * t_unpack};
}

// PowerSGD: every bucket's start + finish over the GPT's gradient on a 1-rank world.
inline KernelRow power_sgd_buckets_row(const Compression& c, const std::string& spelling, const BenchConfig& config,
                                       int N, std::int64_t bucket, int reps, std::int64_t& elements) {
    KernelRow row{spelling + " GPT buckets (start + finish, 1 rank)"};
    loom::comm::ThreadWorld(1).run([&](ThreadComm& comm) {
        auto model = loom::gpt::make_model(config.model);
        const auto units = loom::nn::units_of(model);
        const loom::parallel::ShardLayout layout(units, N, loom::parallel::Grouping::buckets, bucket);
        loom::parallel::PowerSgdBuckets buckets(layout, units, c.rank, {});
        const auto n = static_cast<std::size_t>(layout.padded_size());
        std::vector<float> grad(n), pristine(n), error(n);
        fill_gradient(pristine, 11);
        const double t = median_seconds(
            reps,
            [&] {
                for (int g = 0; g < static_cast<int>(layout.groups().size()); ++g) {
                    const auto& group = layout.group(g);
                    const std::span<float> gs(grad.data() + group.offset, static_cast<std::size_t>(group.padded));
                    const std::span<float> es(error.data() + group.offset, static_cast<std::size_t>(group.padded));
                    buckets.start(comm, g, gs, es).wait();
                    buckets.finish(comm, g, gs, es);
                }
                keep_memory(grad.data());
            },
            [&] {
                std::copy(pristine.begin(), pristine.end(), grad.begin());
                std::fill(error.begin(), error.end(), 0.0f);
            });
        elements = layout.padded_size();
        row.pack_ms = 1e3 * t;
        row.pack_gbs = 4.0 * static_cast<double>(n) / t / 1e9;
    });
    return row;
}

// PowerSGD's kernels alone on one rows x cols matrix (no communication).
inline KernelRow power_sgd_kernels_row(int rank, std::vector<float>& m, const std::vector<float>& pristine,
                                       std::vector<float>& approx, std::int64_t rows, std::int64_t cols, int reps) {
    namespace k = loom::kernels::host;
    std::vector<float> p(static_cast<std::size_t>(rows * rank)), q(static_cast<std::size_t>(cols * rank));
    const loom::RngStream rng{loom::parallel::power_sgd_seed, 0};
    std::vector<float> q0(q.size());
    for (std::size_t i = 0; i < q0.size(); ++i) q0[i] = rng.normal(i);
    const double t = median_seconds(
        reps,
        [&] {
            k::gemm(k::Trans::no, k::Trans::no, rows, rank, cols, 1.0f, m.data(), cols, q.data(), rank, 0.0f,
                    p.data(), rank);
            k::orthonormalize_columns(p.data(), rows, rank);
            k::gemm(k::Trans::yes, k::Trans::no, cols, rank, rows, 1.0f, m.data(), cols, p.data(), rank, 0.0f,
                    q.data(), rank);
            k::gemm(k::Trans::no, k::Trans::yes, rows, cols, rank, 1.0f, p.data(), rank, q.data(), rank, 0.0f,
                    approx.data(), cols);
            for (std::int64_t i = 0; i < rows * cols; ++i)
                m[static_cast<std::size_t>(i)] -= approx[static_cast<std::size_t>(i)];
            keep_memory(m.data());
        },
        [&] {
            std::memcpy(m.data(), pristine.data(), static_cast<std::size_t>(rows * cols) * sizeof(float));
            q = q0;
        });
    const double bytes = 4.0 * static_cast<double>(rows * cols);
    char what[128];
    std::snprintf(what, sizeof what, "powersgd:%d kernels, one %lld x %lld matrix", rank, static_cast<long long>(rows),
                  static_cast<long long>(cols));
    return {what, bytes / t / 1e9, 0, 1e3 * t, 0};
}

}  // namespace bench::compression
