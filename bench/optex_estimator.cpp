// bench_optex_estimator: what OptEx's gradient estimator costs per sequential
// iteration, against d and T0, beside one gradient evaluation of the GPT
// (config A: forward and backward of 8 sequences of 128 tokens, one thread)
// measured in the same run. Per iteration with N workers the estimator adds
// the N new points (their distances to the history), factors K once, and
// answers N - 1 queries; that must stay well below one gradient evaluation,
// or the proxy steps cost what they were meant to save.
//
//   bench_optex_estimator [--workers 4] [--reps 5] [--dims 10000,100000,1000000] [--histories 10,25,50]
#include <loom/data/corpus.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/nn/compose.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/gp_estimator.hpp>

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

struct EstimatorCost {
    double add = 0, prepare = 0, estimate = 0;  // seconds: one new point, one factorisation, one query
    [[nodiscard]] double per_iteration(int workers) const {
        return workers * add + prepare + (workers - 1) * estimate;
    }
};

EstimatorCost estimator_cost(std::int64_t d, int history, int reps) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(static_cast<std::size_t>(d)), g(x.size()), out(x.size());
    loom::optim::GpGradientEstimator est(d, {.history = history});
    const auto fill = [&] {
        for (float& v : x) v = u(rng);
        for (float& v : g) v = u(rng);
    };
    for (int i = 0; i < history; ++i) {  // a full history: the steady state
        fill();
        est.add(x, g);
    }
    std::vector<double> adds, prepares, estimates;
    for (int r = 0; r < reps; ++r) {
        fill();
        auto t0 = clock_type::now();
        est.add(x, g);
        adds.push_back(seconds_since(t0));
        t0 = clock_type::now();
        est.prepare();
        prepares.push_back(seconds_since(t0));
        t0 = clock_type::now();
        est.estimate(x, out);
        estimates.push_back(seconds_since(t0));
    }
    return {bench::median(adds), bench::median(prepares), bench::median(estimates)};
}

}  // namespace

int main(int argc, char** argv) {
    int workers = 4, reps = 5;
    std::vector<int> dims{10000, 100000, 1000000}, histories{10, 25, 50};
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        if (flag == "--workers") workers = std::atoi(argv[i + 1]);
        else if (flag == "--reps") reps = std::atoi(argv[i + 1]);
        else if (flag == "--dims") dims = loom_bench::parse_int_list("bench_optex_estimator", "--dims", argv[i + 1], 100000000, "a whole number in 1..1e8");
        else if (flag == "--histories") histories = loom_bench::parse_int_list("bench_optex_estimator", "--histories", argv[i + 1], 100000000, "a whole number in 1..1e8");
        else {
            std::fprintf(stderr, "bench_optex_estimator: unknown flag %s (flags: --workers N --reps N --dims a,b "
                                 "--histories a,b)\n", argv[i]);
            return 1;
        }
    }
    if (workers < 1 || reps < 1) {
        std::fprintf(stderr, "bench_optex_estimator: --workers and --reps must be at least 1\n");
        return 1;
    }
    loom::kernels::host::set_blas_threads(1);
    std::int64_t gpt_parameters = 0;
    const double gradient = gpt_gradient_seconds(reps, gpt_parameters);
    std::printf("# OptEx estimator cost per sequential iteration (one thread, %d workers, median of %d)\n\n", workers,
                reps);
    std::printf("One gradient evaluation of GPT config A (%lld parameters; 8 x 128 tokens, forward + backward): "
                "%.1f ms.\n\n",
                static_cast<long long>(gpt_parameters), gradient * 1e3);
    std::printf("| d | T0 | add a point ms | prepare ms | query ms | per iteration ms (%d adds + prepare + %d queries) "
                "| / GPT gradient |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
                workers, workers - 1);
    std::vector<std::int64_t> all_dims(dims.begin(), dims.end());
    all_dims.push_back(gpt_parameters);
    for (const std::int64_t d : all_dims)
        for (const int t : histories) {
            const EstimatorCost c = estimator_cost(d, t, reps);
            std::printf("| %lld%s | %d | %.2f | %.3f | %.2f | %.1f | %.2f |\n", static_cast<long long>(d),
                        d == gpt_parameters ? " (GPT A)" : "", t, c.add * 1e3, c.prepare * 1e3, c.estimate * 1e3,
                        c.per_iteration(workers) * 1e3, c.per_iteration(workers) / gradient);
            std::fflush(stdout);
        }
    return 0;
}
