// OptEx<Inner>: one worker is the inner optimizer bit for bit; N workers on
// N rank threads (each holding a slice) follow the serial definition of the
// algorithm; non-finite gradients stay out of the history, counted; the
// length-scale tuning equals its brute-force definition; bad input is named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/optim/length_scale_tuning.hpp>
#include <loom/optim/sgd.hpp>

#include "optim/optex_suite.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;
using loom::optim::AdamW;
using loom::optim::OptEx;
using loom::optim::OptExSelect;

TEST_CASE("OptEx with one worker is its inner optimizer bit for bit", "[optex]") {
    const loom_test::OptExCase c{.workers = 1, .d = 101, .iterations = 20};
    auto x = loom_test::optex_start(c.d);
    AdamW adam(c.d, loom_test::optex_adam());
    std::vector<float> g(static_cast<std::size_t>(c.d));
    for (int t = 0; t < c.iterations; ++t) {
        (void)loom_test::optex_objective(c, t, 0, x, g);
        adam.step(x, g);
    }
    ThreadWorld(1).run([&](ThreadComm& comm) {
        const auto run = loom_test::parallel_optex_run(comm, c);
        CHECK(run.x == x);
    });
}

TEST_CASE("OptEx on N rank threads equals the serial definition of the algorithm", "[optex]") {
    for (const int workers : {2, 3, 4})
        for (const OptExSelect select : {OptExSelect::last, OptExSelect::lowest_loss, OptExSelect::smallest_gradient}) {
            const loom_test::OptExCase c{.workers = workers, .d = 37, .iterations = 12, .select = select};
            const auto serial = loom_test::serial_optex_run(c);
            std::vector<loom_test::OptExRun> runs(static_cast<std::size_t>(workers));
            ThreadWorld(workers).run([&](ThreadComm& comm) { runs[static_cast<std::size_t>(comm.rank())] = loom_test::parallel_optex_run(comm, c); });
            for (const auto& run : runs) {
                INFO("N " << workers << ", select " << name(select));
                CHECK(run.x == runs[0].x);  // every rank holds the same iterate
                CHECK(run.selected == serial.selected);
                CHECK(loom_test::max_difference(run.x, serial.x) <= 2e-5);
                CHECK(loom_test::max_difference(run.losses, serial.losses) <= 2e-4);
            }
            // The proxy steps matter: the result is not plain AdamW on the last worker's data.
            CHECK(loom_test::max_difference(serial.x, loom_test::serial_optex_run({.workers = 1, .d = 37, .iterations = 12})
                                                          .x) > 1e-2);
        }
}

TEST_CASE("OptEx runs are reproducible bit for bit", "[optex]") {
    const loom_test::OptExCase c{.workers = 3, .d = 50, .iterations = 10, .effective_dim = 20};
    std::vector<loom_test::OptExRun> first(3), second(3);
    ThreadWorld(3).run([&](ThreadComm& comm) { first[static_cast<std::size_t>(comm.rank())] = loom_test::parallel_optex_run(comm, c); });
    ThreadWorld(3).run([&](ThreadComm& comm) { second[static_cast<std::size_t>(comm.rank())] = loom_test::parallel_optex_run(comm, c); });
    for (std::size_t r = 0; r < 3; ++r) {
        CHECK(first[r].x == second[r].x);
        CHECK(first[r].losses == second[r].losses);
    }
    // Another seed draws another subset of coordinates for the kernel.
    auto other = c.config();
    other.seed = 2;
    CHECK(loom::optim::kernel_coordinates(other, c.d) != loom::optim::kernel_coordinates(c.config(), c.d));
}

TEST_CASE("OptEx with an effective dimension equals its serial definition", "[optex]") {
    // The kernel sees 5 of 37 coordinates, drawn once; some ranks' slices hold none of them.
    const loom_test::OptExCase c{.workers = 4, .d = 37, .iterations = 12, .effective_dim = 5};
    const auto coordinates = loom::optim::kernel_coordinates(c.config(), c.d);
    REQUIRE(coordinates.size() == 5);
    CHECK(std::adjacent_find(coordinates.begin(), coordinates.end()) == coordinates.end());  // distinct
    CHECK(coordinates == loom::optim::kernel_coordinates(c.config(), c.d));                     // reproducible
    const auto serial = loom_test::serial_optex_run(c);
    std::vector<loom_test::OptExRun> runs(4);
    ThreadWorld(4).run([&](ThreadComm& comm) { runs[static_cast<std::size_t>(comm.rank())] = loom_test::parallel_optex_run(comm, c); });
    for (const auto& run : runs) CHECK(loom_test::max_difference(run.x, serial.x) <= 2e-5);
    // And the subset changes the estimate: not the run with every coordinate.
    auto whole = c;
    whole.effective_dim = 0;
    CHECK(loom_test::max_difference(serial.x, loom_test::serial_optex_run(whole).x) > 1e-4);
}

