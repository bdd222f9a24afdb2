// OptEx<Inner> (arXiv 2402.11427; the reference is run_optex in the JAX
// implementation, optex_jax/OptEx_JAX.py): sequential optimisation spread
// over N workers, one per rank of an `optex` axis. Each iteration, from the
// iterate x_t and the optimizer state s_t:
//   1. N - 1 cheap proxy steps with the GP estimate mu of the gradient:
//      (x0, s0) = (x_t, s_t), (x_{k+1}, s_{k+1}) = Inner step from (x_k, s_k) with mu(x_k);
//   2. worker k evaluates the true gradient g_k at x_k (its own mini-batch);
//   3. the next (x, s) is the selected worker's (the last by default) after
//      one true step with its gradient;
//   4. all N (x_k, g_k) join the history (the last T0 are kept).
// With N = 1 it is the inner optimizer, bit for bit.
//
// Each rank keeps one slice of the dimensions, the way ZeRO shards: its slice
// of x, of the inner optimizer's state, and of every history point and
// gradient. The proxy steps then run on slices with no traffic but a handful
// of numbers per query (the estimator's partial distances), and the per-rank
// cost of the estimator is 1/N of the whole. Two all-to-alls per iteration
// assemble worker k's point and hand each rank its slice of every gradient.
// So Inner must be elementwise (a step on a slice equals the slice of the
// whole step), as AdamW and SGD are; and copyable, for the proxy states.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/optim/gp_estimator.hpp"
#include "loom/optim/length_scale_tuning.hpp"

namespace loom::optim {

// Which worker's step becomes the next iterate.
enum class OptExSelect {
    last,               // the reference's rule: the furthest along the proxy chain
    lowest_loss,        // the worker whose true loss at its point was lowest
    smallest_gradient,  // the worker whose true gradient was shortest
};

[[nodiscard]] inline std::string_view name(OptExSelect s) {
    switch (s) {
        case OptExSelect::last: return "last";
        case OptExSelect::lowest_loss: return "lowest-loss";
        case OptExSelect::smallest_gradient: return "smallest-gradient";
    }
    return "?";
}

struct OptExConfig {
    int workers = 1;               // N, one per rank of the optex axis
    GpEstimatorConfig estimator{};  // T0, length scale, sigma^2, normalisation
    OptExSelect select = OptExSelect::last;
    // > 0: every this many iterations, choose the length scale among
    // `length_scales` by how well each predicts the newest `holdout` points
    // of the history from the rest (the reference's tuning_mattern).
    int tune_every = 0;
    int holdout = 4;
    std::vector<double> length_scales{0.1, 1.0, 10.0, 100.0};
    // > 0 (and < d): the kernel sees only this many coordinates of each
    // point, drawn once from `seed` (the reference's effective_dim, which it
    // redraws every iteration; drawn once, the distances stay incremental and
    // the history keeps only those coordinates of its points). Removes the
    // distance passes over the history, about half the estimator's work.
    std::int64_t effective_dim = 0;
    std::uint64_t seed = 1;
};

inline std::ostream& operator<<(std::ostream& out, const OptExConfig& c) {
    out << "OptEx(N=" << c.workers << ", T0=" << c.estimator.history << ", l=" << c.estimator.length_scale
        << ", sigma^2=" << c.estimator.noise << (c.estimator.normalise_inputs ? "" : ", unnormalised")
        << ", select " << name(c.select);
    if (c.tune_every > 0) out << ", tune every " << c.tune_every;
    if (c.effective_dim > 0) out << ", effective dim " << c.effective_dim;
    return out << ")";
}

// The coordinates OptEx's kernel sees with config.effective_dim of d (sorted):
// a sample the same on every rank, by Floyd's algorithm over a splitmix64
// stream from config.seed; empty when the kernel sees every coordinate.
[[nodiscard]] inline std::vector<std::int64_t> kernel_coordinates(const OptExConfig& c, std::int64_t d) {
    if (c.effective_dim <= 0 || c.effective_dim >= d) return {};
    std::uint64_t state = c.seed;
    const auto next = [&state] {
        std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    };
    std::unordered_set<std::int64_t> taken;
    std::vector<std::int64_t> chosen;
    for (std::int64_t j = d - c.effective_dim; j < d; ++j) {
        const auto t = static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(j + 1));
        const std::int64_t pick = taken.contains(t) ? j : t;
        taken.insert(pick);
        chosen.push_back(pick);
    }
    std::sort(chosen.begin(), chosen.end());
    return chosen;
}

