// Data parallelism and ZeRO under mpirun: the equivalence suite of
// tests/parallel (the same body the rank-thread tests run), with dp = the
// number of processes, every ZeRO stage, 1 and 4 micro-batches; and the
// pipeline suite on 4 processes; OptEx with one worker per process; bf16
// matrix products; recomputation, and the gradient OptEx asks for with it;
// Kraken with its sub-layers placed on the tp ranks.
#include <catch2/catch.hpp>

#include <loom/comm/communicator_mpi.hpp>

#include "optim/optex_suite.hpp"
#include "parallel/compression_suite.hpp"
#include "parallel/equivalence_suite.hpp"
#include "parallel/executor_gradient_suite.hpp"
#include "parallel/kraken_training_suite.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("data parallel equals serial under MPI", "[parallel]") {
    static const auto serial = loom_test::serial_run(5);
    auto world = loom::comm::Mpi::world();
    for (int stage : {0, 1, 2, 3})
        for (int micro_batches : {1, 4}) {
            const loom_test::EquivalenceCase c{.dp = world.size(), .stage = stage, .micro_batches = micro_batches};
            const auto result = loom_test::run_equivalence(world, c, serial);
            INFO("dp " << c.dp << ", stage " << stage << ", " << micro_batches << " micro-batches, rank "
                       << world.rank() << ": " << result.describe());
            CHECK(result.worst_loss_error <= 1e-5);
            CHECK(result.worst_param_error <= 1e-5);
        }
}

// Pipelines on 4 processes: pp 4 alone for every schedule and 1, 4 and 8
// micro-batches, and dp 2 x pp 2 at every ZeRO stage, as on rank threads.
TEST_CASE("pipelines equal serial under MPI", "[pipeline]") {
    constexpr int layers = 4;  // 8 units: enough for 4 stages x 2 chunks
    static const auto serial = loom_test::serial_run(3, layers);
    auto world = loom::comm::Mpi::world();
    REQUIRE(world.size() == 4);
    using loom::ScheduleKind;
    std::vector<loom_test::EquivalenceCase> cases;
    for (ScheduleKind schedule : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                  ScheduleKind::zero_bubble_h1, ScheduleKind::zero_bubble_v}) {
        for (int micro_batches : {1, 4, 8})
            if (schedule != ScheduleKind::interleaved || micro_batches % 4 == 0)
                cases.push_back({.dp = 1, .micro_batches = micro_batches, .steps = 3, .pp = 4, .schedule = schedule,
                                 .layers = layers});
        for (int stage : {0, 1, 2, 3})
            cases.push_back({.dp = 2, .stage = stage, .micro_batches = 4, .steps = 3, .pp = 2, .schedule = schedule,
                             .layers = layers});
    }
    for (const auto& c : cases) {
        const auto result = loom_test::run_equivalence(world, c, serial);
        INFO(c << ", rank " << world.rank() << ": " << result.describe());
        CHECK(result.worst_loss_error <= 1e-5);
        CHECK(result.worst_param_error <= 1e-5);
    }
}

// Tensor parallelism under MPI: tp 4 (1D and Optimus 2D) and tp 2 x dp 2 at
// ZeRO 3 on 4 processes, and 3D (dp 2 x pp 2 x tp 2, and dp 2 x tp 4 in 2D)
// on 8.
TEST_CASE("tensor parallelism and 3D parallelism equal serial under MPI", "[tensor]") {
    constexpr int layers = 4, heads = 4;
    static const auto serial = loom_test::serial_run(3, layers, heads);
    auto world = loom::comm::Mpi::world();
    std::vector<loom_test::EquivalenceCase> cases;
    if (world.size() == 4) {
        cases.push_back({.dp = 1, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 4, .heads = heads});
        cases.push_back({.dp = 2, .stage = 3, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 2, .heads = heads});
        cases.push_back({.dp = 1, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 4, .heads = heads,
                         .grid = true});
    } else {
        REQUIRE(world.size() == 8);
        for (int stage : {0, 3})
            cases.push_back({.dp = 2, .stage = stage, .micro_batches = 4, .steps = 3, .pp = 2,
                             .schedule = loom::ScheduleKind::one_f_one_b, .layers = layers, .tp = 2, .heads = heads});
        cases.push_back({.dp = 2, .stage = 2, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 4,
                         .heads = heads, .grid = true});
    }
    for (const auto& c : cases) {
        const auto result = loom_test::run_equivalence(world, c, serial);
        INFO(c << ", rank " << world.rank() << ": " << result.describe());
        CHECK(result.worst_loss_error <= 1e-5);
        CHECK(result.worst_param_error <= 1e-5);
    }
}

