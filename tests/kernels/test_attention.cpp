// Causal attention (kernels/host/attention.hpp) against a naive double-precision
// reference that builds the full T x T masked softmax, against central finite
// differences of that reference, and for causality, NaN propagation and refusals.
#include <catch2/catch.hpp>

#include "support/attention_shape.hpp"
#include "support/message_of.hpp"

#include <loom/core/error.hpp>
#include <loom/core/rng.hpp>
#include <loom/kernels/host/attention.hpp>
#include <loom/kernels/host/gemm_threads.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::kernels::host::attention_backward;
using loom::kernels::host::attention_forward;

using Shape = loom_test::AttentionShape;
using loom_test::describe;

// T around the tile sizes (32 queries x up to 128 keys): 1, below, at and
// across query-block edges, one and two key tiles with a partial last one.
const std::vector<Shape>& shapes() {
    static const std::vector<Shape> all{
        {2, 1, 3, 16}, {2, 5, 1, 3},  {2, 5, 3, 64},   {2, 32, 1, 16}, {2, 33, 3, 3},
        {2, 70, 1, 64}, {2, 70, 3, 16}, {2, 130, 1, 3}, {2, 130, 3, 64}, {1, 200, 2, 16},
    };
    return all;
}

std::vector<float> normals(std::size_t n, std::uint64_t stream, float stddev = 1.0f) {
    std::vector<float> out(n);
    loom::RngStream(11, stream).fill_normal(out, 0, 0.0f, stddev);
    return out;
}

std::vector<double> widen(std::span<const float> v) { return {v.begin(), v.end()}; }

double max_abs(std::span<const double> v) {
    double m = 0.0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
}

// max |got - want| / max |want|: the error relative to the tensor's scale (an
// elementwise ratio is meaningless where an entry is near 0). `min_scale`
// stands in for a tensor that is exactly 0 in exact arithmetic. A NaN or inf
// in `got` is an infinite error (std::max would skip a NaN).
double relative_error(std::span<const float> got, std::span<const double> want, double min_scale = 0.0) {
    REQUIRE(got.size() == want.size());
    double error = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
        error = std::max(error, std::abs(static_cast<double>(got[i]) - want[i]));
    }
    return error / std::max({max_abs(want), min_scale, std::numeric_limits<double>::min()});
}

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// ----- the naive reference, in double -----------------------------------------

struct Reference {
    std::vector<double> out, lse;
};

// Full T x T scores per head, masked above the diagonal, plain softmax.
Reference reference_forward(const std::vector<double>& qkv, const Shape& s) {
    const std::int64_t C = s.C(), T = s.T, D = s.D;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    Reference ref{std::vector<double>(s.out_size()), std::vector<double>(s.lse_size())};
    std::vector<double> probs(static_cast<std::size_t>(T * T));
    for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t h = 0; h < s.H; ++h) {
            auto q = [&](std::int64_t t, std::int64_t d) { return qkv[((b * T + t) * 3 * C) + h * D + d]; };
            auto k = [&](std::int64_t t, std::int64_t d) { return qkv[((b * T + t) * 3 * C) + C + h * D + d]; };
            auto v = [&](std::int64_t t, std::int64_t d) { return qkv[((b * T + t) * 3 * C) + 2 * C + h * D + d]; };
            for (std::int64_t i = 0; i < T; ++i) {
                double* row = probs.data() + i * T;
                double best = -std::numeric_limits<double>::infinity();
                for (std::int64_t j = 0; j < T; ++j) {
                    double dot = 0.0;
                    for (std::int64_t d = 0; d < D; ++d) dot += q(i, d) * k(j, d);
                    row[j] = j <= i ? dot * scale : -std::numeric_limits<double>::infinity();
                    best = std::max(best, row[j]);
                }
                double sum = 0.0;
                for (std::int64_t j = 0; j < T; ++j) sum += (row[j] = std::exp(row[j] - best));
                for (std::int64_t j = 0; j < T; ++j) row[j] /= sum;
                ref.lse[static_cast<std::size_t>((b * s.H + h) * T + i)] = best + std::log(sum);
                for (std::int64_t d = 0; d < D; ++d) {
                    double acc = 0.0;
                    for (std::int64_t j = 0; j < T; ++j) acc += row[j] * v(j, d);
                    ref.out[static_cast<std::size_t>((b * T + i) * C + h * D + d)] = acc;
                }
            }
        }
    return ref;
}

