// The gradient estimator of OptEx (arXiv 2402.11427; the reference is the JAX
// implementation, optex_jax/OptEx_JAX.py): the posterior mean of a Gaussian
// process fitted to the last T0 points and their true gradients,
//   mu(x) = k(x, X) (K(X, X) + sigma^2 I)^-1 G,
// with one Matern-5/2 kernel shared by every dimension,
//   k(r) = (1 + sqrt(5) r / l + 5 r^2 / (3 l^2)) exp(-sqrt(5) r / l),
// on points divided by the history's mean sqrt(|x_i|) (the reference's input
// normalisation). The T0 x d solve (K + sigma^2 I)^-1 G is done once per
// iteration by Cholesky (prepare()); each query is then O(T0 d): T0
// distances and one T0-term combination per element. Distances, the kernel
// and the factorisation are in double; the points and gradients are kept in
// f32, as the optimizer holds them. mu = 0 while the history has fewer than
// two points. A gradient that is not finite never enters the history: it is
// counted, and the caller reports it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::optim {

struct GpEstimatorConfig {
    int history = 50;             // T0: the last points kept
    double length_scale = 0.1;    // l, on normalised points
    double noise = 1e-3;          // sigma^2, added to K's diagonal
    bool normalise_inputs = true;  // divide points by mean_i sqrt(|x_i|)
};

inline void check_config(const GpEstimatorConfig& c) {
    LOOM_CHECK(c.history >= 2, "OptEx: a history of T0 = ", c.history, " points; it needs at least 2");
    LOOM_CHECK(std::isfinite(c.length_scale) && c.length_scale > 0, "OptEx: length scale ", c.length_scale,
               " must be finite and > 0");
    LOOM_CHECK(std::isfinite(c.noise) && c.noise > 0, "OptEx: noise sigma^2 = ", c.noise,
               " must be finite and > 0 (it keeps K + sigma^2 I positive definite)");
}

[[nodiscard]] inline double matern52(double r, double length_scale) {
    const double a = std::sqrt(5.0) * r / length_scale;
    return (1.0 + a + a * a / 3.0) * std::exp(-a);
}

class GpGradientEstimator {
public:
    GpGradientEstimator(std::int64_t dimension, GpEstimatorConfig config = {}) : d_(dimension), config_(config) {
        check_config(config);
        LOOM_CHECK(dimension >= 1, "OptEx: dimension ", dimension, " must be at least 1");
    }

    [[nodiscard]] std::int64_t dimension() const noexcept { return d_; }
    [[nodiscard]] int size() const noexcept { return static_cast<int>(points_.size()); }
    [[nodiscard]] std::int64_t skipped() const noexcept { return skipped_; }  // non-finite gradients refused

    // Appends (x, g), dropping the oldest point beyond T0. Returns false (and
    // counts it) when g is not finite.
    bool add(std::span<const float> x, std::span<const float> g) {
        LOOM_CHECK(static_cast<std::int64_t>(x.size()) == d_ && static_cast<std::int64_t>(g.size()) == d_,
                   "OptEx: a point of ", x.size(), " and a gradient of ", g.size(), " elements; the dimension is ", d_);
        if (!std::all_of(g.begin(), g.end(), [](float v) { return std::isfinite(v); })) {
            ++skipped_;
            return false;
        }
        if (static_cast<int>(points_.size()) == config_.history) {
            points_.erase(points_.begin());
            gradients_.erase(gradients_.begin());
        }
        points_.emplace_back(x.begin(), x.end());
        gradients_.emplace_back(g.begin(), g.end());
        prepared_ = false;
        return true;
    }

