// bench/tensor_parallel: what Megatron 1D and Optimus 2D tensor parallelism
// cost and save, measured on the real GPT through the executor, beside the
// formulas.
//
//   bench_tensor_parallel [--degrees 1,2,4] [--grids 4] [--steps 3] [--gbit 100]
//
// For each 1D tp degree t (ranks are threads of this process):
//   - parameter bytes per rank from loom::memory_report(), beside the formula
//     L (12C^2 + 7C)/t + 6LC + 2VC/t + TC + 2C floats: every block's qkv,
//     projection and MLP cut 1/t, the row layers' biases and the LayerNorms
//     whole; the token table and the head (no bias) cut by vocabulary, the
//     position table and the last LayerNorm whole;
//   - activation bytes per rank (the micro-batch context's peak: every
//     ctx.alloc of one micro-batch's forward and backward, each rounded up to
//     64 bytes), beside the formula, M = B T rows:
//     4 [L (12 M C + 24 M C/t + M H/t + 4 M) + 4 M C + 2 M V/t + 3 M + 2 M [t > 1]] + 64:
//     per block 12 [M, C] tensors whole (the LayerNorms' outputs, the row
//     layers' outputs and the residual sums, forward; the column layers' and
//     the LayerNorms' input gradients and the residual sums, backward), 24
//     M C/t of attention and MLP interiors (qkv, attention output, fc, GELU
//     forward; their gradients backward), the attention's log-sum-exp
//     (M H/t) and the LayerNorms' mean and rstd (4 M); outside the blocks the
//     embedding, the last LayerNorm's output and input gradient and the
//     head's input gradient (4 M C), the logits and their gradient (2 M V/t),
//     the last LayerNorm's and the loss's row statistics (3 M), the loss's
//     all-reduced sums when t > 1 (2 M) and the loss itself (one 64-byte
//     block). Interiors shrink by 1/t; the residual stream and the
//     LayerNorms stay whole ("partly replicated");
//   - bytes on the tp axis per step, counted by comm::Counted, beside the
//     formula: per micro-batch 4 all-reduces of B T C floats per block (g
//     twice forward, f twice backward), one for the embedding (g) and one for
//     the head (f), and the loss's max and sums (3 B T floats): payload
//     4 (4L + 2) B T C + 12 B T bytes, on the wire 2 (t-1)/t of it (ring);
//   - step time (median) with every tp link Shaped to --gbit Gbit/s, the
//     unshaped step beside it.
// For each 2D degree t = q^2 (--grids), the same columns against the 2D
// formulas (parallel/optimus2d.hpp), M = B T rows:
//   - parameters (12 L C^2 + 2 V C) / q^2 + (13 L C + T C + 2 C) / q floats:
//     every matrix (and the token table) in q^2 blocks, every vector cut q
//     ways and held by each grid row;
//   - activations: every [B, T, C] tensor (and the interiors, log-sum-exp
//     and logits) is a q^2 block, the row statistics 1/q:
//     4 [L (36 M C + M H) / q^2 + 8 L M / q + (4 M C + 2 M V) / q^2 + 7 M / q] + 128:
//     the 1D terms at t = 1 cut q^2 ways, each LayerNorm's mean and rstd
//     plus its backward's two row sums (4 M / q per LayerNorm), and the
//     loss's all-reduced mean (a second 64-byte block);
//   - payload per step (bytes passed to the row and column groups' ops):
//     each Linear K -> N moves 3 (M N + N K) / q floats (SUMMA's broadcasts
//     and reduce-scatters, forward and both backward products) plus its bias
//     gradient N / q; each LayerNorm 4 M / q + 2 C / q (row statistics forward
//     and backward, gain and shift gradients); the embedding 2 M C / q
//     (reduce-scatter forward, all-gather backward); the loss 3 M / q + 1:
//     [L (27 M C + 36 C^2 + 8 M + 13 C) + 3 M V + 3 V C + 2 M C + 7 M + 2 C] / q + 1.
// A speed claim is not made here: on 2 cores, t ranks share the cores.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <loom/comm/counted.hpp>
#include <loom/comm/links.hpp>
#include <loom/comm/mesh.hpp>
#include <loom/comm/shaped.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/data/corpus.hpp>
#include <loom/exec/executor.hpp>
#include <loom/gpt/model.hpp>
#include <loom/kernels/host/gemm.hpp>
#include <loom/parallel/optimus2d.hpp>

