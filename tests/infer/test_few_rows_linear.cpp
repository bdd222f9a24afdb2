// infer/few_rows_linear.hpp, the Linear of a decode step or a verification
// pass, at each kernel level this CPU runs: against a double-precision
// reference, and the same bits for a row whether it is multiplied alone,
// among others (every block shape: 1-4 rows, 1-4 columns of the last block,
// a masked tail of k) or on two threads; and the cached engines' matmul_rows
// on both sides of few_rows(), where it hands over to the packed GEMM; and a
// decode step's attention over the paged cache (infer/few_queries_attention.hpp)
// at each level against a double-precision softmax.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "loom/infer/cached_rows.hpp"
#include "loom/infer/few_queries_attention.hpp"
#include "loom/infer/few_rows_linear.hpp"
#include "loom/infer/kv_cache.hpp"
#include "loom/kernels/host/gemm.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

namespace host = loom::kernels::host;

struct KeepHostGemm {
    host::HostGemm before = host::host_gemm();
    int threads = host::gemm_threads();
    ~KeepHostGemm() {
        host::set_host_gemm(before);
        host::set_gemm_threads(threads);
    }
};

std::vector<float> values(std::int64_t n, std::uint32_t seed) {
    std::vector<float> v(static_cast<std::size_t>(n));
    std::uint32_t state = seed * 2654435761u + 1u;
    for (float& x : v) {
        state = state * 1664525u + 1013904223u;
        x = static_cast<float>(state >> 8) / 16777216.0f * 2.0f - 1.0f;
    }
    return v;
}

// Largest |got - x w^T - b| / (1 + |reference|) over [rows, out].
double worst_error(const std::vector<float>& x, const std::vector<float>& w, const float* bias,
                   const std::vector<float>& got, std::int64_t rows, std::int64_t in, std::int64_t out) {
    double worst = 0.0;
    for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t o = 0; o < out; ++o) {
            double sum = bias != nullptr ? bias[o] : 0.0;
            for (std::int64_t i = 0; i < in; ++i)
                sum += static_cast<double>(x[static_cast<std::size_t>(r * in + i)]) * w[static_cast<std::size_t>(o * in + i)];
            worst = std::max(worst, std::abs(sum - got[static_cast<std::size_t>(r * out + o)]) / (1.0 + std::abs(sum)));
        }
    return worst;
}

struct Case {
    std::int64_t rows, in, out;
};

}  // namespace

TEST_CASE("few_rows_linear matches a double loop and gives a row the same bits alone, in a block and on two threads",
          "[infer][few_rows_linear]") {
    KeepHostGemm keep;
    const std::vector<Case> cases{{1, 1, 1},   {1, 16, 4},  {3, 17, 5},   {4, 33, 7},   {5, 256, 768},
                                  {7, 100, 3}, {9, 31, 65}, {13, 384, 9}, {48, 64, 130}, {2, 1536, 12}};
    for (host::CpuIsa isa : {host::CpuIsa::portable, host::CpuIsa::avx2, host::CpuIsa::avx512}) {
        if (!host::cpu_features().runs(isa)) continue;
        host::set_host_gemm({host::HostGemmBackend::loom, isa});
        for (const Case& c : cases)
            for (bool with_bias : {false, true}) {
                CAPTURE(host::name_of(isa), c.rows, c.in, c.out, with_bias);
                const std::vector<float> x = values(c.rows * c.in, 1), w = values(c.out * c.in, 2),
                                         b = values(c.out, 3);
                const float* bias = with_bias ? b.data() : nullptr;
                host::set_gemm_threads(1);
                std::vector<float> together(static_cast<std::size_t>(c.rows * c.out));
                loom::infer::few_rows_linear(x.data(), w.data(), bias, together.data(), c.rows, c.in, c.out);
                CHECK(worst_error(x, w, bias, together, c.rows, c.in, c.out) < 1e-5);
                // Each row alone: the same bits.
                bool same_alone = true;
                std::vector<float> alone(static_cast<std::size_t>(c.out));
                for (std::int64_t r = 0; r < c.rows; ++r) {
                    loom::infer::few_rows_linear(x.data() + r * c.in, w.data(), bias, alone.data(), 1, c.in, c.out);
                    for (std::int64_t o = 0; o < c.out; ++o)
                        same_alone = same_alone && alone[static_cast<std::size_t>(o)] ==
                                                       together[static_cast<std::size_t>(r * c.out + o)];
                }
                CHECK(same_alone);
                // Two threads (each a range of column blocks): the same bits.
                host::set_gemm_threads(2);
                std::vector<float> threaded(together.size());
                loom::infer::few_rows_linear(x.data(), w.data(), bias, threaded.data(), c.rows, c.in, c.out);
                CHECK(threaded == together);
            }
    }
}

