// bench/tensor_parallel: what Megatron 1D and Optimus 2D tensor parallelism
// cost and save, measured on the real GPT through the executor, beside the
// formulas.
//
//   bench_tensor_parallel [--degrees 1,2,4] [--grids 4] [--steps 3] [--gbit 100]
//
// For each 1D tp degree t (ranks are threads of this process):
//   - parameter bytes per rank from loom::memory_report(), beside the formula
//     L (12C^2 + 7C)/t + 6LC + (VC + V)/t + VC/t + TC + 2C floats: every
//     block's qkv, projection and MLP cut 1/t, the row layers' biases and the
//     LayerNorms whole; the token table and the head cut by vocabulary, the
//     position table and the last LayerNorm whole;
//   - activation bytes per rank (the micro-batch context's peak), t = 1
//     beside: attention and MLP interiors shrink by 1/t, the residual stream
//     and the LayerNorms stay whole ("partly replicated");
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
//   - activations: every [B, T, C] tensor is a q^2 block, so 1/q^2 of t = 1
//     beside it (the per-row LayerNorm and loss statistics are 1/q);
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

double median(std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
}

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

std::vector<int> parse_list(const std::string& text) {
    std::vector<int> out;
    std::size_t at = 0;
    while (at <= text.size()) {
        const std::size_t comma = text.find(',', at);
        const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 1 || v > 64) {
            std::fprintf(stderr, "bench_tensor_parallel: --degrees %s: '%s' is not a degree in 1..64\n", text.c_str(), item.c_str());
            std::exit(2);
        }
        out.push_back(static_cast<int>(v));
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    return out;
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
    std::printf("%3s %14s %14s %7s %14s %8s %8s %14s %14s %7s %14s %8s %10s %10s\n", "t", "params B/rank", "formula",
                "ratio", "activations B", "x t=1", "expect", "tp payload B", "formula", "ratio", "tp wire B",
                "wire/pl", "step ms", "shaped ms");
}

void print_row(int t, const Result& counted, const Result& shaped, double params, double activations_t1,
               double activation_share, double payload) {
    const std::string expect = activation_share > 0 ? std::to_string(activation_share).substr(0, 5) : "-";
    std::printf("%3d %14lld %14.0f %7.4f %14lld %8.3f %8s %14lld %14.0f %7.4f %14.0f %8.4f %10.1f %10.1f\n", t,
                static_cast<long long>(counted.parameter_bytes), params * 4,
                static_cast<double>(counted.parameter_bytes) / (params * 4),
                static_cast<long long>(counted.activation_bytes),
                activations_t1 > 0 ? static_cast<double>(counted.activation_bytes) / activations_t1 : 0.0,
                expect.c_str(), static_cast<long long>(counted.tp_payload_bytes), payload,
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
        if (flag == "--degrees") degrees = parse_list(value);
        else if (flag == "--grids") grids = parse_list(value);
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
        const double params = L * (12 * C * C + 7 * C) / td + 6 * L * C + (V * C + V) / td + V * C / td + T * C + 2 * C;
        const double payload = t == 1 ? 0 : 4 * (4 * L + 2) * B * T * C + 12 * B * T;
        if (t == 1) activations_t1 = static_cast<double>(counted.activation_bytes);
        print_row(t, counted, shaped, params, activations_t1, 0, payload);
    }
    if (!grids.empty()) {
        std::printf("Optimus 2D (Optimus2D), t = q x q; expect: activations 1/q^2 of t = 1\n");
        print_header();
    }
    for (int t : grids) {
        const auto [counted, shaped] = counted_and_shaped<TwoD>(t, steps, gbit);
        const double q = loom::tp::GridPosition::of(0, t).q, M = B * T;
        const double params = (12 * L * C * C + 2 * V * C) / (q * q) + (13 * L * C + T * C + 2 * C) / q;
        const double payload =
            (L * (27 * M * C + 36 * C * C + 8 * M + 13 * C) + 3 * M * V + 3 * V * C + 2 * M * C + 7 * M + 2 * C) / q +
            1;
        print_row(t, counted, shaped, params, activations_t1, 1 / (q * q), payload * 4);
    }
    std::printf("wire/pl: bytes this rank put on the wire over the payload (ring all-reduce: 2(t-1)/t); shaped: every "
                "tp link %.0f Gbit/s, 5 us latency\n", gbit);
    return 0;
}
