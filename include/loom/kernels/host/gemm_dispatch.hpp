// Which host GEMM runs, chosen once per process: loom's own packed
// micro-kernels (kernels/host/gemm_blocked.hpp) at the highest instruction
// level this CPU has (kernels/host/cpu_features.hpp), or the CBLAS the build
// linked. Why loom carries its own: docs/design.md, "Host GEMM".
//
//   LOOM_HOST_GEMM unset or "loom"   loom's kernels at the CPU's level (default)
//   LOOM_HOST_GEMM=loom-avx512 | loom-avx2 | loom-portable
//                                    loom's kernels at that level (refused if
//                                    this CPU cannot run it)
//   LOOM_HOST_GEMM=blas              cblas_sgemm, as before loom had its own
//
// set_host_gemm() makes the same choice from code (tests force each level).
// host_gemm_description() names what runs, e.g. "loom avx512 14x32", and
// blas_kernel_warning() says in one line when the BLAS path would run
// OpenBLAS kernels below this CPU's level (Debian 12's OpenBLAS 0.3.21 does
// not know Sapphire/Emerald Rapids and falls back to its SSE3 kernels).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <cblas.h>

#include "loom/core/error.hpp"
#include "loom/kernels/host/cpu_features.hpp"
#include "loom/kernels/host/gemm_blocked.hpp"
#include "loom/kernels/host/gemm_kernel_avx2.hpp"
#include "loom/kernels/host/gemm_kernel_avx512.hpp"
#include "loom/kernels/host/gemm_kernel_avx512_bf16.hpp"
#include "loom/kernels/host/gemm_kernel_portable.hpp"
#include "loom/kernels/host/gemm_threads.hpp"

#if !defined(OPENBLAS_VERSION) && defined(__GNUC__) && defined(__ELF__)
extern "C" char* openblas_get_corename(void) __attribute__((weak));
#endif

