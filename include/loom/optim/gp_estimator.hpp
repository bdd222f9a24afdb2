// The gradient estimator of OptEx (arXiv 2402.11427; the reference is the JAX
// implementation, optex_jax/OptEx_JAX.py): the posterior mean of a Gaussian
// process fitted to the last T0 points and their true gradients,
//   mu(x) = k(x, X) (K(X, X) + sigma^2 I)^-1 G,
// with one Matern-5/2 kernel shared by every dimension,
//   k(r) = (1 + sqrt(5) r / l + 5 r^2 / (3 l^2)) exp(-sqrt(5) r / l),
// on points divided by the history's mean sqrt(|x_i|) (the reference's input
// normalisation). Computed as mu(x) = sum_i alpha_i g_i with
// alpha = (K + sigma^2 I)^-1 k(x), so that no step costs T0^2 d:
//   add()      the new point's squared distances to the history, O(T0 d)
//              (none when its locate() already has them), kept unnormalised
//              (the normalisation only rescales them);
//   prepare()  K from the distances and its Cholesky factor, O(T0^3), once
//              per iteration;
//   locate()   a query's distances to the history, O(T0 d);
//   estimate() alpha by two triangular solves, and the combination of the
//              gradients: O(T0 d + T0^2).
// It may hold one slice of the dimensions (OptEx gives each rank 1/N): the
// partial sums then go through a reduction the caller supplies. Distances,
// the kernel and the factorisation are in double; points and gradients are
// kept in f32, as the optimizer holds them. mu = 0 while the history has
// fewer than two points. A gradient that is not finite never enters the
// history: it is counted, and the caller reports it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
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