TEST_CASE("matmul_rows takes the few-rows path up to few_rows() rows and the packed GEMM past it, both right",
          "[infer][few_rows_linear]") {
    const std::int64_t in = 40, out = 24;
    for (const std::int64_t rows : {loom::infer::few_rows(), loom::infer::few_rows() + 1}) {
        CAPTURE(rows);
        const std::vector<float> x = values(rows * in, 4), w = values(out * in, 5), b = values(out, 6);
        std::vector<float> y(static_cast<std::size_t>(rows * out));
        loom::infer::matmul_rows(x.data(), w.data(), b.data(), y.data(), rows, in, out);
        CHECK(worst_error(x, w, b.data(), y, rows, in, out) < 1e-5);
    }
}

TEST_CASE("a decode step's attention over cached pages matches a double-precision softmax at each level",
          "[infer][few_rows_linear]") {
    KeepHostGemm keep;
    struct Shape {
        std::int64_t H, D, start, count;
    };
    // D 8 takes the portable loops everywhere; D 16 and 64 the AVX-512 blocks where they run (H x D 384:
    // a chunk of 16 output vectors and one of 8; 37 + 3 positions: a partial last page of 16).
    for (const Shape& sh : {Shape{4, 8, 21, 2}, Shape{4, 16, 37, 3}, Shape{6, 64, 37, 3}, Shape{5, 16, 1, 1}})
        for (host::CpuIsa isa : {host::CpuIsa::portable, host::CpuIsa::avx512}) {
            if (!host::cpu_features().runs(isa)) continue;
            host::set_host_gemm({host::HostGemmBackend::loom, isa});
            CAPTURE(host::name_of(isa), sh.H, sh.D, sh.start, sh.count);
            const std::int64_t C = sh.H * sh.D, total = sh.start + sh.count;
            loom::infer::KvCache cache(1, C, 2, 64, 16);
            cache.reserve(1, total);
            const std::vector<float> kv = values(total * 2 * C, 7), q = values(sh.count * 3 * C, 8);
            for (std::int64_t p = 0; p < total; ++p)
                std::copy_n(kv.data() + p * 2 * C, 2 * C, cache.row(0, 1, p));
            std::vector<float> out(static_cast<std::size_t>(sh.count * C)), scores;
            std::vector<const float*> pages;
            loom::infer::attend_few_queries(cache, 0, 1, sh.start, q.data(), 3 * C, sh.count, sh.H, sh.D, out.data(),
                                            scores, pages);
            double worst = 0.0;
            const double scale = 1.0 / std::sqrt(static_cast<double>(sh.D));
            for (std::int64_t t = 0; t < sh.count; ++t)
                for (std::int64_t h = 0; h < sh.H; ++h) {
                    const std::int64_t keys = sh.start + t + 1;
                    std::vector<double> w(static_cast<std::size_t>(keys));
                    double top = -1e300, sum = 0.0;
                    for (std::int64_t p = 0; p < keys; ++p) {
                        double dot = 0.0;
                        for (std::int64_t d = 0; d < sh.D; ++d)
                            dot += static_cast<double>(q[static_cast<std::size_t>(t * 3 * C + h * sh.D + d)]) *
                                   kv[static_cast<std::size_t>(p * 2 * C + h * sh.D + d)];
                        w[static_cast<std::size_t>(p)] = dot * scale;
                        top = std::max(top, dot * scale);
                    }
                    for (double& x : w) sum += (x = std::exp(x - top));
                    for (std::int64_t d = 0; d < sh.D; ++d) {
                        double o = 0.0;
                        for (std::int64_t p = 0; p < keys; ++p)
                            o += w[static_cast<std::size_t>(p)] * kv[static_cast<std::size_t>(p * 2 * C + C + h * sh.D + d)];
                        o /= sum;
                        worst = std::max(worst, std::abs(o - out[static_cast<std::size_t>(t * C + h * sh.D + d)]));
                    }
                }
            CHECK(worst < 1e-5);
        }
}

}  // namespace LOOM_TEST_FILE
