// bench_compression's training runs: one world of dp rank threads with one
// executor per compressor, stepped in turn (the first one rotating every
// round, so a neighbour's burst of load falls on every compressor alike),
// under comm::Counted (bytes) or comm::Shaped (link speed); each
// compressor's step times, collective waits and counts. See
// bench/compression.cpp for what the benchmark reports.
#pragma once

#include <loom/comm/counted.hpp>
#include <loom/comm/links.hpp>
#include <loom/comm/shaped.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/trace.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/parallel/grad_compress.hpp>
#include <loom/parallel/shard_layout.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpt_bench_configs.hpp"

namespace bench::compression {

using loom::Compression;
using loom::CompressorKind;
using loom::comm::ThreadComm;

inline constexpr std::uint64_t data_seed = 1;
inline constexpr std::uint64_t init_seed = 1;
inline constexpr double latency_s = 5e-6;  // every Shaped link's, and the formulas'
inline constexpr loom::optim::AdamWConfig adamw{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};

// One compressor's figures in one world.
struct StepRun {
    std::vector<double> step_ms;         // per timed step: the slowest rank's
    std::vector<double> wait_ms;         // per timed step: the slowest rank's time waiting for collectives
    loom::comm::CommCounts counts;       // rank 0, the last timed step
    bool bytes_constant = true;          // every timed step, every rank: the same counts
    float loss = 0;                      // rank 0, the last step
    std::vector<loom::parallel::ShardGroup> groups;
    std::vector<std::vector<loom::Shape>> group_shapes;  // each group's parameter shapes, arena order
    std::vector<std::string> notices;