TEST_CASE("OptEx keeps non-finite gradients out of its history and counts them", "[optex]") {
    const loom_test::OptExCase c{.workers = 3, .d = 20, .iterations = 6, .nan_iteration = 2, .nan_worker = 2};
    const auto serial = loom_test::serial_optex_run(c);
    REQUIRE(serial.skipped == 1);
    std::vector<loom_test::OptExRun> runs(3);
    ThreadWorld(3).run([&](ThreadComm& comm) { runs[static_cast<std::size_t>(comm.rank())] = loom_test::parallel_optex_run(comm, c); });
    for (const auto& run : runs) {
        CHECK(run.skipped == 1);
        CHECK(run.selected[2] == 1);  // the last finite worker stepped
        CHECK(loom_test::max_difference(run.x, serial.x) <= 2e-5);
        for (float x : run.x) CHECK(std::isfinite(x));
    }
}

TEST_CASE("OptEx refuses to step when every worker's gradient is non-finite", "[optex]") {
    std::vector<std::string> messages(2);
    ThreadWorld(2).run([&](ThreadComm& comm) {
        std::vector<float> x0(8, 1.0f);
        OptEx<AdamW, ThreadComm> optex(comm, x0, [](std::int64_t n) { return AdamW(n, {}); }, {.workers = 2});
        messages[static_cast<std::size_t>(comm.rank())] = loom_test::message_of([&] {
            (void)optex.iterate([](std::span<const float>, std::span<float> g) {
                g[0] = std::numeric_limits<float>::infinity();
                return 2.5f;
            });
        });
    });
    for (const auto& m : messages)
        CHECK(m == "OptEx: iteration 0: every worker's gradient has non-finite values (losses 2.500000, 2.500000); "
                   "lower the learning rate or check the data");
}

TEST_CASE("OptEx wraps SGD as well as AdamW", "[optex]") {
    // One worker: SGD with momentum, bit for bit.
    std::vector<float> x(16, 0.5f), direct = x, g(16);
    loom::optim::Sgd sgd(16, {.lr = 0.1f});
    for (int t = 0; t < 5; ++t) {
        for (std::size_t i = 0; i < 16; ++i) g[i] = 2 * direct[i] - float(i) / 16;
        sgd.step(direct, g);
    }
    ThreadWorld(1).run([&](ThreadComm& comm) {
        OptEx<loom::optim::Sgd, ThreadComm> optex(comm, x, [](std::int64_t n) { return loom::optim::Sgd(n, {.lr = 0.1f}); },
                                                  {.workers = 1});
        for (int t = 0; t < 5; ++t)
            (void)optex.iterate([](std::span<const float> p, std::span<float> grad) {
                for (std::size_t i = 0; i < 16; ++i) grad[i] = 2 * p[i] - float(i) / 16;
                return 0.0f;
            });
        optex.gather_params(x);
    });
    CHECK(x == direct);
}

