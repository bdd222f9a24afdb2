// Executor::gradient and set_parameters on rank threads: the serial
// gradient at points the caller chooses, with the parameters left as they
// were; the same bits with Full, Selective and Budget recomputation (what
// lets OptEx compose with Recompute<...>); and the refusals.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/parallel/recompute.hpp>
#include <loom/train/optex_gradient.hpp>

#include "parallel/executor_gradient_suite.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using namespace loom;
using loom_test::GradientRun;

std::vector<GradientRun> gradients_on_threads(int ranks, RecomputeSpec recompute) {
    std::vector<GradientRun> runs(static_cast<std::size_t>(ranks));
    comm::ThreadWorld(ranks).run([&](comm::ThreadComm& comm) {
        runs[static_cast<std::size_t>(comm.rank())] = loom_test::gradient_run(comm, recompute);
    });
    return runs;
}

}  // namespace

TEST_CASE("Executor::gradient gives the serial loss and gradient at the points set, and leaves them set",
          "[parallel][optex]") {
    for (const int ranks : {1, 2, 4}) {
        const std::vector<GradientRun> runs = gradients_on_threads(ranks, {});
        const loom_test::SerialGradients serial = loom_test::serial_gradients(runs[0]);
        for (int r = 0; r < ranks; ++r) {
            const GradientRun& run = runs[static_cast<std::size_t>(r)];
            INFO(ranks << " ranks, rank " << r);
            for (int call = 0; call < loom_test::gradient_calls; ++call) {
                const auto k = static_cast<std::size_t>(call);
                INFO("call " << call);
                CHECK(std::abs(run.losses[k] - serial.losses[k]) <= 1e-5 * std::abs(serial.losses[k]));
                CHECK(loom_test::gradient_error(run.grads[k], serial.grads[k]) <= 1e-5);
                CHECK(run.grads[k] == runs[0].grads[k]);  // every rank holds the same averaged bits
                CHECK(run.losses[k] == runs[0].losses[k]);
            }
            CHECK(run.after == run.points.back());  // no optimizer step ran
        }
        // The calls saw different points and batches.
        CHECK(runs[0].losses[0] != runs[0].losses[1]);
    }
}

TEST_CASE("Executor::gradient with Full, Selective and Budget recomputation gives the same bits",
          "[parallel][recompute][optex]") {
    const std::vector<GradientRun> plain = gradients_on_threads(2, {});
    const std::vector<GradientRun> full = gradients_on_threads(2, Recompute<Full>::spec);
    const std::vector<GradientRun> selective = gradients_on_threads(2, Recompute<Selective>::spec);
    const std::int64_t halfway = (plain[0].activation_bytes + full[0].activation_bytes) / 2;
    const std::vector<GradientRun> budget = gradients_on_threads(2, {RecomputeMode::budget, halfway});
    for (std::size_t r = 0; r < plain.size(); ++r) {
        INFO("rank " << r);
        for (const auto* runs : {&full, &selective, &budget}) {
            CHECK((*runs)[r].losses == plain[r].losses);
            CHECK((*runs)[r].grads == plain[r].grads);
        }
        CHECK(plain[r].recomputes == 0);
        CHECK(full[r].recomputes > 0);
        CHECK(selective[r].recomputes == full[r].recomputes);
        CHECK(budget[r].recomputes > 0);
        CHECK(budget[r].recomputes < full[r].recomputes);
        CHECK(full[r].activation_bytes < plain[r].activation_bytes);
        CHECK(budget[r].activation_bytes <= plain[r].activation_bytes);
    }
}

TEST_CASE("an executor without optimizer state gives the same gradients, holds no moments and refuses what reads them",
          "[parallel][optex]") {
    // Found on the rank threads, checked after them (Catch's assertions are not thread-safe).
    struct Found {
        bool same_initial = false, same_loss = false, same_gradient = false;
        std::int64_t moments_with = 0, moments_without = 0, parameters = 0;
        std::vector<std::string> refusals;
    };
    std::vector<Found> found(2);
    comm::ThreadWorld(2).run([&](comm::ThreadComm& comm) {
        Found& f = found[static_cast<std::size_t>(comm.rank())];
        auto with_model = gpt::make_model(loom_test::equivalence_model());
        auto without_model = gpt::make_model(loom_test::equivalence_model());
        auto optex_model = gpt::make_model(loom_test::equivalence_model());
        exec::Executor<comm::ThreadComm> with(with_model, comm, exec::ExecutionPlan{}, {});
        exec::Executor<comm::ThreadComm> without(without_model, comm, exec::ExecutionPlan{}, {.optimizer_state = false});
        with.initialize(loom_test::equivalence_seed);
        const auto n = static_cast<std::size_t>(with.parameter_count());
        f.parameters = static_cast<std::int64_t>(n);
        std::vector<float> values(n), m(n), v(n);
        with.gather_state(values, m, v);
        // OptEx's worker starts from the same values without asking its executor for them.
        train::OptExGradient<gpt::Model, comm::ThreadComm> optex(optex_model, comm, exec::ExecutionPlan{}, {});
        std::vector<float> optex_initial(n);
        optex.initial_values(loom_test::equivalence_seed, optex_initial);
        f.same_initial = optex_initial == values;

        without.set_parameters(values);
        std::vector<std::int32_t> inputs, targets;
        loom_test::gradient_rows(0, comm.rank(), comm.size(), inputs, targets);
        const std::int64_t rows = loom_test::equivalence_batch / comm.size(), T = loom_test::equivalence_model().seq;
        const Tensor x = Tensor::of(inputs.data(), {rows, T}), y = Tensor::of(targets.data(), {rows, T});
        std::vector<float> g_with(n), g_without(n);
        const float loss_with = with.gradient(x, y, g_with);  // collectives: one executor after the other
        const float loss_without = without.gradient(x, y, g_without);
        f.same_loss = loss_with == loss_without;
        f.same_gradient = g_with == g_without;
        f.moments_with = with.memory_report().optimizer_state;
        f.moments_without = without.memory_report().optimizer_state;
        f.refusals = {loom_test::message_of([&] { (void)without.step(x, y, 1e-3f); }),
                      loom_test::message_of([&] { without.gather_state(values, m, v); }),
                      loom_test::message_of([&] { without.load_state(values, m, v, 0); }),
                      loom_test::message_of([&] { (void)without.owned_state(); })};
    });
    const std::string why = ": this executor holds no optimizer state (ExecutorOptions::optimizer_state is false: "
                            "an optimizer outside it keeps its own); gradient() and set_parameters() run without it";
    for (const Found& f : found) {
        CHECK(f.same_initial);
        CHECK(f.same_loss);
        CHECK(f.same_gradient);
        CHECK(f.moments_with == 8 * f.parameters);
        CHECK(f.moments_without == 0);
        CHECK(f.refusals == std::vector<std::string>{"Executor::step" + why, "Executor::gather_state" + why,
                                                     "Executor::load_state" + why, "Executor::owned_state" + why});
    }
}

