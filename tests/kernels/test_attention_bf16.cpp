// Causal attention at MatmulPrecision::bf16 (kernels/host/attention_bf16.hpp)
// against a double-precision reference that rounds exactly the operands the
// header says it rounds (q, k, v, dO, P and dS; the softmax and D_i in full
// precision). Each test also measures the f32 kernel against the same
// reference: the bf16 kernel must be far closer (measured: 7600 to 96000 times), so a missing or
// misplaced rounding fails (the f32 kernel is within bf16's error of both).
#include <catch2/catch.hpp>

#include "support/attention_shape.hpp"
#include "support/message_of.hpp"

#include <loom/core/dtype.hpp>
#include <loom/core/rng.hpp>
#include <loom/kernels/host/attention.hpp>
#include <loom/kernels/host/attention_bf16.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom_test::AttentionShape;
using loom_test::describe;
namespace host = loom::kernels::host;

double rounded(double x) { return loom::to_float(loom::to_bf16(static_cast<float>(x))); }

std::vector<float> normals(std::size_t n, std::uint64_t stream) {
    std::vector<float> out(n);
    loom::RngStream(23, stream).fill_normal(out, 0, 0.0f, 1.0f);
    return out;
}

struct Reference {
    std::vector<double> out, lse, dqkv;
};

// The bf16 arithmetic of the header, in double: rounded operands, exact
// products and sums, P rounded after exp(s - shift) in the forward, where
// the shift is the row's max rounded up to a multiple of ln 2 (any running
// max's shift gives the same roundings up to a power of two:
// kernels/attention_shape.hpp's bf16_softmax_shift), and after exp(s - lse)
// in the backward, dS rounded after its f32-free formula.
Reference reference(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionShape& s) {
    const std::int64_t B = s.B, T = s.T, H = s.H, D = s.D, C = s.C();
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Reference r{std::vector<double>(s.out_size()), std::vector<double>(s.lse_size()),
                std::vector<double>(s.qkv_size())};
    const auto x = [&](std::int64_t b, std::int64_t t, int part, std::int64_t h, std::int64_t d) {
        return rounded(qkv[static_cast<std::size_t>(((b * T + t) * 3 + part) * C + h * D + d)]);
    };
    const auto at = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t d) {
        return static_cast<std::size_t>((b * T + t) * C + h * D + d);
    };
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < T; ++i) {
                std::vector<double> score(static_cast<std::size_t>(i + 1));
                for (std::int64_t j = 0; j <= i; ++j) {
                    double dot = 0.0;
                    for (std::int64_t d = 0; d < D; ++d) dot += x(b, i, 0, h, d) * x(b, j, 1, h, d);
                    score[static_cast<std::size_t>(j)] = scale * dot;
                }
                const double max = *std::max_element(score.begin(), score.end());
                const double m = std::log(2.0) * std::ceil(max / std::log(2.0));
                double sum = 0.0;
                for (double v : score) sum += std::exp(v - m);
                const double lse = m + std::log(sum);
                r.lse[static_cast<std::size_t>((b * H + h) * T + i)] = lse;
                for (std::int64_t d = 0; d < D; ++d) {
                    double acc = 0.0;
                    for (std::int64_t j = 0; j <= i; ++j)
                        acc += rounded(std::exp(score[static_cast<std::size_t>(j)] - m)) * x(b, j, 2, h, d);
                    r.out[at(b, i, h, d)] = acc / sum;
                }
                // Backward of this query row.
                double di = 0.0;
                for (std::int64_t d = 0; d < D; ++d) di += dout[at(b, i, h, d)] * r.out[at(b, i, h, d)];
                for (std::int64_t j = 0; j <= i; ++j) {
                    const double p = std::exp(score[static_cast<std::size_t>(j)] - lse);
                    double dp = 0.0;
                    for (std::int64_t d = 0; d < D; ++d) dp += rounded(dout[at(b, i, h, d)]) * x(b, j, 2, h, d);
                    const double ds = rounded(p * (dp - di));
                    for (std::int64_t d = 0; d < D; ++d) {
                        const auto grad = [&](std::int64_t t, int part) {
                            return static_cast<std::size_t>(((b * T + t) * 3 + part) * C + h * D + d);
                        };
                        r.dqkv[grad(j, 2)] += rounded(p) * rounded(dout[at(b, i, h, d)]);
                        r.dqkv[grad(i, 0)] += scale * ds * x(b, j, 1, h, d);
                        r.dqkv[grad(j, 1)] += scale * ds * x(b, i, 0, h, d);
                    }
                }
            }
    return r;
}

struct Errors {
    double max = 0.0, mean = 0.0;
};

// |got - want| over the tensor, relative to max |want|.
Errors errors(const std::vector<float>& got, const std::vector<double>& want) {
    REQUIRE(got.size() == want.size());
    double scale = 0.0, worst = 0.0, total = 0.0;
    for (double w : want) scale = std::max(scale, std::abs(w));
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double e = std::abs(static_cast<double>(got[i]) - want[i]);
        worst = std::isfinite(e) ? std::max(worst, e) : std::numeric_limits<double>::infinity();
        total += e;
    }
    return {worst / scale, total / static_cast<double>(got.size()) / scale};
}

struct Run {
    std::vector<float> out, lse, dqkv;
};