// The textbook softmax backward on the full T x T matrix: dS = P * (dP -
// rowsum(P * dP)), not FlashAttention's rowsum(dO * O), so the two agree only
// if the kernel's identity and its masking are right.
std::vector<double> reference_backward(const std::vector<double>& qkv, const std::vector<double>& dout,
                                       const Shape& s) {
    const std::int64_t C = s.C(), T = s.T, D = s.D;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<double> dqkv(s.qkv_size(), 0.0);
    std::vector<double> probs(static_cast<std::size_t>(T * T)), dprobs(probs.size());
    for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t h = 0; h < s.H; ++h) {
            auto at = [&](std::int64_t t, std::int64_t part, std::int64_t d) {
                return static_cast<std::size_t>((b * T + t) * 3 * C + part * C + h * D + d);
            };
            auto dout_at = [&](std::int64_t t, std::int64_t d) { return dout[(b * T + t) * C + h * D + d]; };
            for (std::int64_t i = 0; i < T; ++i) {
                double* row = probs.data() + i * T;
                double best = -std::numeric_limits<double>::infinity();
                for (std::int64_t j = 0; j <= i; ++j) {
                    double dot = 0.0;
                    for (std::int64_t d = 0; d < D; ++d) dot += qkv[at(i, 0, d)] * qkv[at(j, 1, d)];
                    row[j] = dot * scale;
                    best = std::max(best, row[j]);
                }
                double sum = 0.0;
                for (std::int64_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] - best));
                for (std::int64_t j = 0; j <= i; ++j) row[j] /= sum;
                for (std::int64_t j = i + 1; j < T; ++j) row[j] = 0.0;
            }
            for (std::int64_t i = 0; i < T; ++i) {
                const double* p = probs.data() + i * T;
                double* dp = dprobs.data() + i * T;
                double p_dot_dp = 0.0;
                for (std::int64_t j = 0; j < T; ++j) {
                    double dot = 0.0;
                    for (std::int64_t d = 0; d < D; ++d) dot += dout_at(i, d) * qkv[at(j, 2, d)];
                    dp[j] = dot;
                    p_dot_dp += p[j] * dot;
                }
                for (std::int64_t j = 0; j < T; ++j) {
                    const double ds = p[j] * (dp[j] - p_dot_dp);
                    for (std::int64_t d = 0; d < D; ++d) {
                        dqkv[at(j, 2, d)] += p[j] * dout_at(i, d);
                        dqkv[at(i, 0, d)] += scale * ds * qkv[at(j, 1, d)];
                        dqkv[at(j, 1, d)] += scale * ds * qkv[at(i, 0, d)];
                    }
                }
            }
        }
    return dqkv;
}

// ----- running the kernel ---------------------------------------------------------

struct Forward {
    std::vector<float> out, lse;
};

// Outputs start as NaN: every element must be written, none read.
Forward run_forward(const std::vector<float>& qkv, const Shape& s) {
    Forward f{std::vector<float>(s.out_size(), std::numeric_limits<float>::quiet_NaN()),
              std::vector<float>(s.lse_size(), std::numeric_limits<float>::quiet_NaN())};
    attention_forward(qkv.data(), f.out.data(), f.lse.data(), s.B, s.T, s.H, s.D);
    return f;
}

std::vector<float> run_backward(const std::vector<float>& qkv, const Forward& f, const std::vector<float>& dout,
                                const Shape& s) {
    std::vector<float> dqkv(s.qkv_size(), std::numeric_limits<float>::quiet_NaN());
    attention_backward(qkv.data(), f.out.data(), dout.data(), f.lse.data(), dqkv.data(), s.B, s.T, s.H, s.D);
    return dqkv;
}


}  // namespace

