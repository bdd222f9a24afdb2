// "Parallel equals serial" for GradCompress, written once for every
// transport. A compressor changes what is averaged, so the serial run it
// must equal is the serial run *of the compressed algorithm*: one process
// computes each of the N dp ranks' gradients on its rows, averages them the
// way the compressor defines (reference_average: plain loops over the ranks,
// not the exchange's collectives), and takes the AdamW step. run_compressed
// trains the same model with Executor + GradCompress on a real world and
// compares. The reference shares the kernels (pack, unpack, GEMM,
// Gram-Schmidt), which have their own tests against scalar definitions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <loom/exec/executor.hpp>
#include <loom/parallel/power_sgd.hpp>
#include <loom/kernels/host/elementwise.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/kernels/host/low_rank.hpp>
#include <loom/parallel/grad_compress.hpp>

#include "parallel/equivalence_suite.hpp"

namespace loom_test {

struct CompressionCase {
    loom::Compression compression;
    int dp = 4;
    int stage = 0;  // 0: all-reduce; 1 and 2: reduce-scatter (one micro-batch)
    int micro_batches = 1;
    int steps = 4;
    std::int64_t warmup = 0;
    std::int64_t bucket_bytes = 16 << 10;
};

// The N ranks' error feedback (padded arena layout), one-bit's second error
// (chunk j's is rank j's: one padded array), PowerSGD's Qs by bucket.
struct ReferenceState {
    std::vector<std::vector<float>> error;
    std::vector<float> server;
    std::vector<std::vector<float>> q;
};

// PowerSGD's rule for which Params are factored, as parallel/power_sgd.hpp states it.
inline bool factored(const loom::Param& p, int rank) {
    if (p.shape.rank() < 2) return false;
    const std::int64_t rows = p.shape[0], cols = p.numel() / rows;
    return rank <= std::min(rows, cols) && (rows + cols) * rank * 2 < rows * cols;
}

// Averages bucket g of the ranks' padded gradients `grads` into `out` (the
// whole padded bucket: all-reduce semantics, or every rank's block of a
// reduce-scatter side by side), updating `state`.
inline void reference_average(const loom::Compression& c, const loom::parallel::ShardLayout& layout,
                              const std::vector<loom::nn::Unit>& units, int g, bool scatter,
                              const std::vector<std::vector<float>>& grads, ReferenceState& state,
                              std::vector<float>& out) {
    const auto& group = layout.group(g);
    const int n = static_cast<int>(grads.size());
    const float weight = 1.0f / static_cast<float>(n);
    std::vector<std::vector<float>> x(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
        auto& xr = x[static_cast<std::size_t>(r)];
        xr.assign(grads[static_cast<std::size_t>(r)].begin() + group.offset,
                  grads[static_cast<std::size_t>(r)].begin() + group.offset + group.padded);
        if (c.error_feedback())
            for (std::int64_t i = 0; i < group.padded; ++i)
                xr[static_cast<std::size_t>(i)] += state.error[static_cast<std::size_t>(r)][static_cast<std::size_t>(group.offset + i)];
    }
    float* result = out.data() + group.offset;
    if (c.kind == loom::CompressorKind::power_sgd) {
        const int k = c.rank;
        std::vector<float>& q = state.q[static_cast<std::size_t>(g)];
        std::int64_t at = 0, q_at = 0;
        std::fill_n(result, group.padded, 0.0f);
        for (int u = group.first_unit; u <= group.last_unit; ++u)
            for (const loom::Param* p : units[static_cast<std::size_t>(u)].params) {
                const std::int64_t numel = p->numel();
                if (!factored(*p, k)) {  // averaged whole, no residual
                    for (std::int64_t i = at; i < at + numel; ++i) {
                        float sum = 0;
                        for (int r = 0; r < n; ++r) sum += x[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
                        result[i] = sum / static_cast<float>(n);
                        for (int r = 0; r < n; ++r) x[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] = result[i];
                    }
                    at += numel;
                    continue;
                }
                const std::int64_t rows = p->shape[0], cols = numel / rows;
                std::vector<float> P(static_cast<std::size_t>(rows * k), 0.0f), Q(static_cast<std::size_t>(cols * k), 0.0f);
                std::vector<float> part(std::max(P.size(), Q.size()));
                using loom::kernels::host::Trans;
                for (int r = 0; r < n; ++r) {
                    loom::kernels::host::gemm(Trans::no, Trans::no, rows, k, cols, 1.0f,
                                              x[static_cast<std::size_t>(r)].data() + at, cols, q.data() + q_at, k, 0.0f,
                                              part.data(), k);
                    for (std::size_t i = 0; i < P.size(); ++i) P[i] += part[i];
                }
                for (float& v : P) v /= static_cast<float>(n);
                loom::kernels::host::orthonormalize_columns(P.data(), rows, k);
                for (int r = 0; r < n; ++r) {
                    loom::kernels::host::gemm(Trans::yes, Trans::no, cols, k, rows, 1.0f,
                                              x[static_cast<std::size_t>(r)].data() + at, cols, P.data(), k, 0.0f,
                                              part.data(), k);
                    for (std::size_t i = 0; i < Q.size(); ++i) Q[i] += part[i];
                }
                for (float& v : Q) v /= static_cast<float>(n);
                loom::kernels::host::gemm(Trans::no, Trans::yes, rows, cols, k, 1.0f, P.data(), k, Q.data(), k, 0.0f,
                                          result + at, cols);
                std::copy(Q.begin(), Q.end(), q.begin() + q_at);
                at += numel;
                q_at += cols * k;
            }
        for (int r = 0; r < n; ++r)
            for (std::int64_t i = 0; i < group.padded; ++i)
                state.error[static_cast<std::size_t>(r)][static_cast<std::size_t>(group.offset + i)] =
                    x[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)] - result[i];
        return;
    }
    // Chunk by chunk: rank r's chunk j compressed (its residual kept), the
    // chunks of j averaged in rank order.
    loom::parallel::ChunkCodec codec(c);
    const std::int64_t block = group.block, words = codec.words(block);
    std::vector<std::uint32_t> packed(static_cast<std::size_t>(words));
    for (int j = 0; j < n; ++j) {
        float* sums = result + j * block;
        for (int r = 0; r < n; ++r) {
            float* chunk = x[static_cast<std::size_t>(r)].data() + j * block;
            codec.pack(chunk, block, packed.data(), c.error_feedback() ? chunk : nullptr);
            codec.unpack(packed.data(), block, sums, weight, r > 0);
        }
        if (scatter || !c.two_stage()) continue;
        // All-reduce of a two-stage compressor: the sums compressed again.
        if (c.kind == loom::CompressorKind::one_bit) {
            float* server = state.server.data() + group.offset + j * block;
            for (std::int64_t i = 0; i < block; ++i) sums[i] += server[i];
            codec.pack(sums, block, packed.data(), server);
        } else {
            codec.pack(sums, block, packed.data());
        }
        codec.unpack(packed.data(), block, sums, 1.0f, false);
    }
    if (c.error_feedback())
        for (int r = 0; r < n; ++r)  // x now holds each rank's residual
            std::copy_n(x[static_cast<std::size_t>(r)].begin(), group.padded,
                        state.error[static_cast<std::size_t>(r)].begin() + group.offset);
}

inline ReferenceState reference_state(const loom::Compression& c, const loom::parallel::ShardLayout& layout,
                                      const std::vector<loom::nn::Unit>& units, int n) {
    ReferenceState state;
    state.error.assign(static_cast<std::size_t>(n), std::vector<float>(static_cast<std::size_t>(layout.padded_size()), 0.0f));
    state.server.assign(static_cast<std::size_t>(layout.padded_size()), 0.0f);
    for (int g = 0; g < static_cast<int>(layout.groups().size()); ++g) {
        std::vector<float> q;
        const auto& group = layout.group(g);
        for (int u = group.first_unit; u <= group.last_unit; ++u)
            for (const loom::Param* p : units[static_cast<std::size_t>(u)].params)
                if (c.kind == loom::CompressorKind::power_sgd && factored(*p, c.rank))
                    q.resize(q.size() + static_cast<std::size_t>(p->numel() / p->shape[0] * c.rank));
        const loom::RngStream stream{loom::parallel::power_sgd_seed, static_cast<std::uint64_t>(g)};
        for (std::size_t i = 0; i < q.size(); ++i) q[i] = stream.normal(i);
        state.q.push_back(std::move(q));
    }
    return state;
}

// The serial run of compressed data parallelism over c.dp virtual ranks.
inline SerialRun serial_compressed_run(const CompressionCase& c) {
    const auto config = equivalence_model();
    auto model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, equivalence_seed);
    auto adamw = equivalence_adamw();
    // As the executor: error feedback freezes AdamW's variance when compression starts.
    if (c.compression.error_feedback()) adamw.freeze_variance_after = c.warmup;
    loom::optim::AdamW optimizer(arena.size(), adamw);
    const auto units = loom::nn::units_of(model);
    const loom::parallel::ShardLayout layout(units, c.dp, c.stage == 3 ? loom::parallel::Grouping::per_unit
                                                                       : loom::parallel::Grouping::buckets,
                                             c.bucket_bytes);
    ReferenceState state = reference_state(c.compression, layout, units, c.dp);
    const std::int64_t rows = equivalence_batch / c.dp;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * config.seq)), targets(inputs.size());
    std::vector<std::vector<float>> grads(static_cast<std::size_t>(c.dp),
                                          std::vector<float>(static_cast<std::size_t>(layout.padded_size())));
    std::vector<float> average(static_cast<std::size_t>(layout.padded_size())), dense(arena.grads().size());
    loom::nn::Context ctx;
    SerialRun run;
    for (int step = 0; step < c.steps; ++step) {
        float loss = 0;
        for (int r = 0; r < c.dp; ++r) {
            equivalence_corpus().rows(equivalence_seed, step, r * rows, rows, config.seq, inputs, targets);
            arena.zero_grads();
            // Micro-batch by micro-batch, as the executor accumulates them (a
            // lossy compressor turns a last-bit difference into a visible one).
            const std::int64_t mb_rows = rows / c.micro_batches;
            for (int mb = 0; mb < c.micro_batches; ++mb)
                loss += loom::nn::forward_backward(
                            model, ctx, loom::Tensor::of(inputs.data() + mb * mb_rows * config.seq, {mb_rows, config.seq}),
                            loom::Tensor::of(targets.data() + mb * mb_rows * config.seq, {mb_rows, config.seq})) /
                        static_cast<float>(c.micro_batches);
            for (float& g : arena.grads()) g /= static_cast<float>(c.micro_batches);
            layout.from_dense(arena.grads(), grads[static_cast<std::size_t>(r)]);
        }
        run.losses.push_back(loss / static_cast<float>(c.dp));
        if (step < c.warmup) {
            std::fill(average.begin(), average.end(), 0.0f);
            for (const auto& gr : grads)
                for (std::size_t i = 0; i < gr.size(); ++i) average[i] += gr[i] / static_cast<float>(c.dp);
        } else {
            // 1-bit Adam at ZeRO 0: each rank's momentum-to-be is what is compressed.
            const bool momentum = c.compression.compresses_momentum() && c.stage == 0;
            std::vector<float> m_padded(average.size());
            if (momentum) {
                layout.from_dense(optimizer.m(), m_padded);
                for (auto& gr : grads)
                    loom::kernels::host::mix_momentum(gr.data(), m_padded.data(), static_cast<std::int64_t>(gr.size()),
                                                      adamw.beta1);
            }
            for (int g = 0; g < static_cast<int>(layout.groups().size()); ++g)
                reference_average(c.compression, layout, units, g, c.stage >= 1, grads, state, average);
            if (momentum)
                loom::kernels::host::unmix_momentum(average.data(), m_padded.data(),
                                                    static_cast<std::int64_t>(average.size()), adamw.beta1);
        }
        layout.to_dense(average, dense);
        optimizer.step(arena.values(), dense);
    }
    run.params.assign(arena.values().begin(), arena.values().end());
    return run;
}

