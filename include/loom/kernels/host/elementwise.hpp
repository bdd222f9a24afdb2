// Host elementwise kernels (f32, row-major, raw pointers) and what the other
// host kernels share: lane-split reductions, a vectorisable exp, and the two
// macros that keep their loops vectorised and CPU-dispatched. Everything is a
// plain loop that GCC vectorises without -march or -ffast-math (at -O3; GCC 12's
// -O2 cost model vectorises little), because outside the GEMMs a training step
// must cost almost nothing.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "loom/kernels/column_sum_order.hpp"

// The per-element helpers below must be inlined into the loops that call
// them, or those loops hold a call and stay scalar (measured: 5x slower). GCC
// otherwise stops inlining them once a large caller, say a main() that calls
// many kernels, exhausts its growth budget; always_inline removes that risk.
#if defined(__GNUC__)
#define LOOM_KERNEL_INLINE inline __attribute__((always_inline))
#else
#define LOOM_KERNEL_INLINE inline
#endif

// CPU dispatch for the kernels' loops: the build targets baseline x86-64 (SSE2,
// no FMA), where an exp-heavy loop such as GELU runs ~6x slower than with
// AVX2 + FMA or AVX-512 (measured: 1.37 vs 0.21 ns per element), enough to
// show next to the GEMMs, which OpenBLAS already dispatches by CPU.
// target_clones compiles a loop for the baseline and for x86-64-v3 / -v4, and
// glibc's ifunc picks one when the program loads; no compiler flag changes.
// Only where that is known to work (GCC, x86-64 Linux with glibc, not inside
// nvcc). Define LOOM_NO_CPU_DISPATCH (in every translation unit alike) for the
// baseline code alone. Results may differ in the last bits between CPUs of
// different levels (FMA contraction), never between ranks on one machine.
// GCC 12 cannot unwind out of a target_clones function (a throw there calls
// std::terminate), so dispatched functions must not throw: the public kernels
// check their arguments and then call a dispatched loop in `detail`. Under
// ThreadSanitizer the ifunc resolvers would run instrumented code before the
// sanitizer starts (a crash at load), so a -fsanitize=thread build gets the
// baseline loops.
#if !defined(LOOM_NO_CPU_DISPATCH) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && \
    defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && !defined(__SANITIZE_THREAD__)
#define LOOM_KERNEL_DISPATCH __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define LOOM_KERNEL_DISPATCH
#endif