TEST_CASE("attention_forward matches a double-precision causal softmax", "[attention]") {
    for (const Shape& s : shapes()) {
        INFO(describe(s));
        const std::vector<float> qkv = normals(s.qkv_size(), 1);
        const Forward got = run_forward(qkv, s);
        const Reference want = reference_forward(widen(qkv), s);
        CHECK(relative_error(got.out, want.out) <= 1e-5);
        CHECK(relative_error(got.lse, want.lse) <= 1e-6);
    }
}

TEST_CASE("attention_forward stays accurate when the running max moves far (online softmax)", "[attention]") {
    // Scores that grow by 1/2 per key on top of noise with a spread of ~10:
    // each key tile raises a row's running max by tens, so the rescaling of the
    // running sum and output carries the result, and exp underflows to 0 for
    // most entries. q and k sit on a grid of 1/4 so that every score is exact
    // in float: otherwise the rounding of scores of ~100 alone costs ~1e-5
    // (measured: a naive reference with only q.k in float is off by as much as
    // the kernel), which would hide what this test is after.
    for (const Shape& s : {Shape{2, 130, 2, 16}, Shape{1, 200, 1, 64}}) {
        INFO(describe(s));
        std::vector<float> qkv = normals(s.qkv_size(), 2, 3.0f);
        const auto rows = static_cast<std::size_t>(s.B * s.T);
        const auto row_width = static_cast<std::size_t>(3 * s.C());
        for (std::size_t row = 0; row < rows; ++row) {
            float* q = qkv.data() + row * row_width;
            float* k = q + s.C();
            // A shared direction (each head's first column): queries get +4
            // along it and key t gets t * sqrt(D) / 8, so score(i, t) grows by t / 2.
            const auto t = static_cast<float>(static_cast<std::int64_t>(row) % s.T);
            for (std::int64_t h = 0; h < s.H; ++h) {
                q[h * s.D] += 4.0f;
                k[h * s.D] += t * std::sqrt(static_cast<float>(s.D)) / 8.0f;
            }
            for (std::int64_t c = 0; c < 2 * s.C(); ++c) q[c] = std::round(q[c] * 4.0f) / 4.0f;
        }
        const Forward got = run_forward(qkv, s);
        const Reference want = reference_forward(widen(qkv), s);
        CHECK(relative_error(got.out, want.out) <= 1e-5);
        CHECK(relative_error(got.lse, want.lse) <= 1e-6);
    }
}

TEST_CASE("attention_backward matches the double-precision softmax backward", "[attention]") {
    for (const Shape& s : shapes()) {
        INFO(describe(s));
        const std::vector<float> qkv = normals(s.qkv_size(), 3);
        const std::vector<float> dout = normals(s.out_size(), 4);
        const std::vector<float> got = run_backward(qkv, run_forward(qkv, s), dout, s);
        const std::vector<double> want = reference_backward(widen(qkv), widen(dout), s);
        // Each third (dq, dk, dv) on its own scale: dv is the largest and would
        // hide errors in dq. For T = 1, dq and dk are exactly 0 (a softmax over
        // one key is constant); a tenth of the whole gradient's scale stands in.
        const double whole_scale = max_abs(want);
        for (std::int64_t part = 0; part < 3; ++part) {
            INFO("part " << part << " (0 = dq, 1 = dk, 2 = dv)");
            std::vector<float> got_part;
            std::vector<double> want_part;
            for (std::size_t row = 0; row < static_cast<std::size_t>(s.B * s.T); ++row)
                for (std::int64_t c = 0; c < s.C(); ++c) {
                    const std::size_t i = row * static_cast<std::size_t>(3 * s.C()) + static_cast<std::size_t>(part * s.C() + c);
                    got_part.push_back(got[i]);
                    want_part.push_back(want[i]);
                }
            CHECK(relative_error(got_part, want_part, 0.1 * whole_scale) <= 1e-5);
        }
    }
}

