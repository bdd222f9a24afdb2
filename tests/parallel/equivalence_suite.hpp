// "Parallel equals serial", written once for every transport: a rank of a
// world of any Communicator trains a small GPT for a few AdamW steps with a
// data-parallel / ZeRO / pipeline strategy and compares its losses and final
// parameters with the serial run of the same seed and global batch, which
// every rank computes itself. Used by tests/parallel (rank threads) and
// tests/mpi. The world is dp x pp ranks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <loom/comm/communicator.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/matmul_precision.hpp>
#include <loom/nn/compose.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/optim/adamw.hpp>
#include <loom/parallel/pipeline.hpp>
#include <loom/parallel/recompute.hpp>
#include <loom/schedule/program.hpp>

namespace loom_test {

struct EquivalenceCase {
    int dp = 2;
    int stage = 0;
    int micro_batches = 1;
    std::int64_t bucket_bytes = 16 << 10;  // small: several buckets even in a small model
    int steps = 5;
    int pp = 1;  // > 1: pipelined with `schedule`
    loom::ScheduleKind schedule = loom::ScheduleKind::one_f_one_b;
    int layers = 2;  // pipelines need units for stages x chunks virtual stages (layers + 4 units)
    int tp = 1;      // > 1: tensor parallel (Megatron 1D, or Optimus 2D with grid)
    int heads = 2;   // tp (2D: its side q) must divide them
    bool grid = false;  // Optimus 2D: tp = q x q
    int sp = 1;         // > 1: sequence parallel (each sequence split over sp ranks)
    loom::nn::SequenceAttention sp_attention = loom::nn::SequenceAttention::ring;
    bool zigzag = true;
    int ulysses = 1;  // the hybrid's K
    std::int64_t width = 32, vocab = 64;  // 2D: q must divide both
    loom::Compression pp_cast{}, tp_cast{};  // GradCompress<Cast, PpAxis / TpAxis>: lossy, by design
    loom::Compression dp_compress{};          // GradCompress on the dp axis (lossless settings only here)
    // The layers' matrix products; compare a bf16 case with a bf16 serial run.
    loom::kernels::MatmulPrecision matmul = loom::kernels::MatmulPrecision::f32;
    loom::RecomputeSpec recompute{};  // Recompute<...>: bit-identical to the case without it

