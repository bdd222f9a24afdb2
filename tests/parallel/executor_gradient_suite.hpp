// Executor::gradient, the oracle an optimizer with its own state (OptEx)
// asks: one step's program without its optimizer step, at points the caller
// sets. Written once for every transport (tests/parallel/test_executor_gradient.cpp
// on rank threads, tests/mpi/test_mpi_parallel.cpp under mpirun): every rank
// of `world` is a dp rank at ZeRO 0 and runs three calls, the first at the
// initial parameters and the others at points the optimizer could choose.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/comm/communicator.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/model_gradient.hpp>
#include <loom/gpt/model.hpp>
#include <loom/parallel/recompute.hpp>

#include "parallel/equivalence_suite.hpp"

namespace loom_test {

inline constexpr int gradient_calls = 3;

// What one rank's calls gave: each call's point, loss and gradient, and the
// parameters after the last call (which a gradient must leave unchanged).
struct GradientRun {
    std::vector<std::vector<float>> points, grads;
    std::vector<float> losses;
    std::vector<float> after;
    std::int64_t recomputes = 0;  // Op::recompute instructions in the program the last call ran
    std::int64_t activation_bytes = 0;
};

// Call k's point: the initial values moved along a fixed direction (the same on every rank).
inline std::vector<float> gradient_point(const std::vector<float>& initial, int call) {
    std::vector<float> x = initial;
    for (std::size_t k = 0; k < x.size(); ++k)
        x[k] += 1e-2f * static_cast<float>(call) * std::sin(0.37f * static_cast<float>(k));
    return x;
}

// The batch's rows of call k that rank `rank` of `ranks` holds (every call reads another batch).
inline void gradient_rows(int call, int rank, int ranks, std::vector<std::int32_t>& inputs,
                          std::vector<std::int32_t>& targets) {
    const std::int64_t rows = equivalence_batch / ranks, T = equivalence_model().seq;
    inputs.resize(static_cast<std::size_t>(rows * T));
    targets.resize(inputs.size());
    equivalence_corpus().rows(equivalence_seed, call, rank * rows, rows, T, inputs, targets);
}

// Runs on every rank of `world`, each a dp rank.
template <loom::comm::Communicator C>
GradientRun gradient_run(C& world, loom::RecomputeSpec recompute) {
    auto model = loom::gpt::make_model(equivalence_model());
    loom::exec::ExecutionPlan plan{};
    plan.recompute = recompute;
    loom::exec::Executor<C> exec(model, world, plan, {.adamw = equivalence_adamw(), .notice = [](const std::string&) {}});
    exec.initialize(equivalence_seed);
    const auto n = static_cast<std::size_t>(exec.parameter_count());
    std::vector<float> initial(n), m(n), v(n);
    exec.gather_state(initial, m, v);
    const std::int64_t rows = equivalence_batch / world.size(), T = equivalence_model().seq;
    GradientRun run;
    std::vector<std::int32_t> inputs, targets;
    for (int call = 0; call < gradient_calls; ++call) {
        run.points.push_back(gradient_point(initial, call));
        if (call > 0) exec.set_parameters(run.points.back());
        gradient_rows(call, world.rank(), world.size(), inputs, targets);
        run.grads.emplace_back(n);
        run.losses.push_back(exec.gradient(loom::Tensor::of(inputs.data(), {rows, T}),
                                           loom::Tensor::of(targets.data(), {rows, T}), run.grads.back()));
    }
    run.after.resize(n);
    exec.gather_state(run.after, m, v);
    run.recomputes = exec.program().count(loom::schedule::Op::recompute);
    run.activation_bytes = exec.memory_report().activations;
    return run;
}

// The serial definition: exec::ModelGradient on the whole batch at each of `run`'s points.
struct SerialGradients {
    std::vector<float> losses;
    std::vector<std::vector<float>> grads;
};
inline SerialGradients serial_gradients(const GradientRun& run) {
    auto model = loom::gpt::make_model(equivalence_model());
    loom::exec::ModelGradient<loom::gpt::Model> at(model, loom::host_device);
    SerialGradients out;
    std::vector<std::int32_t> inputs, targets;
    const std::int64_t T = equivalence_model().seq;
    for (int call = 0; call < gradient_calls; ++call) {
        gradient_rows(call, 0, 1, inputs, targets);
        out.grads.emplace_back(run.points[static_cast<std::size_t>(call)].size());
        out.losses.push_back(at(run.points[static_cast<std::size_t>(call)],
                                loom::Tensor::of(inputs.data(), {equivalence_batch, T}),
                                loom::Tensor::of(targets.data(), {equivalence_batch, T}), out.grads.back()));
    }
    return out;
}

// The largest difference between two gradients, relative to the largest element of `b`.
inline double gradient_error(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0, scale = 0;
    for (std::size_t k = 0; k < a.size(); ++k) {
        worst = std::max(worst, std::abs(static_cast<double>(a[k]) - b[k]));
        scale = std::max(scale, std::abs(static_cast<double>(b[k])));
    }
    return worst / scale;
}

}  // namespace loom_test