TEST_CASE("attention on 2 and 3 GEMM threads gives the one-thread bits, heads side by side", "[attention]") {
    struct KeepThreads {
        int threads = loom::kernels::host::gemm_threads();
        ~KeepThreads() { loom::kernels::host::set_gemm_threads(threads); }
    } keep;
    for (const Shape& s : shapes()) {
        INFO(describe(s));
        const std::vector<float> qkv = normals(s.qkv_size(), 5);
        const std::vector<float> dout = normals(s.out_size(), 6);
        loom::kernels::host::set_gemm_threads(1);
        const auto forward = run_forward(qkv, s);
        const std::vector<float> backward = run_backward(qkv, forward, dout, s);
        for (int threads : {2, 3}) {
            loom::kernels::host::set_gemm_threads(threads);
            const auto threaded = run_forward(qkv, s);
            CHECK(std::memcmp(threaded.out.data(), forward.out.data(), forward.out.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(threaded.lse.data(), forward.lse.data(), forward.lse.size() * sizeof(float)) == 0);
            const std::vector<float> threaded_backward = run_backward(qkv, threaded, dout, s);
            CHECK(std::memcmp(threaded_backward.data(), backward.data(), backward.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("attention gradient check: central differences of the double reference", "[attention][gradcheck]") {
    // Loss = sum(out * G) for a fixed random G, so dL/dout = G. Central
    // differences (h = 1e-5, truncation error ~h^2) of the double reference
    // check the reference backward tightly and the float kernel to float
    // accuracy.
    const Shape s{2, 5, 2, 3};
    const std::vector<float> qkv = normals(s.qkv_size(), 5);
    const std::vector<float> weights = normals(s.out_size(), 6);
    const std::vector<double> qkv_d = widen(qkv), weights_d = widen(weights);
    auto loss = [&](const std::vector<double>& x) {
        const Reference r = reference_forward(x, s);
        double sum = 0.0;
        for (std::size_t i = 0; i < r.out.size(); ++i) sum += r.out[i] * weights_d[i];
        return sum;
    };
    const double h = 1e-5;
    std::vector<double> numeric(s.qkv_size());
    for (std::size_t i = 0; i < numeric.size(); ++i) {
        std::vector<double> plus = qkv_d, minus = qkv_d;
        plus[i] += h;
        minus[i] -= h;
        numeric[i] = (loss(plus) - loss(minus)) / (2.0 * h);
    }
    const std::vector<double> analytic = reference_backward(qkv_d, weights_d, s);
    double reference_error = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < numeric.size(); ++i) {
        reference_error = std::max(reference_error, std::abs(analytic[i] - numeric[i]));
        scale = std::max(scale, std::abs(numeric[i]));
    }
    CHECK(reference_error / scale <= 1e-8);

    const std::vector<float> kernel = run_backward(qkv, run_forward(qkv, s), weights, s);
    CHECK(relative_error(kernel, numeric) <= 1e-5);
}

TEST_CASE("attention_forward never reads a token after the query", "[attention]") {
    const Shape s{2, 140, 3, 16};
    const std::vector<float> qkv = normals(s.qkv_size(), 7);
    const Forward base = run_forward(qkv, s);
    const std::vector<float> dout = normals(s.out_size(), 8);
    const std::vector<float> dbase = run_backward(qkv, base, dout, s);
    const std::size_t row = static_cast<std::size_t>(3 * s.C());
    // Last tokens kept: inside the first query block, at its end, at the
    // start of the next, at the end and start of the first key tile (128), in
    // the last, partial query block.
    for (std::int64_t kept : {0, 5, 31, 32, 63, 64, 127, 128, 137}) {
        INFO("tokens 0.." << kept << " kept, later ones changed");
        std::vector<float> changed = qkv;
        for (std::int64_t b = 0; b < s.B; ++b)
            for (std::int64_t t = kept + 1; t < s.T; ++t)
                for (std::size_t c = 0; c < row; ++c)
                    changed[static_cast<std::size_t>(b * s.T + t) * row + c] += 3.0f;
        const Forward f = run_forward(changed, s);
        const std::vector<float> df = run_backward(changed, f, dout, s);
        const auto kept_rows = static_cast<std::size_t>(kept + 1);
        bool later_changed = false;
        for (std::int64_t b = 0; b < s.B; ++b) {
            const auto first = static_cast<std::size_t>(b * s.T);
            const auto C = static_cast<std::size_t>(s.C());
            CHECK(same_bits(f.out.data() + first * C, base.out.data() + first * C, kept_rows * C));
            for (std::int64_t h = 0; h < s.H; ++h) {
                const auto lse_first = static_cast<std::size_t>((b * s.H + h) * s.T);
                CHECK(same_bits(f.lse.data() + lse_first, base.lse.data() + lse_first, kept_rows));
            }
            // dq of a token depends on nothing after it either (dk and dv do:
            // later queries look back at them).
            for (std::size_t t = first; t < first + kept_rows; ++t)
                CHECK(same_bits(df.data() + t * row, dbase.data() + t * row, C));
            if (kept + 1 < s.T)
                later_changed |= !same_bits(f.out.data() + (first + kept_rows) * C,
                                            base.out.data() + (first + kept_rows) * C, C);
        }
        // The perturbation is real: the first changed token's output moved.
        if (kept + 1 < s.T) CHECK(later_changed);
    }
}

TEST_CASE("attention passes a NaN on to exactly the queries that see it", "[attention]") {
    const Shape s{1, 70, 1, 16};
    std::vector<float> qkv = normals(s.qkv_size(), 9);
    const std::int64_t poisoned = 40;
    qkv[static_cast<std::size_t>(poisoned * 3 * s.C() + s.C() + 2)] = std::numeric_limits<float>::quiet_NaN();  // a key
    const Forward f = run_forward(qkv, s);
    for (std::int64_t t = 0; t < s.T; ++t) {
        INFO("token " << t);
        const float* row = f.out.data() + t * s.C();
        const bool any_nan = std::any_of(row, row + s.C(), [](float x) { return std::isnan(x); });
        const bool all_finite = std::all_of(row, row + s.C(), [](float x) { return std::isfinite(x); });
        if (t < poisoned)
            CHECK(all_finite);
        else
            CHECK(any_nan);
        CHECK(std::isnan(f.lse[static_cast<std::size_t>(t)]) == (t >= poisoned));
    }
}

TEST_CASE("attention refuses bad shapes and null buffers with one line", "[attention]") {
    std::vector<float> buffer(3 * 4 * 2 * 2, 0.0f), lse(8, 0.0f);
    float* p = buffer.data();
    CHECK(loom_test::message_of([&] { attention_forward(p, p, lse.data(), 1, 2, 0, 2); }) ==
          "attention_forward: head count H = 0 must be >= 1");
    CHECK(loom_test::message_of([&] { attention_forward(p, p, lse.data(), 1, 2, 2, 0); }) ==
          "attention_forward: head size D = 0 must be >= 1");
    CHECK(loom_test::message_of([&] { attention_forward(p, p, lse.data(), -1, 2, 2, 2); }) ==
          "attention_forward: batch size B = -1 must be >= 0");
    CHECK(loom_test::message_of([&] { attention_backward(p, p, p, lse.data(), p, 1, -3, 2, 2); }) ==
          "attention_backward: sequence length T = -3 must be >= 0");
    CHECK(loom_test::message_of([&] { attention_forward(p, p, lse.data(), 1, 2, std::int64_t{1} << 20, 1024); }) ==
          "attention_forward: qkv row width 3*H*D = 3*1048576*1024 exceeds the BLAS's int range (at most 2147483647)");
    CHECK(loom_test::message_of([&] { attention_forward(p, nullptr, lse.data(), 1, 2, 2, 2); }) ==
          "attention_forward: qkv, out and lse must all be non-null for B = 1, T = 2");
    CHECK(loom_test::message_of([&] { attention_backward(p, p, nullptr, lse.data(), p, 1, 2, 2, 2); }) ==
          "attention_backward: qkv, out, dout, lse and dqkv must all be non-null for B = 1, T = 2");
    // Empty batches are a no-op, buffers or not.
    CHECK(loom_test::message_of([&] { attention_forward(nullptr, nullptr, nullptr, 0, 2, 2, 2); }) == "(no error)");
    CHECK(loom_test::message_of([&] { attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, 3, 0, 2, 2); }) == "(no error)");
}

}  // namespace LOOM_TEST_FILE
