// The CUDA attention kernels of kernels/cuda/attention.cuh against their host
// twin in kernels/host/attention.hpp, on the same seeded inputs (q, k, v and
// dout drawn from N(0, 1)): the forward's out and log-sum-exp, the backward's
// dq, dk and dv; causality, NaN propagation, determinism, the stream, and the
// argument errors word for word. Tolerances, per tensor (stated again where
// they are checked):
//   out:         1e-5 of max |host out|. Both sides evaluate the same formulas
//                in f32 and differ in the summation order of the D-term dot
//                products and of the sums over keys (the host's BLAS and 8-lane
//                dots, the device's sequential fmaf and warp butterflies), in
//                exp (the host's degree-5 polynomial, <= 3 ulp; expf, <= 2 ulp)
//                and in FMA contraction. A score's rounding error is ~sqrt(D)
//                ulp of the scaled dot products' magnitude (O(1) here): a few
//                1e-7, which moves each p by that much of itself; out is a
//                convex combination of rows of v, so the difference is ~1e-6
//                of its scale. The host's own test holds it within 1e-5 of a
//                double-precision reference; 1e-5 keeps that bound here.
//   lse:         1e-5 of max(1, max |host lse|). lse = max + log(sum): its
//                error is absolute (the relative error of the sum, ~1e-6 at
//                T = 1024), whatever its size, and lse may be near 0.
//   dq, dk, dv:  2e-5 of max(max |host part|, 0.1 max |host dqkv|), each part
//                on its own scale (dv is the largest and would hide dq). They
//                are sums over up to T terms of P and dS = P (dP - D_i),
//                which cancels; the host's test holds each within 1e-5 of the
//                double reference with the same floor, the device follows the
//                same formulas with the same error bound, so the two agree
//                within twice that. The floor: at T = 1, dq and dk are 0 in
//                exact arithmetic and both sides return rounding noise.
// Causality, determinism and the stream are checked bit for bit.
//
// They passed on an H200 in every GPU run so far (docs/cuda.md); without a
// device (here and in CI) they compile, and skip with exit 77.
#include <catch2/catch.hpp>

#include "../support/attention_shape.hpp"
#include "../support/message_of.hpp"
#include "device_support.hpp"
#include "loom/core/check_cuda.hpp"
#include "loom/kernels/cuda/attention.cuh"
#include "loom/kernels/host/attention.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

namespace dev = loom::kernels::cuda;
namespace host = loom::kernels::host;
using loom_test::compare_floats;
using loom_test::DeviceArray;
using loom_test::describe;
using loom_test::largest_magnitude;
using loom_test::qkv_part;
using loom_test::message_of;
using loom_test::Mismatches;
using loom_test::normal_values;
using loom_test::Stream;
using loom_test::uploads_done;

using Shape = loom_test::AttentionShape;

struct Inputs {
    std::vector<float> qkv, dout;
};

Inputs inputs_for(const Shape& s, std::uint32_t seed) {
    std::mt19937 rng(seed);
    Inputs in;
    in.qkv = normal_values(s.qkv_size(), rng);
    in.dout = normal_values(s.out_size(), rng);
    return in;
}

// What a forward and a backward produce.
struct Results {
    std::vector<float> out, lse, dqkv;
};

Results host_run(const Inputs& in, const Shape& s) {
    Results r{std::vector<float>(s.out_size()), std::vector<float>(s.lse_size()), std::vector<float>(s.qkv_size())};
    host::attention_forward(in.qkv.data(), r.out.data(), r.lse.data(), s.B, s.T, s.H, s.D);
    host::attention_backward(in.qkv.data(), r.out.data(), in.dout.data(), r.lse.data(), r.dqkv.data(), s.B, s.T, s.H,
                             s.D);
    return r;
}