// K + sigma^2 I = L L^T in place (row-major t x t, lower triangle read and
// written). Refuses a matrix that is not positive definite.
inline void cholesky_in_place(std::vector<double>& a, int t) {
    const auto at = [&](int i, int j) -> double& { return a[static_cast<std::size_t>(i * t + j)]; };
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

// b = (L L^T)^-1 b, by two triangular solves.
inline void cholesky_solve(const std::vector<double>& factor, int t, std::span<double> b) {
    const auto at = [&](int i, int j) { return factor[static_cast<std::size_t>(i * t + j)]; };
    for (int i = 0; i < t; ++i) {
        double v = b[static_cast<std::size_t>(i)];
        for (int k = 0; k < i; ++k) v -= at(i, k) * b[static_cast<std::size_t>(k)];
        b[static_cast<std::size_t>(i)] = v / at(i, i);
    }
    for (int i = t - 1; i >= 0; --i) {
        double v = b[static_cast<std::size_t>(i)];
        for (int k = i + 1; k < t; ++k) v -= at(k, i) * b[static_cast<std::size_t>(k)];
        b[static_cast<std::size_t>(i)] = v / at(i, i);
    }
}

// The reduction a sharded estimator needs: sums a vector of partial sums over
// the ranks that hold the other slices of every point (an all-reduce), so that
// every rank sees the same totals. Unsharded, it is nothing.
using PartialSums = std::function<void(std::span<double>)>;

// Where a query point lies relative to the history: its squared distances to
// the points with sequence numbers first, first + 1, ..., and its squared
// norm. Computed once (locate), it answers the estimate at that point and,
// when the point joins the history later, its distances to the points that
// were there (add), so no point's distances are computed twice.
struct GpQuery {
    std::vector<double> squared_distances;
    std::int64_t first = 0;  // the sequence number of the history's oldest point at locate()
    double squared_norm = 0;
};

// The estimator's state, for a checkpoint (train/sharded_optex.hpp): this
// slice's points and gradients, oldest first, and what every rank holds
// whole: the squared distances (T x T), the root norms, the oldest point's
// sequence number, the refused count and the length scale (tuning moves it).
// Restored, the estimator continues exactly as the saved one would have.
struct GpHistory {
    std::vector<std::vector<float>> points, gradients;
    std::vector<std::vector<double>> distances;
    std::vector<double> root_norms;
    std::int64_t first = 0;
    std::int64_t skipped = 0;
    double length_scale = 0.1;
};

// The estimator over one slice of the dimensions: a rank of OptEx's axis keeps
// elements [lo, hi) of every point and gradient, computes partial sums over
// them, and `sum` (an all-reduce over the axis) completes the distances and
// norms, which every rank then holds whole. The kernel, alpha and the
// factorisation are computed redundantly and identically on every rank; each
// rank's estimate is its slice of mu. With one slice (the default) it is the
// plain estimator.
class GpGradientEstimator {
public:
    // `features`: the coordinates of a point the kernel sees (-1: all of
    // them; fewer when OptEx keeps a subset, its effective dimension). Points
    // are given and kept as those coordinates alone; gradients whole.
    GpGradientEstimator(std::int64_t dimension, GpEstimatorConfig config = {}, PartialSums sum = {},
                        std::int64_t features = -1)
        : d_(dimension), features_(features < 0 ? dimension : features), config_(config), sum_(std::move(sum)) {
        check_config(config);
        LOOM_CHECK(dimension >= 1, "OptEx: dimension ", dimension, " must be at least 1");
    }

    [[nodiscard]] std::int64_t dimension() const noexcept { return d_; }  // of this slice
    [[nodiscard]] std::int64_t features() const noexcept { return features_; }  // of a point, in this slice
    [[nodiscard]] int size() const noexcept { return static_cast<int>(points_.size()); }
    [[nodiscard]] std::int64_t skipped() const noexcept { return skipped_; }  // non-finite gradients refused
    [[nodiscard]] const GpEstimatorConfig& config() const noexcept { return config_; }

    // A new length scale (the tuning helper's choice); the factor is redone.
    void set_length_scale(double length_scale) {
        GpEstimatorConfig next = config_;
        next.length_scale = length_scale;
        check_config(next);
        config_ = next;
        prepared_ = false;
    }

    // Appends (x, g), dropping the oldest point beyond T0. Returns false (and
    // counts it) when g is not finite, on any slice. `known`, when given, is
    // x's locate() from earlier in this iteration: its distances to the points
    // that are still kept are reused.
    bool add(std::span<const float> x, std::span<const float> g, const GpQuery* known = nullptr) {
        check_size(x.size(), "a point", features_);
        check_size(g.size(), "a gradient", d_);
        // The oldest point goes when the history is full, but only once the
        // new one is known to be finite: a refused gradient changes nothing.
        const int from = size() == config_.history ? 1 : 0;
        // Partial sums, in one reduction: the distances not known, the norm
        // when not known, and the count of non-finite gradient elements.
        std::vector<int> missing;
        std::vector<double> row(static_cast<std::size_t>(size() - from) + 1, 0.0);
        for (int i = from; i < size(); ++i) {
            const std::int64_t seq = first_ + i;
            if (known != nullptr && seq >= known->first &&
                seq < known->first + static_cast<std::int64_t>(known->squared_distances.size()))
                row[static_cast<std::size_t>(i - from)] =
                    known->squared_distances[static_cast<std::size_t>(seq - known->first)];
            else
                missing.push_back(i);
        }
        std::vector<double> partial(missing.size() + 2, 0.0);
        for (std::size_t m = 0; m < missing.size(); ++m)
            partial[m] = squared_distance(x, points_[static_cast<std::size_t>(missing[m])]);
        partial[missing.size()] = known != nullptr ? 0.0 : squared_norm(x);
        partial[missing.size() + 1] =
            static_cast<double>(std::count_if(g.begin(), g.end(), [](float v) { return !std::isfinite(v); }));
        if (sum_) sum_(partial);
        if (partial[missing.size() + 1] > 0) {
            ++skipped_;
            return false;
        }
        // The dropped point's arrays take the new one: no allocation (and no
        // fresh pages to fault in) per point once the history is full.
        std::vector<float> point, gradient;
        if (from == 1) {
            point = std::move(points_.front());
            gradient = std::move(gradients_.front());
            drop_oldest();
        }
        for (std::size_t m = 0; m < missing.size(); ++m) row[static_cast<std::size_t>(missing[m] - from)] = partial[m];
        const double norm = known != nullptr ? known->squared_norm : partial[missing.size()];
        for (std::size_t i = 0; i < points_.size(); ++i) distances_[i].push_back(row[i]);
        distances_.push_back(std::move(row));
        point.assign(x.begin(), x.end());
        gradient.assign(g.begin(), g.end());
        points_.push_back(std::move(point));
        gradients_.push_back(std::move(gradient));
        root_norms_.push_back(std::sqrt(std::sqrt(norm)));
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
        cholesky_in_place(factor_, t);
    }

    // x's squared distances to the history and its squared norm: one pass
    // over this slice of the points, then one reduction.
    [[nodiscard]] GpQuery locate(std::span<const float> x) const {
        check_size(x.size(), "a query", features_);
        GpQuery q{.squared_distances = std::vector<double>(points_.size() + 1, 0.0), .first = first_};
        auto& partial = q.squared_distances;
        // Blocked, so each block of x stays in the first-level cache while the
        // history streams past it once.
        for (std::int64_t lo = 0; lo < features_; lo += block) {
            const std::int64_t n = std::min(block, features_ - lo);
            const auto xb = x.subspan(static_cast<std::size_t>(lo), static_cast<std::size_t>(n));
            for (std::size_t i = 0; i < points_.size(); ++i)
                partial[i] += squared_distance(xb, std::span<const float>(points_[i]).subspan(
                                                       static_cast<std::size_t>(lo), static_cast<std::size_t>(n)));
            partial.back() += squared_norm(xb);
        }
        if (sum_) sum_(partial);
        q.squared_norm = partial.back();
        partial.pop_back();
        return q;
    }

    // mu(x) into out (this slice) for a located x: O(T0 d) after prepare().
    void estimate(const GpQuery& q, std::span<float> out) const {
        check_size(out.size(), "an estimate", d_);
        LOOM_CHECK(prepared_, "OptEx: estimate() before prepare() since the history last changed");
        LOOM_CHECK(q.first == first_ && q.squared_distances.size() == points_.size(),
                   "OptEx: a query located against another history; locate() it again");
        const int t = size();
        std::fill(out.begin(), out.end(), 0.0f);
        if (t < 2) return;
        std::vector<double> alpha(static_cast<std::size_t>(t));
        for (int i = 0; i < t; ++i)
            alpha[static_cast<std::size_t>(i)] = kernel_of(q.squared_distances[static_cast<std::size_t>(i)]);
        cholesky_solve(factor_, t, alpha);
        // Blocked like locate(): a block of out stays in cache across all T0 gradients.
        for (std::int64_t lo = 0; lo < d_; lo += block) {
            const std::int64_t n = std::min(block, d_ - lo);
            float* __restrict o = out.data() + lo;
            for (int i = 0; i < t; ++i) {
                const auto a = static_cast<float>(alpha[static_cast<std::size_t>(i)]);
                const float* __restrict g = gradients_[static_cast<std::size_t>(i)].data() + lo;
                for (std::int64_t e = 0; e < n; ++e) o[e] += a * g[e];
            }
        }
    }

    // locate() and estimate() in one call.
    void estimate(std::span<const float> x, std::span<float> out) const { estimate(locate(x), out); }

    // The whole state, for a checkpoint.
    [[nodiscard]] GpHistory history() const {
        return {points_, gradients_, distances_, root_norms_, first_, skipped_, config_.length_scale};
    }

    // Continues from a saved state. Its points must have this estimator's
    // features and its gradients this slice's dimension (the saver's slicing
    // may differ: the caller reads this slice of every point); a history
    // longer than this T0 keeps its newest points. The saved length scale
    // replaces the configured one, as the saved run's tuning left it.
    void restore(GpHistory h) {
        const std::size_t t = h.points.size();
        LOOM_CHECK(h.gradients.size() == t && h.distances.size() == t && h.root_norms.size() == t,
                   "OptEx: a restored history of ", t, " points has ", h.gradients.size(), " gradients, ",
                   h.distances.size(), " rows of distances and ", h.root_norms.size(), " norms; each needs ", t);
        for (std::size_t i = 0; i < t; ++i) {
            check_size(h.points[i].size(), "a restored point", features_);
            check_size(h.gradients[i].size(), "a restored gradient", d_);
            LOOM_CHECK(h.distances[i].size() == t, "OptEx: row ", i, " of a restored history's distances has ",
                       h.distances[i].size(), " entries; it needs ", t);
            for (std::size_t j = 0; j < t; ++j)
                LOOM_CHECK(std::isfinite(h.distances[i][j]) && h.distances[i][j] >= 0 &&
                               h.distances[i][j] == h.distances[j][i],
                           "OptEx: a restored history's squared distance (", i, ", ", j, ") = ", h.distances[i][j],
                           "; distances must be finite, >= 0 and symmetric");
            LOOM_CHECK(std::isfinite(h.root_norms[i]) && h.root_norms[i] >= 0, "OptEx: a restored history's root norm ",
                       i, " = ", h.root_norms[i], "; it must be finite and >= 0");
        }
        LOOM_CHECK(h.first >= 0 && h.skipped >= 0, "OptEx: a restored history's first point ", h.first,
                   " and refused count ", h.skipped, " must be >= 0");
        set_length_scale(h.length_scale);
        points_ = std::move(h.points);
        gradients_ = std::move(h.gradients);
        distances_ = std::move(h.distances);
        root_norms_ = std::move(h.root_norms);
        first_ = h.first;
        skipped_ = h.skipped;
        while (size() > config_.history) drop_oldest();
        prepared_ = false;
    }

    // The history (this slice), oldest first: for the length-scale tuning.
    [[nodiscard]] const std::vector<std::vector<float>>& points() const noexcept { return points_; }
    [[nodiscard]] const std::vector<std::vector<float>>& gradients() const noexcept { return gradients_; }
    [[nodiscard]] double squared_distance_between(int i, int j) const {
        return distances_[static_cast<std::size_t>(std::max(i, j))][static_cast<std::size_t>(std::min(i, j))];
    }
    [[nodiscard]] double root_norm(int i) const { return root_norms_[static_cast<std::size_t>(i)]; }
    // G G^T over the whole dimension (t x t, row-major, symmetric): the
    // inner products of the history's gradients, for the tuning helper.
    [[nodiscard]] std::vector<double> gradient_gram() const {
        const int t = size();
        std::vector<double> gram(static_cast<std::size_t>(t * t), 0.0);
        for (int i = 0; i < t; ++i)
            for (int j = 0; j <= i; ++j) {
                const auto& a = gradients_[static_cast<std::size_t>(i)];
                const auto& b = gradients_[static_cast<std::size_t>(j)];
                gram[static_cast<std::size_t>(i * t + j)] = lane_sum(a.size(), [&](std::size_t e) { return a[e] * b[e]; });
            }
        if (sum_) sum_(gram);
        for (int i = 0; i < t; ++i)
            for (int j = i + 1; j < t; ++j) gram[static_cast<std::size_t>(i * t + j)] = gram[static_cast<std::size_t>(j * t + i)];
        return gram;
    }
    // Completes partial sums over this slice (the axis's reduction, or nothing).
    void sum_partials(std::span<double> partial) const {
        if (sum_) sum_(partial);
    }

private:
    static constexpr std::int64_t block = 2048;

    static void check_size(std::size_t n, const char* what, std::int64_t expected) {
        LOOM_CHECK(static_cast<std::int64_t>(n) == expected, "OptEx: ", what, " of ", n, " elements; the dimension is ",
                   expected);
    }
    void drop_oldest() {
        points_.erase(points_.begin());
        gradients_.erase(gradients_.begin());
        root_norms_.erase(root_norms_.begin());
        distances_.erase(distances_.begin());
        for (auto& row : distances_) row.erase(row.begin());
        ++first_;
    }
    [[nodiscard]] double& at(int i, int j) { return factor_[static_cast<std::size_t>(i * size() + j)]; }
    [[nodiscard]] double kernel_of(double squared) const {
        return matern52(std::sqrt(squared) / scale_, config_.length_scale);
    }
    // 16 lanes accumulated in float over 256 elements (a loop GCC vectorises
    // without -ffast-math, since each lane's order is fixed), then in double:
    // float rounding stays within 16 terms.
    template <class Term>
    [[nodiscard]] static double lane_sum(std::size_t n, Term term) {
        double total[16] = {};
        std::size_t e = 0;
        for (; e + 256 <= n; e += 256) {
            float acc[16] = {};
            for (std::size_t j = 0; j < 256; j += 16)
                for (std::size_t k = 0; k < 16; ++k) acc[k] += term(e + j + k);
            for (std::size_t k = 0; k < 16; ++k) total[k] += acc[k];
        }
        for (; e < n; ++e) total[e % 16] += static_cast<double>(term(e));
        double sum = 0;
        for (double t : total) sum += t;
        return sum;
    }
    [[nodiscard]] static double squared_norm(std::span<const float> p) {
        return lane_sum(p.size(), [&](std::size_t e) { return p[e] * p[e]; });
    }
    [[nodiscard]] static double squared_distance(std::span<const float> a, std::span<const float> b) {
        return lane_sum(a.size(), [&](std::size_t e) {
            const float diff = a[e] - b[e];
            return diff * diff;
        });
    }

    std::int64_t d_, features_;
    GpEstimatorConfig config_;
    PartialSums sum_;
    std::vector<std::vector<float>> points_, gradients_;  // this slice, oldest first
    std::vector<std::vector<double>> distances_;          // squared, unnormalised, T x T, whole
    std::vector<double> root_norms_;                      // sqrt(|x_i|), for the normalisation
    std::vector<double> factor_;                          // L, T x T, lower
    std::int64_t first_ = 0;                              // the sequence number of points_[0]
    double scale_ = 1.0;
    bool prepared_ = false;
    std::int64_t skipped_ = 0;
};

}  // namespace loom::optim