namespace loom::kernels::host {

enum class HostGemmBackend : std::uint8_t { loom, blas };

struct HostGemm {
    HostGemmBackend backend = HostGemmBackend::loom;
    CpuIsa isa = CpuIsa::portable;  // loom's kernel level (unused for blas)
};

namespace gemm_detail {

// "loom", "loom-<level>" or "blas", as LOOM_HOST_GEMM takes them.
[[nodiscard]] inline HostGemm parse_host_gemm(std::string_view text) {
    const CpuFeatures& cpu = cpu_features();
    if (text.empty() || text == "loom") return {HostGemmBackend::loom, cpu.best()};
    if (text == "blas") return {HostGemmBackend::blas, cpu.best()};
    for (CpuIsa isa : {CpuIsa::avx512, CpuIsa::avx2, CpuIsa::portable}) {
        if (text == std::string("loom-") + name_of(isa)) {
            LOOM_CHECK(cpu.runs(isa), "LOOM_HOST_GEMM = ", text, ": this CPU cannot run loom's ", name_of(isa),
                       " kernels; its level is ", name_of(cpu.best()), " (pass loom or loom-", name_of(cpu.best()),
                       ")");
            return {HostGemmBackend::loom, isa};
        }
    }
    LOOM_FAIL("LOOM_HOST_GEMM = '", text, "' is not one of: loom, loom-avx512, loom-avx2, loom-portable, blas");
}

// The choice, packed in one atomic: backend in bit 8, isa in the low byte.
inline std::atomic<int>& host_gemm_setting() {
    static std::atomic<int> setting = [] {
        const char* env = std::getenv("LOOM_HOST_GEMM");
        const HostGemm g = parse_host_gemm(env != nullptr ? env : "");
        return static_cast<int>(g.backend) << 8 | static_cast<int>(g.isa);
    }();
    return setting;
}

// OpenBLAS's kernel family ("SkylakeX", "Haswell", "Prescott", ...), or
// empty when the linked CBLAS is not OpenBLAS.
[[nodiscard]] inline std::string openblas_corename() {
#if defined(OPENBLAS_VERSION)
    const char* name = openblas_get_corename();
#elif defined(__GNUC__) && defined(__ELF__)
    const char* name = openblas_get_corename != nullptr ? openblas_get_corename() : nullptr;
#else
    const char* name = nullptr;
#endif
    return name != nullptr ? std::string(name) : std::string();
}

// The instruction level an OpenBLAS kernel family uses (its x86 targets).
[[nodiscard]] inline CpuIsa openblas_core_level(std::string_view core) {
    for (const char* name : {"skylakex", "cooperlake", "sapphirerapids"})
        if (core == name) return CpuIsa::avx512;
    for (const char* name : {"haswell", "zen", "excavator", "steamroller", "piledriver"})
        if (core == name) return CpuIsa::avx2;
    return CpuIsa::portable;
}

[[nodiscard]] inline std::string lower(std::string text) {
    for (char& ch : text)
        if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    return text;
}

// Whether bf16 dot products are on: LOOM_HOST_GEMM_BF16=vdpbf16ps or round,
// or set_bf16_dot_products; by default where vdpbf16ps runs at the FMA's
// rate (CpuFeatures::bf16_dot_full_rate). A rule of the CPU, not a timing at
// start-up, so that a machine always runs the same kernels (the same bits).
inline std::atomic<bool>& bf16_dot_setting() {
    static std::atomic<bool> on = [] {
        const char* env = std::getenv("LOOM_HOST_GEMM_BF16");
        const std::string_view text = env != nullptr ? env : "";
        if (text.empty()) return cpu_features().bf16_dot_full_rate;
        if (text == "round") return false;
        LOOM_CHECK(text == "vdpbf16ps", "LOOM_HOST_GEMM_BF16 = '", text, "' is not one of: round, vdpbf16ps");
        return cpu_features().avx512_bf16;
    }();
    return on;
}

// Whether MatmulPrecision::bf16 products run bf16 dot products (vdpbf16ps,
// kernels/host/gemm_kernel_avx512_bf16.hpp) with the host GEMM in use: loom's
// AVX-512 kernels on a CPU with AVX512_BF16, by default where vdpbf16ps runs
// at the FMA's rate (AMD's Zen 4 on). Elsewhere bf16 products round their
// operands while packing them for the f32 kernels: on the Xeon of
// docs/performance.md (Emerald Rapids under KVM, no AMX) vdpbf16ps retires at
// a quarter of the FMA rate, so its two products per lane run at half the
// f32 kernel's flops.
[[nodiscard]] inline bool bf16_dot_products(HostGemm g) {
    return g.backend == HostGemmBackend::loom && g.isa == CpuIsa::avx512 && cpu_features().avx512_bf16 &&
           bf16_dot_setting().load(std::memory_order_relaxed);
}

}  // namespace gemm_detail

// The host GEMM in use.
[[nodiscard]] inline HostGemm host_gemm() {
    const int v = gemm_detail::host_gemm_setting().load(std::memory_order_relaxed);
    return {static_cast<HostGemmBackend>(v >> 8), static_cast<CpuIsa>(v & 0xff)};
}

// Chooses the host GEMM for the whole process (what LOOM_HOST_GEMM chose at
// start-up otherwise). Refuses a kernel level this CPU cannot run.
inline void set_host_gemm(HostGemm choice) {
    LOOM_CHECK(choice.backend == HostGemmBackend::blas || cpu_features().runs(choice.isa),
               "set_host_gemm: this CPU cannot run loom's ", name_of(choice.isa), " kernels; its level is ",
               name_of(cpu_features().best()));
    gemm_detail::host_gemm_setting().store(static_cast<int>(choice.backend) << 8 | static_cast<int>(choice.isa));
}

// Runs MatmulPrecision::bf16 products as bf16 dot products (vdpbf16ps) or,
// with false, rounds the operands into the f32 kernels (the default where
// vdpbf16ps is slow). Refused where the CPU has no AVX512_BF16.
inline void set_bf16_dot_products(bool on) {
    LOOM_CHECK(!on || cpu_features().avx512_bf16,
               "set_bf16_dot_products: this CPU has no AVX512_BF16 (vdpbf16ps); bf16 products round their operands "
               "into the f32 kernels instead");
    gemm_detail::bf16_dot_setting().store(on);
}

// Empty, or the one line that says the BLAS path runs kernels below this
// CPU's level and how to fix it.
[[nodiscard]] inline std::string blas_kernel_warning() {
    const std::string core = gemm_detail::openblas_corename();
    if (core.empty()) return {};
    const CpuIsa cpu = cpu_features().best();
    const CpuIsa blas = gemm_detail::openblas_core_level(gemm_detail::lower(core));
    if (static_cast<int>(blas) >= static_cast<int>(cpu)) return {};
    return "OpenBLAS runs its " + core + " kernels on this " + name_of(cpu) +
           " CPU (it does not know the model): unset LOOM_HOST_GEMM for loom's own kernels, or set "
           "OPENBLAS_CORETYPE=" + (cpu == CpuIsa::avx512 ? "SkylakeX" : "Haswell");
}

// What runs host products, e.g. "loom avx512 14x32 (bf16: rounded f32), 1
// thread" or "blas OpenBLAS SkylakeX, 1 thread".
[[nodiscard]] inline std::string host_gemm_description() {
    const HostGemm g = host_gemm();
    std::string text;
    if (g.backend == HostGemmBackend::blas) {
        const std::string core = gemm_detail::openblas_corename();
        text = core.empty() ? std::string("blas (cblas_sgemm)") : "blas OpenBLAS " + core;
    } else {
        const char* shape = g.isa == CpuIsa::portable ? gemm_detail::PortableKernel::shape : "";
#if defined(LOOM_GEMM_X86)
        if (g.isa == CpuIsa::avx512) shape = gemm_detail::Avx512Kernel::shape;
        if (g.isa == CpuIsa::avx2) shape = gemm_detail::Avx2Kernel::shape;
#endif
        text = std::string("loom ") + name_of(g.isa) + " " + shape;
        text += gemm_detail::bf16_dot_products(g) ? " (bf16: vdpbf16ps)" : " (bf16: rounded f32)";
    }
    const int threads = gemm_threads();
    return text + ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
}

// host_gemm_description(), then, when the BLAS path is in use and runs
// kernels below this CPU's level, blas_kernel_warning() after "; ": the line
// train_gpt and the benches print.
[[nodiscard]] inline std::string host_gemm_report() {
    std::string text = host_gemm_description();
    if (host_gemm().backend == HostGemmBackend::blas) {
        const std::string warning = blas_kernel_warning();
        if (!warning.empty()) text += "; " + warning;
    }
    return text;
}

namespace gemm_detail {

// Products smaller than this many multiply-adds run on one thread: below it
// waking a second thread costs more than it saves.
inline constexpr std::int64_t min_threaded_macs = std::int64_t{1} << 18;

// A product of loom's, run by `blocked` (a blocked_gemm) on gemm_threads()
// threads: its columns (or, for tall thin products, rows) cut into ranges of
// whole MR x NR tiles, one per thread. `bias`: blocked_gemm's.
template <int MR, int NR, class Blocked>
inline void threaded_gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                          const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                          std::int64_t ldc, const float* bias, const Blocked& blocked) {
    int threads = gemm_threads();
    if (threads > 1 && M * N * K < min_threaded_macs) threads = 1;
    const bool by_columns = N >= M;
    const std::int64_t unit = by_columns ? NR : MR;
    const std::int64_t units = ((by_columns ? N : M) + unit - 1) / unit;
    if (threads > units) threads = static_cast<int>(units);
    if (threads <= 1) {
        blocked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
        return;
    }
    GemmPool::instance().run(threads, [&](int part) {
        const std::int64_t first = units * part / threads * unit;
        const std::int64_t last = std::min((by_columns ? N : M), units * (part + 1) / threads * unit);
        if (first >= last) return;
        if (by_columns)
            blocked(ta, tb, M, last - first, K, alpha, A, lda, tb == Trans::no ? B + first : B + first * ldb, ldb,
                    beta, C + first, ldc, bias != nullptr ? bias + first : nullptr);
        else
            blocked(ta, tb, last - first, N, K, alpha, ta == Trans::no ? A + first * lda : A + first, lda, B, ldb,
                    beta, C + first * ldc, ldc, bias);
    });
}

// C = beta C (BLAS's meaning of K = 0 or alpha = 0: A and B are not read;
// beta = 0 writes zeros, NaN in C included); with a bias, C's rows = bias.
inline void scale_c(std::int64_t M, std::int64_t N, float beta, float* C, std::int64_t ldc,
                    const float* bias = nullptr) {
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t j = 0; j < N; ++j)
            C[i * ldc + j] = bias != nullptr ? bias[j] : beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

// The blocked product with micro-kernel `Kernel`, its rows or columns split
// over the GEMM threads; with round_bf16, of the operands rounded to bf16.
template <class Kernel>
void kernel_gemm(bool round_bf16, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                 const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                 std::int64_t ldc, const float* bias) {
    threaded_gemm<Kernel::mr, Kernel::nr>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias,
                                          round_bf16 ? blocked_gemm<Kernel, true> : blocked_gemm<Kernel>);
}

