// Choosing OptEx's length scale from its own history (the reference's
// tuning_mattern): hold out the newest points, fit the GP on the rest with
// each candidate length scale, and keep the one whose posterior mean
// predicts the held-out gradients best (least squared error summed over
// them). Normalised by the fitted points alone, as the reference does.
//
// Nothing of size d is formed per candidate: with alpha_j = (K + sigma^2 I)^-1 k_j
// for held-out point j,
//   |mu_j - g_j|^2 = alpha_j^T (G_F G_F^T) alpha_j - 2 alpha_j^T G_F g_j + g_j^T g_j,
// so the gradients' Gram matrix (T0^2 / 2 inner products of length d, the
// whole cost, computed once) answers every candidate.
#pragma once

#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/optim/gp_estimator.hpp"

namespace loom::optim {

inline void check_tuning(const std::vector<double>& length_scales, int holdout, int history) {
    LOOM_CHECK(!length_scales.empty(), "OptEx: length-scale tuning with no candidates; give at least one");
    for (double l : length_scales)
        LOOM_CHECK(std::isfinite(l) && l > 0, "OptEx: candidate length scale ", l, " must be finite and > 0");
    LOOM_CHECK(holdout >= 1 && holdout <= history - 2, "OptEx: holdout = ", holdout,
               " points for tuning; it must be in [1, T0 - 2] = [1, ", history - 2, "]");
}

// The squared prediction error of the held-out points for each candidate;
// empty while the history is too short to hold any out (fewer than
// holdout + 2 points).
[[nodiscard]] inline std::vector<double> held_out_errors(const GpGradientEstimator& est,
                                                         const std::vector<double>& length_scales, int holdout) {
    const int t = est.size(), fit = t - holdout;
    if (fit < 2) return {};
    const auto gram = est.gradient_gram();
    const auto g = [&](int i, int j) { return gram[static_cast<std::size_t>(i * t + j)]; };
    double scale = 1.0;
    if (est.config().normalise_inputs) {
        double mean = 0;
        for (int i = 0; i < fit; ++i) mean += est.root_norm(i);
        mean /= fit;
        if (mean > 0) scale = mean;
    }
    std::vector<double> errors;
    for (double l : length_scales) {
        const auto kernel = [&](int i, int j) { return matern52(std::sqrt(est.squared_distance_between(i, j)) / scale, l); };
        std::vector<double> factor(static_cast<std::size_t>(fit * fit), 0.0);
        for (int i = 0; i < fit; ++i)
            for (int j = 0; j <= i; ++j)
                factor[static_cast<std::size_t>(i * fit + j)] = kernel(i, j) + (i == j ? est.config().noise : 0.0);
        cholesky_in_place(factor, fit);
        double error = 0;
        for (int target = fit; target < t; ++target) {
            std::vector<double> alpha(static_cast<std::size_t>(fit));
            for (int i = 0; i < fit; ++i) alpha[static_cast<std::size_t>(i)] = kernel(target, i);
            cholesky_solve(factor, fit, alpha);
            double quadratic = 0, cross = 0;
            for (int i = 0; i < fit; ++i) {
                const double ai = alpha[static_cast<std::size_t>(i)];
                cross += ai * g(i, target);
                for (int j = 0; j < fit; ++j) quadratic += ai * alpha[static_cast<std::size_t>(j)] * g(i, j);
            }
            error += quadratic - 2 * cross + g(target, target);
        }
        errors.push_back(error);
    }
    return errors;
}

// Sets the estimator's length scale to the best candidate and returns it; a
// history too short to tune keeps the current one.
inline double tune_length_scale(GpGradientEstimator& est, const std::vector<double>& length_scales, int holdout) {
    const auto errors = held_out_errors(est, length_scales, holdout);
    if (errors.empty()) return est.config().length_scale;
    std::size_t best = 0;
    for (std::size_t i = 1; i < errors.size(); ++i)
        if (errors[i] < errors[best]) best = i;
    est.set_length_scale(length_scales[best]);
    return length_scales[best];
}

}  // namespace loom::optim