TEST_CASE("Executor::gradient and set_parameters refuse what leaves no rank the whole gradient", "[parallel]") {
    auto model = gpt::make_model(loom_test::equivalence_model());
    comm::ThreadWorld(1).run([&](comm::ThreadComm& comm) {
        exec::ExecutionPlan plan{};
        plan.zero_stage = 1;
        exec::Executor<comm::ThreadComm> sharded(model, comm, plan, {});
        const auto n = static_cast<std::size_t>(sharded.parameter_count());
        std::vector<float> g(n);
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(loom_test::equivalence_model().seq), 0);
        const Tensor row = Tensor::of(tokens.data(), {1, loom_test::equivalence_model().seq});
        CHECK(loom_test::message_of([&] { (void)sharded.gradient(row, row, g); }) ==
              "Executor::gradient needs every array whole on every rank, but the strategy keeps the moments sharded "
              "over dp; step() runs every strategy");
        CHECK(loom_test::message_of([&] { sharded.set_parameters(g); }) ==
              "Executor::set_parameters needs every array whole on every rank, but the strategy keeps the moments "
              "sharded over dp; use load_state");
    });
    auto whole_model = gpt::make_model(loom_test::equivalence_model());
    comm::ThreadWorld(1).run([&](comm::ThreadComm& comm) {
        exec::Executor<comm::ThreadComm> whole(whole_model, comm, exec::ExecutionPlan{}, {});
        const std::int64_t n = whole.parameter_count();
        std::vector<float> short_by_one(static_cast<std::size_t>(n - 1));
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(loom_test::equivalence_model().seq), 0);
        const Tensor row = Tensor::of(tokens.data(), {1, loom_test::equivalence_model().seq});
        CHECK(loom_test::message_of([&] { whole.set_parameters(short_by_one); }) ==
              "Executor::set_parameters: " + std::to_string(n - 1) + " values for a model of " + std::to_string(n) +
                  " parameters; give one per parameter");
        CHECK(loom_test::message_of([&] { (void)whole.gradient(row, row, short_by_one); }) ==
              "Executor::gradient: room for " + std::to_string(n - 1) + " gradient elements for a model of " +
                  std::to_string(n) + " parameters; give one per parameter");
    });
}

TEST_CASE("OptEx's gradient refuses recomputation on a device in one line, before touching it", "[parallel][optex]") {
    auto model = gpt::make_model(loom_test::equivalence_model());
    comm::ThreadWorld(1).run([&](comm::ThreadComm& comm) {
        exec::ExecutionPlan plan{};
        plan.recompute = Recompute<Full>::spec;
        CHECK(loom_test::message_of([&] {
                  train::OptExGradient<gpt::Model, comm::ThreadComm> at(model, comm, plan, {.device = cuda_device(0)});
              }) == "OptExGradient: Recompute<Full> on cuda:0: OptEx recomputes on the host only (its executor there "
                    "would need a communicator that moves the device's memory); drop the recomputation or run on the "
                    "host");
        // On the host the same strategy runs, through the executor.
        train::OptExGradient<gpt::Model, comm::ThreadComm> on_host(model, comm, plan, {});
        CHECK(on_host.size() > 0);
    });
}

TEST_CASE("Executor::gradient refuses a compressed gradient exchange", "[parallel][compress]") {
    std::vector<std::string> messages(2);
    Compression compression{};
    comm::ThreadWorld(2).run([&](comm::ThreadComm& comm) {
        auto model = gpt::make_model(loom_test::equivalence_model());
        exec::ExecutionPlan plan{};
        plan.dp_compression = {CompressorKind::top_k, 0.25};
        exec::Executor<comm::ThreadComm> exec(model, comm, plan, {.notice = [](const std::string&) {}});
        if (comm.rank() == 0) compression = exec.gradient_exchange().compression();
        std::vector<float> g(static_cast<std::size_t>(exec.parameter_count()));
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(loom_test::equivalence_model().seq), 0);
        const Tensor row = Tensor::of(tokens.data(), {1, loom_test::equivalence_model().seq});
        messages[static_cast<std::size_t>(comm.rank())] = loom_test::message_of([&] { (void)exec.gradient(row, row, g); });
    });
    REQUIRE(compression.on());
    const std::string expected = "Executor::gradient: GradCompress<" + compression.describe() +
                                 "> changes what the exchange hands the optimizer step; gradient() needs an exchange "
                                 "that averages";
    CHECK(messages[0] == expected);
    CHECK(messages[1] == expected);
}

}  // namespace LOOM_TEST_FILE