#include "degree_list.hpp"
#include "timing.hpp"

namespace {

using loom::comm::ThreadComm;

const loom::gpt::Config config{.layers = 4, .width = 256, .heads = 8, .seq = 128, .vocab = 256};
constexpr std::int64_t batch = 8;
using OneD = loom::Strategy<loom::DataParallel<>, loom::TensorParallel>;
using TwoD = loom::Strategy<loom::DataParallel<>, loom::Optimus2D>;

struct Result {
    std::int64_t parameter_bytes = 0, activation_bytes = 0;
    std::int64_t tp_payload_bytes = 0;
    double tp_wire_bytes = 0;
    double step_ms = 0;
    float loss = 0;
};

using bench::median;

// One run of `steps` steps on t rank threads over communicator type C,
// `wrap` turning each ThreadComm into a C. Rank 0's figures.
template <class S, class C, class Wrap>
Result run(int t, int steps, Wrap wrap) {
    Result result;
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 18, 3, static_cast<int>(config.vocab));
    loom::comm::ThreadWorld(t).run([&](ThreadComm& thread_comm) {
        loom::kernels::host::set_blas_threads(1);
        C world = wrap(std::move(thread_comm));
        loom::comm::Mesh<C> mesh(world, {{"dp", 1}, {"tp", t}});
        auto model = loom::gpt::make_model(config);
        auto exec = loom::exec::Executor<C>::template make<S>(model, mesh, {.micro_batches = 1});
        exec.initialize(7);
        std::vector<std::int32_t> x(static_cast<std::size_t>(batch * config.seq)), y(x.size());
        std::vector<double> ms;
        for (int s = 0; s <= steps; ++s) {  // step 0 warms up
            corpus.batch(3, s, batch, config.seq, x, y);
            if constexpr (requires { world.reset(); }) {
                if (s == steps) world.reset();  // count the last step alone
            }
            mesh.axis("dp").barrier();
            world.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            const float loss = exec.step(loom::Tensor::of(x.data(), {batch, config.seq}),
                                         loom::Tensor::of(y.data(), {batch, config.seq}), 1e-3f);
            if (s > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            if (world.rank() == 0) result.loss = loss;
        }
        if (world.rank() != 0) return;
        const auto report = exec.memory_report();
        result.parameter_bytes = report.parameters;
        result.activation_bytes = report.activations;
        result.step_ms = median(ms);
        if constexpr (requires { world.counts_with_splits(); }) {
            const auto total = mesh.axis("tp").counts_with_splits().total();  // 2D: its row and column groups
            result.tp_payload_bytes = total.bytes;
            result.tp_wire_bytes = total.wire_bytes;
        }
    });
    return result;
}


// Bytes of one Context::alloc of `floats` f32 elements: rounded up to 64.
double alloc_bytes(double floats) { return std::ceil(floats * 4 / 64) * 64; }

// The activation bytes of one micro-batch on one rank: the sum of every
// ctx.alloc in its forward and backward (layers in include/loom/nn). `rows`
// and `width` are this rank's block of the residual stream ([rows, width]),
// `inner` its share of the C features inside attention and the MLP, `heads`
// and `vocab` its heads and classes; `grid`: LayerNorms and the loss are
// cut over an Optimus 2D grid; `vocab_split`: the loss reduces row sums.
double activation_bytes(double rows, double width, double inner, double heads, double vocab, bool grid,
                        bool vocab_split) {
    const double L = static_cast<double>(config.layers), m = rows;
    // LayerNorm: mean, rstd, output; input gradient; on a grid, its backward's row sums.
    const double layernorm = 2 * alloc_bytes(m) + 2 * alloc_bytes(m * width) + (grid ? alloc_bytes(2 * m) : 0);
    const double attention = 2 * alloc_bytes(3 * m * inner)  // qkv; its gradient
                             + 2 * alloc_bytes(m * inner)    // attention output; its gradient (proj's dx)
                             + alloc_bytes(m * heads)        // log-sum-exp [B, H, T]
                             + 2 * alloc_bytes(m * width);   // proj's output; qkv's input gradient
    const double mlp = 4 * alloc_bytes(4 * m * inner)        // fc and GELU outputs; their gradients
                       + 2 * alloc_bytes(m * width);         // proj's output; fc's input gradient
    const double residual = 2 * alloc_bytes(m * width);      // x + f(x); dy + df
    const double block = 2 * layernorm + attention + mlp + 2 * residual;
    const double head = alloc_bytes(m * vocab) + alloc_bytes(m * width);  // logits; input gradient
    const double loss = alloc_bytes(m)                                    // log-sum-exp
                        + (vocab_split ? alloc_bytes(2 * m) : 0)          // row sums, all-reduced
                        + (grid ? alloc_bytes(1) : 0)                     // the mean over the grid column
                        + alloc_bytes(1)                                  // the loss
                        + alloc_bytes(m * vocab);                         // dlogits
    return alloc_bytes(m * width) + L * block + layernorm + head + loss;  // embedding first
}

// Megatron 1D, degree t: rows and the residual stream whole, interiors,
// heads and vocabulary cut t ways.
double activation_bytes_1d(int t) {
    const double td = t, M = static_cast<double>(batch * config.seq), C = static_cast<double>(config.width);
    return activation_bytes(M, C, C / td, static_cast<double>(config.heads) / td,
                            static_cast<double>(config.vocab) / td, false, t > 1);
}

// Optimus 2D, q x q: rows, features, heads and vocabulary all cut q ways.
double activation_bytes_2d(int q) {
    const double qd = q, M = static_cast<double>(batch * config.seq), C = static_cast<double>(config.width);
    return activation_bytes(M / qd, C / qd, C / qd, static_cast<double>(config.heads) / qd,
                            static_cast<double>(config.vocab) / qd, true, true);
}

}  // namespace