// The device's forward, then its backward from its own out and lse. Every
// output starts as NaN bytes (0xff): each element must be written.
Results device_run(const Inputs& in, const Shape& s, cudaStream_t stream = nullptr) {
    DeviceArray<float> qkv(in.qkv), dout(in.dout), out(s.out_size()), lse(s.lse_size()), dqkv(s.qkv_size());
    out.fill_bytes(0xff);
    lse.fill_bytes(0xff);
    dqkv.fill_bytes(0xff);
    if (stream != nullptr) uploads_done();
    dev::attention_forward(qkv.get(), out.get(), lse.get(), s.B, s.T, s.H, s.D, stream);
    dev::attention_backward(qkv.get(), out.get(), dout.get(), lse.get(), dqkv.get(), s.B, s.T, s.H, s.D, stream);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    return {out.to_host(), lse.to_host(), dqkv.to_host()};
}

// |device - host| <= allowed for every element (NaN never passes), and the
// largest difference seen, for the report.
Mismatches within(const std::vector<float>& device, const std::vector<float>& reference, double allowed,
                  double& largest) {
    Mismatches bad;
    largest = 0.0;
    if (device.size() != reference.size()) {
        bad.add("sizes differ");
        return bad;
    }
    for (std::size_t i = 0; i < reference.size(); ++i) {
        const double error = std::fabs(static_cast<double>(device[i]) - static_cast<double>(reference[i]));
        if (!(error <= allowed))
            bad.add("element " + std::to_string(i) + ": device " + std::to_string(device[i]) + ", host " +
                    std::to_string(reference[i]) + ", allowed " + std::to_string(allowed));
        else
            largest = std::max(largest, error);
    }
    return bad;
}

// One CHECK per tensor, reporting the largest difference that agreed.
#define CHECK_WITHIN(what, device, reference, allowed)                                           \
    do {                                                                                         \
        double largest_ = 0.0;                                                                   \
        const double allowed_ = (allowed);                                                       \
        const ::loom_test::Mismatches bad_ = within((device), (reference), allowed_, largest_);  \
        INFO(what << ": largest agreeing |device - host| " << largest_ << " of " << allowed_);   \
        CHECK_NO_MISMATCHES(what, bad_);                                                         \
    } while (false)

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// T = 1; D = 1; T and D not multiples of the 32-row tiles or of 4 (the float4
// dots); one, two and many tiles; every tile width (D <= 32, 64, 128).
const Shape shapes[] = {{1, 1, 1, 1},    {1, 7, 1, 4},   {2, 33, 3, 16},  {2, 128, 4, 64}, {1, 257, 2, 32},
                        {1, 1024, 1, 64}, {2, 5, 1, 3},   {1, 45, 2, 33},  {2, 70, 2, 97},  {1, 96, 2, 128}};

}  // namespace

TEST_CASE("CUDA attention forward and backward match the host kernel", "[kernels][attention]") {
    // Tolerances (see the top of the file): out 1e-5 of max |out|; lse 1e-5
    // of max(1, max |lse|); dq, dk, dv 2e-5 of max(max |part|, 0.1 max |dqkv|).
    std::uint32_t seed = 1201;
    for (const Shape& s : shapes) {
        INFO(describe(s));
        const Inputs in = inputs_for(s, seed++);
        const Results want = host_run(in, s);
        const Results got = device_run(in, s);

        CHECK_WITHIN("out", got.out, want.out, 1e-5 * largest_magnitude(want.out));
        CHECK_WITHIN("lse", got.lse, want.lse, 1e-5 * std::max(1.0, largest_magnitude(want.lse)));
        const double whole = largest_magnitude(want.dqkv);
        const char* names[] = {"dq", "dk", "dv"};
        for (std::int64_t part = 0; part < 3; ++part) {
            const std::vector<float> want_part = qkv_part(want.dqkv, s, part);
            CHECK_WITHIN(names[part], qkv_part(got.dqkv, s, part), want_part,
                         2e-5 * std::max(largest_magnitude(want_part), 0.1 * whole));
        }
    }
}

