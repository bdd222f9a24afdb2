// The host GEMM's portable micro-kernel, for CPUs (or compilers, or nvcc's
// view of a header) without the AVX2 / AVX-512 kernels: a 4 x 16 tile in
// plain loops the compiler vectorises for the baseline (SSE2 on x86-64, NEON
// on Arm). Same structure and order as the vector kernels, with separate
// multiply and add where the baseline has no FMA: acc += a * b over k in
// order, then alpha * acc, plus beta * C where beta != 0.
#pragma once

#include <cstdint>

#include "loom/kernels/host/cpu_features.hpp"
#include "loom/kernels/host/gemm_packing.hpp"
#include "loom/kernels/trans.hpp"

namespace loom::kernels::host::gemm_detail {

struct PortableKernel {
    static constexpr CpuIsa isa = CpuIsa::portable;
    static constexpr const char* shape = "4x16";
    static constexpr int mr = 4;
    static constexpr int nr = 16;
    static constexpr std::int64_t kc = 256;
    static constexpr std::int64_t mc = 64;
    static constexpr std::int64_t nc = 1024;

    // The packing loops (kernels/host/gemm_packing.hpp) compiled for this
    // kernel's instruction set: wider copies, and the bf16 rounding
    // vectorised (a plain call would run them at the baseline's SSE2).
    template <bool RoundBf16>
    static void pack_b_panels(Trans tb, const float* B, std::int64_t ldb, std::int64_t k0, std::int64_t kc_,
                                        std::int64_t j0, std::int64_t nc_, float* out) noexcept {
        pack_b<nr, RoundBf16>(tb, B, ldb, k0, kc_, j0, nc_, out);
    }
    template <bool RoundBf16>
    static void pack_a_panels(Trans ta, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc_,
                                        std::int64_t k0, std::int64_t kc_, float* out) noexcept {
        pack_a<mr, RoundBf16>(ta, A, lda, i0, mc_, k0, kc_, out);
    }
    static void round_block(Trans ta, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc_,
                                      std::int64_t k0, std::int64_t kc_, float* out) noexcept {
        round_block_bf16(ta, A, lda, i0, mc_, k0, kc_, out);
    }

    // B's panel is read at b[p * b_ks + j]: packed (b_ks = nr) or in place;
    // beta's term at c_in[r * ldc_in + j]: C itself, or a bias row (ldc_in = 0).
    static void tile(int rows, int cols, std::int64_t k, const float* a, std::int64_t a_rs, std::int64_t a_ks,
                     const float* b, std::int64_t b_ks, float* c, std::int64_t ldc, float alpha, float beta,
                     const float* c_in, std::int64_t ldc_in) noexcept {
        float acc[mr][nr] = {};
        for (std::int64_t p = 0; p < k; ++p) {
            const float* brow = b + p * b_ks;
            for (int r = 0; r < rows; ++r) {
                const float x = a[r * a_rs + p * a_ks];
                for (int j = 0; j < nr; ++j) acc[r][j] += x * brow[j];
            }
        }
        for (int r = 0; r < rows; ++r) {
            float* row = c + r * ldc;
            const float* in = c_in + r * ldc_in;
            for (int j = 0; j < cols; ++j) {
                const float t = alpha * acc[r][j];
                row[j] = beta != 0.0f ? beta * in[j] + t : t;
            }
        }
    }
};

}  // namespace loom::kernels::host::gemm_detail
