// bench_optex_estimator: what OptEx costs a rank per sequential iteration,
// against d and T0, beside one gradient evaluation of the GPT (config A:
// forward and backward of 8 sequences of 128 tokens, one thread) measured in
// the same run. With N workers a rank holds 1/N of the dimensions and, per
// iteration, factors K once, locates and answers N - 1 queries, takes N - 1
// proxy AdamW steps (copying the state for each), and adds N points (N - 1 of
// them with distances known from their queries). That must stay well below
// one gradient evaluation, or the proxy steps cost what they were meant to
// save. The whole iteration is then timed end to end on N rank threads with
// the GPT's gradient as the workers' work, beside the same threads computing
// the gradients alone.
//
//   bench_optex_estimator [--workers 4] [--reps 5] [--dims 10000,100000,1000000] [--histories 10,25,50]
//                         [--end-to-end 50 (T0; 0: skip)] [--effective-dim 100000]
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/compose.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/optim/gp_estimator.hpp>
#include <loom/optim/optex.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "degree_list.hpp"
#include "gpt_bench_configs.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
    return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// One GPT config A gradient evaluation on one thread: median of `reps`.
double gpt_gradient_seconds(int reps, std::int64_t& parameters) {
    const auto& config = bench::configs().at("A");
    auto model = loom::gpt::make_model(config.model);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, 1);
    parameters = arena.size();
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 20, 1, static_cast<int>(config.model.vocab));
    const std::int64_t rows = config.batch, T = config.model.seq;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * T)), targets(inputs.size());
    loom::nn::Context ctx;
    std::vector<double> times;
    for (int r = 0; r < reps + 1; ++r) {
        corpus.rows(1, r, 0, rows, T, inputs, targets);
        arena.zero_grads();
        const auto t0 = clock_type::now();
        (void)loom::nn::forward_backward(model, ctx, loom::Tensor::of(inputs.data(), {rows, T}),
                                         loom::Tensor::of(targets.data(), {rows, T}));
        if (r > 0) times.push_back(seconds_since(t0));  // the first warms the caches and the allocator
    }
    return bench::median(times);
}

struct RankCost {
    double estimator = 0, optimizer = 0;  // seconds per iteration on one rank's slice
    [[nodiscard]] double total() const { return estimator + optimizer; }
};

// One rank's slice (d / N elements) of a steady-state iteration (a full
// history), timed in two parts: the estimator's work and the inner optimizer's
// proxy steps and state copies.
RankCost rank_cost(std::int64_t d, int history, int workers, int reps, std::int64_t effective_dim = 0) {
    const std::int64_t n = (d + workers - 1) / workers;
    // With an effective dimension the kernel sees e / N coordinates of the slice.
    const std::int64_t f = effective_dim > 0 ? (effective_dim + workers - 1) / workers : n;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const auto random = [&](std::int64_t size) {
        std::vector<float> v(static_cast<std::size_t>(size));
        for (float& e : v) e = u(rng);
        return v;
    };
    loom::optim::GpGradientEstimator est(n, {.history = history}, {}, f);
    for (int i = 0; i < history; ++i) est.add(random(f), random(n));
    loom::optim::AdamW adam(n, {});
    std::vector<std::vector<float>> points(static_cast<std::size_t>(workers), random(n));
    std::vector<std::vector<float>> grads;
    for (int k = 0; k < workers; ++k) grads.push_back(random(n));
    // The kernel's coordinates of a point: a strided subset standing in for the sample.
    std::vector<float> seen(static_cast<std::size_t>(f));
    const auto features = [&](const std::vector<float>& p) -> std::span<const float> {
        if (f == n) return p;
        for (std::int64_t i = 0; i < f; ++i) seen[static_cast<std::size_t>(i)] = p[static_cast<std::size_t>(i * (n / f))];
        return seen;
    };
    std::vector<loom::optim::AdamW> states(static_cast<std::size_t>(workers), adam);
    std::vector<loom::optim::GpQuery> queries(static_cast<std::size_t>(workers));
    std::vector<float> mu(static_cast<std::size_t>(n));
    std::vector<double> estimator_times, optimizer_times;
    for (int r = 0; r < reps; ++r) {
        double estimator = 0, optimizer = 0;
        auto t0 = clock_type::now();
        est.prepare();
        estimator += seconds_since(t0);
        for (int k = 0; k + 1 < workers; ++k) {
            t0 = clock_type::now();
            queries[static_cast<std::size_t>(k)] = est.locate(features(points[static_cast<std::size_t>(k)]));
            est.estimate(queries[static_cast<std::size_t>(k)], mu);
            estimator += seconds_since(t0);
            t0 = clock_type::now();
            points[static_cast<std::size_t>(k + 1)] = points[static_cast<std::size_t>(k)];
            states[static_cast<std::size_t>(k + 1)] = states[static_cast<std::size_t>(k)];
            states[static_cast<std::size_t>(k + 1)].step(points[static_cast<std::size_t>(k + 1)], mu);
            optimizer += seconds_since(t0);
        }
        t0 = clock_type::now();
        for (int k = 0; k < workers; ++k)
            est.add(features(points[static_cast<std::size_t>(k)]), grads[static_cast<std::size_t>(k)],
                    k + 1 < workers ? &queries[static_cast<std::size_t>(k)] : nullptr);
        estimator += seconds_since(t0);
        estimator_times.push_back(estimator);
        optimizer_times.push_back(optimizer);
    }
    return {bench::median(estimator_times), bench::median(optimizer_times)};
}