// What one iteration did, the same on every rank.
struct OptExIteration {
    std::vector<float> losses;  // each worker's true loss at its point
    int selected = 0;           // whose step was taken
    float loss = 0;             // losses[selected]
    int skipped = 0;            // gradients not finite this iteration (kept out of the history)
    double length_scale = 0;    // the kernel's, after any tuning this iteration
};

template <class O>
concept ElementwiseOptimizer =
    std::copy_constructible<O> && std::is_copy_assignable_v<O> &&
    requires(O& o, std::span<float> p, std::span<const float> g) { o.step(p, g); };

template <ElementwiseOptimizer Inner, comm::Communicator C>
class OptEx {
public:
    // `axis` has one rank per worker; `x0` is the whole starting point (the
    // same on every rank); make_inner(n) builds the inner optimizer for a
    // slice of n elements.
    template <class MakeInner>
        requires std::is_invocable_r_v<Inner, MakeInner&, std::int64_t>
    OptEx(C& axis, std::span<const float> x0, MakeInner&& make_inner, OptExConfig config)
        : axis_(&axis), config_(checked(config, axis.size(), static_cast<std::int64_t>(x0.size()))),
          d_(static_cast<std::int64_t>(x0.size())), lo_(bound(axis.rank())), hi_(bound(axis.rank() + 1)),
          block_((d_ + config_.workers - 1) / config_.workers),
          x_(x0.begin() + lo_, x0.begin() + hi_), inner_(make_inner(hi_ - lo_)),
          features_(feature_coordinates(config_, d_, lo_, hi_, feature_begin_)),
          estimator_(hi_ - lo_, config_.estimator, [this](std::span<double> partial) { sum_over_axis(partial); },
                     uses_subset() ? static_cast<std::int64_t>(features_.size()) : -1) {}

    // The estimator's reduction refers to this object.
    OptEx(const OptEx&) = delete;
    OptEx& operator=(const OptEx&) = delete;

    [[nodiscard]] const OptExConfig& config() const noexcept { return config_; }
    [[nodiscard]] std::int64_t dimension() const noexcept { return d_; }
    [[nodiscard]] std::int64_t slice_begin() const noexcept { return lo_; }
    [[nodiscard]] std::int64_t slice_end() const noexcept { return hi_; }
    [[nodiscard]] std::span<float> slice() noexcept { return x_; }  // this rank's part of x
    [[nodiscard]] Inner& inner() noexcept { return inner_; }         // this rank's slice of the state
    [[nodiscard]] const GpGradientEstimator& estimator() const noexcept { return estimator_; }
    [[nodiscard]] std::int64_t skipped() const noexcept { return estimator_.skipped(); }
    [[nodiscard]] std::int64_t iterations() const noexcept { return iterations_; }
    // Where this slice's points are among the kernel's coordinates (the
    // sorted kernel_coordinates, or every coordinate): [first, end). A
    // checkpoint stores history points in that order, so any slicing reads them.
    [[nodiscard]] std::int64_t feature_begin() const noexcept { return feature_begin_; }
    [[nodiscard]] std::int64_t feature_end() const noexcept {
        return feature_begin_ + (uses_subset() ? static_cast<std::int64_t>(features_.size()) : hi_ - lo_);
    }