    [[nodiscard]] double median_ms() const { return median(step_ms); }
    [[nodiscard]] double median_wait_ms() const { return median(wait_ms); }
};

// Milliseconds the compute thread stood waiting for collectives in `step`
// (the trace's "wait for" events: the part overlap did not hide, and for a
// compressed exchange its second half, which runs in the wait).
inline double waited_ms(const loom::exec::Trace& trace, std::int64_t step) {
    double ms = 0;
    for (const auto& e : trace.events())
        if (e.step == step && e.lane == loom::exec::compute_lane && e.category == "wait") ms += e.duration_us / 1e3;
    return ms;
}

// One world of dp rank threads over communicator type C (`wrap` turns each
// ThreadComm into a C), one executor (and model) per compressor on it; every
// round steps each executor once, the starting compressor rotating, so a
// neighbour's burst of load falls on every compressor alike. `warmup`
// untimed rounds, then `steps` timed ones. Every executor sees the same rows.
template <class C, class Wrap>
std::vector<StepRun> run_round_robin(const BenchConfig& config, int dp, const std::vector<Compression>& compressors,
                                     std::int64_t bucket, int steps, int warmup, Wrap wrap) {
    const std::int64_t B = config.batch, T = config.model.seq;
    const int total = warmup + steps;
    const auto K = compressors.size();
    // Before the clock: every rank's rows of every step's global batch.
    auto batches = bench::pregenerated_batches(config, dp, total, data_seed);
    // [rank][compressor][timed step]
    using Grid = std::vector<std::vector<std::vector<double>>>;
    Grid seconds(static_cast<std::size_t>(dp), std::vector<std::vector<double>>(K, std::vector<double>(static_cast<std::size_t>(steps))));
    Grid waits = seconds;
    std::vector<std::vector<std::vector<loom::comm::CommCounts>>> counts(
        static_cast<std::size_t>(dp),
        std::vector<std::vector<loom::comm::CommCounts>>(K, std::vector<loom::comm::CommCounts>(static_cast<std::size_t>(steps))));
    std::vector<StepRun> runs(K);
    loom::comm::ThreadWorld(dp).run([&](ThreadComm& thread_comm) {
        loom::kernels::host::set_blas_threads(1);
        C comm = wrap(std::move(thread_comm));
        const int r = comm.rank();
        std::vector<std::unique_ptr<loom::gpt::Model>> models;
        std::vector<std::unique_ptr<loom::exec::Executor<C>>> execs;
        for (std::size_t k = 0; k < K; ++k) {
            models.push_back(std::make_unique<loom::gpt::Model>(loom::gpt::make_model(config.model)));
            loom::exec::ExecutionPlan plan{0, bucket};
            plan.dp_compression = compressors[k];
            StepRun& run = runs[k];
            loom::exec::ExecutorOptions options{
                .micro_batches = 1,
                .adamw = adamw,
                .trace = true,  // for the wait times; a few clock reads per unit
                .field_names = {"embed", "blocks", "ln_f", "head", "loss"},
                .exchange = {.compress_warmup = 0},
                .notice = [&run](const std::string& line) { run.notices.push_back(line); }};
            execs.push_back(std::make_unique<loom::exec::Executor<C>>(*models.back(), comm, plan, options));
            execs.back()->initialize(init_seed);
        }
        for (int s = 0; s < total; ++s) {
            auto& in = batches.inputs[batches.at(r, s)];
            auto& out = batches.targets[batches.at(r, s)];
            for (std::size_t j = 0; j < K; ++j) {
                const std::size_t k = (j + static_cast<std::size_t>(s)) % K;
                comm.inner().barrier();  // the wrapped one: neither counted nor shaped
                if constexpr (requires { comm.reset(); }) comm.reset();
                const auto t0 = std::chrono::steady_clock::now();
                const float loss =
                    execs[k]->step(loom::Tensor::of(in.data(), {B, T}), loom::Tensor::of(out.data(), {B, T}), adamw.lr);
                const auto t1 = std::chrono::steady_clock::now();
                if (r == 0) runs[k].loss = loss;
                if (s < warmup) continue;
                const auto at = static_cast<std::size_t>(s - warmup), rr = static_cast<std::size_t>(r);
                seconds[rr][k][at] = std::chrono::duration<double>(t1 - t0).count();
                waits[rr][k][at] = waited_ms(execs[k]->trace(), s);
                if constexpr (requires { comm.counts(); }) counts[rr][k][at] = comm.counts();
            }
        }
        if (r == 0)
            for (std::size_t k = 0; k < K; ++k) {
                runs[k].groups = execs[k]->layout().groups();
                for (const auto& g : runs[k].groups) {
                    std::vector<loom::Shape> shapes;
                    for (int u = g.first_unit; u <= g.last_unit; ++u)
                        for (const loom::Param* p : execs[k]->units()[static_cast<std::size_t>(u)].params)
                            shapes.push_back(p->shape);
                    runs[k].group_shapes.push_back(std::move(shapes));
                }
            }
    });
    for (std::size_t k = 0; k < K; ++k) {
        StepRun& run = runs[k];
        run.step_ms.assign(static_cast<std::size_t>(steps), 0.0);
        run.wait_ms.assign(static_cast<std::size_t>(steps), 0.0);
        for (std::size_t s = 0; s < run.step_ms.size(); ++s)
            for (std::size_t rr = 0; rr < seconds.size(); ++rr) {
                run.step_ms[s] = std::max(run.step_ms[s], 1e3 * seconds[rr][k][s]);
                run.wait_ms[s] = std::max(run.wait_ms[s], waits[rr][k][s]);
            }
        run.counts = counts[0][k].back();
        for (const auto& rank : counts)
            for (const auto& c : rank[k]) run.bytes_constant = run.bytes_constant && c == run.counts;
    }
    return runs;
}

inline std::vector<StepRun> run_counted(const BenchConfig& config, int dp, const std::vector<Compression>& c,
                                        std::int64_t bucket, int steps, int warmup) {
    using Counted = loom::comm::Counted<ThreadComm>;
    return run_round_robin<Counted>(config, dp, c, bucket, steps, warmup,
                                    [](ThreadComm comm) { return Counted(std::move(comm)); });
}

inline std::vector<StepRun> run_shaped(const BenchConfig& config, int dp, const std::vector<Compression>& c,
                                       std::int64_t bucket, int steps, int warmup, double gbit) {
    using Shaped = loom::comm::Shaped<ThreadComm>;
    const loom::comm::Links links(dp, loom::comm::Link::gbit(gbit, latency_s));
    return run_round_robin<Shaped>(config, dp, c, bucket, steps, warmup,
                                   [&](ThreadComm comm) { return Shaped(std::move(comm), links); });
}

// Median over the timed rounds of none's step time over this one's (same round).
inline double speedup(const StepRun& none, const StepRun& run) {
    std::vector<double> ratios;
    for (std::size_t s = 0; s < run.step_ms.size(); ++s) ratios.push_back(none.step_ms[s] / run.step_ms[s]);
    return median(ratios);
}

}  // namespace bench::compression