    // The once-per-iteration work: normalisation, K, its Cholesky factor, and
    // the weights (K + sigma^2 I)^-1 G (T x d, in double).
    void prepare() {
        const int t = size();
        prepared_ = true;
        if (t < 2) return;
        scale_ = 1.0;
        if (config_.normalise_inputs) {
            double mean = 0;
            for (const auto& p : points_) mean += std::sqrt(norm(p));
            mean /= t;
            scale_ = mean > 0 ? mean : 1.0;
        }
        std::vector<double> l(static_cast<std::size_t>(t * t), 0.0);
        for (int i = 0; i < t; ++i)
            for (int j = 0; j <= i; ++j)
                l[idx(i, j, t)] = kernel(points_[static_cast<std::size_t>(i)], points_[static_cast<std::size_t>(j)]) +
                                  (i == j ? config_.noise : 0.0);
        // Cholesky, lower: K + sigma^2 I = L L^T.
        for (int j = 0; j < t; ++j) {
            double diag = l[idx(j, j, t)];
            for (int k = 0; k < j; ++k) diag -= l[idx(j, k, t)] * l[idx(j, k, t)];
            LOOM_CHECK(diag > 0, "OptEx: K + sigma^2 I is not positive definite at row ", j, " (", diag,
                       "); raise the noise sigma^2");
            const double root = std::sqrt(diag);
            l[idx(j, j, t)] = root;
            for (int i = j + 1; i < t; ++i) {
                double v = l[idx(i, j, t)];
                for (int k = 0; k < j; ++k) v -= l[idx(i, k, t)] * l[idx(j, k, t)];
                l[idx(i, j, t)] = v / root;
            }
        }
        // Weights: solve L L^T W = G column by column of G's d columns, all at once per row.
        weights_.assign(static_cast<std::size_t>(t * d_), 0.0);
        for (int i = 0; i < t; ++i)
            for (std::int64_t e = 0; e < d_; ++e) weights_[w(i, e)] = gradients_[static_cast<std::size_t>(i)][static_cast<std::size_t>(e)];
        for (int i = 0; i < t; ++i) {  // forward: L Y = G
            for (int k = 0; k < i; ++k) {
                const double f = l[idx(i, k, t)];
                for (std::int64_t e = 0; e < d_; ++e) weights_[w(i, e)] -= f * weights_[w(k, e)];
            }
            const double inv = 1.0 / l[idx(i, i, t)];
            for (std::int64_t e = 0; e < d_; ++e) weights_[w(i, e)] *= inv;
        }
        for (int i = t - 1; i >= 0; --i) {  // backward: L^T W = Y
            for (int k = i + 1; k < t; ++k) {
                const double f = l[idx(k, i, t)];
                for (std::int64_t e = 0; e < d_; ++e) weights_[w(i, e)] -= f * weights_[w(k, e)];
            }
            const double inv = 1.0 / l[idx(i, i, t)];
            for (std::int64_t e = 0; e < d_; ++e) weights_[w(i, e)] *= inv;
        }
    }

    // mu(x) into out (d elements): O(T0 d) after prepare().
    void estimate(std::span<const float> x, std::span<float> out) const {
        LOOM_CHECK(static_cast<std::int64_t>(x.size()) == d_ && static_cast<std::int64_t>(out.size()) == d_,
                   "OptEx: a query of ", x.size(), " elements into ", out.size(), "; the dimension is ", d_);
        LOOM_CHECK(prepared_, "OptEx: estimate() before prepare() since the history last changed");
        const int t = size();
        if (t < 2) {
            std::fill(out.begin(), out.end(), 0.0f);
            return;
        }
        std::vector<double> k(static_cast<std::size_t>(t));
        for (int i = 0; i < t; ++i) k[static_cast<std::size_t>(i)] = kernel(x, points_[static_cast<std::size_t>(i)]);
        for (std::int64_t e = 0; e < d_; ++e) {
            double v = 0;
            for (int i = 0; i < t; ++i) v += k[static_cast<std::size_t>(i)] * weights_[w(i, e)];
            out[static_cast<std::size_t>(e)] = static_cast<float>(v);
        }
    }

private:
    [[nodiscard]] static std::size_t idx(int i, int j, int t) { return static_cast<std::size_t>(i * t + j); }
    [[nodiscard]] std::size_t w(int i, std::int64_t e) const { return static_cast<std::size_t>(i * d_ + e); }
    [[nodiscard]] static double norm(const std::vector<float>& p) {
        double s = 0;
        for (float v : p) s += static_cast<double>(v) * v;
        return std::sqrt(s);
    }
    [[nodiscard]] double kernel(std::span<const float> a, std::span<const float> b) const {
        double s = 0;
        for (std::size_t e = 0; e < a.size(); ++e) {
            const double diff = static_cast<double>(a[e]) - b[e];
            s += diff * diff;
        }
        return matern52(std::sqrt(s) / scale_, config_.length_scale);
    }

    std::int64_t d_;
    GpEstimatorConfig config_;
    std::vector<std::vector<float>> points_, gradients_;  // oldest first
    std::vector<double> weights_;                          // (K + sigma^2 I)^-1 G, T x d
    double scale_ = 1.0;
    bool prepared_ = false;
    std::int64_t skipped_ = 0;
};

}  // namespace loom::optim