// bf16 matrix products on 4 processes: dp 2 x tp 2 at ZeRO 1, a 2 x 2
// Optimus grid, and ring attention at dp 2 x sp 2 (its bf16 block kernels),
// against the bf16 serial run, with the bounds (and their reason) of
// tests/parallel/test_matmul_bf16_equivalence.cpp.
TEST_CASE("bf16 matrix products equal the bf16 serial run under MPI", "[bf16]") {
    constexpr int layers = 4, heads = 4;
    using loom::kernels::MatmulPrecision;
    static const auto serial = loom_test::serial_run(3, layers, heads, 32, 64, MatmulPrecision::bf16);
    auto world = loom::comm::Mpi::world();
    REQUIRE(world.size() == 4);
    const loom_test::EquivalenceCase cases[] = {
        {.dp = 2, .stage = 1, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 2, .heads = heads,
         .matmul = MatmulPrecision::bf16},
        {.dp = 1, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 4, .heads = heads, .grid = true,
         .matmul = MatmulPrecision::bf16},
        {.dp = 2, .micro_batches = 2, .steps = 3, .layers = layers, .heads = heads, .sp = 2,
         .matmul = MatmulPrecision::bf16},
    };
    const auto& bounds = loom_test::bf16_matmul_bounds;
    for (const auto& c : cases) {
        const auto result = loom_test::run_equivalence(world, c, serial);
        INFO(c << ", rank " << world.rank() << ": " << result.describe());
        CHECK(result.worst_loss_error <= bounds.loss);
        CHECK(result.param_norm_error <= bounds.param_norm);
        CHECK(result.worst_param_error <= bounds.param);
    }
}

// Sequence parallelism under MPI: ring at sp 4 and Ulysses at dp 2 x sp 2 on
// 4 processes; ring at dp 2 x sp 2 x tp 2 with ZeRO 3 on 8.
TEST_CASE("sequence parallelism equals serial under MPI", "[sequence]") {
    constexpr int layers = 4, heads = 4;
    static const auto serial = loom_test::serial_run(3, layers, heads);
    auto world = loom::comm::Mpi::world();
    std::vector<loom_test::EquivalenceCase> cases;
    if (world.size() == 4) {
        cases.push_back({.dp = 1, .micro_batches = 2, .steps = 3, .layers = layers, .heads = heads, .sp = 4});
        cases.push_back({.dp = 2, .micro_batches = 2, .steps = 3, .layers = layers, .heads = heads, .sp = 2,
                         .sp_attention = loom::nn::SequenceAttention::ulysses});
    } else {
        REQUIRE(world.size() == 8);
        cases.push_back({.dp = 2, .stage = 3, .micro_batches = 2, .steps = 3, .layers = layers, .tp = 2,
                         .heads = heads, .sp = 2});
    }
    for (const auto& c : cases) {
        const auto result = loom_test::run_equivalence(world, c, serial);
        INFO(c << ", rank " << world.rank() << ": " << result.describe());
        CHECK(result.worst_loss_error <= 1e-5);
        CHECK(result.worst_param_error <= 1e-5);
        CHECK(result.tokens_per_sequence * c.sp == 16);
    }
}

// GradCompress under mpirun: the compression suite of tests/parallel, with dp
// = the number of processes, ZeRO 0 (all-reduce) and 2 (reduce-scatter).
// Compressed from the first step: an uncompressed warm-up step would average
// in MPI's own summation order, and a compressor's discontinuities (which
// element is in the top k, which sign a value near 0 gets) turn that last-bit
// difference into 1e-4 (docs/testing.md). The rank threads test the warm-up.
TEST_CASE("every gradient compressor trains as the serial run of its algorithm under MPI", "[compress]") {
    auto world = loom::comm::Mpi::world();
    for (const loom::Compression& compression : loom_test::every_compressor())
        for (int stage : {0, 2}) {
            const loom_test::CompressionCase c{.compression = compression, .dp = world.size(), .stage = stage};
            const auto serial = loom_test::serial_compressed_run(c);
            const auto result = loom_test::run_compressed(world, c, serial);
            INFO(compression.describe() << " dp " << c.dp << " stage " << stage << ", rank " << world.rank() << ": "
                                        << result.describe());
            CHECK(result.worst_loss_error <= 1e-5);
            CHECK(result.worst_param_error <= 1e-5);
        }
}

// OptEx with one worker per process: the suite the rank threads run, against
// the serial definition of the algorithm, every selection rule, and a
// non-finite gradient kept out of the history.
TEST_CASE("OptEx on MPI processes equals the serial definition of the algorithm", "[optex]") {
    auto world = loom::comm::Mpi::world();
    using loom::optim::OptExSelect;
    for (const OptExSelect select : {OptExSelect::last, OptExSelect::lowest_loss, OptExSelect::smallest_gradient})
        for (const int nan_worker : {-1, world.size() - 1}) {
            const loom_test::OptExCase c{.workers = world.size(), .d = 37, .iterations = 12, .select = select,
                                         .nan_iteration = nan_worker < 0 ? -1 : 3, .nan_worker = nan_worker};
            const auto serial = loom_test::serial_optex_run(c);
            const auto run = loom_test::parallel_optex_run(world, c);
            INFO("N " << c.workers << ", select " << name(select) << ", non-finite worker " << nan_worker << ", rank "
                      << world.rank());
            CHECK(run.selected == serial.selected);
            CHECK(run.skipped == serial.skipped);
            CHECK(loom_test::max_difference(run.x, serial.x) <= 2e-5);
            CHECK(loom_test::max_difference(run.losses, serial.losses) <= 2e-4);
        }
}

