// custom_policy: a policy written outside loom's headers, global
// gradient-norm clipping, composed with loom's own policies into
// dp 2 x pp 2 x tp 2 at ZeRO 3 and checked against clipping written plainly
// in a serial loop.
//
// A policy of kind `custom` lowers itself into every rank's step program
// (here, one instruction before the optimizer step) and runs there through
// its own `run`, with the step's reduced gradients as this rank holds them.
// Neither Strategy, the executor nor the planner names it.
//
//   custom_policy                      # 8 rank threads
//   mpirun -np 8 custom_policy --mpi   # one rank per process
#include <loom/comm/mesh.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/parallel/strategy.hpp>
#include <loom/parallel/tensor_parallel.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <ostream>
#include <span>
#include <string_view>
#include <vector>

#if LOOM_EXAMPLE_WITH_MPI
#include <loom/comm/communicator_mpi.hpp>
#include <loom/comm/session_mpi.hpp>
#endif

// ---- the policy: all of it ---------------------------------------------------

// Scales the step's gradients by min(1, MaxNorm / (||g|| + 1e-6)), ||g|| the
// norm of the whole model's gradient, as torch.nn.utils.clip_grad_norm_.
template <float MaxNorm>
struct ClipGradNorm {
    static constexpr loom::PolicyKind kind = loom::PolicyKind::custom;
    static void describe(std::ostream& out) { out << "ClipGradNorm<" << MaxNorm << ">"; }

    // Into each rank's program: one instruction, after the gradients are
    // reduced and before the optimizer reads them.
    static void lower(loom::schedule::StepProgram& program, int self) {
        program.insert_before(loom::schedule::Op::optimizer_step, {.op = loom::schedule::Op::policy, .policy = self});
    }

    // Each rank sums the squares of the elements it owns (its ZeRO shard,
    // its tensor-parallel cut, its pipeline stage's units); the sum over
    // every axis that spreads them is the whole model's, on every rank.
    template <class View>
    void run(View& gradients) {
        const float squares = gradients.sum_over_axes(static_cast<float>(gradients.owned_squared_norm()));
        last_norm = std::sqrt(squares);
        last_scale = std::min(1.0f, MaxNorm / (last_norm + 1e-6f));
        if (last_scale < 1.0f) gradients.scale(last_scale);
    }

    // Run-time state the policy owns: what it saw last (exec.policy<...>()).
    float last_norm = 0;
    float last_scale = 1;
};

// ---- the run -----------------------------------------------------------------

namespace {

constexpr float max_norm = 0.5f;
using Clip = ClipGradNorm<max_norm>;
using Parallel = loom::Strategy<loom::DataParallel<>, loom::Pipeline<loom::OneFOneB>, loom::TensorParallel,
                                loom::ZeroShard<3>, Clip>;

constexpr int steps = 3, micro_batches = 4;
constexpr std::int64_t batch = 48;
constexpr std::uint64_t seed = 7;
constexpr float lr = 2e-3f;
const loom::gpt::Config config{.layers = 4, .width = 32, .heads = 4, .seq = 16, .vocab = 64};
const loom::optim::AdamWConfig adamw{lr, 0.9f, 0.95f, 1e-8f, 0.1f};

const loom::data::ByteCorpus& corpus() {
    static const auto c = loom::data::ByteCorpus::synthetic(1 << 16, seed, 64);
    return c;
}

struct Run {
    std::vector<float> losses, norms, params;
};

// The serial run, with clipping written plainly (or none): one rank, the whole batch.
Run serial(bool clip) {
    auto model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, seed);
    loom::optim::AdamW optimizer(arena.size(), adamw);
    std::vector<std::int32_t> x(static_cast<std::size_t>(batch * config.seq)), y(x.size());
    loom::nn::Context ctx;
    Run run;
    for (int step = 0; step < steps; ++step) {
        corpus().batch(seed, step, batch, config.seq, x, y);
        arena.zero_grads();
        run.losses.push_back(loom::nn::forward_backward(model, ctx, loom::Tensor::of(x.data(), {batch, config.seq}),
                                                        loom::Tensor::of(y.data(), {batch, config.seq})));
        double squares = 0;
        for (float g : arena.grads()) squares += static_cast<double>(g) * g;
        const float norm = static_cast<float>(std::sqrt(squares));
        run.norms.push_back(norm);
        if (clip && norm > max_norm)
            for (float& g : arena.grads()) g *= max_norm / (norm + 1e-6f);
        optimizer.step(arena.values(), arena.grads());
    }
    run.params.assign(arena.values().begin(), arena.values().end());
    return run;
}

double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
    float scale = 0;
    for (float p : b) scale = std::max(scale, std::abs(p));
    double worst = 0;
    for (std::size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::abs(static_cast<double>(a[k]) - b[k]) / scale);
    return worst;
}