// Outputs start as NaN: every element must be written.
template <class Forward, class Backward>
Run run(Forward forward, Backward backward, const std::vector<float>& qkv, const std::vector<float>& dout,
        const AttentionShape& s) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Run r{std::vector<float>(s.out_size(), nan), std::vector<float>(s.lse_size(), nan),
          std::vector<float>(s.qkv_size(), nan)};
    forward(qkv.data(), r.out.data(), r.lse.data(), s.B, s.T, s.H, s.D);
    backward(qkv.data(), r.out.data(), dout.data(), r.lse.data(), r.dqkv.data(), s.B, s.T, s.H, s.D);
    return r;
}

}  // namespace

TEST_CASE("bf16 attention rounds q, k, v, dO, P and dS as its header says, and nothing else",
          "[attention][bf16]") {
    // T across the host's tiles (32 queries x 128 keys): one key tile, and
    // several, where P is rounded at a running max that later moves (by a
    // multiple of ln 2, so that P rounds as at the final max, up to a power
    // of two: measured 6.6e-6 at T = 150, against 2.7e-4 before the shift).
    const std::vector<AttentionShape> shapes{{2, 20, 2, 16}, {1, 70, 3, 8}, {1, 150, 2, 16}};
    for (const AttentionShape& s : shapes) {
        INFO(describe(s));
        const std::vector<float> qkv = normals(s.qkv_size(), 1), dout = normals(s.out_size(), 2);
        const Reference want = reference(qkv, dout, s);
        const Run bf16 = run(host::attention_forward_bf16_inputs, host::attention_backward_bf16_inputs, qkv, dout, s);
        const Run f32 = run(host::attention_forward, host::attention_backward, qkv, dout, s);
        const Errors out = errors(bf16.out, want.out), out_f32 = errors(f32.out, want.out);
        const Errors lse = errors(bf16.lse, want.lse);
        const Errors grad = errors(bf16.dqkv, want.dqkv), grad_f32 = errors(f32.dqkv, want.dqkv);
        INFO("out: max " << out.max << " mean " << out.mean << " (f32 kernel: " << out_f32.mean << ")");
        INFO("dqkv: max " << grad.max << " mean " << grad.mean << " (f32 kernel: " << grad_f32.mean << ")");
        // A P whose exp lands on the other side of a bf16 rounding midpoint
        // than the reference's (f32 against double, ln 2 rounded to f32 in
        // the shift) is one bf16 step away, at most 2^-7 of itself, and so
        // moves out by at most 2^-7 of the largest |v| (P / l <= 1).
        CHECK(out.max < 8e-3);
        CHECK(lse.max < 1e-5);
        CHECK(grad.max < 8e-3);
        // On average far closer than the f32 kernel, which rounds nothing.
        CHECK(out.mean * 1000 < out_f32.mean);
        CHECK(grad.mean * 1000 < grad_f32.mean);
    }
}

TEST_CASE("bf16 attention with q = 0 averages the bf16-rounded values exactly", "[attention][bf16]") {
    // Every score is 0, so every P is exactly 1 and out[t] is the mean of the
    // rounded v over tokens 0..t: only v's rounding shows.
    const AttentionShape s{1, 40, 1, 8};
    std::vector<float> qkv = normals(s.qkv_size(), 3);
    for (std::int64_t t = 0; t < s.T; ++t)
        for (std::int64_t d = 0; d < s.D; ++d) qkv[static_cast<std::size_t>(t * 3 * s.C() + d)] = 0.0f;
    std::vector<float> out(s.out_size()), lse(s.lse_size());
    host::attention_forward_bf16_inputs(qkv.data(), out.data(), lse.data(), s.B, s.T, s.H, s.D);
    for (std::int64_t t = 0; t < s.T; ++t) {
        CHECK(lse[static_cast<std::size_t>(t)] == Approx(std::log(static_cast<double>(t + 1))).epsilon(1e-6));
        for (std::int64_t d = 0; d < s.D; ++d) {
            double mean = 0.0;
            for (std::int64_t j = 0; j <= t; ++j) mean += rounded(qkv[static_cast<std::size_t>(j * 3 * s.C() + 2 * s.C() + d)]);
            mean /= static_cast<double>(t + 1);
            CHECK(out[static_cast<std::size_t>(t * s.C() + d)] == Approx(mean).margin(1e-6));
        }
    }
}

TEST_CASE("bf16 attention checks its arguments with the f32 kernel's messages", "[attention][bf16]") {
    float x[6] = {};
    float lse[2] = {};
    CHECK(loom_test::message_of([&] { host::attention_forward_bf16_inputs(x, x, lse, 1, 2, 2, 0); }) ==
          "attention_forward: head size D = 0 must be >= 1");
    CHECK(loom_test::message_of([&] { host::attention_forward_bf16_inputs(x, nullptr, lse, 1, 2, 2, 2); }) ==
          "attention_forward: qkv, out and lse must all be non-null for B = 1, T = 2");
    CHECK(loom_test::message_of([&] { host::attention_backward_bf16_inputs(x, x, x, lse, x, 1, -3, 2, 2); }) ==
          "attention_backward: sequence length T = -3 must be >= 0");
    CHECK(loom_test::message_of([&] { host::attention_backward_bf16_inputs(x, x, nullptr, lse, x, 1, 2, 2, 2); }) ==
          "attention_backward: qkv, out, dout, lse and dqkv must all be non-null for B = 1, T = 2");
    CHECK(loom_test::message_of([&] { host::attention_forward_bf16_inputs(nullptr, nullptr, nullptr, 0, 2, 2, 2); }) ==
          "(no error)");
}

}  // namespace LOOM_TEST_FILE
