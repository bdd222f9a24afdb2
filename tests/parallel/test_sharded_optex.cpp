// OptEx in sharded checkpoints (train/sharded_optex.hpp): resumed equals
// uninterrupted bit for bit under the same workers, any number of workers
// takes the same history back, and a history that does not belong to the
// loading run is left out with the reason.
#include <catch2/catch.hpp>

#include <algorithm>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/mesh.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/train/sharded_optex.hpp"
#include "io/temp_dir.hpp"
#include "optim/optex_suite.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;
using loom::optim::AdamW;
using loom::optim::OptEx;
using Optimizer = OptEx<AdamW, ThreadComm>;

const loom_test::OptExCase shape{.workers = 2, .d = 53, .iterations = 12, .history = 6, .effective_dim = 0};

loom::optim::OptExConfig config_of(int workers, std::int64_t effective_dim) {
    auto c = shape.config();
    c.workers = workers;
    c.effective_dim = effective_dim;
    c.tune_every = 3;
    c.holdout = 2;
    return c;
}

// Iterations [from, to) of the test objective, worker k = the optex rank.
void iterate(Optimizer& optex, ThreadComm& axis, int from, int to) {
    for (int t = from; t < to; ++t)
        (void)optex.iterate([&](std::span<const float> x, std::span<float> g) {
            return loom_test::optex_objective(shape, t, axis.rank(), x, g);
        });
}

// The whole of every history point (the kernel's coordinates of it) and
// gradient, oldest first, on every rank of `axis` (collectives): what any
// slicing of the same history must give back. A point's slices are summed
// into zeros, which is exact.
std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> whole_history(Optimizer& optex,
                                                                                          ThreadComm& axis,
                                                                                          std::int64_t features) {
    const auto h = optex.estimator().history();
    std::vector<std::vector<float>> points, gradients;
    for (std::size_t i = 0; i < h.gradients.size(); ++i) {
        gradients.emplace_back(static_cast<std::size_t>(optex.dimension()));
        optex.gather(h.gradients[i], gradients.back());
        points.emplace_back(static_cast<std::size_t>(features), 0.0f);
        std::copy(h.points[i].begin(), h.points[i].end(), points.back().begin() + optex.feature_begin());
        const auto whole = loom::Tensor::of(points.back().data(), {features});
        axis.all_reduce(whole, whole, loom::comm::ReduceOp::sum);
    }
    return {points, gradients};
}

std::int64_t features_of(std::int64_t effective_dim) { return effective_dim > 0 ? effective_dim : shape.d; }

Optimizer make(ThreadComm& axis, int workers, std::int64_t effective_dim = 0) {
    return Optimizer(axis, loom_test::optex_start(shape.d), [](std::int64_t n) { return AdamW(n, loom_test::optex_adam()); },
                     config_of(workers, effective_dim));
}

}  // namespace

TEST_CASE("OptEx resumed from a sharded checkpoint equals the uninterrupted run bit for bit", "[optex][checkpoint]") {
    const loom_test::TempDir scratch;
    const auto dir = scratch / "checkpoint";
    std::vector<std::vector<float>> straight(2), resumed(2);
    ThreadWorld(2).run([&](ThreadComm& axis) {
        const auto r = static_cast<std::size_t>(axis.rank());
        Optimizer a = make(axis, 2);
        iterate(a, axis, 0, shape.iterations);
        straight[r].resize(static_cast<std::size_t>(shape.d));
        a.gather_params(straight[r]);

        Optimizer b = make(axis, 2);
        iterate(b, axis, 0, 7);
        loom::train::save_sharded_optex(b, true, axis, dir);
        Optimizer c = make(axis, 2);
        std::string note;
        (void)loom::train::load_sharded_optex(c, dir, note);
        CHECK(note.empty());
        CHECK(c.iterations() == 7);
        iterate(c, axis, 7, shape.iterations);
        resumed[r].resize(static_cast<std::size_t>(shape.d));
        c.gather_params(resumed[r]);
    });
    CHECK(resumed[0] == straight[0]);
    CHECK(resumed[1] == straight[1]);
}

TEST_CASE("OptEx's sharded history loads under any number of workers", "[optex][checkpoint]") {
    for (const std::int64_t effective_dim : {std::int64_t{0}, std::int64_t{17}}) {
        const loom_test::TempDir scratch;
        const auto dir = scratch / "checkpoint";
        std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> saved;
        std::vector<float> saved_x(static_cast<std::size_t>(shape.d));
        // Saved by 2 workers, each with a dp replica: world 4, only dp 0 writes.
        ThreadWorld(4).run([&](ThreadComm& world) {
            loom::comm::Mesh<ThreadComm> mesh(world, {{"optex", 2}, {"dp", 2}});
            ThreadComm& axis = mesh.axis("optex");
            Optimizer a = make(axis, 2, effective_dim);
            iterate(a, axis, 0, 5);
            loom::train::save_sharded_optex(a, mesh.coordinate("dp") == 0, world, dir);
            auto whole = whole_history(a, axis, features_of(effective_dim));
            std::vector<float> x(static_cast<std::size_t>(shape.d));
            a.gather_params(x);
            if (world.rank() == 0) {
                saved = std::move(whole);
                saved_x = x;
            }
        });
        REQUIRE(saved.first.size() == 6);
        for (const int workers : {1, 3}) {
            std::mutex lock;
            std::vector<std::string> notes;
            ThreadWorld(workers).run([&](ThreadComm& axis) {
                Optimizer b = make(axis, workers, effective_dim);
                std::string note;
                (void)loom::train::load_sharded_optex(b, dir, note);
                const auto whole = whole_history(b, axis, features_of(effective_dim));
                std::vector<float> x(static_cast<std::size_t>(shape.d));
                b.gather_params(x);
                std::lock_guard guard(lock);
                notes.push_back(note);
                INFO("workers " << workers << ", effective dimension " << effective_dim);
                CHECK(whole.first == saved.first);
                CHECK(whole.second == saved.second);
                CHECK(b.iterations() == 5);
                CHECK(x == saved_x);
            });
            for (const auto& note : notes) CHECK(note.empty());
        }
        }
}

TEST_CASE("OptEx leaves out a sharded history that is not its own, and says why", "[optex][checkpoint]") {
    const loom_test::TempDir scratch;
    const auto dir = scratch / "checkpoint";
    std::string other, plain;
    ThreadWorld(2).run([&](ThreadComm& axis) {
        Optimizer a = make(axis, 2);
        iterate(a, axis, 0, 3);
        loom::train::save_sharded_optex(a, true, axis, dir);
        // Another effective dimension sees other coordinates: its history would mean something else.
        Optimizer b = make(axis, 2, 11);
        std::string note;
        (void)loom::train::load_sharded_optex(b, dir, note);
        CHECK(b.estimator().size() == 0);
        // A checkpoint without the history's signature (an executor's): x and the moments only.
        Optimizer c = make(axis, 2);
        loom::exec::ShardedSave<ThreadComm>(axis, dir, loom::train::optex_shard_contents(c, true)).finish();
        std::string none;
        (void)loom::train::load_sharded_optex(c, dir, none);
        CHECK(c.estimator().size() == 0);
        if (axis.rank() == 0) {
            other = note;
            plain = none;
        }
    });
    CHECK(other == "the checkpoint's OptEx history belongs to d=53 effective_dim=0 seed=0 normalise=1 noise=0.001, not "
                   "d=53 effective_dim=11 seed=1 normalise=1 noise=0.001");
    CHECK(plain == "the checkpoint keeps no OptEx history");
}

}  // namespace LOOM_TEST_FILE
