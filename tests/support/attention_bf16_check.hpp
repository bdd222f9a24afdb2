// How a bf16 attention kernel is judged against the host's bf16 emulation
// (kernels/host/attention_bf16.hpp), shared by the CUDA test
// (tests/cuda/test_kernels_attention_bf16.cu) and the simulated one
// (tests/simulated/test_attention_mma_simulated.cpp) so that both hold the
// kernels to the same tolerances. CUDA-free. Per tensor:
//   out:         8e-3 of max |v| for any element, and 1e-4 of it on average.
//                Both sides round the same operands and shift P by multiples
//                of ln 2 (bf16_softmax_shift), so their key tiles round P
//                alike up to a power of two; they differ in the order of the
//                sums, which can move a P across a bf16 midpoint, one bf16
//                step, at most 2^-7 of itself: out, with weights P / l <= 1 on
//                rows of v, then moves by at most 2^-7 max |v|.
//   lse:         1e-5 of max(1, max |lse|): f32 softmax sums on both sides.
//   dq, dk, dv:  8e-3 of max(max |part|, 0.1 max |dqkv|) for any element and
//                1e-4 of it on average, the kernel's backward run from the
//                host's out and lse (so both form the same D_i): it rounds
//                P = exp(S - lse) and dS at the same reference as the host,
//                so only an f32 difference that crosses a bf16 rounding
//                boundary (rare) moves a term by a bf16 step.
//   And the kernel must be at least `closer` times closer, on average, to the
//   host's bf16 emulation than to the host's f32 kernel: 10 on a GPU, where
//   the tensor cores sum in their own order (a rounding left out fails that);
//   1000 in the simulation, whose sums differ from the host's only in order
//   (measured 2900 to 55000 times closer), so that a rounding misplaced (dS
//   from a rounded P, say), which moves results by about a bf16 step, fails too.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/kernels/host/attention.hpp"
#include "loom/kernels/host/attention_bf16.hpp"
#include "attention_shape.hpp"

namespace loom_test {

struct AttentionResults {
    std::vector<float> out, lse, dqkv;
};

// The host's forward, then its backward from that forward's out and lse.
template <class Forward, class Backward>
AttentionResults host_attention(Forward forward, Backward backward, const std::vector<float>& qkv,
                                const std::vector<float>& dout, const AttentionShape& s) {
    AttentionResults r{std::vector<float>(s.out_size()), std::vector<float>(s.lse_size()),
                       std::vector<float>(s.qkv_size())};
    forward(qkv.data(), r.out.data(), r.lse.data(), s.B, s.T, s.H, s.D);
    backward(qkv.data(), r.out.data(), dout.data(), r.lse.data(), r.dqkv.data(), s.B, s.T, s.H, s.D);
    return r;
}

struct Difference {
    double max = 0.0, mean = 0.0;  // NaN anywhere: infinite
};

inline Difference difference(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    Difference d;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double e = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
        if (!std::isfinite(e)) return {INFINITY, INFINITY};
        d.max = std::max(d.max, e);
        d.mean += e;
    }
    d.mean /= static_cast<double>(std::max<std::size_t>(1, a.size()));
    return d;
}

// Within `bound` everywhere, within `bound` / 80 on average, and at least
// `closer` times closer on average to the bf16 emulation than to the f32 kernel.
inline void check_bf16_tensor(const char* what, const std::vector<float>& got, const std::vector<float>& bf16,
                              const std::vector<float>& f32, double bound, double closer) {
    const Difference to_bf16 = difference(got, bf16), to_f32 = difference(got, f32);
    INFO(what << ": |kernel - host bf16| max " << to_bf16.max << " mean " << to_bf16.mean
              << "; |kernel - host f32| mean " << to_f32.mean << "; bound " << bound);
    CHECK(to_bf16.max <= bound);
    CHECK(to_bf16.mean <= bound / 80);
    CHECK(to_bf16.mean * closer <= to_f32.mean);
}

// Every output of a kernel's run (its backward from `bf16`'s out and lse)
// against the host's bf16 emulation `bf16` and f32 kernel `f32`.
inline void check_bf16_attention(const AttentionResults& got, const AttentionResults& bf16,
                                 const AttentionResults& f32, const std::vector<float>& qkv, const AttentionShape& s,
                                 double closer = 10) {
    check_bf16_tensor("out", got.out, bf16.out, f32.out, 8e-3 * largest_magnitude(qkv_part(qkv, s, 2)), closer);
    const Difference lse = difference(got.lse, bf16.lse);
    INFO("lse: max |kernel - host| " << lse.max);
    CHECK(lse.max <= 1e-5 * std::max(1.0, largest_magnitude(bf16.lse)));
    const double whole = largest_magnitude(bf16.dqkv);
    const char* names[] = {"dq", "dk", "dv"};
    for (std::int64_t part = 0; part < 3; ++part) {
        const std::vector<float> want = qkv_part(bf16.dqkv, s, part);
        check_bf16_tensor(names[part], qkv_part(got.dqkv, s, part), want, qkv_part(f32.dqkv, s, part),
                          8e-3 * std::max(largest_magnitude(want), 0.1 * whole), closer);
    }
}

// The CUDA test's shapes: odd sizes, every head-size class (32, 64, 128
// columns), T past a tile and long.
inline constexpr AttentionShape bf16_attention_shapes[] = {
    {1, 7, 1, 4}, {2, 33, 3, 16}, {2, 128, 4, 64}, {1, 257, 2, 32}, {1, 1024, 1, 64},
    {2, 5, 1, 3}, {1, 45, 2, 33}, {2, 70, 2, 97},  {1, 96, 2, 128}};

}  // namespace loom_test