// Recompute<...> under mpirun: dp 2 x pp 2 x tp 2 at ZeRO 3 on 8 processes,
// and dp 2 x pp 2 on ZB-H1 on 4, with Full, Selective and a Budget between Full's
// and the plain run's activations: losses and parameters bit-identical to the
// same strategy without recomputation (tests/parallel/test_recompute.cpp on
// rank threads).
TEST_CASE("recomputation is bit-identical under MPI", "[recompute]") {
    auto world = loom::comm::Mpi::world();
    REQUIRE((world.size() == 4 || world.size() == 8));
    loom_test::EquivalenceCase c{.dp = 2, .stage = 3, .micro_batches = 4, .steps = 3, .pp = 2,
                                 .schedule = loom::ScheduleKind::zero_bubble_h1, .layers = 4};
    if (world.size() == 8) c = {.dp = 2, .stage = 3, .micro_batches = 2, .steps = 3, .pp = 2, .layers = 2, .tp = 2};
    const auto plain = loom_test::train_case(world, c);
    c.recompute = loom::Recompute<loom::Full>::spec;
    const auto full = loom_test::train_case(world, c);
    c.recompute = loom::Recompute<loom::Selective>::spec;
    const auto selective = loom_test::train_case(world, c);
    c.recompute = {loom::RecomputeMode::budget, (plain.memory.activations + full.memory.activations) / 2};
    const auto budget = loom_test::train_case(world, c);
    INFO(c << ", rank " << world.rank());
    CHECK(full.recomputes > 0);
    CHECK(selective.recomputes == full.recomputes);
    for (const auto* run : {&full, &selective, &budget}) {
        CHECK(run->losses == plain.losses);
        CHECK(run->params == plain.params);
    }
}

// Executor::gradient (what OptEx asks the executor for) with dp = the
// processes: the serial gradient at each point, the parameters left as set,
// and the same bits with Full, Selective and a Budget between
// (tests/parallel/test_executor_gradient.cpp on rank threads).
TEST_CASE("the executor's gradient with recomputation is bit-identical under MPI", "[recompute]") {
    auto world = loom::comm::Mpi::world();
    const auto plain = loom_test::gradient_run(world, {});
    const auto full = loom_test::gradient_run(world, loom::Recompute<loom::Full>::spec);
    const auto selective = loom_test::gradient_run(world, loom::Recompute<loom::Selective>::spec);
    const auto budget =
        loom_test::gradient_run(world, {loom::RecomputeMode::budget, (plain.activation_bytes + full.activation_bytes) / 2});
    const auto serial = loom_test::serial_gradients(plain);
    INFO("rank " << world.rank() << " of " << world.size());
    for (int call = 0; call < loom_test::gradient_calls; ++call) {
        const auto k = static_cast<std::size_t>(call);
        CHECK(std::abs(plain.losses[k] - serial.losses[k]) <= 1e-5 * std::abs(serial.losses[k]));
        CHECK(loom_test::gradient_error(plain.grads[k], serial.grads[k]) <= 1e-5);
    }
    CHECK(plain.after == plain.points.back());
    CHECK(full.recomputes > 0);
    for (const auto* run : {&full, &selective, &budget}) {
        CHECK(run->losses == plain.losses);
        CHECK(run->grads == plain.grads);
    }
}

// Kraken on 4 processes with sub-layer i on tp rank i: tp 4, dp 2 x tp 2 at
// ZeRO 3, pp 2 x tp 2, against the single-process run of each degree (the
// same body as tests/parallel/test_kraken_equivalence.cpp on rank threads).
TEST_CASE("Kraken trained with its sub-layers on the tp ranks equals serial under MPI", "[kraken]") {
    auto world = loom::comm::Mpi::world();
    REQUIRE(world.size() == 4);
    auto self = world.split(world.rank(), 0);
    const auto serial2 = loom_test::train_kraken(self, {.degree = 2});
    const auto serial4 = loom_test::train_kraken(self, {.degree = 4});
    for (const loom_test::KrakenCase& c :
         {loom_test::KrakenCase{.tp = 4, .degree = 4},
          loom_test::KrakenCase{.dp = 2, .tp = 2, .zero_stage = 3, .micro_batches = 2, .degree = 4},
          loom_test::KrakenCase{.pp = 2, .tp = 2, .micro_batches = 2, .degree = 2}}) {
        const auto errors = loom_test::kraken_errors(loom_test::train_kraken(world, c), c.degree == 2 ? serial2 : serial4);
        INFO(c << ", rank " << world.rank() << ": loss error " << errors.loss << ", parameter error " << errors.param);
        CHECK(errors.loss <= loom_test::kraken_loss_bound);
        CHECK(errors.param <= loom_test::kraken_param_bound);
    }
}

}  // namespace LOOM_TEST_FILE