// On every rank of an 8-rank world; returns the process's exit code.
template <loom::comm::Communicator C>
int train_and_compare(C& world, const char* transport, const Run& clipped, const Run& unclipped) {
    loom::comm::Mesh<C> mesh(world, {{"dp", 2}, {"pp", 2}, {"tp", 2}});
    auto model = loom::gpt::make_model(config);
    auto exec = loom::exec::Executor<C>::template make<Parallel>(model, mesh,
                                                                 {.micro_batches = micro_batches, .adamw = adamw});
    exec.initialize(seed);
    const bool speaker = world.rank() == 0;
    if (speaker) {
        std::cout << Parallel{} << " on " << world.size() << " " << transport << "\n";
        for (const auto& in : exec.program().code)
            if (in.op == loom::schedule::Op::policy || in.op == loom::schedule::Op::optimizer_step)
                std::cout << "  step program: " << in << " "
                          << (in.op == loom::schedule::Op::policy ? exec.program().policies.at(0) : "") << "\n";
    }
    const std::int64_t rows = batch / 2;
    std::vector<std::int32_t> x(static_cast<std::size_t>(rows * config.seq)), y(x.size());
    Run parallel;
    for (int step = 0; step < steps; ++step) {
        corpus().rows(seed, step, mesh.coordinate("dp") * rows, rows, config.seq, x, y);
        parallel.losses.push_back(exec.step(loom::Tensor::of(x.data(), {rows, config.seq}),
                                            loom::Tensor::of(y.data(), {rows, config.seq}), lr));
        parallel.norms.push_back(exec.template policy<Clip>()->last_norm);
        if (speaker)
            std::printf("  step %d: loss %.6f (serial %.6f), gradient norm %.5f (serial %.5f), scaled by %.4f\n", step,
                        parallel.losses.back(), clipped.losses[static_cast<std::size_t>(step)], parallel.norms.back(),
                        clipped.norms[static_cast<std::size_t>(step)], exec.template policy<Clip>()->last_scale);
    }
    const auto n = static_cast<std::size_t>(exec.parameter_count());
    std::vector<float> m(n), v(n);
    parallel.params.resize(n);
    exec.gather_state(parallel.params, m, v);

    // The worst of every rank's errors, so every rank reaches the same verdict.
    float errors[3] = {0, 0, 0};
    for (int s = 0; s < steps; ++s) {
        const auto k = static_cast<std::size_t>(s);
        errors[0] = std::max(errors[0], std::abs(parallel.losses[k] - clipped.losses[k]) / clipped.losses[k]);
        errors[1] = std::max(errors[1], std::abs(parallel.norms[k] - clipped.norms[k]) / clipped.norms[k]);
    }
    errors[2] = static_cast<float>(largest_difference(parallel.params, clipped.params));
    world.all_reduce(loom::Tensor::of(errors, {3}), loom::Tensor::of(errors, {3}), loom::comm::ReduceOp::max);
    const double unclipped_gap = largest_difference(unclipped.params, clipped.params);
    // Reassociation (the dp, tp and pp sums) moves losses and norms by ~1e-7; AdamW divides each
    // update by the gradient's own scale, so parameters whose gradients are small move further:
    // 1.7e-5 of the largest parameter over these steps with the attention softmax in AVX-512.
    const bool equal = errors[0] <= 1e-5f && errors[1] <= 1e-5f && errors[2] <= 3e-5f;
    const bool clipping_mattered = unclipped_gap > 100.0 * errors[2];
    if (speaker) {
        std::printf("largest differences from serial clipping: loss %.2e, norm %.2e, parameters %.2e "
                    "(of the largest parameter; 1e-5, 1e-5 and 3e-5 allowed)\n",
                    errors[0], errors[1], errors[2]);
        std::printf("serial without clipping ends %.2e away from serial clipping\n", unclipped_gap);
        if (equal && clipping_mattered)
            std::printf("%s trains equal to serial clipping\n", loom::describe<Clip>().c_str());
        else if (!equal)
            std::printf("FAILED: the parallel run differs from serial clipping by more than that\n");
        else
            std::printf("FAILED: clipping changed nothing measurable; the check proves nothing\n");
    }
    return equal && clipping_mattered ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    bool mpi = false;
    for (int i = 1; i < argc; ++i) {
        if (std::string_view(argv[i]) == "--mpi") {
            mpi = true;
            continue;
        }
        std::fprintf(stderr, "custom_policy: unknown flag %s; the only flag is --mpi (under mpirun -np 8)\n", argv[i]);
        return 2;
    }
    const Run clipped = serial(true), unclipped = serial(false);
    if (mpi) {
#if LOOM_EXAMPLE_WITH_MPI
        loom::comm::MpiSession session(argc, argv);
        auto world = loom::comm::Mpi::world();
        if (world.size() != 8) {
            if (world.rank() == 0)
                std::fprintf(stderr, "custom_policy: %d MPI processes; run it with mpirun -np 8\n", world.size());
            return 2;
        }
        int code = 0;
        world.run([&](loom::comm::Mpi& c) { code = train_and_compare(c, "MPI processes", clipped, unclipped); });
        return code;
#else
        std::fprintf(stderr, "custom_policy: --mpi needs a build with MPI (LOOM_WITH_MPI=ON and an MPI library)\n");
        return 2;
#endif
    }
    std::vector<int> codes(8, 0);
    loom::comm::ThreadWorld(8).run([&](loom::comm::ThreadComm& c) {
        codes[static_cast<std::size_t>(c.rank())] = train_and_compare(c, "rank threads", clipped, unclipped);
    });
    return *std::max_element(codes.begin(), codes.end());
}
