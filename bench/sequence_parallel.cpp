// bench/sequence_parallel: what sequence parallelism (ring attention and
// Ulysses) costs and saves, measured on the real GPT through the executor,
// beside the formulas.
//
//   bench_sequence_parallel [--seq 8192] [--layers 2] [--width 128] [--heads 8] [--vocab 256]
//                           [--degrees 1,2,4,8] [--cap-mib 64] [--refine 4] [--shaped-degrees 2,4]
//                           [--shaped-seq 2048] [--steps 3] [--gbit 10]
//
// Strategy<DataParallel, SequenceParallel<RingAttention or Ulysses>> on a mesh
// {dp 1, sp N}; ranks are threads of this process; batch 1; every rank passes
// the whole sequence to step() and the executor keeps its positions (zigzag:
// chunks r and 2N-1-r of 2N; contiguous: chunk r of N). B = 1, C width, H
// heads, V vocabulary, L layers; m = B T / N rows on each rank.
//
// 1. Activation bytes per rank (the micro-batch context's peak: every
//    ctx.alloc of one forward and backward, each rounded up to 64 bytes)
//    versus sp at a fixed T (--seq), beside the formula. At sp = 1 the layers
//    run whole (bench_tensor_parallel's formula at t = 1): per block
//    2 LayerNorms (mean, rstd, output, input gradient), attention 2 (3mC) + 6
//    (mC) + mH, MLP 4 (4mC) + 2 (mC), residuals 4 (mC); outside, the
//    embedding, the last LayerNorm, the head's input gradient, logits and
//    their gradient (2 mV), the loss's log-sum-exp (m) and the loss (64 B).
//    Under sp every one of these is over this rank's m rows, and attention
//    adds (replacing the whole layer's mH log-sum-exp):
//      ring: the queries' log-sum-exp (mH), as the whole layer keeps; it reads
//        q and writes its output in place, and the K/V blocks in flight, their
//        gradients and one pair's partial result are scratch of the call,
//        freed when it returns (at most 4 x 2mC + mC at once, not per layer);
//      Ulysses (heads/N heads over the whole T: 3 T C/N = 3mC): the gathered
//        q, k, v (3mC), output (mC) and log-sum-exp (mH), which the backward
//        needs; the all-to-all buffers and the backward's gathered gradients
//        are scratch of the call.
//    Nothing here is held whole: Ulysses' whole-sequence buffers are heads/N
//    of them, 1/N of the bytes. The token ids (4 T bytes, the caller's; the
//    executor copies this rank's 4 T/N) are not activations. So per rank
//    activations are exactly 1/sp of sp = 1's for ring, and (1 + 4mC per
//    layer over the rest) / sp for Ulysses; the 64-byte rounding is the only
//    part that does not scale.
//    Then the longest sequence whose step fits --cap-mib of activations per
//    rank, at sp = 1 and at the largest of --degrees (ring and Ulysses): T
//    doubles from 256 (a multiple of 2 x sp) while a one-step run's measured
//    peak fits; the last T that fit and the first that did not are reported,
//    then --refine bisections between them (multiples of 2 x sp, each a
//    measured step), beside the largest multiple of 2 x sp whose formula
//    fits. The default cap keeps the largest probe at 16K tokens (the causal
//    attention's T^2 work dominates the bench's run time).
// 2. Causal work balance of ring attention, counted exactly: over the N ring
//    steps, rank r's (query chunk, key chunk) pairs, classified by the ring's
//    own ring_detail::pair_of, cost c^2 scores (full), c (c+1)/2 (diagonal)
//    or 0 (skip), c the chunk length. busiest/mean over ranks, contiguous
//    (plain ring: (N-1) c^2 + c(c+1)/2 over (N-1) c^2/2 + c(c+1)/2) against
//    zigzag (every rank 2N c^2 + c: two diagonals and one full pair at step 0,
//    two full pairs at each later step); "lock-step" is the sum over
//    ring steps of the busiest rank's work in that step over the mean total
//    (a step's block waits for the slowest neighbour). Target: zigzag <= 1.05.
// 3. Step time (median of --steps after one warm-up) with every link Shaped
//    to --gbit Gbit/s (10 by default: an inter-node link, where sp's traffic
//    goes) and 5 us latency, the unshaped step beside it, and the
//    bytes per step on the sp axis (comm::Counted: payload counts sends and
//    receives; wire counts sends, and all-to-alls at (N-1)/N), at --shaped-seq,
//    beside the formulas, per layer, m = B T / N:
//      ring     payload 2 (6N - 4) mC floats, wire (6N - 4) mC: the K/V block
//               (2mC) sent N-1 times forward, N-1 times backward, and its
//               gradient (2mC) N times;
//      Ulysses  payload 8 mC floats (q, k, v and the output forward, dout and
//               dqkv backward), wire (N-1)/N of it;
//      U2xring  the hybrid UlyssesRing<2> (sp >= 4): Ulysses within pairs
//               (8 mC, half on the wire), then a ring of R = N/2 over the
//               pair's tokens for half the heads (K/V blocks of 2 mC):
//               payload 8 mC + 2 (6R - 4) mC, wire 4 mC + (6R - 4) mC.
//    Gradients are reduced over dp x sp, a group of its own, not counted here.
// A speed claim is not made here: on 2 cores, N rank threads share the cores.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
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
#include <loom/nn/ring_attention.hpp>
#include <loom/nn/sequence_layout.hpp>
#include <loom/parallel/sequence_parallel.hpp>