TEST_CASE("CUDA attention is deterministic and runs on the caller's stream", "[kernels][attention]") {
    // Bit for bit: no atomics, every sum in an order fixed by the shape.
    const Shape s{2, 130, 3, 64};
    const Inputs in = inputs_for(s, 1211);
    const Results first = device_run(in, s);
    const Results again = device_run(in, s);
    Stream stream(cudaStreamNonBlocking);
    const Results streamed = device_run(in, s, stream.get());
    for (const Results* other : {&again, &streamed}) {
        CHECK_NO_MISMATCHES("out", compare_floats(other->out, first.out, false));
        CHECK_NO_MISMATCHES("lse", compare_floats(other->lse, first.lse, false));
        CHECK_NO_MISMATCHES("dqkv", compare_floats(other->dqkv, first.dqkv, false));
    }
}

TEST_CASE("CUDA attention never reads a token after the query", "[kernels][attention]") {
    // Bit for bit: a masked key's score is computed but replaced by -inf (its
    // p by 0) before any sum, and its value row is skipped.
    const Shape s{2, 140, 3, 16};
    const Inputs base_in = inputs_for(s, 1221);
    const Results base = device_run(base_in, s);
    const auto row = static_cast<std::size_t>(3 * s.C());
    const auto C = static_cast<std::size_t>(s.C());
    // Last tokens kept: inside the first tile, at its end, at the start of the
    // next, at tile edges further on, in the last, partial tile.
    for (const std::int64_t kept : {0, 5, 31, 32, 63, 64, 127, 128, 137}) {
        INFO("tokens 0.." << kept << " kept, later ones changed");
        Inputs changed = base_in;
        for (std::int64_t b = 0; b < s.B; ++b)
            for (std::int64_t t = kept + 1; t < s.T; ++t)
                for (std::size_t c = 0; c < row; ++c)
                    changed.qkv[static_cast<std::size_t>(b * s.T + t) * row + c] += 3.0f;
        const Results got = device_run(changed, s);
        const auto kept_rows = static_cast<std::size_t>(kept + 1);
        bool later_changed = false;
        for (std::int64_t b = 0; b < s.B; ++b) {
            const auto first = static_cast<std::size_t>(b * s.T);
            CHECK(same_bits(got.out.data() + first * C, base.out.data() + first * C, kept_rows * C));
            for (std::int64_t h = 0; h < s.H; ++h) {
                const auto lse_first = static_cast<std::size_t>((b * s.H + h) * s.T);
                CHECK(same_bits(got.lse.data() + lse_first, base.lse.data() + lse_first, kept_rows));
            }
            // dq of a token depends on nothing after it either (dk and dv do:
            // later queries look back at them).
            for (std::size_t t = first; t < first + kept_rows; ++t)
                CHECK(same_bits(got.dqkv.data() + t * row, base.dqkv.data() + t * row, C));
            if (kept + 1 < s.T)
                later_changed |= !same_bits(got.out.data() + (first + kept_rows) * C,
                                            base.out.data() + (first + kept_rows) * C, C);
        }
        // The perturbation is real: the first changed token's output moved.
        if (kept + 1 < s.T) CHECK(later_changed);
    }
}