    // Continues from a checkpoint: the iterations done and the estimator's
    // state (this slice of it). x and the inner state are restored through
    // slice() and inner().
    void restore_history(std::int64_t iterations, GpHistory history) {
        LOOM_CHECK(iterations >= 0, "OptEx: ", iterations, " iterations restored; it must be >= 0");
        estimator_.restore(std::move(history));
        iterations_ = iterations;
    }

    // The learning rate of the proxy and true steps alike, where Inner has one.
    void set_lr(float lr)
        requires requires(Inner& o) { o.set_lr(lr); }
    {
        inner_.set_lr(lr);
    }

    // One sequential iteration. gradient(x, g) -> loss evaluates this rank's
    // worker at x (the whole point) into g (whole) and returns its loss.
    template <class Gradient>
        requires std::is_invocable_r_v<float, Gradient&, std::span<const float>, std::span<float>>
    OptExIteration iterate(Gradient&& gradient) {
        const int n = config_.workers;
        const std::int64_t local = hi_ - lo_;
        if (config_.tune_every > 0 && iterations_ % config_.tune_every == 0 && iterations_ > 0)
            tune_length_scale(estimator_, config_.length_scales, config_.holdout);
        if (n > 1) estimator_.prepare();

        // 1. The proxy chain, on this slice: points_[k] and states_[k] (a
        // slice of the state is 1/N of it, so all N are kept: the selected
        // worker is known only after the gradients, and even the last rule
        // falls back to an earlier worker when the last gradient is not finite).
        points_.resize(static_cast<std::size_t>(n));
        queries_.resize(static_cast<std::size_t>(n));
        points_[0].assign(x_.begin(), x_.end());
        states_.resize(static_cast<std::size_t>(n), inner_);
        states_[0] = inner_;
        mu_.resize(static_cast<std::size_t>(local));
        for (int k = 0; k + 1 < n; ++k) {
            auto& q = queries_[static_cast<std::size_t>(k)];
            q = estimator_.locate(features_of(points_[static_cast<std::size_t>(k)]));
            estimator_.estimate(q, mu_);
            points_[static_cast<std::size_t>(k + 1)] = points_[static_cast<std::size_t>(k)];
            states_[static_cast<std::size_t>(k + 1)] = states_[static_cast<std::size_t>(k)];
            states_[static_cast<std::size_t>(k + 1)].step(points_[static_cast<std::size_t>(k + 1)], mu_);
        }

        // 2. This rank's worker: its whole point from every rank's slice, its gradient.
        send_.assign(static_cast<std::size_t>(n * block_), 0.0f);
        receive_.resize(send_.size());
        for (int k = 0; k < n; ++k)
            std::copy(points_[static_cast<std::size_t>(k)].begin(), points_[static_cast<std::size_t>(k)].end(),
                      send_.begin() + k * block_);
        axis_->all_to_all(tensor(send_), tensor(receive_));
        whole_.resize(static_cast<std::size_t>(d_));
        unpad(receive_, whole_);
        grad_.assign(static_cast<std::size_t>(d_), 0.0f);
        const float loss = gradient(std::span<const float>(whole_), std::span<float>(grad_));

        // 3. Everyone's loss, gradient norm and finiteness; each rank's slice of every gradient.
        float mine[3] = {loss, 0.0f, 0.0f};
        double norm = 0;
        for (float g : grad_) {
            if (!std::isfinite(g)) mine[2] = 1.0f;
            norm += static_cast<double>(g) * g;
        }
        mine[1] = static_cast<float>(norm);
        std::vector<float> stats(static_cast<std::size_t>(3 * n));
        axis_->all_gather(Tensor::of(mine, {3}), Tensor::of(stats.data(), {3 * n}));
        for (int k = 0; k < n; ++k)
            std::copy(grad_.begin() + bound(k), grad_.begin() + bound(k + 1), send_.begin() + k * block_);
        axis_->all_to_all(tensor(send_), tensor(receive_));

        OptExIteration out;
        out.length_scale = estimator_.config().length_scale;
        out.losses.resize(static_cast<std::size_t>(n));
        for (int k = 0; k < n; ++k) out.losses[static_cast<std::size_t>(k)] = stats[static_cast<std::size_t>(3 * k)];
        out.selected = select(stats);
        out.loss = out.losses[static_cast<std::size_t>(out.selected)];

        // The selected worker's true step, on this slice.
        const std::span<const float> selected_grad(receive_.data() + out.selected * block_, static_cast<std::size_t>(local));
        x_ = points_[static_cast<std::size_t>(out.selected)];
        inner_ = states_[static_cast<std::size_t>(out.selected)];
        inner_.step(x_, selected_grad);

        // 4. The history (not needed with one worker: nothing is estimated).
        if (n > 1) {
            const std::int64_t before = estimator_.skipped();
            for (int k = 0; k < n; ++k)
                estimator_.add(features_of(points_[static_cast<std::size_t>(k)]),
                               std::span<const float>(receive_.data() + k * block_, static_cast<std::size_t>(local)),
                               k + 1 < n ? &queries_[static_cast<std::size_t>(k)] : nullptr);
            out.skipped = static_cast<int>(estimator_.skipped() - before);
        }
        ++iterations_;
        return out;
    }

