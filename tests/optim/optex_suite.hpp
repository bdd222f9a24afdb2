// OptEx's equivalence suite, written once and run on every transport: OptEx
// with N workers on N ranks (each keeping one slice of the dimensions) against
// a serial reference written from the algorithm's definition, with the GP
// posterior mean solved in double by Gaussian elimination on whole vectors.
// The objective gives each (iteration, worker) its own "mini-batch", so a
// worker's gradient depends on which worker it is, as in training.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <loom/optim/adamw.hpp>
#include <loom/optim/optex.hpp>

namespace loom_test {

struct OptExCase {
    int workers = 4;
    std::int64_t d = 37;
    int iterations = 12;
    loom::optim::OptExSelect select = loom::optim::OptExSelect::last;
    int history = 10;
    int nan_iteration = -1, nan_worker = -1;  // a non-finite gradient there
    std::int64_t effective_dim = 0;
    [[nodiscard]] loom::optim::OptExConfig config() const {
        return {.workers = workers, .estimator = {.history = history}, .select = select, .effective_dim = effective_dim};
    }
};

inline loom::optim::AdamWConfig optex_adam() { return {.lr = 0.05f, .weight_decay = 0.0f}; }

inline std::vector<float> optex_start(std::int64_t d) {
    std::vector<float> x(static_cast<std::size_t>(d));
    for (std::int64_t i = 0; i < d; ++i) x[static_cast<std::size_t>(i)] = std::sin(1.7f * static_cast<float>(i) + 0.3f);
    return x;
}

// f(x) = sum_i a_i (x_i - b_i)^2 + s sum_i sin(x_i), with s from the batch
// index t N + k: a smooth objective whose gradient differs per worker.
inline float optex_objective(const OptExCase& c, int t, int k, std::span<const float> x, std::span<float> g) {
    const float s = 0.2f * static_cast<float>((t * c.workers + k) % 5) - 0.4f;
    double f = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const float a = 1.0f + 0.5f * static_cast<float>(i % 3), b = 0.25f * static_cast<float>(i % 4);
        f += a * (x[i] - b) * (x[i] - b) + s * std::sin(x[i]);
        g[i] = 2.0f * a * (x[i] - b) + s * std::cos(x[i]);
    }
    if (t == c.nan_iteration && k == c.nan_worker) g[g.size() / 2] = std::numeric_limits<float>::quiet_NaN();
    return static_cast<float>(f);
}

// mu(x) from the formula in double over whole vectors (no slices, no
// incremental distances, no Cholesky): the independent side of the test.
inline std::vector<float> reference_posterior_mean(const std::vector<std::vector<float>>& X,
                                                   const std::vector<std::vector<float>>& G,
                                                   const std::vector<float>& x, std::size_t dimension,
                                                   const loom::optim::GpEstimatorConfig& c) {
    const std::size_t t = X.size(), d = x.size();  // d: the coordinates the kernel sees
    std::vector<float> mu(dimension, 0.0f);
    if (t < 2) return mu;
    double scale = 0;
    for (const auto& p : X) {
        double s = 0;
        for (float v : p) s += double(v) * v;
        scale += std::sqrt(std::sqrt(s));
    }
    scale /= static_cast<double>(t);
    const auto k = [&](const std::vector<float>& a, const std::vector<float>& b) {
        double s = 0;
        for (std::size_t e = 0; e < d; ++e) s += (double(a[e]) - b[e]) * (double(a[e]) - b[e]);
        const double z = std::sqrt(5.0) * std::sqrt(s) / scale / c.length_scale;
        return (1 + z + z * z / 3) * std::exp(-z);
    };
    // Solve (K + sigma^2 I) alpha = k(x) by elimination with partial pivoting.
    std::vector<std::vector<double>> A(t, std::vector<double>(t + 1));
    for (std::size_t i = 0; i < t; ++i) {
        for (std::size_t j = 0; j < t; ++j) A[i][j] = k(X[i], X[j]) + (i == j ? c.noise : 0.0);
        A[i][t] = k(x, X[i]);
    }
    for (std::size_t col = 0; col < t; ++col) {
        std::size_t pivot = col;
        for (std::size_t r = col + 1; r < t; ++r)
            if (std::abs(A[r][col]) > std::abs(A[pivot][col])) pivot = r;
        std::swap(A[col], A[pivot]);
        for (std::size_t r = 0; r < t; ++r) {
            if (r == col) continue;
            const double f = A[r][col] / A[col][col];
            for (std::size_t q = col; q <= t; ++q) A[r][q] -= f * A[col][q];
        }
    }
    for (std::size_t e = 0; e < dimension; ++e) {
        double s = 0;
        for (std::size_t i = 0; i < t; ++i) s += A[i][t] / A[i][i] * G[i][e];
        mu[e] = static_cast<float>(s);
    }
    return mu;
}