TEST_CASE("CUDA attention passes a NaN on to exactly the queries that see it, as the host does",
          "[kernels][attention]") {
    const Shape s{1, 70, 1, 16};
    const std::int64_t poisoned = 40;  // inside the second tile, past its first rows
    const auto C = static_cast<std::size_t>(s.C());
    const auto row_has = [&](const std::vector<float>& out, std::int64_t t, bool (*test)(float)) {
        const float* begin = out.data() + static_cast<std::size_t>(t) * C;
        return std::any_of(begin, begin + C, test);
    };
    const auto is_nan = +[](float x) { return std::isnan(x); };
    const auto not_finite = +[](float x) { return !std::isfinite(x); };

    SECTION("a NaN in a key: the host's case") {
        Inputs in = inputs_for(s, 1231);
        const auto key = static_cast<std::size_t>(poisoned * 3 * s.C() + s.C() + 2);
        in.qkv[key] = std::numeric_limits<float>::quiet_NaN();
        const Results want = host_run(in, s);
        const Results got = device_run(in, s);
        for (std::int64_t t = 0; t < s.T; ++t) {
            INFO("token " << t);
            const bool sees = t >= poisoned;
            CHECK(row_has(got.out, t, is_nan) == sees);
            CHECK(row_has(got.out, t, not_finite) == sees);
            CHECK(row_has(want.out, t, is_nan) == sees);
            CHECK(std::isnan(got.lse[static_cast<std::size_t>(t)]) == sees);
            CHECK(std::isnan(want.lse[static_cast<std::size_t>(t)]) == sees);
        }
    }
    SECTION("a NaN in a value: the device skips masked keys, never multiplying a later value by 0") {
        Inputs in = inputs_for(s, 1232);
        const auto value = static_cast<std::size_t>(poisoned * 3 * s.C() + 2 * s.C() + 5);
        in.qkv[value] = std::numeric_limits<float>::quiet_NaN();
        const Results got = device_run(in, s);
        for (std::int64_t t = 0; t < s.T; ++t) {
            INFO("token " << t);
            CHECK(row_has(got.out, t, not_finite) == (t >= poisoned));
            CHECK(std::isfinite(got.lse[static_cast<std::size_t>(t)]));  // v plays no part in the scores
        }
    }
}

TEST_CASE("CUDA attention refuses bad shapes and null buffers with the host's words", "[kernels][attention]") {
    // The checks run before anything reaches the device: host pointers serve.
    std::vector<float> buffer(3 * 4 * 2 * 2, 0.0f), lse(8, 0.0f);
    float* p = buffer.data();
    float* l = lse.data();
    struct Case {
        bool backward;
        float* out;
        float* dout;
        std::int64_t B, T, H, D;
    };
    const Case cases[] = {
        {false, p, p, 1, 2, 0, 2},  {false, p, p, 1, 2, 2, 0},  {false, p, p, -1, 2, 2, 2},
        {true, p, p, 1, -3, 2, 2},  {false, p, p, 1, 2, std::int64_t{1} << 20, 1024},
        {false, nullptr, p, 1, 2, 2, 2}, {true, p, nullptr, 1, 2, 2, 2},
        // Empty batches are a no-op, buffers or not.
        {false, nullptr, nullptr, 0, 2, 2, 2}, {true, nullptr, nullptr, 3, 0, 2, 2},
    };
    for (const Case& c : cases) {
        INFO((c.backward ? "backward" : "forward") << " B=" << c.B << " T=" << c.T << " H=" << c.H << " D=" << c.D);
        const float* in = c.B == 0 || c.T == 0 ? nullptr : p;
        std::string want, got;
        if (c.backward) {
            want = message_of([&] { host::attention_backward(in, p, c.dout, l, p, c.B, c.T, c.H, c.D); });
            got = message_of([&] { dev::attention_backward(in, p, c.dout, l, p, c.B, c.T, c.H, c.D); });
        } else {
            want = message_of([&] { host::attention_forward(in, c.out, l, c.B, c.T, c.H, c.D); });
            got = message_of([&] { dev::attention_forward(in, c.out, l, c.B, c.T, c.H, c.D); });
        }
        CHECK(got == want);
    }
    CHECK(message_of([&] { dev::attention_forward(p, p, l, 1, 2, 2, 0); }) ==
          "attention_forward: head size D = 0 must be >= 1");
    // The device's own limit: its tiles hold D <= 128 (the host has none).
    CHECK(message_of([&] { dev::attention_forward(p, p, l, 1, 2, 1, 129); }) ==
          "attention_forward: head size D = 129 exceeds the CUDA kernel's limit of 128 (its shared-memory tiles hold "
          "128 floats per row); use the host kernel for larger heads");
    CHECK(message_of([&] { dev::attention_backward(p, p, p, l, p, 1, 2, 1, 129); }) ==
          "attention_backward: head size D = 129 exceeds the CUDA kernel's limit of 128 (its shared-memory tiles hold "
          "128 floats per row); use the host kernel for larger heads");
}
