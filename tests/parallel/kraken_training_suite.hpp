// The Kraken GPT's training equivalence, written once for every transport
// (tests/parallel/test_kraken_equivalence.cpp on rank threads,
// tests/mpi/test_mpi_parallel.cpp under mpirun): a strategy of dp x pp x tp
// ranks trains Kraken to the single-rank run's losses and whole parameters.
// At tp t each rank holds N / t of every layer's sub-layers (KrakenLayer
// places its own parts), so a layer's sum over sub-layers is one all-reduce.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <ostream>
#include <vector>

#include <loom/comm/communicator.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/exec/sharded_checkpoint.hpp>
#include <loom/gpt/kraken.hpp>
#include <loom/parallel/recompute.hpp>
#include <loom/schedule/program.hpp>

namespace loom_test {

struct KrakenCase {
    int dp = 1, pp = 1, tp = 1;
    int zero_stage = 0;
    int micro_batches = 1;
    std::int64_t degree = 2;  // Kraken's sub-layers per layer (tp divides it)
    int steps = 4;
    loom::RecomputeSpec recompute{};  // Recompute<...>: bit-identical to the case without it

    friend std::ostream& operator<<(std::ostream& out, const KrakenCase& c) {
        out << "Kraken of degree " << c.degree << " at dp " << c.dp << " x pp " << c.pp << " x tp " << c.tp
            << ", ZeRO " << c.zero_stage << ", " << c.micro_batches << " micro-batches";
        if (c.recompute.on()) out << ", recompute " << c.recompute.describe();
        return out;
    }
};

struct KrakenTrained {
    std::vector<float> losses, params;
    std::int64_t recomputes = 0;  // Op::recompute instructions in this rank's last step
};

[[nodiscard]] inline loom::gpt::KrakenConfig kraken_training_config(std::int64_t degree) {
    return {.layers = 2, .width = 16, .heads = 4, .seq = 8, .vocab = 256, .degree = degree};
}

inline constexpr std::int64_t kraken_training_rows = 4;  // the global batch, split over dp

// Runs on every rank of `world` (its size dp x pp x tp); every rank gets the
// losses and the whole model's parameters. With `load_from` the run starts
// from that sharded checkpoint; with `save_to` it saves one at the end.
template <loom::comm::Communicator C>
KrakenTrained train_kraken(C& world, const KrakenCase& c, const std::filesystem::path& load_from = {},
                           const std::filesystem::path& save_to = {}) {
    const auto config = kraken_training_config(c.degree);
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 12, 1);
    loom::comm::Mesh<C> mesh(world, {{"dp", c.dp}, {"pp", c.pp}, {"tp", c.tp}});
    auto model = loom::gpt::make_kraken(config);
    loom::exec::ExecutionPlan plan;
    plan.zero_stage = c.zero_stage;
    plan.pipelined = c.pp > 1;
    plan.tensor_parallel = c.tp > 1;
    plan.recompute = c.recompute;
    loom::exec::Executor<C> exec(model, mesh.axis("dp"), c.pp > 1 ? &mesh.axis("pp") : nullptr,
                                 c.tp > 1 ? &mesh.axis("tp") : nullptr, nullptr, plan,
                                 {.micro_batches = c.micro_batches, .field_names = loom::gpt::kraken_field_names});
    exec.initialize(7);
    if (!load_from.empty()) (void)loom::exec::load_sharded(exec, load_from);
    const std::int64_t mine = kraken_training_rows / c.dp;
    std::vector<std::int32_t> x(static_cast<std::size_t>(mine * config.seq)), y(x.size());
    KrakenTrained result;
    for (int step = 0; step < c.steps; ++step) {
        corpus.rows(1, step, mesh.coordinate("dp") * mine, mine, config.seq, x, y);
        result.losses.push_back(exec.step(loom::Tensor::of(x.data(), {mine, config.seq}),
                                          loom::Tensor::of(y.data(), {mine, config.seq}), 1e-2f));
    }
    if (!save_to.empty()) loom::exec::save_sharded(exec, world, save_to);
    result.recomputes = exec.program().count(loom::schedule::Op::recompute);
    const auto n = static_cast<std::size_t>(exec.parameter_count());
    std::vector<float> m(n), v(n);
    result.params.resize(n);
    exec.gather_state(result.params, m, v);
    return result;
}

// The worst relative loss error and the worst parameter error relative to the
// largest parameter.
struct KrakenErrors {
    double loss = 0, param = 0;
};

[[nodiscard]] inline KrakenErrors kraken_errors(const KrakenTrained& parallel, const KrakenTrained& serial) {
    KrakenErrors e;
    if (parallel.losses.size() != serial.losses.size() || parallel.params.size() != serial.params.size())
        return {1e9, 1e9};
    for (std::size_t i = 0; i < serial.losses.size(); ++i)
        e.loss = std::max(e.loss, std::abs(double(parallel.losses[i]) - serial.losses[i]) / std::abs(serial.losses[i]));
    float scale = 0;
    for (float p : serial.params) scale = std::max(scale, std::abs(p));
    for (std::size_t k = 0; k < serial.params.size(); ++k)
        e.param = std::max(e.param, std::abs(double(parallel.params[k]) - serial.params[k]) / scale);
    return e;
}

// Reassociation of the dp and tp sums, through AdamW's division by each
// gradient's own scale: about 1e-5 of the largest parameter after four steps
// (the losses agree to 1e-5).
inline constexpr double kraken_loss_bound = 1e-5, kraken_param_bound = 3e-5;

}  // namespace loom_test