// loom's product at `isa`, arguments already checked, M and N >= 1; with
// round_bf16, of the operands rounded to bf16 (MatmulPrecision::bf16). With
// a `bias` (N floats): C = alpha op(A) op(B) + bias on every row, beta unread.
inline void loom_gemm(CpuIsa isa, bool round_bf16, Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                      const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                      std::int64_t ldc, const float* bias = nullptr) {
    if (K == 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc, bias);
        return;
    }
#if defined(LOOM_GEMM_X86)
    if (isa == CpuIsa::avx512)
        return kernel_gemm<Avx512Kernel>(round_bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    if (isa == CpuIsa::avx2)
        return kernel_gemm<Avx2Kernel>(round_bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
#else
    (void)isa;
#endif
    kernel_gemm<PortableKernel>(round_bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
}

// The bf16 product with bf16 dot products, arguments already checked, M and N
// >= 1; only where bf16_dot_products(host_gemm()). `bias`: loom_gemm's.
inline void loom_gemm_bf16(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                           const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                           std::int64_t ldc, const float* bias = nullptr) {
    if (K == 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc, bias);
        return;
    }
#if defined(LOOM_GEMM_X86)
    threaded_gemm<Avx512Bf16Kernel::mr, Avx512Bf16Kernel::nr>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                                                              bias, blocked_gemm_bf16);
#else
    (void)ta, (void)tb, (void)A, (void)lda, (void)B, (void)ldb, (void)ldc;
#endif
}