    // The whole of a per-slice array (x, or a slice of the inner state) on
    // every rank: a collective.
    void gather(std::span<const float> slice, std::span<float> whole) {
        LOOM_CHECK(static_cast<std::int64_t>(slice.size()) == hi_ - lo_ && static_cast<std::int64_t>(whole.size()) == d_,
                   "OptEx::gather: a slice of ", slice.size(), " into ", whole.size(), "; this rank's slice has ",
                   hi_ - lo_, " elements of ", d_);
        std::vector<float> mine(static_cast<std::size_t>(block_), 0.0f), all(static_cast<std::size_t>(block_ * config_.workers));
        std::copy(slice.begin(), slice.end(), mine.begin());
        axis_->all_gather(tensor(mine), tensor(all));
        unpad(all, whole);
    }
    void gather_params(std::span<float> whole) { gather(x_, whole); }

private:
    static OptExConfig checked(const OptExConfig& c, int ranks, std::int64_t d) {
        LOOM_CHECK(c.workers >= 1, "OptEx: ", c.workers, " workers; it needs at least 1");
        LOOM_CHECK(c.workers == ranks, "OptEx: ", c.workers, " workers but the optex axis has ", ranks,
                   " ranks; each worker is one rank: use ", ranks, " workers or an axis of ", c.workers, " ranks");
        LOOM_CHECK(d >= c.workers, "OptEx: a point of ", d, " elements cannot be split over ", c.workers,
                   " workers; it needs at least one element per worker");
        check_config(c.estimator);
        LOOM_CHECK(c.effective_dim >= 0, "OptEx: effective_dim = ", c.effective_dim,
                   "; it must be >= 0 (0: every coordinate)");
        LOOM_CHECK(c.tune_every >= 0, "OptEx: tune_every = ", c.tune_every, "; it must be >= 0 (0: never)");
        if (c.tune_every > 0) check_tuning(c.length_scales, c.holdout, c.estimator.history);
        return c;
    }
    // Slice r is [bound(r), bound(r + 1)): sizes differ by at most one.
    [[nodiscard]] std::int64_t bound(int r) const noexcept { return d_ * r / config_.workers; }
    static Tensor tensor(std::vector<float>& v) { return Tensor::of(v.data(), {static_cast<std::int64_t>(v.size())}); }
    // Blocks of block_ (slices padded) into the whole vector.
    void unpad(const std::vector<float>& blocks, std::span<float> whole) const {
        for (int r = 0; r < config_.workers; ++r)
            std::copy(blocks.begin() + r * block_, blocks.begin() + r * block_ + (bound(r + 1) - bound(r)),
                      whole.begin() + bound(r));
    }
    // The kernel's coordinates in [lo, hi), as offsets from lo; `begin`
    // becomes the first one's position among all of them (lo with every
    // coordinate).
    static std::vector<std::int64_t> feature_coordinates(const OptExConfig& c, std::int64_t d, std::int64_t lo,
                                                         std::int64_t hi, std::int64_t& begin) {
        const std::vector<std::int64_t> all = kernel_coordinates(c, d);
        std::vector<std::int64_t> mine;
        begin = all.empty() ? lo : std::lower_bound(all.begin(), all.end(), lo) - all.begin();
        for (const std::int64_t i : all)
            if (i >= lo && i < hi) mine.push_back(i - lo);
        return mine;
    }
    [[nodiscard]] bool uses_subset() const noexcept {
        return config_.effective_dim > 0 && config_.effective_dim < d_;
    }
    // A point's coordinates as the kernel sees them: all, or the subset.
    std::span<const float> features_of(const std::vector<float>& point) {
        if (!uses_subset()) return point;
        feature_scratch_.resize(features_.size());
        for (std::size_t i = 0; i < features_.size(); ++i)
            feature_scratch_[i] = point[static_cast<std::size_t>(features_[i])];
        return feature_scratch_;
    }
    // The estimator's partial sums, summed over the axis in rank order, so
    // every rank holds the same totals on every transport. Gathered as 8-byte
    // words (there is no f64 dtype; a gather copies bits).
    void sum_over_axis(std::span<double> partial) {
        if (config_.workers == 1) return;
        const auto count = static_cast<std::int64_t>(partial.size());
        std::vector<std::int64_t> mine(partial.size()), all(partial.size() * static_cast<std::size_t>(config_.workers));
        std::memcpy(mine.data(), partial.data(), partial.size() * sizeof(double));
        axis_->all_gather(Tensor::of(mine.data(), {count}), Tensor::of(all.data(), {count * config_.workers}));
        std::fill(partial.begin(), partial.end(), 0.0);
        for (int r = 0; r < config_.workers; ++r)
            for (std::int64_t i = 0; i < count; ++i) {
                double v;
                std::memcpy(&v, &all[static_cast<std::size_t>(r * count + i)], sizeof v);
                partial[static_cast<std::size_t>(i)] += v;
            }
    }
    // The rule's worker among those whose gradient is finite (the last rule
    // falls back to the last finite one); when none is, the iteration fails
    // with every worker's loss rather than step to NaN.
    int select(const std::vector<float>& stats) const {
        const int n = config_.workers;
        const auto finite = [&](int k) { return stats[static_cast<std::size_t>(3 * k + 2)] == 0.0f; };
        int best = -1;
        for (int k = 0; k < n; ++k) {
            if (!finite(k)) continue;
            if (best < 0 || config_.select == OptExSelect::last) {
                best = k;
                continue;
            }
            const int field = config_.select == OptExSelect::lowest_loss ? 0 : 1;
            if (stats[static_cast<std::size_t>(3 * k + field)] < stats[static_cast<std::size_t>(3 * best + field)]) best = k;
        }
        if (best >= 0) return best;
        std::string losses;
        for (int k = 0; k < n; ++k) losses += (k ? ", " : "") + std::to_string(stats[static_cast<std::size_t>(3 * k)]);
        throw Error(loom::detail::concat("OptEx: iteration ", iterations_, ": every worker's gradient has non-finite values (losses ",
                                   losses, "); lower the learning rate or check the data"));
    }

    C* axis_;
    OptExConfig config_;
    std::int64_t d_, lo_, hi_, block_;
    std::vector<float> x_;
    Inner inner_;
    std::int64_t feature_begin_ = 0;      // set by feature_coordinates, before features_
    std::vector<std::int64_t> features_;  // the kernel's coordinates in this slice (empty: all)
    GpGradientEstimator estimator_;
    std::int64_t iterations_ = 0;
    // Per-iteration scratch, kept to reuse its memory.
    std::vector<std::vector<float>> points_;
    std::vector<GpQuery> queries_;
    std::vector<Inner> states_;
    std::vector<float> mu_, send_, receive_, whole_, grad_, feature_scratch_;
};

}  // namespace loom::optim