TEST_CASE("OptEx's length-scale tuning equals its brute-force definition", "[optex]") {
    using loom::optim::GpGradientEstimator;
    constexpr std::int64_t d = 30;
    constexpr int t = 12, holdout = 3;
    std::vector<std::vector<float>> X, G;
    GpGradientEstimator est(d, {.history = t});
    for (int i = 0; i < t; ++i) {
        std::vector<float> x(d), g(d);
        for (std::int64_t e = 0; e < d; ++e) {
            x[static_cast<std::size_t>(e)] = std::sin(0.3f * float(i) + 0.1f * float(e));
            g[static_cast<std::size_t>(e)] = std::cos(2.0f * x[static_cast<std::size_t>(e)]);
        }
        est.add(x, g);
        X.push_back(x);
        G.push_back(g);
    }
    const std::vector<double> choices{0.01, 0.1, 1.0, 10.0};
    const auto errors = loom::optim::held_out_errors(est, choices, holdout);
    REQUIRE(errors.size() == choices.size());
    for (std::size_t c = 0; c < choices.size(); ++c) {
        // Fit an estimator on the older points alone and measure it on the newest.
        GpGradientEstimator fit(d, {.history = t, .length_scale = choices[c]});
        for (int i = 0; i < t - holdout; ++i) fit.add(X[static_cast<std::size_t>(i)], G[static_cast<std::size_t>(i)]);
        fit.prepare();
        double brute = 0;
        for (int j = t - holdout; j < t; ++j) {
            std::vector<float> mu(d);
            fit.estimate(X[static_cast<std::size_t>(j)], mu);
            for (std::int64_t e = 0; e < d; ++e) {
                const double diff = double(mu[static_cast<std::size_t>(e)]) - G[static_cast<std::size_t>(j)][static_cast<std::size_t>(e)];
                brute += diff * diff;
            }
        }
        INFO("l = " << choices[c]);
        CHECK(errors[c] == Approx(brute).epsilon(1e-4).margin(1e-9));
    }
    const double best = loom::optim::tune_length_scale(est, choices, holdout);
    CHECK(est.config().length_scale == best);
    CHECK(errors[static_cast<std::size_t>(std::find(choices.begin(), choices.end(), best) - choices.begin())] ==
          *std::min_element(errors.begin(), errors.end()));
}

TEST_CASE("OptEx names bad input", "[optex]") {
    std::vector<float> x0(3, 0.0f);
    const auto make = [](std::int64_t n) { return AdamW(n, {}); };
    std::mutex lock;
    std::vector<std::string> messages;
    ThreadWorld(2).run([&](ThreadComm& comm) {
        const auto attempt = [&](loom::optim::OptExConfig config, std::span<const float> x) {
            return loom_test::message_of([&] { OptEx<AdamW, ThreadComm> optex(comm, x, make, config); });
        };
        std::vector<std::string> mine{
            attempt({.workers = 4}, x0),
            attempt({.workers = 2}, std::span<const float>(x0).first(1)),
            attempt({.workers = 2, .estimator = {.history = 1}}, x0),
            attempt({.workers = 2, .tune_every = 5, .holdout = 49}, x0),
            attempt({.workers = 2, .tune_every = 5, .length_scales = {0.1, -1.0}}, x0),
            attempt({.workers = 2, .effective_dim = -3}, x0),
        };
        if (comm.rank() == 0) {
            std::lock_guard guard(lock);
            messages = mine;
        }
    });
    REQUIRE(messages.size() == 6);
    CHECK(messages[0] == "OptEx: 4 workers but the optex axis has 2 ranks; each worker is one rank: use 2 workers or an axis of 4 ranks");
    CHECK(messages[1] == "OptEx: a point of 1 elements cannot be split over 2 workers; it needs at least one element per worker");
    CHECK(messages[2] == "OptEx: a history of T0 = 1 points; it needs at least 2");
    CHECK(messages[3] == "OptEx: holdout = 49 points for tuning; it must be in [1, T0 - 2] = [1, 48]");
    CHECK(messages[4] == "OptEx: candidate length scale -1 must be finite and > 0");
    CHECK(messages[5] == "OptEx: effective_dim = -3; it must be >= 0 (0: every coordinate)");
}

namespace {

// One OptEx run of case c on `axis`, from iteration `from` to `to`; when
// `resume` is given the run starts from that state instead of x0.
struct OptExSnapshot {
    std::vector<float> x, m, v;  // this rank's slice
    std::int64_t steps = 0, iterations = 0;
    loom::optim::GpHistory history;
};

template <class C>
std::vector<float> optex_span(C& axis, const loom_test::OptExCase& c, int from, int to, const OptExSnapshot* resume,
                              OptExSnapshot* save) {
    auto config = c.config();
    config.tune_every = 4;
    config.holdout = 2;
    OptEx<AdamW, C> optex(axis, loom_test::optex_start(c.d), [](std::int64_t n) { return AdamW(n, loom_test::optex_adam()); },
                          config);
    if (resume != nullptr) {
        std::copy(resume->x.begin(), resume->x.end(), optex.slice().begin());
        std::copy(resume->m.begin(), resume->m.end(), optex.inner().m().begin());
        std::copy(resume->v.begin(), resume->v.end(), optex.inner().v().begin());
        optex.inner().restore(resume->steps);
        optex.restore_history(resume->iterations, resume->history);
    }
    for (int t = from; t < to; ++t)
        (void)optex.iterate([&](std::span<const float> x, std::span<float> g) { return loom_test::optex_objective(c, t, axis.rank(), x, g); });
    if (save != nullptr) {
        const auto m = optex.inner().m(), v = optex.inner().v();
        *save = {{optex.slice().begin(), optex.slice().end()}, {m.begin(), m.end()}, {v.begin(), v.end()},
                 optex.inner().steps(), optex.iterations(), optex.estimator().history()};
    }
    std::vector<float> whole(static_cast<std::size_t>(c.d));
    optex.gather_params(whole);
    return whole;
}

}  // namespace