#include "degree_list.hpp"
#include "timing.hpp"

namespace {

using loom::comm::ThreadComm;

loom::gpt::Config config{.layers = 2, .width = 128, .heads = 8, .seq = 8192, .vocab = 256};
constexpr std::int64_t batch = 1;
using Ring = loom::Strategy<loom::DataParallel<>, loom::SequenceParallel<loom::RingAttention>>;
using Ulysses = loom::Strategy<loom::DataParallel<>, loom::SequenceParallel<loom::Ulysses>>;
using Hybrid = loom::Strategy<loom::DataParallel<>, loom::SequenceParallel<loom::UlyssesRing<2>>>;

enum class Mode { ring, ulysses, hybrid };  // hybrid: UlyssesRing<2>, Ulysses pairs on a ring of sp/2
const char* name(Mode mode) { return mode == Mode::ring ? "ring" : mode == Mode::ulysses ? "Ulysses" : "U2xring"; }

struct Result {
    std::int64_t activation_bytes = 0;
    std::int64_t sp_payload_bytes = 0;
    double sp_wire_bytes = 0;
    double step_ms = 0;
    float loss = 0;
};

using bench::median;

// One run on n rank threads over communicator type C, `wrap` turning each
// ThreadComm into a C: one warm-up step, then `steps` timed ones (none: the
// warm-up alone, for its memory). Sequences of T tokens. Rank 0's figures.
template <class S, class C, class Wrap>
Result run(int n, std::int64_t T, int steps, Wrap wrap) {
    Result result;
    loom::gpt::Config c = config;
    c.seq = T;
    const auto corpus = loom::data::ByteCorpus::synthetic(std::max<std::int64_t>(1 << 18, 4 * T), 3,
                                                          static_cast<int>(c.vocab));
    loom::comm::ThreadWorld(n).run([&](ThreadComm& thread_comm) {
        loom::kernels::host::set_blas_threads(1);
        C world = wrap(std::move(thread_comm));
        loom::comm::Mesh<C> mesh(world, {{"dp", 1}, {"sp", n}});
        auto model = loom::gpt::make_model(c);
        auto exec = loom::exec::Executor<C>::template make<S>(model, mesh, {.micro_batches = 1});
        exec.initialize(7);
        std::vector<std::int32_t> x(static_cast<std::size_t>(batch * T)), y(x.size());
        std::vector<double> ms;
        for (int s = 0; s <= steps; ++s) {  // step 0 warms up
            corpus.batch(3, s, batch, T, x, y);
            if constexpr (requires { world.reset(); }) {
                if (s == steps) world.reset();  // count the last step alone
            }
            world.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            const float loss =
                exec.step(loom::Tensor::of(x.data(), {batch, T}), loom::Tensor::of(y.data(), {batch, T}), 1e-3f);
            if (s > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            if (world.rank() == 0) result.loss = loss;
        }
        if (world.rank() != 0) return;
        result.activation_bytes = exec.memory_report().activations;
        result.step_ms = median(ms);
        if constexpr (requires { world.counts_with_splits(); }) {
            const auto total = mesh.axis("sp").counts_with_splits().total();
            result.sp_payload_bytes = total.bytes;
            result.sp_wire_bytes = total.wire_bytes;
        }
    });
    return result;
}

template <class C, class Wrap>
Result run_mode(Mode mode, int n, std::int64_t T, int steps, Wrap wrap) {
    if (mode == Mode::hybrid) return run<Hybrid, C>(n, T, steps, wrap);
    return mode == Mode::ring ? run<Ring, C>(n, T, steps, wrap) : run<Ulysses, C>(n, T, steps, wrap);
}

Result plain(Mode mode, int n, std::int64_t T, int steps) {
    return run_mode<ThreadComm>(mode, n, T, steps, [](ThreadComm c) { return c; });
}


std::int64_t parse_int(const char* flag, const std::string& text, std::int64_t lo, std::int64_t hi) {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < lo || v > hi) {
        std::fprintf(stderr, "bench_sequence_parallel: %s %s is not a whole number in %lld..%lld\n", flag,
                     text.c_str(), static_cast<long long>(lo), static_cast<long long>(hi));
        std::exit(2);
    }
    return v;
}

// Bytes of one Context::alloc of `floats` f32 elements: rounded up to 64.
double alloc_bytes(double floats) { return std::ceil(floats * 4 / 64) * 64; }

// The activation bytes of one step on one rank (sequences of T over n sp
// ranks): the sum of every ctx.alloc in the forward and backward (layers in
// include/loom/nn; the sp paths in nn/ring_attention.hpp and
// nn/ulysses_attention.hpp).
double activation_formula(Mode mode, int n, std::int64_t T) {
    const double L = static_cast<double>(config.layers), C = static_cast<double>(config.width),
                 H = static_cast<double>(config.heads), V = static_cast<double>(config.vocab);
    const double m = static_cast<double>(batch * T / n);
    const double layernorm = 2 * alloc_bytes(m) + 2 * alloc_bytes(m * C);  // mean, rstd, output; input gradient
    const double attention_base = 2 * alloc_bytes(3 * m * C)                // qkv; its gradient
                                  + 2 * alloc_bytes(m * C)                  // attention output; proj's dx
                                  + 2 * alloc_bytes(m * C);                 // proj's output; qkv's input gradient
    double attention = attention_base;
    if (n == 1) {
        attention += alloc_bytes(m * H);  // log-sum-exp [B, H, T]
    } else if (mode == Mode::ring) {
        attention += alloc_bytes(m * H);  // log-sum-exp; the K/V blocks in flight are scratch of the call
    } else {
        // The group's q, k, v and output over whole sequences for heads/N
        // heads (3mC and mC), and its log-sum-exp; the all-to-all buffers are scratch.
        attention += alloc_bytes(3 * m * C) + alloc_bytes(m * C) + alloc_bytes(m * H);
    }
    const double mlp = 4 * alloc_bytes(4 * m * C) + 2 * alloc_bytes(m * C);
    const double residual = 2 * alloc_bytes(m * C);
    const double block = 2 * layernorm + attention + mlp + 2 * residual;
    const double head = alloc_bytes(m * V) + alloc_bytes(m * C);                 // logits; input gradient
    const double loss = alloc_bytes(m) + alloc_bytes(1) + alloc_bytes(m * V);    // log-sum-exp, loss, dlogits
    return alloc_bytes(m * C) + L * block + layernorm + head + loss;             // embedding first
}

// Bytes per step on the sp axis: {payload, wire}.
std::pair<double, double> sp_bytes_formula(Mode mode, int n, std::int64_t T) {
    if (n == 1) return {0, 0};
    const double L = static_cast<double>(config.layers), C = static_cast<double>(config.width), nd = n;
    const double mC = static_cast<double>(batch * T / n) * C * 4;
    if (mode == Mode::ring) return {L * 2 * (6 * nd - 4) * mC, L * (6 * nd - 4) * mC};
    if (mode == Mode::hybrid) {
        // Ulysses within pairs (8 mC, half on the wire), then a ring of R = N/2
        // over the pair's tokens for half the heads: K/V blocks of 2 mC, as a
        // ring of R ranks with m tokens each.
        const double R = nd / 2;
        return {L * (8 * mC + 2 * (6 * R - 4) * mC), L * (8 * mC / 2 + (6 * R - 4) * mC)};
    }
    return {L * 8 * mC, L * 8 * mC * (nd - 1) / nd};
}

// Exact attention work of ring attention on each rank (scores computed, a
// diagonal pair's causal half counted with its diagonal), over the N steps.
struct Balance {
    double busiest_over_mean = 0, lockstep_over_mean = 0;
};

Balance ring_balance(int n, bool zigzag, std::int64_t T) {
    const loom::nn::SequenceLayout layout{n, 0, zigzag};
    const std::int64_t c = layout.chunk_length(T);
    const double full = static_cast<double>(c) * static_cast<double>(c);
    const double diagonal = static_cast<double>(c) * static_cast<double>(c + 1) / 2;
    std::vector<double> work(static_cast<std::size_t>(n), 0.0);
    double lockstep = 0;
    for (int step = 0; step < n; ++step) {
        double step_max = 0;
        for (int r = 0; r < n; ++r) {
            const int src = (r - step + n) % n;  // as ring_attention_forward
            const auto mine = layout.runs(T, r);
            const auto theirs = layout.chunks_of(src);
            double w = 0;
            for (int x = 0; x < layout.runs_per_rank(); ++x)
                for (int y = 0; y < layout.runs_per_rank(); ++y) {
                    const auto pair = loom::nn::ring_detail::pair_of(mine[static_cast<std::size_t>(x)].chunk,
                                                                     theirs[static_cast<std::size_t>(y)], true);
                    w += pair == loom::nn::ring_detail::Pair::full       ? full
                         : pair == loom::nn::ring_detail::Pair::diagonal ? diagonal
                                                                        : 0.0;
                }
            work[static_cast<std::size_t>(r)] += w;
            step_max = std::max(step_max, w);
        }
        lockstep += step_max;
    }
    double sum = 0, busiest = 0;
    for (double w : work) {
        sum += w;
        busiest = std::max(busiest, w);
    }
    const double mean = sum / n;
    // Every rank's work together is the causal T (T+1)/2 scores.
    const double whole = static_cast<double>(T) * static_cast<double>(T + 1) / 2;
    if (std::abs(sum - whole) > 0.5) std::printf("    note: the pairs count %.0f scores, not T(T+1)/2 = %.0f\n", sum, whole);
    return {busiest / mean, lockstep / mean};
}

// The longest T (doubling from 256, a multiple of 2 n) whose one-step
// activation peak per rank fits `cap` bytes (0 when none does), then
// `refine` bisections between it and the first T over, on multiples of 2 n.
struct Fit {
    std::int64_t T = 0, bytes = 0, first_over = 0, over_bytes = 0, refined_T = 0, refined_bytes = 0, formula_T = 0;
};

Fit longest_fit(Mode mode, int n, double cap, int refine, std::int64_t limit) {
    Fit fit;
    const std::int64_t unit = 2 * static_cast<std::int64_t>(n);
    for (std::int64_t T = (256 + unit - 1) / unit * unit; T <= limit; T *= 2) {
        const Result r = plain(mode, n, T, 0);
        if (static_cast<double>(r.activation_bytes) > cap) {
            fit.first_over = T;
            fit.over_bytes = r.activation_bytes;
            break;
        }
        fit.T = T;
        fit.bytes = r.activation_bytes;
    }
    fit.refined_T = fit.T;
    fit.refined_bytes = fit.bytes;
    std::int64_t over = fit.first_over;
    for (int probe = 0; probe < refine && fit.refined_T > 0 && over > 0; ++probe) {
        const std::int64_t mid = (fit.refined_T + over) / 2 / unit * unit;
        if (mid <= fit.refined_T || mid >= over) break;
        const Result r = plain(mode, n, mid, 0);
        if (static_cast<double>(r.activation_bytes) > cap) {
            over = mid;
        } else {
            fit.refined_T = mid;
            fit.refined_bytes = r.activation_bytes;
        }
    }
    // The formula is increasing in T: the largest multiple of 2n under the cap.
    std::int64_t lo = 0, hi = limit / unit;
    while (lo < hi) {
        const std::int64_t mid = (lo + hi + 1) / 2;
        if (activation_formula(mode, n, mid * unit) <= cap) lo = mid;
        else hi = mid - 1;
    }
    fit.formula_T = lo * unit;
    return fit;
}

double mib(double bytes) { return bytes / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
    std::vector<int> degrees{1, 2, 4, 8}, shaped_degrees{2, 4};
    std::int64_t seq = 8192, shaped_seq = 2048, cap_mib = 64;
    int steps = 3, refine = 4;
    double gbit = 10;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "bench_sequence_parallel: %s needs a value\n", flag.c_str());
            return 2;
        }
        const std::string value = argv[++i];
        if (flag == "--degrees") degrees = loom_bench::parse_degree_list("bench_sequence_parallel", "--degrees", value);
        else if (flag == "--shaped-degrees") shaped_degrees = loom_bench::parse_degree_list("bench_sequence_parallel", "--shaped-degrees", value);
        else if (flag == "--seq") seq = parse_int("--seq", value, 2, 1 << 20);
        else if (flag == "--shaped-seq") shaped_seq = parse_int("--shaped-seq", value, 2, 1 << 20);
        else if (flag == "--layers") config.layers = parse_int("--layers", value, 1, 1024);
        else if (flag == "--width") config.width = parse_int("--width", value, 1, 65536);
        else if (flag == "--heads") config.heads = parse_int("--heads", value, 1, 65536);
        else if (flag == "--vocab") config.vocab = parse_int("--vocab", value, 2, 1 << 24);
        else if (flag == "--cap-mib") cap_mib = parse_int("--cap-mib", value, 0, 1 << 20);
        else if (flag == "--refine") refine = static_cast<int>(parse_int("--refine", value, 0, 20));
        else if (flag == "--steps") steps = static_cast<int>(parse_int("--steps", value, 1, 1000));
        else if (flag == "--gbit") gbit = std::atof(value.c_str());
        else {
            std::fprintf(stderr, "bench_sequence_parallel: unknown flag %s; flags are --seq T, --layers L, --width C, "
                         "--heads H, --vocab V, --degrees LIST, --cap-mib MIB (0: no search), --refine N, --shaped-degrees LIST, "
                         "--shaped-seq T, --steps N, --gbit X\n", flag.c_str());
            return 2;
        }
    }
    if (!(gbit > 0)) {
        std::fprintf(stderr, "bench_sequence_parallel: --gbit must be positive\n");
        return 2;
    }
    if (config.width % config.heads != 0) {
        std::fprintf(stderr, "bench_sequence_parallel: --heads %lld does not divide --width %lld\n",
                     static_cast<long long>(config.heads), static_cast<long long>(config.width));
        return 2;
    }
    for (const auto& [flag, list, seq_flag, T] : {std::tuple{"--degrees", &degrees, "--seq", seq},
                                                  std::tuple{"--shaped-degrees", &shaped_degrees, "--shaped-seq", shaped_seq}})
        for (int n : *list)
            if (T % (2 * n) != 0) {
                std::fprintf(stderr, "bench_sequence_parallel: %s %lld does not split into the 2 x %d zigzag chunks of "
                             "sp %d (%s); use a multiple of %d\n", seq_flag, static_cast<long long>(T), n, n, flag, 2 * n);
                return 2;
            }
    const int largest = *std::max_element(degrees.begin(), degrees.end());
    std::printf("GPT layers %lld, width %lld, heads %lld, vocab %lld, batch %lld; Strategy<DataParallel, "
                "SequenceParallel<RingAttention or Ulysses>> (zigzag) on a mesh {dp 1, sp N} of rank threads\n",
                static_cast<long long>(config.layers), static_cast<long long>(config.width),
                static_cast<long long>(config.heads), static_cast<long long>(config.vocab),
                static_cast<long long>(batch));

    // 1. Activations per rank versus sp, fixed T.
    std::printf("\n1. Activation bytes per rank, T = %lld tokens (one step each); x sp=1 beside 1/sp, and x sp=1 "
                "times sp (1.000 when exactly 1/sp)\n", static_cast<long long>(seq));
    std::printf("%8s %3s %14s %14s %9s %9s %8s %11s\n", "mode", "sp", "activations B", "formula", "act ratio",
                "x sp=1", "1/sp", "x sp=1 *sp");
    double at_one = 0;
    for (int n : degrees)
        if (n == 1) at_one = static_cast<double>(plain(Mode::ring, 1, seq, 0).activation_bytes);
    if (at_one == 0) at_one = activation_formula(Mode::ring, 1, seq);  // sp = 1 not run: the formula's
    for (Mode mode : {Mode::ring, Mode::ulysses})
        for (int n : degrees) {
            if (mode == Mode::ulysses && (n == 1 || config.heads % n != 0)) {
                if (n != 1)
                    std::printf("%8s %3d   (the %lld heads do not split over %d ranks)\n", name(mode), n,
                                static_cast<long long>(config.heads), n);
                continue;
            }
            const double bytes = n == 1 ? at_one : static_cast<double>(plain(mode, n, seq, 0).activation_bytes);
            const double formula = activation_formula(mode, n, seq);
            std::printf("%8s %3d %14.0f %14.0f %9.4f %9.4f %8.4f %11.3f\n", n == 1 ? "whole" : name(mode), n, bytes,
                        formula, bytes / formula, bytes / at_one, 1.0 / n, bytes / at_one * n);
        }

    if (cap_mib > 0) {
        const double cap = static_cast<double>(cap_mib) * (1 << 20);
        std::printf("\n   Longest sequence within %lld MiB of activations per rank (T doubling from 256, then "
                    "bisected; one step each)\n", static_cast<long long>(cap_mib));
        std::printf("%8s %3s %10s %8s %10s %8s %10s %8s %10s %12s\n", "mode", "sp", "doubled T", "MiB", "next T",
                    "MiB", "refined T", "MiB", "formula T", "x sp=1 T");
        std::vector<std::pair<Mode, int>> searches{{Mode::ring, 1}};
        if (largest > 1) searches.emplace_back(Mode::ring, largest);
        if (largest > 1 && config.heads % largest == 0) searches.emplace_back(Mode::ulysses, largest);
        std::int64_t whole_T = 0;
        for (const auto& [mode, n] : searches) {
            const Fit fit = longest_fit(mode, n, cap, refine, std::int64_t{1} << 20);
            if (n == 1) whole_T = fit.refined_T;
            std::printf("%8s %3d %10lld %8.1f %10lld %8.1f %10lld %8.1f %10lld", n == 1 ? "whole" : name(mode), n,
                        static_cast<long long>(fit.T), mib(static_cast<double>(fit.bytes)),
                        static_cast<long long>(fit.first_over), mib(static_cast<double>(fit.over_bytes)),
                        static_cast<long long>(fit.refined_T), mib(static_cast<double>(fit.refined_bytes)),
                        static_cast<long long>(fit.formula_T));
            if (whole_T > 0) std::printf(" %12.2f", static_cast<double>(fit.refined_T) / static_cast<double>(whole_T));
            std::printf("\n");
        }
        std::printf("   refined: %d bisections on multiples of 2 x sp between the doubled T and the next; x sp=1 T: "
                    "refined T over sp=1's\n", refine);
    }

    // 2. Causal work balance.
    std::printf("\n2. Ring attention's causal work, busiest rank over the mean (exact counts of scores, T = %lld; "
                "target zigzag <= 1.05)\n", static_cast<long long>(seq));
    std::printf("%3s %14s %14s %14s %14s\n", "sp", "contiguous", "lock-step", "zigzag", "lock-step");
    for (int n : degrees) {
        if (n == 1) continue;
        const Balance plain_ring = ring_balance(n, false, seq), zigzag = ring_balance(n, true, seq);
        std::printf("%3d %14.4f %14.4f %14.4f %14.4f\n", n, plain_ring.busiest_over_mean,
                    plain_ring.lockstep_over_mean, zigzag.busiest_over_mean, zigzag.lockstep_over_mean);
    }

    // 3. Step time and bytes on the sp axis.
    std::printf("\n3. Step time (median of %d after a warm-up) and bytes per step on the sp axis, T = %lld; "
                "shaped: every link %.0f Gbit/s, 5 us latency\n", steps, static_cast<long long>(shaped_seq), gbit);
    std::printf("%8s %3s %14s %14s %7s %14s %14s %7s %10s %10s\n", "mode", "sp", "sp payload B", "formula", "ratio",
                "sp wire B", "formula", "ratio", "step ms", "shaped ms");
    for (int n : shaped_degrees)
        for (Mode mode : {Mode::ring, Mode::ulysses, Mode::hybrid}) {
            if (mode == Mode::ulysses && config.heads % n != 0) {
                std::printf("%8s %3d   (the %lld heads do not split over %d ranks)\n", name(mode), n,
                            static_cast<long long>(config.heads), n);
                continue;
            }
            if (mode == Mode::hybrid && (n < 4 || n % 2 != 0 || config.heads % 2 != 0)) continue;  // 2 x a ring of 2+
            const Result counted = run_mode<loom::comm::Counted<ThreadComm>>(
                mode, n, shaped_seq, steps, [](ThreadComm c) { return loom::comm::Counted<ThreadComm>(std::move(c)); });
            const loom::comm::Links links(n, loom::comm::Link::gbit(gbit, 5e-6));
            const Result shaped = run_mode<loom::comm::Shaped<ThreadComm>>(
                mode, n, shaped_seq, steps,
                [&](ThreadComm c) { return loom::comm::Shaped<ThreadComm>(std::move(c), links); });
            if (counted.loss != shaped.loss)
                std::printf("    note: the counted and shaped runs ended at losses %.6f and %.6f\n",
                            static_cast<double>(counted.loss), static_cast<double>(shaped.loss));
            const auto [payload, wire] = sp_bytes_formula(mode, n, shaped_seq);
            std::printf("%8s %3d %14lld %14.0f %7.4f %14.0f %14.0f %7.4f %10.1f %10.1f\n", name(mode), n,
                        static_cast<long long>(counted.sp_payload_bytes), payload,
                        payload > 0 ? static_cast<double>(counted.sp_payload_bytes) / payload : 1.0,
                        counted.sp_wire_bytes, wire, wire > 0 ? counted.sp_wire_bytes / wire : 1.0, counted.step_ms,
                        shaped.step_ms);
        }
    std::printf("payload: bytes passed to the sp axis's ops on rank 0 (sends and receives; all-to-alls' send buffer); "
                "wire: bytes it sent (all-to-all (N-1)/N)\n");
    return 0;
}
