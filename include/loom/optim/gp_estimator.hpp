// The gradient estimator of OptEx (arXiv 2402.11427; the reference is the JAX
// implementation, optex_jax/OptEx_JAX.py): the posterior mean of a Gaussian
// process fitted to the last T0 points and their true gradients,
//   mu(x) = k(x, X) (K(X, X) + sigma^2 I)^-1 G,
// with one Matern-5/2 kernel shared by every dimension,
//   k(r) = (1 + sqrt(5) r / l + 5 r^2 / (3 l^2)) exp(-sqrt(5) r / l),
// on points divided by the history's mean sqrt(|x_i|) (the reference's input
// normalisation). Computed as mu(x) = sum_i alpha_i g_i with
// alpha = (K + sigma^2 I)^-1 k(x), so that no step costs T0^2 d:
//   add()      the new point's squared distances to the history, O(T0 d),
//              kept unnormalised (the normalisation only rescales them);
//   prepare()  K from the distances and its Cholesky factor, O(T0^3), once
//              per iteration;
//   estimate() k(x) from x's distances, alpha by two triangular solves, and
//              the combination of the gradients: O(T0 d + T0^2).
// Distances, the kernel and the factorisation are in double; points and
// gradients are kept in f32, as the optimizer holds them. mu = 0 while the
// history has fewer than two points. A gradient that is not finite never
// enters the history: it is counted, and the caller reports it.
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
        if (size() == config_.history) {
            points_.erase(points_.begin());
            gradients_.erase(gradients_.begin());
            root_norms_.erase(root_norms_.begin());
            distances_.erase(distances_.begin());
            for (auto& row : distances_) row.erase(row.begin());
        }
        std::vector<double> row(points_.size() + 1, 0.0);
        for (std::size_t i = 0; i < points_.size(); ++i) row[i] = squared_distance(x, points_[i]);
        for (std::size_t i = 0; i < points_.size(); ++i) distances_[i].push_back(row[i]);
        distances_.push_back(std::move(row));
        points_.emplace_back(x.begin(), x.end());
        gradients_.emplace_back(g.begin(), g.end());
        root_norms_.push_back(std::sqrt(std::sqrt(squared_norm(x))));
        prepared_ = false;
        return true;
    }

    // The once-per-iteration work: the normalisation, K and its Cholesky factor.
    void prepare() {
        const int t = size();
        prepared_ = true;
        if (t < 2) return;
        scale_ = 1.0;
        if (config_.normalise_inputs) {
            double mean = 0;
            for (double r : root_norms_) mean += r;
            mean /= t;
            scale_ = mean > 0 ? mean : 1.0;
        }
        factor_.assign(static_cast<std::size_t>(t * t), 0.0);
        for (int i = 0; i < t; ++i)
            for (int j = 0; j <= i; ++j)
                at(i, j) = kernel_of(distances_[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)]) +
                           (i == j ? config_.noise : 0.0);
        // Cholesky, lower: K + sigma^2 I = L L^T.
        for (int j = 0; j < t; ++j) {
            double diag = at(j, j);
            for (int k = 0; k < j; ++k) diag -= at(j, k) * at(j, k);
            LOOM_CHECK(diag > 0, "OptEx: K + sigma^2 I is not positive definite at row ", j, " (", diag,
                       "); raise the noise sigma^2");
            const double root = std::sqrt(diag);
            at(j, j) = root;
            for (int i = j + 1; i < t; ++i) {
                double v = at(i, j);
                for (int k = 0; k < j; ++k) v -= at(i, k) * at(j, k);
                at(i, j) = v / root;
            }
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
        // alpha = L^-T L^-1 k(x).
        std::vector<double> alpha(static_cast<std::size_t>(t));
        for (int i = 0; i < t; ++i)
            alpha[static_cast<std::size_t>(i)] = kernel_of(squared_distance(x, points_[static_cast<std::size_t>(i)]));
        for (int i = 0; i < t; ++i) {
            double v = alpha[static_cast<std::size_t>(i)];
            for (int k = 0; k < i; ++k) v -= at(i, k) * alpha[static_cast<std::size_t>(k)];
            alpha[static_cast<std::size_t>(i)] = v / at(i, i);
        }
        for (int i = t - 1; i >= 0; --i) {
            double v = alpha[static_cast<std::size_t>(i)];
            for (int k = i + 1; k < t; ++k) v -= at(k, i) * alpha[static_cast<std::size_t>(k)];
            alpha[static_cast<std::size_t>(i)] = v / at(i, i);
        }
        std::fill(out.begin(), out.end(), 0.0f);
        for (int i = 0; i < t; ++i) {
            const auto a = static_cast<float>(alpha[static_cast<std::size_t>(i)]);
            const float* g = gradients_[static_cast<std::size_t>(i)].data();
            for (std::int64_t e = 0; e < d_; ++e) out[static_cast<std::size_t>(e)] += a * g[e];
        }
    }

private:
    [[nodiscard]] double& at(int i, int j) { return factor_[static_cast<std::size_t>(i * size() + j)]; }
    [[nodiscard]] double at(int i, int j) const { return factor_[static_cast<std::size_t>(i * size() + j)]; }
    [[nodiscard]] double kernel_of(double squared) const {
        return matern52(std::sqrt(squared) / scale_, config_.length_scale);
    }
    [[nodiscard]] static double squared_norm(std::span<const float> p) {
        double s = 0;
        for (float v : p) s += static_cast<double>(v) * v;
        return s;
    }
    [[nodiscard]] static double squared_distance(std::span<const float> a, std::span<const float> b) {
        double s = 0;
        for (std::size_t e = 0; e < a.size(); ++e) {
            const double diff = static_cast<double>(a[e]) - b[e];
            s += diff * diff;
        }
        return s;
    }

    std::int64_t d_;
    GpEstimatorConfig config_;
    std::vector<std::vector<float>> points_, gradients_;  // oldest first
    std::vector<std::vector<double>> distances_;          // squared, unnormalised, T x T
    std::vector<double> root_norms_;                      // sqrt(|x_i|), for the normalisation
    std::vector<double> factor_;                          // L, T x T, lower
    double scale_ = 1.0;
    bool prepared_ = false;
    std::int64_t skipped_ = 0;
};

}  // namespace loom::optim