TEST_CASE("OptEx restored from its history continues bit for bit", "[optex][checkpoint]") {
    // Tuning every 4 iterations, a history shorter than the run, and a
    // sampled effective dimension: every part of the state matters.
    for (const std::int64_t effective_dim : {std::int64_t{0}, std::int64_t{15}}) {
        const loom_test::OptExCase c{.workers = 3, .d = 41, .iterations = 14, .history = 7, .effective_dim = effective_dim};
        std::vector<std::vector<float>> straight(3), resumed(3);
        std::vector<OptExSnapshot> saved(3);
        ThreadWorld(3).run([&](ThreadComm& comm) {
            const auto r = static_cast<std::size_t>(comm.rank());
            straight[r] = optex_span(comm, c, 0, c.iterations, nullptr, nullptr);
            (void)optex_span(comm, c, 0, 9, nullptr, &saved[r]);
            resumed[r] = optex_span(comm, c, 9, c.iterations, &saved[r], nullptr);
        });
        INFO("effective dimension " << effective_dim);
        CHECK(saved[0].history.points.size() == 7);
        for (std::size_t r = 0; r < 3; ++r) CHECK(resumed[r] == straight[r]);
        // Without the history the continuation differs: the test can fail.
        std::vector<std::vector<float>> forgetful(3);
        ThreadWorld(3).run([&](ThreadComm& comm) {
            const auto r = static_cast<std::size_t>(comm.rank());
            OptExSnapshot empty = saved[r];
            empty.history = {};
            empty.history.length_scale = saved[r].history.length_scale;
            forgetful[r] = optex_span(comm, c, 9, c.iterations, &empty, nullptr);
        });
        CHECK(forgetful[0] != straight[0]);
    }
}

TEST_CASE("OptEx names a history that does not fit", "[optex][checkpoint]") {
    loom::optim::GpGradientEstimator estimator(4, {.history = 3});
    const auto refused = [&](loom::optim::GpHistory h) { return loom_test::message_of([&] { estimator.restore(std::move(h)); }); };
    const std::vector<float> point(4, 1.0f);
    loom::optim::GpHistory h{{point}, {point}, {{0.0}}, {1.0}};
    CHECK(refused({{point}, {}, {{0.0}}, {1.0}}) ==
          "OptEx: a restored history of 1 points has 0 gradients, 1 rows of distances and 1 norms; each needs 1");
    CHECK(refused({{std::vector<float>(5)}, {point}, {{0.0}}, {1.0}}) ==
          "OptEx: a restored point of 5 elements; the dimension is 4");
    CHECK(refused({{point, point}, {point, point}, {{0.0, 1.0}, {2.0, 0.0}}, {1.0, 1.0}}) ==
          "OptEx: a restored history's squared distance (0, 1) = 1; distances must be finite, >= 0 and symmetric");
    CHECK(refused({{point}, {point}, {{0.0}}, {-1.0}}) ==
          "OptEx: a restored history's root norm 0 = -1; it must be finite and >= 0");
    h.length_scale = 0;
    CHECK(refused(h) == "OptEx: length scale 0 must be finite and > 0");
    // A longer history than T0 keeps its newest points.
    loom::optim::GpHistory four{{point, point, point, point}, {point, point, point, {9, 9, 9, 9}},
                                std::vector<std::vector<double>>(4, std::vector<double>(4, 0.0)), {1, 1, 1, 1}, 5};
    estimator.restore(four);
    CHECK(estimator.size() == 3);
    CHECK(estimator.gradients().back() == std::vector<float>(4, 9.0f));
    CHECK(estimator.history().first == 6);
}

}  // namespace LOOM_TEST_FILE
