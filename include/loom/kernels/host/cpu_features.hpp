// What this x86 CPU can run, asked once at run time (cpuid through GCC's
// __builtin_cpu_supports), so that one binary built for baseline x86-64 picks
// the host GEMM's AVX-512, AVX2 + FMA or portable micro-kernels on the machine
// it finds (kernels/host/gemm_dispatch.hpp). The build never passes -march:
// each kernel carries its own __attribute__((target)), and nothing calls one
// unless the level it needs is reported here.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace loom::kernels::host {

// The instruction-set levels the host GEMM has kernels for, lowest first.
enum class CpuIsa : std::uint8_t { portable, avx2, avx512 };

[[nodiscard]] constexpr const char* name_of(CpuIsa isa) noexcept {
    switch (isa) {
        case CpuIsa::avx512: return "avx512";
        case CpuIsa::avx2: return "avx2";
        case CpuIsa::portable: break;
    }
    return "portable";
}

// GCC's x86 intrinsics and target attributes (nvcc passes them through to the
// host compiler, so a CUDA translation unit compiles the same kernels: the
// inline functions must be the same in every translation unit).
#if defined(__x86_64__) && defined(__GNUC__)
#define LOOM_GEMM_X86 1
#endif

// Full unrolling of the kernels' register loops. nvcc's front end does not
// know GCC's pragma (a warning there); the host compiler then unrolls these
// constant-trip loops on its own, with the same arithmetic.
#if defined(__CUDACC__)
#define LOOM_GEMM_UNROLL(n)
#else
#define LOOM_GEMM_UNROLL_TEXT(n) _Pragma(#n)
#define LOOM_GEMM_UNROLL(n) LOOM_GEMM_UNROLL_TEXT(GCC unroll n)
#endif

struct CpuFeatures {
    bool avx2_fma = false;     // AVX2 and FMA3: the 6 x 16 kernel
    bool avx512 = false;       // AVX-512 F, BW, DQ, VL: the 14 x 32 kernel
    bool avx512_bf16 = false;  // vdpbf16ps: bf16 dot products with f32 sums
    // vdpbf16ps at the f32 FMA's rate, so bf16 dot products (two products a
    // lane) run twice the f32 kernel's flops: AMD's AVX512_BF16 (Zen 4 on,
    // measured 1.7x loom's f32 step on config A). The Xeons measured so far
    // retire it at a quarter of the FMA rate (Emerald Rapids, 0.65x), where
    // rounding into the f32 kernels is faster (docs/performance.md).
    bool bf16_dot_full_rate = false;
    // The L1 data cache's geometry (cpuid leaf 4, AMD's 0x8000001D): its ways,
    // and the bytes of one way (addresses this far apart share a set). The
    // GEMM packs a plain A whose rows alias in one set when the ways are too
    // few for a tile's rows (kernels/host/gemm_blocked.hpp). Unknown: 8 ways of 4 KiB.
    int l1d_ways = 8;
    std::int64_t l1d_way_bytes = 4096;

    // The highest level the GEMM has a kernel for on this CPU.
    [[nodiscard]] CpuIsa best() const noexcept {
        return avx512 ? CpuIsa::avx512 : avx2_fma ? CpuIsa::avx2 : CpuIsa::portable;
    }
    // Whether a kernel built for `isa` can run here.
    [[nodiscard]] bool runs(CpuIsa isa) const noexcept {
        switch (isa) {
            case CpuIsa::avx512: return avx512;
            case CpuIsa::avx2: return avx2_fma;
            case CpuIsa::portable: break;
        }
        return true;
    }
};

namespace detail {
[[nodiscard]] inline CpuFeatures detect_cpu_features() noexcept {
    CpuFeatures f;
#if defined(LOOM_GEMM_X86)
    __builtin_cpu_init();
    f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512 = f.avx2_fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
    f.bf16_dot_full_rate = f.avx512_bf16 && __builtin_cpu_is("amd");
    // Subleaf 0 of the cache leaf is the L1 data cache on every x86 so far; checked by its type and level.
    unsigned a = 0, b = 0, c = 0, d = 0;
    const unsigned leaf = __builtin_cpu_is("amd") ? 0x8000001Du : 4u;
    if (__get_cpuid_count(leaf, 0, &a, &b, &c, &d) && (a & 31u) == 1u && ((a >> 5) & 7u) == 1u) {
        f.l1d_ways = static_cast<int>(((b >> 22) & 0x3ffu) + 1u);
        f.l1d_way_bytes = static_cast<std::int64_t>((b & 0xfffu) + 1u) * (static_cast<std::int64_t>(c) + 1);
    }
#endif
    return f;
}
}  // namespace detail

// This CPU's features, detected on first use (thread-safe static).
[[nodiscard]] inline const CpuFeatures& cpu_features() noexcept {
    static const CpuFeatures features = detail::detect_cpu_features();
    return features;
}

}  // namespace loom::kernels::host