// loom's product for a `choice` on loom's backend, arguments already checked,
// M and N >= 1: f32, or with bf16_inputs (MatmulPrecision::bf16) bf16 dot
// products where bf16_dot_products(choice) and rounded f32 operands
// elsewhere. `bias`: loom_gemm's.
inline void loom_product(HostGemm choice, bool bf16_inputs, Trans ta, Trans tb, std::int64_t M, std::int64_t N,
                         std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
                         std::int64_t ldb, float beta, float* C, std::int64_t ldc, const float* bias = nullptr) {
    if (bf16_inputs && bf16_dot_products(choice))
        loom_gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    else
        loom_gemm(choice.isa, bf16_inputs, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
}

// The product on the backend in use, arguments already checked (sizes within
// int for the BLAS), M and N >= 1: host::gemm after its checks, and the
// tiles of host attention (kernels/host/attention.hpp).
inline void dispatched_gemm(Trans ta, Trans tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                            const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                            std::int64_t ldc) {
    const HostGemm choice = host_gemm();
    if (choice.backend == HostGemmBackend::loom) {
        loom_product(choice, false, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta == Trans::yes ? CblasTrans : CblasNoTrans,
                tb == Trans::yes ? CblasTrans : CblasNoTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C,
                static_cast<int>(ldc));
}

}  // namespace gemm_detail

}  // namespace loom::kernels::host