// OptEx<AdamW> on `workers` rank threads with the GPT config A gradient as
// each worker's work, and the same threads computing gradients alone: median
// seconds per iteration of each.
std::pair<double, double> end_to_end(int workers, int history, int reps, std::int64_t effective_dim) {
    const auto& config = bench::configs().at("A");
    std::vector<double> plain, optex;
    loom::comm::ThreadWorld(workers).run([&](loom::comm::ThreadComm& comm) {
        auto model = loom::gpt::make_model(config.model);
        loom::nn::ParamArena arena(model);
        arena.initialize(model, 1);
        const auto corpus = loom::data::ByteCorpus::synthetic(1 << 20, 1, static_cast<int>(config.model.vocab));
        const std::int64_t rows = config.batch, T = config.model.seq;
        std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * T)), targets(inputs.size());
        loom::nn::Context ctx;
        int batch = 0;
        const auto gradient = [&](std::span<const float> x, std::span<float> g) {
            std::copy(x.begin(), x.end(), arena.values().begin());
            arena.zero_grads();
            corpus.rows(1, batch++ * workers + comm.rank(), 0, rows, T, inputs, targets);
            const float loss = loom::nn::forward_backward(model, ctx, loom::Tensor::of(inputs.data(), {rows, T}),
                                                          loom::Tensor::of(targets.data(), {rows, T}));
            std::copy(arena.grads().begin(), arena.grads().end(), g.begin());
            return loss;
        };
        std::vector<float> x0(arena.values().begin(), arena.values().end()), g(x0.size());
        loom::optim::OptEx<loom::optim::AdamW, loom::comm::ThreadComm> opt(
            comm, x0, [](std::int64_t n) { return loom::optim::AdamW(n, {.lr = 1e-4f}); },
            {.workers = workers, .estimator = {.history = history}, .effective_dim = effective_dim});
        // Warm up to a full history, then time.
        for (int i = 0; i * workers < history + workers; ++i) (void)opt.iterate(gradient);
        for (int r = 0; r < reps; ++r) {
            comm.barrier();
            auto t0 = clock_type::now();
            (void)gradient(x0, g);
            comm.barrier();
            const double alone = seconds_since(t0);
            t0 = clock_type::now();
            (void)opt.iterate(gradient);
            comm.barrier();
            const double whole = seconds_since(t0);
            if (comm.rank() == 0) {
                plain.push_back(alone);
                optex.push_back(whole);
            }
        }
    });
    return {bench::median(plain), bench::median(optex)};
}

}  // namespace