namespace loom::kernels::host {

// Partial sums per reduction. Without -ffast-math GCC may not reorder a float
// sum, so a single accumulator runs at one add per add-latency; 16 explicit
// partial sums are four SSE2 registers (two AVX ones) the vectoriser fills
// side by side, and summing in 16 strands also loses less precision.
inline constexpr std::int64_t reduction_lanes = 16;

// Sum of term(i) for i in [0, n): `reduction_lanes` strided partial sums, combined
// pairwise. term must be a cheap, inlinable function of i (a load, a product).
template <class Term>
[[nodiscard]] LOOM_KERNEL_INLINE float sum_over(std::int64_t n, Term term) {
    constexpr std::int64_t L = reduction_lanes;
    // Trip counts computed up front: with `i + L <= n` as the loop test, GCC
    // cannot bound the tail loop and warns (-Waggressive-loop-optimizations)
    // in callers whose n is a compile-time constant.
    const std::int64_t whole = n > 0 ? n - n % L : 0;
    float partial[L] = {};
    for (std::int64_t i = 0; i < whole; i += L)
        for (std::int64_t l = 0; l < L; ++l) partial[l] += term(i + l);
    float tail = 0.0f;
    for (std::int64_t i = whole; i < n; ++i) tail += term(i);
    for (std::int64_t width = L / 2; width > 0; width /= 2)
        for (std::int64_t l = 0; l < width; ++l) partial[l] += partial[l + width];
    return partial[0] + tail;
}

// Largest term(i) for i in [0, n), n >= 1 (NaN terms are skipped unless all are
// NaN; softmax callers see the NaN again when they exponentiate). Lane-split
// for the same reason as sum_over: a max chain does not vectorise by itself.
template <class Term>
[[nodiscard]] LOOM_KERNEL_INLINE float max_over(std::int64_t n, Term term) {
    constexpr std::int64_t L = reduction_lanes;
    const float first = term(0);
    float partial[L];
    for (std::int64_t l = 0; l < L; ++l) partial[l] = first;
    const std::int64_t whole = n - n % L;  // as in sum_over
    for (std::int64_t i = 0; i < whole; i += L)
        for (std::int64_t l = 0; l < L; ++l) partial[l] = std::max(partial[l], term(i + l));
    float best = first;
    for (std::int64_t i = whole; i < n; ++i) best = std::max(best, term(i));
    for (std::int64_t l = 0; l < L; ++l) best = std::max(best, partial[l]);
    return best;
}

namespace detail {

// condition ? if_true : if_false, written with bit masks. GCC (with the default
// -ftrapping-math) will not if-convert a float ?: whose arms it has rewritten
// into arithmetic, which leaves a branch in the loop and stops vectorisation;
// a mask is branch-free by construction (SSE2: cmpps + and/andnot/or).
[[nodiscard]] LOOM_KERNEL_INLINE float blend(bool condition, float if_true, float if_false) {
    const std::uint32_t mask = 0u - static_cast<std::uint32_t>(condition);
    return std::bit_cast<float>((std::bit_cast<std::uint32_t>(if_true) & mask) |
                                (std::bit_cast<std::uint32_t>(if_false) & ~mask));
}

// e^z for z in [-87, 88] (not NaN): the arithmetic of fast_exp without its
// range handling, for callers that have already clamped z (GELU).
// Cody-Waite reduction z = k ln2 + r with |r| <= ln2/2, Cephes' polynomial for
// e^r, and 2^k assembled from its exponent bits (a normal float for k in
// [-126, 127], which the range guarantees).
[[nodiscard]] LOOM_KERNEL_INLINE float exp_in_range(float z) {
    constexpr float log2e = 1.44269504088896341f;
    constexpr float ln2_hi = 0.693359375f;      // 9 significant bits: k * ln2_hi is exact
    constexpr float ln2_lo = -2.12194440e-4f;
    constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float k = (z * log2e + round_magic) - round_magic;
    const float r = (z - k * ln2_hi) - k * ln2_lo;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float e_r = p * (r * r) + r + 1.0f;
    const float two_k = std::bit_cast<float>(static_cast<std::uint32_t>(static_cast<std::int32_t>(k) + 127) << 23);
    return e_r * two_k;
}

}  // namespace detail

// e^z for float z, vectorisable (std::exp is a libm call GCC cannot vectorise),
// within 1 ulp of the exact value on [-87, 88] (checked for every float there;
// 1.01 ulp where the compiler contracts the polynomial into FMAs).
// Below -87 the result is exactly 0 (true e^z would be subnormal there, which
// SSE handles ~100x slower); above 88 it saturates at e^88 ~ 1.65e38 instead of
// overflowing. NaN gives NaN.
[[nodiscard]] LOOM_KERNEL_INLINE float fast_exp(float z) {
    // The clamps send NaN to -87 (every comparison with NaN is false), so the
    // float-to-int conversion inside never sees a NaN; the last line restores it.
    float zc = detail::blend(z > -87.0f, z, -87.0f);
    zc = detail::blend(zc < 88.0f, zc, 88.0f);
    const float e = detail::blend(z < -87.0f, 0.0f, detail::exp_in_range(zc));
    return detail::blend(z == z, e, z);
}

// y[r, j] += bias[j] for a [rows, n] matrix y.
LOOM_KERNEL_DISPATCH inline void add_bias(float* __restrict y, const float* __restrict bias, std::int64_t rows,
                                          std::int64_t n) noexcept {
    for (std::int64_t r = 0; r < rows; ++r) {
        float* __restrict row = y + r * n;
        for (std::int64_t j = 0; j < n; ++j) row[j] += bias[j];
    }
}

// dbias[j] += sum over r of dy[r, j]: the bias gradient of y = x W + bias,
// in float (as PyTorch does), in column_sum_order.hpp's order: chunks of
// consecutive rows summed first, then added to dbias in chunk order, which a
// GPU can run in parallel and the CUDA kernel follows bit for bit. Columns go
// in tiles of 256 so that the chunk's sums stay in L1; the inner loops run
// along j and vectorise.
LOOM_KERNEL_DISPATCH inline void bias_grad(const float* __restrict dy, float* __restrict dbias, std::int64_t rows,
                                           std::int64_t n) noexcept {
    constexpr std::int64_t tile = 256;
    float chunk_sum[tile];
    const std::int64_t chunk_rows = column_sum_chunk_rows(rows);
    for (std::int64_t j0 = 0; j0 < n; j0 += tile) {
        const std::int64_t width = std::min(tile, n - j0);
        for (std::int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
            const std::int64_t r1 = std::min(rows, r0 + chunk_rows);
            const float* __restrict first = dy + r0 * n + j0;
            for (std::int64_t j = 0; j < width; ++j) chunk_sum[j] = first[j];
            for (std::int64_t r = r0 + 1; r < r1; ++r) {
                const float* __restrict row = dy + r * n + j0;
                for (std::int64_t j = 0; j < width; ++j) chunk_sum[j] += row[j];
            }
            float* __restrict out = dbias + j0;
            for (std::int64_t j = 0; j < width; ++j) out[j] += chunk_sum[j];
        }
    }
}

// out = a + b. out may be a or b (a residual add in place), so no __restrict:
// GCC checks for overlap once per call and runs the vector loop.
LOOM_KERNEL_DISPATCH inline void add(const float* a, const float* b, float* out, std::int64_t n) noexcept {
    for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// into += x (gradient accumulation).
LOOM_KERNEL_DISPATCH inline void accumulate(float* __restrict into, const float* __restrict x,
                                            std::int64_t n) noexcept {
    for (std::int64_t i = 0; i < n; ++i) into[i] += x[i];
}

// into -= x (PowerSGD's error feedback: what the low-rank average missed).
inline void subtract(float* __restrict into, const float* __restrict x, std::int64_t n) noexcept {
    for (std::int64_t i = 0; i < n; ++i) into[i] -= x[i];
}

// 1-bit Adam's exchange of momentum through a gradient exchange: before it,
// g becomes the momentum this step would make, beta1 m + (1 - beta1) g; after
// it, the average turns back into the gradient that makes AdamW's momentum
// that average, (avg - beta1 m) / (1 - beta1). m is the step's old momentum,
// the same on every rank. Not CPU-dispatched: an FMA-contracted clone would
// round differently from the baseline, and these run once a step.
inline void mix_momentum(float* __restrict grad, const float* __restrict m, std::int64_t n, float beta1) noexcept {
    for (std::int64_t i = 0; i < n; ++i) grad[i] = beta1 * m[i] + (1.0f - beta1) * grad[i];
}
inline void unmix_momentum(float* __restrict grad, const float* __restrict m, std::int64_t n, float beta1) noexcept {
    for (std::int64_t i = 0; i < n; ++i) grad[i] = (grad[i] - beta1 * m[i]) / (1.0f - beta1);
}

}  // namespace loom::kernels::host