template <class S>
std::pair<Result, Result> counted_and_shaped(int t, int steps, double gbit) {
    const Result counted = run<S, loom::comm::Counted<ThreadComm>>(t, steps, [](ThreadComm c) {
        return loom::comm::Counted<ThreadComm>(std::move(c));
    });
    const loom::comm::Links links(t, loom::comm::Link::gbit(gbit, 5e-6));
    const Result shaped = run<S, loom::comm::Shaped<ThreadComm>>(t, steps, [&](ThreadComm c) {
        return loom::comm::Shaped<ThreadComm>(std::move(c), links);
    });
    if (counted.loss != shaped.loss)
        std::printf("    note: the counted and shaped runs ended at losses %.6f and %.6f\n",
                    static_cast<double>(counted.loss), static_cast<double>(shaped.loss));
    return {counted, shaped};
}

void print_header() {
    std::printf("%3s %14s %14s %7s %14s %8s %14s %9s %14s %14s %7s %14s %8s %10s %10s\n", "t", "params B/rank",
                "formula", "ratio", "activations B", "x t=1", "act formula", "act ratio", "tp payload B", "formula",
                "ratio", "tp wire B", "wire/pl", "step ms", "shaped ms");
}

void print_row(int t, const Result& counted, const Result& shaped, double params, double activations_t1,
               double activations, double payload) {
    std::printf("%3d %14lld %14.0f %7.4f %14lld %8.3f %14.0f %9.4f %14lld %14.0f %7.4f %14.0f %8.4f %10.1f %10.1f\n",
                t, static_cast<long long>(counted.parameter_bytes), params * 4,
                static_cast<double>(counted.parameter_bytes) / (params * 4),
                static_cast<long long>(counted.activation_bytes),
                activations_t1 > 0 ? static_cast<double>(counted.activation_bytes) / activations_t1 : 0.0,
                activations, static_cast<double>(counted.activation_bytes) / activations,
                static_cast<long long>(counted.tp_payload_bytes), payload,
                payload > 0 ? static_cast<double>(counted.tp_payload_bytes) / payload : 1.0, counted.tp_wire_bytes,
                counted.tp_payload_bytes > 0 ? counted.tp_wire_bytes / static_cast<double>(counted.tp_payload_bytes)
                                             : 0.0,
                counted.step_ms, shaped.step_ms);
}