int main(int argc, char** argv) {
    int workers = 4, reps = 5, end_to_end_history = 50;
    std::int64_t effective_dim = 100000;
    std::vector<int> dims{10000, 100000, 1000000}, histories{10, 25, 50};
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (flag == "--workers") workers = std::atoi(argv[i + 1]);
        else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
        else if (flag == "--end-to-end") end_to_end_history = std::atoi(argv[i + 1]);
        else if (flag == "--effective-dim") effective_dim = std::atoll(argv[i + 1]);
        else if (flag == "--dims") dims = loom_bench::parse_int_list("bench_optex_estimator", "--dims", argv[i + 1], 100000000, "a whole number in 1..1e8");
        else if (flag == "--histories") histories = loom_bench::parse_int_list("bench_optex_estimator", "--histories", argv[i + 1], 100000000, "a whole number in 1..1e8");
        else {
            std::fprintf(stderr, "bench_optex_estimator: unknown flag %s (flags: --workers N --reps N --dims a,b "
                                 "--histories a,b --end-to-end T0|0 --effective-dim N)\n", argv[i]);
            return 1;
        }
    }
    if (workers < 1 || reps < 1 || effective_dim < 1) {
        std::fprintf(stderr, "bench_optex_estimator: --workers, --reps and --effective-dim must be at least 1\n");
        return 1;
    }
    loom::kernels::host::set_blas_threads(1);
    std::int64_t gpt_parameters = 0;
    const double gradient = gpt_gradient_seconds(reps, gpt_parameters);
    std::printf("# OptEx's cost per sequential iteration on one rank (one thread, %d workers, median of %d)\n\n",
                workers, reps);
    std::printf("One gradient evaluation of GPT config A (%lld parameters; 8 x 128 tokens, forward + backward): "
                "%.1f ms.\n\n",
                static_cast<long long>(gpt_parameters), gradient * 1e3);
    std::printf("| d | T0 | slice | estimator ms | proxy AdamW ms | per rank ms | / GPT gradient |\n"
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    std::vector<std::int64_t> all_dims(dims.begin(), dims.end());
    all_dims.push_back(gpt_parameters);
    for (const std::int64_t d : all_dims)
        for (const int t : histories) {
            const RankCost c = rank_cost(d, t, workers, reps);
            std::printf("| %lld%s | %d | %lld | %.2f | %.2f | %.1f | %.3f |\n", static_cast<long long>(d),
                        d == gpt_parameters ? " (GPT A)" : "", t, static_cast<long long>((d + workers - 1) / workers),
                        c.estimator * 1e3, c.optimizer * 1e3, c.total() * 1e3, c.total() / gradient);
            std::fflush(stdout);
        }
    for (const int t : histories) {
        const RankCost c = rank_cost(gpt_parameters, t, workers, reps, effective_dim);
        std::printf("| %lld (GPT A), effective dim %lld | %d | %lld | %.2f | %.2f | %.1f | %.3f |\n",
                    static_cast<long long>(gpt_parameters), static_cast<long long>(effective_dim), t,
                    static_cast<long long>((gpt_parameters + workers - 1) / workers), c.estimator * 1e3,
                    c.optimizer * 1e3, c.total() * 1e3, c.total() / gradient);
        std::fflush(stdout);
    }
    for (const std::int64_t e : {std::int64_t{0}, effective_dim}) {
        if (end_to_end_history <= 0) break;
        const auto [alone, whole] = end_to_end(workers, end_to_end_history, reps, e);
        std::printf("\nEnd to end on %d rank threads (GPT A, T0 = %d, effective dim %s): gradients alone %.1f ms, "
                    "OptEx iteration %.1f ms; OptEx adds %.1f%% (everything but the gradients: estimator, proxy "
                    "steps, exchanges).\n",
                    workers, end_to_end_history, e > 0 ? std::to_string(e).c_str() : "all", alone * 1e3, whole * 1e3,
                    100.0 * (whole - alone) / alone);
    }
    return 0;
}