    [[nodiscard]] int chunks() const {
        return schedule == loom::ScheduleKind::interleaved || schedule == loom::ScheduleKind::zero_bubble_v ? 2 : 1;
    }
    friend std::ostream& operator<<(std::ostream& out, const EquivalenceCase& c) {
        out << "dp " << c.dp << " stage " << c.stage << " micro-batches " << c.micro_batches;
        if (c.pp > 1) out << " pp " << c.pp << " " << loom::name(c.schedule) << " layers " << c.layers;
        if (c.tp > 1) out << " tp " << c.tp << (c.grid ? " (2D)" : "") << " heads " << c.heads;
        if (c.width != 32 || c.vocab != 64) out << " width " << c.width << " vocab " << c.vocab;
        if (c.sp > 1)
            out << " sp " << c.sp
                << (c.sp_attention == loom::nn::SequenceAttention::ring      ? " ring"
                    : c.sp_attention == loom::nn::SequenceAttention::ulysses ? " ulysses"
                                                                             : " hybrid ulysses " + std::to_string(c.ulysses))
                << (c.zigzag ? "" : " contiguous");
        if (c.matmul != loom::kernels::MatmulPrecision::f32) out << " matmul " << c.matmul;
        if (c.recompute.on()) out << " recompute " << c.recompute.describe();
        return out;
    }
};

struct EquivalenceResult {
    double worst_loss_error = 0;   // max over steps of |loss - serial| / |serial|
    double worst_param_error = 0;  // max over elements of |p - serial| / max |serial|
    double param_norm_error = 0;   // ||p - serial|| / ||serial|| over all elements
    std::vector<float> losses, serial_losses;
    std::int64_t tokens_per_sequence = 0;  // what this rank's model saw of each sequence
    std::string describe() const {
        std::ostringstream out;
        out << "worst loss error " << worst_loss_error << ", worst parameter error " << worst_param_error
            << ", parameter norm error " << param_norm_error;
        return out.str();
    }
};

// The bounds a case is held to: 1e-5 unless it documents why it needs more.
struct EquivalenceBounds {
    double param = 1e-5;       // worst_param_error
    double loss = 1e-5;        // worst_loss_error
    double param_norm = 1e-5;  // param_norm_error
};

// At MatmulPrecision::bf16 (why: tests/parallel/test_matmul_bf16_equivalence.cpp).
inline constexpr EquivalenceBounds bf16_matmul_bounds{.param = 1.2e-2, .loss = 1e-5, .param_norm = 1e-3};

inline loom::gpt::Config equivalence_model(int layers = 2, int heads = 2, std::int64_t width = 32,
                                           std::int64_t vocab = 64) {
    return {.layers = layers, .width = width, .heads = heads, .seq = 16, .vocab = vocab};
}
// Divisible by dp x micro-batches for dp 2..4 with mb 1 and 4, and dp 2 with mb 8.
inline constexpr std::int64_t equivalence_batch = 48;
inline constexpr std::uint64_t equivalence_seed = 7;
inline constexpr float equivalence_lr = 2e-3f;
inline loom::optim::AdamWConfig equivalence_adamw() { return {equivalence_lr, 0.9f, 0.95f, 1e-8f, 0.1f}; }

inline const loom::data::ByteCorpus& equivalence_corpus() {
    static const auto corpus = loom::data::ByteCorpus::synthetic(1 << 16, equivalence_seed, 64);
    return corpus;
}

// The serial run: one rank, the whole batch, plain forward_backward + AdamW.
struct SerialRun {
    std::vector<float> losses;
    std::vector<float> params;  // dense, reflection order
    std::vector<std::int64_t> tensor_sizes;
};

inline SerialRun serial_run(int steps, int layers = 2, int heads = 2, std::int64_t width = 32,
                            std::int64_t vocab = 64,
                            loom::kernels::MatmulPrecision matmul = loom::kernels::MatmulPrecision::f32) {
    const auto config = equivalence_model(layers, heads, width, vocab);
    auto model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, equivalence_seed);
    loom::optim::AdamW optimizer(arena.size(), equivalence_adamw());
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(equivalence_batch * config.seq)), targets(inputs.size());
    loom::nn::Context ctx;
    ctx.set_matmul_precision(matmul);
    SerialRun run;
    for (int step = 0; step < steps; ++step) {
        equivalence_corpus().batch(equivalence_seed, step, equivalence_batch, config.seq, inputs, targets);
        arena.zero_grads();
        run.losses.push_back(loom::nn::forward_backward(model, ctx,
                                                        loom::Tensor::of(inputs.data(), {equivalence_batch, config.seq}),
                                                        loom::Tensor::of(targets.data(), {equivalence_batch, config.seq})));
        optimizer.step(arena.values(), arena.grads());
    }
    run.params.assign(arena.values().begin(), arena.values().end());
    for (const auto& e : arena.entries()) run.tensor_sizes.push_back(e.param->numel());
    return run;
}

// Collective: the executor's final parameters against the serial run's,
// relative to the model's largest parameter, not element by element: the
// attention's key bias has a gradient of exactly zero (softmax does not
// change when every score of a row shifts by the same amount), so in both
// runs it moves only by AdamW-normalised rounding noise, and its elements
// differ by ~1e-6 absolute around values of ~1e-6. Every other element
// agrees to ~1e-6 of its own tensor's scale (docs/testing.md).
// Also returns ||p - serial|| / ||serial||, which a few noise-driven elements
// (that bias) barely move.
inline std::pair<double, double> value_errors(const std::vector<float>& values, const SerialRun& serial) {
    float scale = 0;
    for (float p : serial.params) scale = std::max(scale, std::abs(p));
    double worst = 0, diff = 0, norm = 0;
    for (std::size_t k = 0; k < values.size(); ++k) {
        const double d = static_cast<double>(values[k]) - serial.params[k];
        worst = std::max(worst, std::abs(d) / scale);
        diff += d * d;
        norm += static_cast<double>(serial.params[k]) * serial.params[k];
    }
    return {worst, std::sqrt(diff / norm)};
}
template <class Executor>
std::pair<double, double> param_errors(Executor& exec, const SerialRun& serial) {
    const auto n = static_cast<std::size_t>(exec.parameter_count());
    std::vector<float> values(n), m(n), v(n);
    exec.gather_state(values, m, v);
    return value_errors(values, serial);
}

