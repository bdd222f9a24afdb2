// bench_pipeline --gpt: the real GPT (config A with 8 layers: width 256,
// heads 4, seq 128, vocab 256) trained with a pipeline of 2 stages on the 2
// cores, beside data parallelism on the same 2 cores and the serial run on
// one, at the same global batch. Each rank runs one BLAS thread, so 2 ranks
// use the 2 cores and no more. Reported: tokens/s (median step of several
// timed steps, each step's time the slowest rank's), the ratios, and the
// schedule's simulated bubble, which bounds what the pipeline can reach
// against dp: dp does the whole step's work on each core with one
// all-reduce, a pipeline leaves each core idle for the bubble.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/schedule/pipeline.hpp>
#include <loom/schedule/simulate.hpp>

namespace bench_gpt {

struct GptRun {
    std::string what;
    int dp = 1, pp = 1, micro_batches = 1;
    loom::ScheduleKind schedule = loom::ScheduleKind::one_f_one_b;
    double step_seconds = 0;
    float final_loss = 0;
};

inline loom::gpt::Config gpt_config() { return {.layers = 8, .width = 256, .heads = 4, .seq = 128, .vocab = 256}; }

inline double median_of(std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
}

// Trains `steps` timed steps after `warmup` with the global batch `batch`.
inline GptRun run_gpt(GptRun run, std::int64_t batch, int steps, int warmup) {
    const auto config = gpt_config();
    const std::int64_t T = config.seq, rows = batch / run.dp;
    const int ranks = run.dp * run.pp, total = steps + warmup;
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 18, 11, static_cast<int>(config.vocab));
    std::vector<std::vector<double>> seconds(static_cast<std::size_t>(ranks));
    std::vector<float> losses(static_cast<std::size_t>(ranks));
    loom::comm::ThreadWorld(ranks).run([&](loom::comm::ThreadComm& world) {
        loom::kernels::host::set_blas_threads(1);
        loom::comm::Mesh<loom::comm::ThreadComm> mesh(world, {{"dp", run.dp}, {"pp", run.pp}});
        auto& dp = mesh.axis("dp");
        auto model = loom::gpt::make_model(config);
        const int chunks = run.schedule == loom::ScheduleKind::interleaved || run.schedule == loom::ScheduleKind::zero_bubble_v ? 2 : 1;
        // Layers split evenly over the virtual stages; embed joins the first, the final layers the last.
        std::vector<int> partition;
        if (run.pp > 1) {
            const int stages = run.pp * chunks;
            partition.assign(static_cast<std::size_t>(stages), static_cast<int>(config.layers) / stages);
            partition.front() += 1;
            partition.back() += 3;
        }
        loom::exec::Executor<loom::comm::ThreadComm> exec(
            model, dp, run.pp > 1 ? &mesh.axis("pp") : nullptr,
            loom::exec::ExecutionPlan{0, loom::default_bucket_bytes, run.pp > 1, run.schedule, chunks},
            {.micro_batches = run.micro_batches, .adamw = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f}, .partition = partition});
        exec.initialize(5);
        std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * T)), targets(inputs.size());
        auto& mine = seconds[static_cast<std::size_t>(world.rank())];
        for (int s = 0; s < total; ++s) {
            corpus.rows(11, s, dp.rank() * rows, rows, T, inputs, targets);
            world.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            losses[static_cast<std::size_t>(world.rank())] = exec.step(
                loom::Tensor::of(inputs.data(), {rows, T}), loom::Tensor::of(targets.data(), {rows, T}), 3e-4f);
            if (s >= warmup) mine.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    });
    std::vector<double> slowest(static_cast<std::size_t>(steps), 0.0);
    for (const auto& rank : seconds)
        for (std::size_t s = 0; s < slowest.size(); ++s) slowest[s] = std::max(slowest[s], rank[s]);
    run.step_seconds = median_of(slowest);
    run.final_loss = losses[0];
    return run;
}

// The table; returns 0.
inline int gpt_table(std::int64_t batch, int steps, int warmup, int repeats) {
    const auto config = gpt_config();
    std::printf("GPT config A with 8 layers (width %lld, heads %lld, seq %lld, vocab %lld), global batch %lld, "
                "1 BLAS thread per rank; per run the median of %d timed steps after %d warm-up, then the median of %d runs\n",
                static_cast<long long>(config.width), static_cast<long long>(config.heads),
                static_cast<long long>(config.seq), static_cast<long long>(config.vocab), static_cast<long long>(batch),
                steps, warmup, repeats);
    using loom::ScheduleKind;
    std::vector<GptRun> plans = {
        {"serial (1 core)", 1, 1, 1, ScheduleKind::one_f_one_b},
        {"dp 2", 2, 1, 1, ScheduleKind::one_f_one_b},
        {"pp 2 GPipe", 1, 2, 8, ScheduleKind::gpipe},
        {"pp 2 1F1B", 1, 2, 4, ScheduleKind::one_f_one_b},
        {"pp 2 1F1B", 1, 2, 8, ScheduleKind::one_f_one_b},
        {"pp 2 ZB-H1", 1, 2, 8, ScheduleKind::zero_bubble_h1},
        {"pp 2 Interleaved<2>", 1, 2, 8, ScheduleKind::interleaved},
        {"pp 2 ZB-V", 1, 2, 8, ScheduleKind::zero_bubble_v},
    };
    double serial = 0, dp2 = 0;
    std::printf("%-22s %4s %12s %10s %9s %9s %14s %11s\n", "run", "mb", "step ms", "tok/s", "x serial", "x dp 2",
                "bubble (sim.)", "final loss");
    for (auto plan : plans) {
        std::vector<double> times;
        GptRun last;
        for (int r = 0; r < repeats; ++r) {
            last = run_gpt(plan, batch, steps, warmup);
            times.push_back(last.step_seconds);
        }
        const double step = median_of(times);
        const double tokens = static_cast<double>(batch * config.seq) / step;
        if (plan.pp == 1 && plan.dp == 1) serial = tokens;
        if (plan.dp == 2) dp2 = tokens;
        std::string bubble = "-";
        if (plan.pp > 1) {
            const int chunks = plan.schedule == ScheduleKind::interleaved || plan.schedule == ScheduleKind::zero_bubble_v ? 2 : 1;
            const auto sim = loom::schedule::simulate(
                loom::schedule::pipeline_program(plan.schedule, plan.pp, plan.micro_batches, chunks),
                {.forward = 1.0 / chunks, .backward_input = 1.0 / chunks, .backward_weight = 1.0 / chunks});
            bubble = std::to_string(sim.bubble).substr(0, 5);
        }
        std::printf("%-22s %4d %12.1f %10.0f %9.2f %9.2f %14s %11.4f\n", plan.what.c_str(), plan.micro_batches,
                    step * 1e3, tokens, serial > 0 ? tokens / serial : 0.0, dp2 > 0 ? tokens / dp2 : 0.0, bubble.c_str(),
                    static_cast<double>(last.final_loss));
    }
    return 0;
}

}  // namespace bench_gpt