struct OptExRun {
    std::vector<float> x;             // the final iterate, whole
    std::vector<float> losses;        // the selected worker's loss per iteration
    std::vector<int> selected;
    std::int64_t skipped = 0;
};

// The serial reference: N workers in one loop, whole vectors.
inline OptExRun serial_optex_run(const OptExCase& c) {
    using loom::optim::AdamW;
    const loom::optim::GpEstimatorConfig gp{.history = c.history};
    const auto coordinates = loom::optim::kernel_coordinates(c.config(), c.d);
    // The kernel's view of a point: its sampled coordinates, or all of it.
    const auto seen = [&](const std::vector<float>& p) {
        if (coordinates.empty()) return p;
        std::vector<float> f;
        for (const auto i : coordinates) f.push_back(p[static_cast<std::size_t>(i)]);
        return f;
    };
    std::vector<float> x = optex_start(c.d);
    AdamW adam(c.d, optex_adam());
    std::vector<std::vector<float>> X, G;
    OptExRun run;
    for (int t = 0; t < c.iterations; ++t) {
        std::vector<std::vector<float>> points{x};
        std::vector<AdamW> states{adam};
        for (int k = 0; k + 1 < c.workers; ++k) {
            const auto mu = reference_posterior_mean(X, G, seen(points.back()), static_cast<std::size_t>(c.d), gp);
            points.push_back(points.back());
            states.push_back(states.back());
            states.back().step(points.back(), mu);
        }
        std::vector<std::vector<float>> grads;
        std::vector<float> losses, norms;
        std::vector<bool> finite;
        for (int k = 0; k < c.workers; ++k) {
            grads.emplace_back(static_cast<std::size_t>(c.d));
            losses.push_back(optex_objective(c, t, k, points[static_cast<std::size_t>(k)], grads.back()));
            double n2 = 0;
            for (float g : grads.back()) n2 += double(g) * g;
            norms.push_back(static_cast<float>(n2));
            finite.push_back(std::all_of(grads.back().begin(), grads.back().end(), [](float g) { return std::isfinite(g); }));
        }
        int sel = -1;
        for (int k = 0; k < c.workers; ++k) {
            if (!finite[static_cast<std::size_t>(k)]) continue;
            const auto better = [&](const std::vector<float>& v) { return v[static_cast<std::size_t>(k)] < v[static_cast<std::size_t>(sel)]; };
            if (sel < 0 || c.select == loom::optim::OptExSelect::last ||
                (c.select == loom::optim::OptExSelect::lowest_loss && better(losses)) ||
                (c.select == loom::optim::OptExSelect::smallest_gradient && better(norms)))
                sel = k;
        }
        x = points[static_cast<std::size_t>(sel)];
        adam = states[static_cast<std::size_t>(sel)];
        adam.step(x, grads[static_cast<std::size_t>(sel)]);
        run.losses.push_back(losses[static_cast<std::size_t>(sel)]);
        run.selected.push_back(sel);
        if (c.workers > 1)
            for (int k = 0; k < c.workers; ++k) {
                if (!finite[static_cast<std::size_t>(k)]) {
                    ++run.skipped;
                    continue;
                }
                X.push_back(seen(points[static_cast<std::size_t>(k)]));
                G.push_back(grads[static_cast<std::size_t>(k)]);
                if (static_cast<int>(X.size()) > c.history) {
                    X.erase(X.begin());
                    G.erase(G.begin());
                }
            }
    }
    run.x = x;
    return run;
}

// OptEx on `axis` (one rank per worker); every rank returns the whole result.
template <class C>
OptExRun parallel_optex_run(C& axis, const OptExCase& c) {
    const auto x0 = optex_start(c.d);
    loom::optim::OptEx<loom::optim::AdamW, C> optex(
        axis, x0, [](std::int64_t n) { return loom::optim::AdamW(n, optex_adam()); },
        c.config());
    OptExRun run;
    for (int t = 0; t < c.iterations; ++t) {
        const int k = axis.rank();
        const auto it = optex.iterate([&](std::span<const float> x, std::span<float> g) { return optex_objective(c, t, k, x, g); });
        run.losses.push_back(it.loss);
        run.selected.push_back(it.selected);
    }
    run.x.resize(static_cast<std::size_t>(c.d));
    optex.gather_params(run.x);
    run.skipped = optex.skipped();
    return run;
}

// The largest |a - b| over the iterate.
inline double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
    return worst;
}

}  // namespace loom_test