// What one rank's training of a case left: its losses, the whole model's
// final parameters (gathered), what its executor held and ran.
struct TrainedCase {
    std::vector<float> losses;
    std::vector<float> params;
    loom::MemoryReport memory;
    std::int64_t tokens_per_sequence = 0;
    std::int64_t recomputes = 0;  // Op::recompute instructions in the last step's program
};

// Runs on every rank of `world` (whose size is dp x pp x tp x sp).
template <loom::comm::Communicator C>
TrainedCase train_case(C& world, const EquivalenceCase& c) {
    const auto config = equivalence_model(c.layers, c.heads, c.width, c.vocab);
    loom::comm::Mesh<C> mesh(world, {{"dp", c.dp}, {"pp", c.pp}, {"tp", c.tp}, {"sp", c.sp}});
    // Sequence parallel ranks reduce their gradients with the data-parallel ones.
    C& dp = c.sp > 1 ? mesh.combined({"dp", "sp"}) : mesh.axis("dp");
    auto model = loom::gpt::make_model(config);
    loom::exec::ExecutionPlan plan{c.stage, c.bucket_bytes, c.pp > 1, c.schedule, c.chunks(), c.tp > 1, c.grid, c.sp > 1, c.sp_attention, c.zigzag, c.ulysses};
    plan.pp_compression = c.pp_cast;
    plan.tp_compression = c.tp_cast;
    plan.dp_compression = c.dp_compress;
    plan.recompute = c.recompute;
    loom::exec::Executor<C> exec(model, dp, c.pp > 1 ? &mesh.axis("pp") : nullptr,
                                 c.tp > 1 ? &mesh.axis("tp") : nullptr, c.sp > 1 ? &mesh.axis("sp") : nullptr, plan,
                                 {.micro_batches = c.micro_batches, .adamw = equivalence_adamw(), .matmul = c.matmul});
    exec.initialize(equivalence_seed);
    const std::int64_t rows = equivalence_batch / c.dp;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(rows * config.seq)), targets(inputs.size());
    TrainedCase run;
    for (int step = 0; step < c.steps; ++step) {
        equivalence_corpus().rows(equivalence_seed, step, mesh.coordinate("dp") * rows, rows, config.seq, inputs,
                                  targets);
        run.losses.push_back(exec.step(loom::Tensor::of(inputs.data(), {rows, config.seq}),
                                       loom::Tensor::of(targets.data(), {rows, config.seq}), equivalence_lr));
    }
    run.tokens_per_sequence = exec.tokens_per_sequence();
    const auto n = static_cast<std::size_t>(exec.parameter_count());
    std::vector<float> m(n), v(n);
    run.params.resize(n);
    exec.gather_state(run.params, m, v);
    run.memory = exec.memory_report();
    run.recomputes = exec.program().count(loom::schedule::Op::recompute);
    return run;
}

// Runs on every rank of `world` (whose size is dp x pp x tp x sp).
template <loom::comm::Communicator C>
EquivalenceResult run_equivalence(C& world, const EquivalenceCase& c, const SerialRun& serial) {
    const TrainedCase run = train_case(world, c);
    EquivalenceResult result;
    result.serial_losses = serial.losses;
    result.losses = run.losses;
    for (std::size_t step = 0; step < run.losses.size(); ++step) {
        const double ref = serial.losses[step];
        result.worst_loss_error = std::max(result.worst_loss_error, std::abs(run.losses[step] - ref) / std::abs(ref));
    }
    result.tokens_per_sequence = run.tokens_per_sequence;
    std::tie(result.worst_param_error, result.param_norm_error) = value_errors(run.params, serial);
    return result;
}

}  // namespace loom_test
