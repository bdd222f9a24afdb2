// What a plan (parallel/strategy_spec.hpp) asks of the executor's traffic,
// as components and values the executor uses without naming the policies
// behind them:
//   - gradient_exchange_for: the gradient exchange over the gradient axis
//     (parallel/gradient_exchange.hpp): GradCompress's on the dp axis, or
//     the plain average;
//   - message_casts: the 16-bit casts of pipeline stage messages and of
//     Megatron's tensor-parallel sums (GradCompress<Cast, PpAxis / TpAxis>);
//   - program_components_for: the components that lower themselves into the
//     rank's step program with run-time state (Recompute<...>'s).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/nn/units.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/parallel/compressed_gradient_exchange.hpp"
#include "loom/parallel/grad_compress.hpp"
#include "loom/parallel/gradient_exchange.hpp"
#include "loom/parallel/program_component.hpp"
#include "loom/parallel/recomputation.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/parallel/strategy_spec.hpp"

namespace loom::parallel {

// The gradient exchange `plan` asks for over `comm` (the gradient axis):
// compressed when the plan compresses the dp axis and it has more than one
// rank, else the plain average. `adamw` is the executor's optimizer config:
// an error-feedback compressor with a warm-up freezes AdamW's variance when
// it starts, unless a step was chosen (error feedback delivers late what a
// step did not send, so it arrives in full).
template <comm::Communicator C>
[[nodiscard]] std::unique_ptr<GradientExchange<C>> gradient_exchange_for(const StrategySpec& plan, C& comm,
                                                                         const ShardLayout& layout,
                                                                         const std::vector<nn::Unit>& units,
                                                                         const ExchangeSetup& setup,
                                                                         optim::AdamWConfig& adamw) {
    const Compression& compression = plan.dp_compression;
    if (!compression.on() || comm.size() <= 1) return std::make_unique<AveragingExchange<C>>(comm);
    LOOM_CHECK(setup.warmup >= 0, "Executor: compress_warmup = ", setup.warmup, " steps; it must be 0 or more");
    if (compression.error_feedback() && setup.warmup > 0 && adamw.freeze_variance_after == 0)
        adamw.freeze_variance_after = setup.warmup;
    return std::make_unique<CompressedGradientExchange<C>>(comm, layout, units, compression, setup.warmup,
                                                           plan.zero_stage, adamw.beta1, setup.notice, setup.device);
}

// The casts of the messages other than gradients; none where the plan sends f32.
struct MessageCasts {
    std::optional<kernels::host::Cast> stage;   // pipeline stage messages (activations and their gradients)
    std::optional<kernels::host::Cast> tensor;  // Megatron's tensor-parallel all-reduces
};

[[nodiscard]] inline kernels::host::Cast cast_of(const Compression& c) {
    LOOM_CHECK(c.is_cast(), "Executor: ", c.describe(), " on the pp or tp axis; activations take CastBf16 or CastFp16");
    return c.kind == CompressorKind::bf16 ? kernels::host::Cast::bf16 : kernels::host::Cast::f16;
}

[[nodiscard]] inline MessageCasts message_casts(const StrategySpec& plan) {
    LOOM_CHECK(!plan.pp_compression.on() || plan.pipelined, "Executor: GradCompress<", plan.pp_compression.describe(),
               ", PpAxis> casts what pipeline stages send; add Pipeline<Schedule>");
    LOOM_CHECK(!plan.tp_compression.on() || (plan.tensor_parallel && !plan.tensor_grid), "Executor: GradCompress<",
               plan.tp_compression.describe(), ", TpAxis> casts Megatron's all-reduces; add TensorParallel (1D)");
    MessageCasts casts;
    if (plan.pp_compression.on()) casts.stage = cast_of(plan.pp_compression);
    if (plan.tp_compression.on()) casts.tensor = cast_of(plan.tp_compression);
    return casts;
}

// The program components `plan` installs on a rank that runs `units`
// (chunk_of_unit: -1 for those another stage holds), in the order they lower.
template <comm::Communicator C>
[[nodiscard]] ProgramComponents<C> program_components_for(const StrategySpec& plan, const std::vector<nn::Unit>& units,
                                                          const std::vector<int>& chunk_of_unit) {
    ProgramComponents<C> out;
    if (plan.recompute.on())
        out.push_back(std::make_unique<RecomputationComponent<C>>(Recomputation(plan.recompute, units, chunk_of_unit)));
    return out;
}

}  // namespace loom::parallel