// Runs on every rank of `world` (dp ranks) with Executor + GradCompress.
template <loom::comm::Communicator C>
EquivalenceResult run_compressed(C& world, const CompressionCase& c, const SerialRun& serial) {
    const auto config = equivalence_model();
    auto model = loom::gpt::make_model(config);
    loom::exec::ExecutionPlan plan{};
    plan.zero_stage = c.stage;
    plan.bucket_bytes = c.bucket_bytes;
    plan.dp_compression = c.compression;
    loom::exec::Executor<C> exec(model, world, plan,
                                 {.micro_batches = c.micro_batches, .adamw = equivalence_adamw(),
                                  .exchange = {.compress_warmup = c.warmup}, .notice = [](const std::string&) {}});
    exec.initialize(equivalence_seed);
    const std::int64_t rows = equivalence_batch / c.dp;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * config.seq)), targets(inputs.size());
    EquivalenceResult result;
    for (int step = 0; step < c.steps; ++step) {
        equivalence_corpus().rows(equivalence_seed, step, world.rank() * rows, rows, config.seq, inputs, targets);
        const float loss = exec.step(loom::Tensor::of(inputs.data(), {rows, config.seq}),
                                     loom::Tensor::of(targets.data(), {rows, config.seq}), equivalence_lr);
        result.losses.push_back(loss);
        const double ref = serial.losses[static_cast<std::size_t>(step)];
        result.worst_loss_error = std::max(result.worst_loss_error, std::abs(loss - ref) / std::abs(ref));
    }
    std::tie(result.worst_param_error, result.param_norm_error) = param_errors(exec, serial);
    return result;
}

// The compressors every transport's suite runs.
inline std::vector<loom::Compression> every_compressor() {
    using loom::parse_compression;
    return {parse_compression("bf16"),      parse_compression("fp16"),       parse_compression("int8"),
            parse_compression("int8:16"),   parse_compression("topk:0.05"),  parse_compression("powersgd:2"),
            parse_compression("onebit")};
}

}  // namespace loom_test
