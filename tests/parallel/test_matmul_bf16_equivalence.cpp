// Parallel equals serial at MatmulPrecision::bf16: data parallelism with
// ZeRO, Megatron tp, a 1F1B pipeline, Optimus 2D and 3D parallelism and
// Ulysses sequence parallelism, each with bf16 matrix products (attention's
// included: kernels/host/attention_bf16.hpp), against the serial run with bf16 matrix products, on
// rank threads (tests/mpi runs two of the cases under mpirun).
//
// Bounds. Every rank rounds exactly the elements the serial run rounds, so
// the only source of difference is still f32 reassociation (the dp and tp
// sums, the micro-batch split). But an operand that reassociation moved by
// one f32 ulp can land on the other side of a bf16 rounding boundary, a jump
// of up to 2^-9 of that element, and AdamW turns the sign of a gradient into
// a step of about lr whatever its size: weights whose gradient is nearly
// zero (those reading GELU-silenced units) take +-lr steps that such a flip
// decides. Attention's bf16 products (P and dS rounded, T^2 elements a head)
// give such flips more places to happen. Measured over 3 steps at lr 2e-3
// (tp 2): worst element 2.7e-3 of the largest parameter, 6.3e-4 in norm,
// 1.4e-6 on losses (2.8e-3, 5.6e-4 and 1.7e-6 on the 2 x 2 grid).
// So:
//   losses within 1e-5, as in f32 (no element flip moves a loss that far);
//   parameters within 1e-3 in norm (||p - serial|| / ||serial||);
//   each element within 1.2e-2 of the largest parameter: 2 lr per step, the
//   most AdamW moves two runs apart. That bound is loose on purpose; the
//   two above do the checking, the loss bound above all.
// And the bf16 serial run must be further from the f32 serial run than the
// loss bound and 1.5 times the norm bound, so the cases compare bf16 with
// bf16, not f32 with f32 by accident (measured: 3.7e-5 on losses, 2.2e-3 in
// parameter norm).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include <loom/comm/thread_world.hpp>

#include "parallel/equivalence_on_threads.hpp"

using loom::kernels::MatmulPrecision;
using loom_test::EquivalenceCase;

namespace {

constexpr int layers = 4, heads = 4;
constexpr loom_test::EquivalenceBounds bounds = loom_test::bf16_matmul_bounds;

const loom_test::SerialRun& serial_bf16() {
    static const auto run = loom_test::serial_run(3, layers, heads, 32, 64, MatmulPrecision::bf16);
    return run;
}

void check_equivalence(const EquivalenceCase& c) {
    loom_test::check_equivalence_on_threads(c, serial_bf16(), bounds);
}

}  // namespace

TEST_CASE("the bf16 serial run is not the f32 one: the cases below compare bf16 with bf16", "[parallel][bf16]") {
    const auto f32 = loom_test::serial_run(3, layers, heads);
    const auto& bf16 = serial_bf16();
    double diff = 0, norm = 0;
    for (std::size_t k = 0; k < f32.params.size(); ++k) {
        const double d = static_cast<double>(bf16.params[k]) - f32.params[k];
        diff += d * d;
        norm += static_cast<double>(f32.params[k]) * f32.params[k];
    }
    double loss_difference = 0;
    for (std::size_t s = 0; s < f32.losses.size(); ++s)
        loss_difference = std::max(loss_difference, std::abs(static_cast<double>(bf16.losses[s]) - f32.losses[s]) /
                                                        std::abs(static_cast<double>(f32.losses[s])));
    INFO("bf16 against f32 products: parameter norm difference " << std::sqrt(diff / norm)
                                                                 << ", worst loss difference " << loss_difference);
    CHECK(std::sqrt(diff / norm) > 1.5 * bounds.param_norm);
    CHECK(loss_difference > bounds.loss);
}

TEST_CASE("data parallelism with ZeRO at bf16 matrix products equals the bf16 serial run", "[parallel][bf16]") {
    for (int stage : {0, 3}) {
        const EquivalenceCase c{.dp = 2, .stage = stage, .micro_batches = 2, .steps = 3, .layers = layers,
                                .heads = heads, .matmul = MatmulPrecision::bf16};
        DYNAMIC_SECTION(c) { check_equivalence(c); }
    }
}

TEST_CASE("tensor, pipeline, Optimus 2D and 3D parallelism at bf16 matrix products equal the bf16 serial run",
          "[parallel][bf16]") {
    const EquivalenceCase cases[] = {
        {.dp = 1, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 2, .heads = heads,
         .matmul = MatmulPrecision::bf16},
        {.dp = 1, .micro_batches = 4, .steps = 3, .pp = 2, .layers = layers, .heads = heads,
         .matmul = MatmulPrecision::bf16},
        {.dp = 1, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 4, .heads = heads, .grid = true,
         .matmul = MatmulPrecision::bf16},
        {.dp = 2, .stage = 1, .micro_batches = 2, .steps = 3, .pp = 2, .layers = layers, .tp = 2, .heads = heads,
         .matmul = MatmulPrecision::bf16},
    };
    for (const auto& c : cases) DYNAMIC_SECTION(c) { check_equivalence(c); }
}

TEST_CASE("Ulysses sequence parallelism at bf16 matrix products equals the bf16 serial run", "[parallel][bf16][sp]") {
    // Its whole-sequence attention is the serial kernel's, at bf16 too.
    const EquivalenceCase c{.dp = 1, .micro_batches = 2, .steps = 3, .layers = layers, .heads = heads, .sp = 2,
                            .sp_attention = loom::nn::SequenceAttention::ulysses, .matmul = MatmulPrecision::bf16};
    check_equivalence(c);
}

TEST_CASE("ring attention refuses bf16 matrix products before a step, naming what works", "[parallel][bf16][sp]") {
    // Its block kernels are f32 only: run anyway, its attention would not be
    // the serial run's bf16 attention. The Executor refuses as it is built
    // ("Executor: ..."), before any step reaches the ring's own check.
    for (const auto attention : {loom::nn::SequenceAttention::ring, loom::nn::SequenceAttention::hybrid}) {
        const EquivalenceCase c{.dp = 1, .steps = 1, .layers = layers, .heads = heads,
                                .sp = attention == loom::nn::SequenceAttention::hybrid ? 4 : 2,
                                .sp_attention = attention, .ulysses = 2, .matmul = MatmulPrecision::bf16};
        CAPTURE(c);
        CHECK_THROWS_WITH(loom_test::check_equivalence_on_threads(c, serial_bf16(), bounds),
                          Catch::Contains("Executor: ring attention's block kernels compute in f32 only, so "
                                          "matrix products at bf16 are not supported; use Ulysses sequence "
                                          "parallelism (SequenceParallel<Ulysses>, train_gpt --sp-mode ulysses) or "
                                          "f32 products (--matmul f32)"));
    }
}