int main(int argc, char** argv) {
    std::vector<int> degrees{1, 2, 4}, grids{4};
    int steps = 3;
    double gbit = 100;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "bench_tensor_parallel: %s needs a value\n", flag.c_str());
            return 2;
        }
        const std::string value = argv[++i];
        if (flag == "--degrees") degrees = loom_bench::parse_degree_list("bench_tensor_parallel", "--degrees", value);
        else if (flag == "--grids") grids = loom_bench::parse_degree_list("bench_tensor_parallel", "--grids", value);
        else if (flag == "--steps") steps = std::max(1, std::atoi(value.c_str()));
        else if (flag == "--gbit") gbit = std::atof(value.c_str());
        else {
            std::fprintf(stderr, "bench_tensor_parallel: unknown flag %s; flags are --degrees LIST, --grids LIST (squares), --steps N, --gbit X\n",
                         flag.c_str());
            return 2;
        }
    }
    if (!(gbit > 0)) {
        std::fprintf(stderr, "bench_tensor_parallel: --gbit must be positive\n");
        return 2;
    }
    const double L = static_cast<double>(config.layers), C = static_cast<double>(config.width),
                 V = static_cast<double>(config.vocab), T = static_cast<double>(config.seq), B = static_cast<double>(batch);
    std::printf("GPT layers %lld, width %lld, heads %lld, seq %lld, vocab %lld, batch %lld; Strategy<DataParallel, "
                "TensorParallel or Optimus2D> on t rank threads; %d timed steps\n",
                static_cast<long long>(config.layers), static_cast<long long>(config.width),
                static_cast<long long>(config.heads), static_cast<long long>(config.seq),
                static_cast<long long>(config.vocab), static_cast<long long>(batch), steps);
    for (int t : grids) {
        int q = 1;
        while ((q + 1) * (q + 1) <= t) ++q;
        if (q * q != t || q < 2) {
            std::fprintf(stderr, "bench_tensor_parallel: --grids: %d is not a square grid of 4 or more ranks (4, 9, 16)\n", t);
            return 2;
        }
    }
    std::printf("Megatron 1D (TensorParallel); wire/pl is 2(t-1)/t (ring all-reduces)\n");
    print_header();
    double activations_t1 = 0;
    for (int t : degrees) {
        const auto [counted, shaped] = counted_and_shaped<OneD>(t, steps, gbit);
        const double td = t;
        const double params = L * (12 * C * C + 7 * C) / td + 6 * L * C + 2 * V * C / td + T * C + 2 * C;
        const double payload = t == 1 ? 0 : 4 * (4 * L + 2) * B * T * C + 12 * B * T;
        if (t == 1) activations_t1 = static_cast<double>(counted.activation_bytes);
        print_row(t, counted, shaped, params, activations_t1, activation_bytes_1d(t), payload);
    }
    if (!grids.empty()) {
        std::printf("Optimus 2D (Optimus2D), t = q x q\n");
        print_header();
    }
    for (int t : grids) {
        const auto [counted, shaped] = counted_and_shaped<TwoD>(t, steps, gbit);
        const double q = loom::tp::GridPosition::of(0, t).q, M = B * T;
        const double params = (12 * L * C * C + 2 * V * C) / (q * q) + (13 * L * C + T * C + 2 * C) / q;
        const double payload =
            (L * (27 * M * C + 36 * C * C + 8 * M + 13 * C) + 3 * M * V + 3 * V * C + 2 * M * C + 7 * M + 2 * C) / q +
            1;
        print_row(t, counted, shaped, params, activations_t1, activation_bytes_2d(static_cast<int>(q)), payload * 4);
    }
    std::printf("wire/pl: bytes this rank put on the wire over the payload (ring all-reduce: 2(t-1)/t); shaped: every "
                "tp link %.0f Gbit/s, 5 us latency\n", gbit);
    return 0;
}
