// The host kernels a rank with GEMM threads runs in ranges side by side
// (kernels/host/gemm_threads.hpp: run_in_ranges): LayerNorm's forward and
// input gradient, GELU both ways, and the AdamW update give the one-thread
// bits on 2 and 3 threads, at sizes that split and at sizes that stay on one
// thread (attention: tests/kernels/test_attention.cpp).
#include <catch2/catch.hpp>

#include <loom/core/rng.hpp>
#include <loom/kernels/host/adamw.hpp>
#include <loom/kernels/host/gelu.hpp>
#include <loom/kernels/host/gemm_threads.hpp>
#include <loom/kernels/host/layernorm.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace host = loom::kernels::host;

std::vector<float> normals(std::int64_t n, std::uint64_t stream, float mean = 0.0f) {
    std::vector<float> out(static_cast<std::size_t>(n));
    loom::RngStream(7, stream).fill_normal(out, 0, mean, 1.0f);
    return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct KeepThreads {
    int threads = host::gemm_threads();
    ~KeepThreads() { host::set_gemm_threads(threads); }
};

// Every output of the kernels, run at the current thread count.
std::vector<std::vector<float>> run_all(std::int64_t rows, std::int64_t C) {
    const std::int64_t n = rows * C;
    const auto x = normals(n, 1, 0.5f), gain = normals(C, 2, 1.0f), shift = normals(C, 3), dy = normals(n, 4);
    std::vector<float> y(static_cast<std::size_t>(n)), mean(static_cast<std::size_t>(rows)), rstd(mean.size()),
        dx(y.size()), gelu(y.size()), gelu_grad(y.size());
    host::layernorm_forward(x.data(), gain.data(), shift.data(), y.data(), mean.data(), rstd.data(), rows, C, 1e-5f);
    host::layernorm_backward_input(dy.data(), x.data(), gain.data(), mean.data(), rstd.data(), dx.data(), rows, C);
    host::gelu_forward(x.data(), gelu.data(), n);
    host::gelu_backward(x.data(), dy.data(), gelu_grad.data(), n);
    auto params = normals(n + 5, 5), m = normals(n + 5, 6), v = normals(n + 5, 7);
    for (float& value : v) value *= value;  // a second moment is never negative
    const auto grads = normals(n + 5, 8);
    const host::AdamWScalars s{0.999f, 0.9f, 0.1f, 0.95f, 0.05f, 0.3f, 1e-8f, -1e-3f};
    host::adamw_update(params.data(), grads.data(), m.data(), v.data(), n + 5, s);
    return {y, mean, rstd, dx, gelu, gelu_grad, params, m, v};
}

TEST_CASE("LayerNorm, GELU and AdamW on GEMM threads give the one-thread bits", "[kernels][threads]") {
    const KeepThreads keep;
    // 3 x 7 stays on one thread; 512 x 256 (128 K elements) splits into ranges.
    for (const auto& [rows, C] : {std::pair<std::int64_t, std::int64_t>{3, 7}, {512, 256}, {1000, 33}}) {
        INFO("rows " << rows << ", C " << C);
        host::set_gemm_threads(1);
        const auto one = run_all(rows, C);
        for (int threads : {2, 3}) {
            INFO(threads << " threads");
            host::set_gemm_threads(threads);
            const auto many = run_all(rows, C);
            for (std::size_t i = 0; i < one.size(); ++i) {
                INFO("output " << i);
                CHECK(same_bits(one[i], many[i]));
            }
        }
    }
}

TEST_CASE("run_in_ranges covers every item once, in ranges of at least the grain", "[kernels][threads]") {
    const KeepThreads keep;
    host::set_gemm_threads(3);
    std::vector<int> seen(100, 0);
    std::vector<std::int64_t> lengths(3, 0);
    std::int64_t ranges = 0;
    host::run_in_ranges(100, [&](std::int64_t first, std::int64_t end) {
        for (std::int64_t i = first; i < end; ++i) ++seen[static_cast<std::size_t>(i)];
        lengths[static_cast<std::size_t>(first * 3 / 100)] = end - first;  // ranges are disjoint: no race
    }, 40);
    for (std::int64_t length : lengths) ranges += length > 0 ? 1 : 0;
    CHECK(seen == std::vector<int>(100, 1));
    CHECK(ranges == 2);  // 100 items in ranges of at least 40: two threads, not three
}

}  // namespace LOOM_TEST_FILE
