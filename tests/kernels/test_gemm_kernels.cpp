// loom's own host GEMM (kernels/host/gemm_dispatch.hpp): each kernel level
// this CPU can run, forced in turn, against a double-precision loop over odd
// shapes, sizes past every block (kc, mc), all transposes, alpha, beta 0 and
// 1, padded row strides; results that do not depend on how M or N are split
// or on the thread count; and the dispatcher choosing the CPU's own level.
#include <catch2/catch.hpp>

#include "support/gemm_operands.hpp"
#include "support/message_of.hpp"

#include <loom/core/dtype.hpp>
#include <loom/core/rng.hpp>
#include <loom/kernels/host/gemm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

using loom::kernels::host::CpuIsa;
using loom::kernels::host::HostGemm;
using loom::kernels::host::HostGemmBackend;
using loom::kernels::host::Trans;
using loom_test::message_of;
using loom_test::normal_values;
using loom_test::op_at;

// Restores the process's GEMM choice and thread count when a test ends.
struct KeepHostGemm {
    HostGemm before = loom::kernels::host::host_gemm();
    int threads = loom::kernels::host::gemm_threads();
    bool bf16_dot = loom::kernels::host::gemm_detail::bf16_dot_setting().load();
    ~KeepHostGemm() {
        loom::kernels::host::set_host_gemm(before);
        loom::kernels::host::set_gemm_threads(threads);
        loom::kernels::host::gemm_detail::bf16_dot_setting().store(bf16_dot);
    }
};

std::vector<CpuIsa> runnable_levels() {
    std::vector<CpuIsa> levels;
    for (CpuIsa isa : {CpuIsa::portable, CpuIsa::avx2, CpuIsa::avx512})
        if (loom::kernels::host::cpu_features().runs(isa)) levels.push_back(isa);
    return levels;
}

struct Shape {
    std::int64_t M, N, K;
};

// One product against the double loop; C's padding must stay untouched.
void check_product(Trans ta, Trans tb, Shape s, float alpha, float beta) {
    const auto [M, N, K] = s;
    const std::int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
    const std::int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
    const std::int64_t lda = a_cols + 3, ldb = b_cols + 1, ldc = N + 5;
    const auto A = normal_values(static_cast<std::size_t>(a_rows * lda), 1);
    const auto B = normal_values(static_cast<std::size_t>(b_rows * ldb), 2);
    auto C = normal_values(static_cast<std::size_t>(M * ldc), 3);
    const auto C_before = C;
    if (beta == 0.0f)
        for (std::int64_t i = 0; i < M; ++i)
            for (std::int64_t j = 0; j < N; ++j)
                C[static_cast<std::size_t>(i * ldc + j)] = std::numeric_limits<float>::quiet_NaN();
    loom::kernels::host::gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < M; ++i) {
        for (std::int64_t j = 0; j < ldc; ++j) {
            const auto at = static_cast<std::size_t>(i * ldc + j);
            if (j >= N) {
                wrong += C[at] != C_before[at] ? 1 : 0;
                continue;
            }
            double product = 0.0, magnitude = 0.0;
            for (std::int64_t k = 0; k < K; ++k) {
                const double term = op_at(A, lda, ta, i, k) * op_at(B, ldb, tb, k, j);
                product += term;
                magnitude += std::fabs(term);
            }
            const double expected = alpha * product + (beta == 0.0f ? 0.0 : double{C_before[at]});
            const double scale = std::fabs(alpha) * magnitude + std::fabs(double{C_before[at]});
            // K roundings of 6e-8 at most in the FMA chain, two more at the end.
            const double bound = (static_cast<double>(K) + 2.0) * 6e-8 * scale + 1e-12;
            wrong += std::fabs(C[at] - expected) <= bound ? 0 : 1;
        }
    }
    CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("loom's GEMM at each kernel level this CPU runs matches a double loop: shapes, transposes, alpha, beta",
          "[kernels][gemm][gemm_kernels]") {
    KeepHostGemm keep;
    const std::vector<Shape> shapes{{1, 1, 1},    {1, 37, 5},    {29, 1, 7},    {13, 33, 1},   {15, 17, 19},
                                    {14, 32, 8},  {6, 16, 300},  {31, 65, 70},  {256, 64, 64}, {300, 70, 400},
                                    {45, 200, 9}, {150, 150, 777}, {32, 64, 128}, {50, 96, 400}};
    for (CpuIsa isa : runnable_levels()) {
        loom::kernels::host::set_host_gemm({HostGemmBackend::loom, isa});
        for (const Shape& s : shapes)
            for (Trans ta : {Trans::no, Trans::yes})
                for (Trans tb : {Trans::no, Trans::yes})
                    for (float beta : {0.0f, 1.0f}) {
                        CAPTURE(loom::kernels::host::name_of(isa), s.M, s.N, s.K, static_cast<bool>(ta),
                                static_cast<bool>(tb), beta);
                        check_product(ta, tb, s, beta == 0.0f ? 1.0f : -0.75f, beta);
                    }
    }
}

TEST_CASE("a plain A whose rows alias in L1 is packed where the L1 has few ways, with the same bits as read in place",
          "[kernels][gemm][gemm_kernels]") {
    KeepHostGemm keep;
    const auto& cpu = loom::kernels::host::cpu_features();
    const std::int64_t M = 30, N = 200, K = 300;
    const std::int64_t aliasing = cpu.l1d_way_bytes / 4, padded = aliasing + 16;  // floats per row
    REQUIRE(aliasing >= K);
    CAPTURE(cpu.l1d_ways, cpu.l1d_way_bytes, loom::kernels::host::gemm_detail::rows_alias_in_l1(aliasing));
    CHECK_FALSE(loom::kernels::host::gemm_detail::rows_alias_in_l1(padded));
    const auto values = normal_values(static_cast<std::size_t>(M * K), 1);
    std::vector<float> A_alias(static_cast<std::size_t>(M * aliasing)), A_padded(static_cast<std::size_t>(M * padded));
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t k = 0; k < K; ++k) {
            A_alias[static_cast<std::size_t>(i * aliasing + k)] = values[static_cast<std::size_t>(i * K + k)];
            A_padded[static_cast<std::size_t>(i * padded + k)] = values[static_cast<std::size_t>(i * K + k)];
        }
    const auto B = normal_values(static_cast<std::size_t>(K * N), 2);
    for (CpuIsa isa : runnable_levels()) {
        CAPTURE(loom::kernels::host::name_of(isa));
        loom::kernels::host::set_host_gemm({HostGemmBackend::loom, isa});
        std::vector<float> C_alias(static_cast<std::size_t>(M * N)), C_padded(C_alias.size());
        loom::kernels::host::gemm(Trans::no, Trans::no, M, N, K, 1.0f, A_alias.data(), aliasing, B.data(), N, 0.0f,
                                  C_alias.data(), N);
        loom::kernels::host::gemm(Trans::no, Trans::no, M, N, K, 1.0f, A_padded.data(), padded, B.data(), N, 0.0f,
                                  C_padded.data(), N);
        CHECK(std::memcmp(C_alias.data(), C_padded.data(), C_alias.size() * sizeof(float)) == 0);
    }
    // Packing a plain A gives the panels a transposed A's packing gives, whatever this CPU does.
    constexpr int MR = 6;
    std::vector<float> At(static_cast<std::size_t>(K * M));
    for (std::int64_t i = 0; i < M; ++i)
        for (std::int64_t k = 0; k < K; ++k) At[static_cast<std::size_t>(k * M + i)] = values[static_cast<std::size_t>(i * K + k)];
    const std::int64_t mc = 17, kc = 40, panels = (mc + MR - 1) / MR;
    std::vector<float> plain(static_cast<std::size_t>(panels * kc * MR), -1.0f), transposed(plain.size(), -2.0f);
    loom::kernels::host::gemm_detail::pack_a<MR, false>(Trans::no, A_alias.data(), aliasing, 5, mc, 7, kc, plain.data());
    loom::kernels::host::gemm_detail::pack_a<MR, false>(Trans::yes, At.data(), M, 5, mc, 7, kc, transposed.data());
    CHECK(plain == transposed);
}

TEST_CASE("a plain B read by few row tiles is read in place, with the same bits as packed",
          "[kernels][gemm][gemm_kernels]") {
    KeepHostGemm keep;
    using loom::kernels::host::gemm_detail::reads_b_in_place;
    // Attention's P V: 32 rows against a 128 x 64 block of V at a row stride of 3C.
    const std::int64_t M = 96, N = 64, K = 450, ldb = 3 * 256, few = 8;
    CHECK(reads_b_in_place<14, 32>(Trans::no, 32, N, ldb));
    CHECK(reads_b_in_place<14, 32>(Trans::no, few, N, ldb));
    CHECK_FALSE(reads_b_in_place<14, 32>(Trans::no, M, N, ldb));      // 7 row tiles: packed
    CHECK_FALSE(reads_b_in_place<14, 32>(Trans::yes, few, N, ldb));   // a transposed B: packed
    CHECK_FALSE(reads_b_in_place<14, 32>(Trans::no, few, N - 8, ldb));  // a partial panel: packed
    const auto A = normal_values(static_cast<std::size_t>(M * K), 11);
    const auto B = normal_values(static_cast<std::size_t>(K * ldb), 12);
    for (CpuIsa isa : runnable_levels()) {
        CAPTURE(loom::kernels::host::name_of(isa));
        loom::kernels::host::set_host_gemm({HostGemmBackend::loom, isa});
        for (float beta : {0.0f, 1.0f}) {
            CAPTURE(beta);
            auto packed = normal_values(static_cast<std::size_t>(M * N), 13), in_place = packed;
            loom::kernels::host::gemm(Trans::no, Trans::no, M, N, K, 0.5f, A.data(), K, B.data() + 7 * 16, ldb, beta,
                                      packed.data(), N);
            for (std::int64_t i0 = 0; i0 < M; i0 += few)
                loom::kernels::host::gemm(Trans::no, Trans::no, few, N, K, 0.5f, A.data() + i0 * K, K,
                                          B.data() + 7 * 16, ldb, beta, in_place.data() + i0 * N, N);
            CHECK(std::memcmp(packed.data(), in_place.data(), packed.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("the AVX-512 packing of a transposed B by register transposes lays out pack_b's panels",
          "[kernels][gemm][gemm_kernels]") {
#if defined(LOOM_GEMM_X86)
    if (!loom::kernels::host::cpu_features().runs(CpuIsa::avx512)) {
        WARN("skipped: this CPU has no AVX-512");
        return;
    }
    const std::int64_t N = 90, K = 70, ldb = K + 3;
    const auto B = normal_values(static_cast<std::size_t>(N * ldb), 31);
    // Whole and partial 16-row halves, a half past nc, k blocks with and without a remainder of 16.
    for (std::int64_t nc : {std::int64_t{64}, std::int64_t{45}, std::int64_t{13}, std::int64_t{90}})
        for (std::int64_t kc : {std::int64_t{16}, std::int64_t{37}, std::int64_t{64}})
            for (std::int64_t j0 : {std::int64_t{0}, std::int64_t{N - nc}}) {
                CAPTURE(nc, kc, j0);
                const std::int64_t k0 = K - kc, floats = (nc + 31) / 32 * 32 * kc;
                std::vector<float> expected(static_cast<std::size_t>(floats), -1.0f), packed(expected.size(), -2.0f);
                loom::kernels::host::gemm_detail::pack_b<32, false>(Trans::yes, B.data(), ldb, k0, kc, j0, nc,
                                                                     expected.data());
                loom::kernels::host::gemm_detail::pack_b_transposed_avx512(B.data(), ldb, k0, kc, j0, nc,
                                                                           packed.data());
                CHECK(packed == expected);
            }
#else
    WARN("skipped: not an x86-64 build");
#endif
}

TEST_CASE("gemm_bias adds the bias in the product's pass: the bits of a product onto rows of the bias",
          "[kernels][gemm][gemm_kernels]") {
    KeepHostGemm keep;
    // K past kc (the bias only at the first k block), a partial tile, tall and wide (rows or columns split);
    // bf16 inputs by rounded f32 products and, where the CPU has them, by bf16 dot products.
    const std::vector<Shape> shapes{{37, 70, 900}, {300, 40, 64}, {5, 200, 17}};
    for (CpuIsa isa : runnable_levels())
        for (const Shape& s : shapes)
            for (int inputs : {0, 1, 2})
                for (int threads : {1, 2}) {
                    const bool bf16_inputs = inputs > 0;
                    CAPTURE(loom::kernels::host::name_of(isa), s.M, s.N, s.K, inputs, threads);
                    loom::kernels::host::set_host_gemm({HostGemmBackend::loom, isa});
                    loom::kernels::host::set_gemm_threads(threads);
                    loom::kernels::host::gemm_detail::bf16_dot_setting().store(inputs == 2);
                    const auto A = normal_values(static_cast<std::size_t>(s.M * s.K), 21);
                    const auto B = normal_values(static_cast<std::size_t>(s.N * s.K), 22);
                    const auto bias = normal_values(static_cast<std::size_t>(s.N), 23);
                    std::vector<float> fused(static_cast<std::size_t>(s.M * s.N), std::nanf("")), onto(fused.size());
                    loom::kernels::host::gemm_bias(bf16_inputs, Trans::no, Trans::yes, s.M, s.N, s.K, 0.5f, A.data(),
                                                   s.K, B.data(), s.K, bias.data(), fused.data(), s.N);
                    loom::kernels::host::repeat_rows(bias.data(), onto.data(), s.M, s.N);
                    if (bf16_inputs)
                        loom::kernels::host::gemm_bf16_inputs(Trans::no, Trans::yes, s.M, s.N, s.K, 0.5f, A.data(),
                                                              s.K, B.data(), s.K, 1.0f, onto.data(), s.N);
                    else
                        loom::kernels::host::gemm(Trans::no, Trans::yes, s.M, s.N, s.K, 0.5f, A.data(), s.K,
                                                  B.data(), s.K, 1.0f, onto.data(), s.N);
                    CHECK(std::memcmp(fused.data(), onto.data(), fused.size() * sizeof(float)) == 0);
                }
}

TEST_CASE("loom's GEMM with K = 0 or alpha = 0 scales C by beta and reads neither A nor B",
          "[kernels][gemm][gemm_kernels]") {
    KeepHostGemm keep;
    for (CpuIsa isa : runnable_levels()) {
        CAPTURE(loom::kernels::host::name_of(isa));
        loom::kernels::host::set_host_gemm({HostGemmBackend::loom, isa});
        std::vector<float> C{1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f};
        const std::vector<float> nan_operand(8, std::numeric_limits<float>::quiet_NaN());
        loom::kernels::host::gemm(Trans::no, Trans::no, 2, 2, 0, 1.0f, nan_operand.data(), 1, nan_operand.data(), 2,
                                  0.0f, C.data(), 2);
        CHECK(C == std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f});
        C = {1.0f, 2.0f, 3.0f, 4.0f};
        loom::kernels::host::gemm(Trans::no, Trans::no, 2, 2, 2, 0.0f, nan_operand.data(), 2, nan_operand.data(), 2,
                                  0.5f, C.data(), 2);
        CHECK(C == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
    }
}

TEST_CASE("loom's GEMM gives the same bits however M and N are split and on 1, 2 or 3 threads",
          "[kernels][gemm][gemm_kernels]") {
    KeepHostGemm keep;
    const std::int64_t M = 97, N = 150, K = 500;
    for (CpuIsa isa : runnable_levels()) {
        loom::kernels::host::set_host_gemm({HostGemmBackend::loom, isa});
        for (Trans ta : {Trans::no, Trans::yes})
            for (Trans tb : {Trans::no, Trans::yes}) {
                CAPTURE(loom::kernels::host::name_of(isa), static_cast<bool>(ta), static_cast<bool>(tb));
                const std::int64_t lda = ta == Trans::no ? K : M, ldb = tb == Trans::no ? N : K;
                const auto A = normal_values(static_cast<std::size_t>(M * K), 4);
                const auto B = normal_values(static_cast<std::size_t>(K * N), 5);
                const auto C0 = normal_values(static_cast<std::size_t>(M * N), 6);
                auto whole = C0;
                loom::kernels::host::set_gemm_threads(1);
                loom::kernels::host::gemm(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f, whole.data(), N);
                // Column shards at odd cuts (a tensor-parallel split), then row shards.
                auto by_columns = C0, by_rows = C0;
                for (std::int64_t j0 : {std::int64_t{0}, std::int64_t{37}, std::int64_t{101}}) {
                    const std::int64_t j1 = j0 == 0 ? 37 : j0 == 37 ? 101 : N;
                    const float* b = tb == Trans::no ? B.data() + j0 : B.data() + j0 * ldb;
                    loom::kernels::host::gemm(ta, tb, M, j1 - j0, K, 1.0f, A.data(), lda, b, ldb, 1.0f,
                                              by_columns.data() + j0, N);
                }
                for (std::int64_t i0 : {std::int64_t{0}, std::int64_t{5}, std::int64_t{60}}) {
                    const std::int64_t i1 = i0 == 0 ? 5 : i0 == 5 ? 60 : M;
                    const float* a = ta == Trans::no ? A.data() + i0 * lda : A.data() + i0;
                    loom::kernels::host::gemm(ta, tb, i1 - i0, N, K, 1.0f, a, lda, B.data(), ldb, 1.0f,
                                              by_rows.data() + i0 * N, N);
                }
                CHECK(std::memcmp(by_columns.data(), whole.data(), whole.size() * 4) == 0);
                CHECK(std::memcmp(by_rows.data(), whole.data(), whole.size() * 4) == 0);
                for (int threads : {2, 3}) {
                    auto threaded = C0;
                    loom::kernels::host::set_gemm_threads(threads);
                    loom::kernels::host::gemm(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 1.0f,
                                              threaded.data(), N);
                    CHECK(std::memcmp(threaded.data(), whole.data(), whole.size() * 4) == 0);
                }
                // A tall product, split by rows between threads.
                auto tall = normal_values(static_cast<std::size_t>(600 * 20), 7), tall_threaded = tall;
                const auto tall_a = normal_values(static_cast<std::size_t>(600 * 64), 8);
                const auto tall_b = normal_values(static_cast<std::size_t>(64 * 20), 9);
                loom::kernels::host::set_gemm_threads(1);
                loom::kernels::host::gemm(Trans::no, tb, 600, 20, 64, 1.0f, tall_a.data(), 64, tall_b.data(),
                                          tb == Trans::no ? 20 : 64, 0.0f, tall.data(), 20);
                loom::kernels::host::set_gemm_threads(2);
                loom::kernels::host::gemm(Trans::no, tb, 600, 20, 64, 1.0f, tall_a.data(), 64, tall_b.data(),
                                          tb == Trans::no ? 20 : 64, 0.0f, tall_threaded.data(), 20);
                CHECK(std::memcmp(tall.data(), tall_threaded.data(), tall.size() * 4) == 0);
            }
    }
}

TEST_CASE("the dispatcher runs loom's kernels at the CPU's own instruction level by default",
          "[kernels][gemm][gemm_kernels]") {
    using loom::kernels::host::cpu_features;
    // The CPU's flags as the kernel reports them, read independently of cpuid.
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line, flags, vendor;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("vendor_id", 0) == 0 && vendor.empty()) vendor = line;
        if (line.rfind("flags", 0) == 0) {
            flags = line + " ";
            break;
        }
    }
    const auto has = [&](const char* flag) { return flags.find(std::string(" ") + flag + " ") != std::string::npos; };
    if (!flags.empty()) {
        const bool avx512 = has("avx512f") && has("avx512bw") && has("avx512dq") && has("avx512vl");
        const bool avx2 = has("avx2") && has("fma");
        const CpuIsa expected = avx512 && avx2 ? CpuIsa::avx512 : avx2 ? CpuIsa::avx2 : CpuIsa::portable;
        CHECK(cpu_features().best() == expected);
        CHECK(cpu_features().avx512_bf16 == (avx512 && avx2 && has("avx512_bf16")));
        // bf16 products take vdpbf16ps by default where it runs at the FMA's rate: AMD's.
        const bool amd = vendor.find("AuthenticAMD") != std::string::npos;
        CHECK(cpu_features().bf16_dot_full_rate == (cpu_features().avx512_bf16 && amd));
    }
    if (std::getenv("LOOM_HOST_GEMM_BF16") == nullptr)
        CHECK(loom::kernels::host::gemm_detail::bf16_dot_setting().load() == cpu_features().bf16_dot_full_rate);
    const HostGemm chosen = loom::kernels::host::gemm_detail::parse_host_gemm("");
    CHECK(chosen.backend == HostGemmBackend::loom);
    CHECK(chosen.isa == cpu_features().best());
    KeepHostGemm keep;
    loom::kernels::host::set_host_gemm(chosen);
    loom::kernels::host::set_gemm_threads(1);
    const std::string description = loom::kernels::host::host_gemm_description();
    CHECK(description.rfind(std::string("loom ") + loom::kernels::host::name_of(cpu_features().best()) + " ", 0) == 0);
    CHECK(description.find(", 1 thread") != std::string::npos);
}

TEST_CASE("OpenBLAS kernel families map to their instruction levels, and a lower one is reported with the fix",
          "[kernels][gemm][gemm_kernels]") {
    using loom::kernels::host::gemm_detail::openblas_core_level;
    CHECK(openblas_core_level("skylakex") == CpuIsa::avx512);
    CHECK(openblas_core_level("sapphirerapids") == CpuIsa::avx512);
    CHECK(openblas_core_level("haswell") == CpuIsa::avx2);
    CHECK(openblas_core_level("zen") == CpuIsa::avx2);
    CHECK(openblas_core_level("prescott") == CpuIsa::portable);
    const std::string core = loom::kernels::host::gemm_detail::openblas_corename();
    const std::string warning = loom::kernels::host::blas_kernel_warning();
    if (!core.empty()) {
        const bool below = static_cast<int>(openblas_core_level(loom::kernels::host::gemm_detail::lower(core))) <
                           static_cast<int>(loom::kernels::host::cpu_features().best());
        CHECK(warning.empty() == !below);
        if (below) {
            CHECK(warning.find(core) != std::string::npos);
            CHECK(warning.find("OPENBLAS_CORETYPE=") != std::string::npos);
        }
    } else {
        CHECK(warning.empty());
    }
}

TEST_CASE("the host GEMM's knobs refuse bad values, naming them", "[kernels][gemm][gemm_kernels]") {
    using loom::kernels::host::gemm_detail::parse_host_gemm;
    CHECK(message_of([] { (void)parse_host_gemm("mkl"); }) ==
          "LOOM_HOST_GEMM = 'mkl' is not one of: loom, loom-avx512, loom-avx2, loom-portable, blas");
    CHECK(parse_host_gemm("blas").backend == HostGemmBackend::blas);
    CHECK(parse_host_gemm("loom-portable").isa == CpuIsa::portable);
    CHECK(message_of([] { loom::kernels::host::set_gemm_threads(0); }) ==
          "set_gemm_threads: threads = 0; pass at least 1");
    CHECK(message_of([] { (void)loom::kernels::host::gemm_threads_for(0); }) ==
          "gemm_threads_for: rank_threads = 0; pass at least 1");
    CHECK(loom::kernels::host::gemm_threads_for(1) >= 1);
    if (!loom::kernels::host::cpu_features().runs(CpuIsa::avx512)) {
        CHECK(message_of([] { loom::kernels::host::set_host_gemm({HostGemmBackend::loom, CpuIsa::avx512}); })
                  .rfind("set_host_gemm: this CPU cannot run loom's avx512 kernels; its level is ", 0) == 0);
    }
}

TEST_CASE("bf16 products round their operands in the packing: the f32 GEMM's bits on rounded copies, every level",
          "[kernels][gemm][gemm_kernels][bf16]") {
    KeepHostGemm keep;
    loom::kernels::host::set_bf16_dot_products(false);
    const std::vector<Shape> shapes{{1, 1, 1}, {15, 17, 19}, {256, 64, 64}, {256, 192, 64}, {64, 64, 256},
                                    {31, 200, 401}};
    for (CpuIsa isa : runnable_levels()) {
        loom::kernels::host::set_host_gemm({HostGemmBackend::loom, isa});
        for (const Shape& s : shapes)
            for (Trans ta : {Trans::no, Trans::yes})
                for (Trans tb : {Trans::no, Trans::yes})
                    for (float beta : {0.0f, 1.0f}) {
                        CAPTURE(loom::kernels::host::name_of(isa), s.M, s.N, s.K, static_cast<bool>(ta),
                                static_cast<bool>(tb), beta);
                        const std::int64_t lda = (ta == Trans::no ? s.K : s.M) + 2;
                        const std::int64_t ldb = (tb == Trans::no ? s.N : s.K) + 1;
                        const auto A = normal_values(static_cast<std::size_t>((ta == Trans::no ? s.M : s.K) * lda), 12);
                        const auto B = normal_values(static_cast<std::size_t>((tb == Trans::no ? s.K : s.N) * ldb), 13);
                        auto C = normal_values(static_cast<std::size_t>(s.M * s.N), 14);
                        auto expected = C;
                        loom::kernels::host::gemm_bf16_inputs(ta, tb, s.M, s.N, s.K, 0.5f, A.data(), lda, B.data(),
                                                              ldb, beta, C.data(), s.N);
                        const auto Ar = loom_test::rounded_to_bf16(A), Br = loom_test::rounded_to_bf16(B);
                        loom::kernels::host::gemm(ta, tb, s.M, s.N, s.K, 0.5f, Ar.data(), lda, Br.data(), ldb, beta,
                                                  expected.data(), s.N);
                        CHECK(std::memcmp(C.data(), expected.data(), C.size() * 4) == 0);
                    }
    }
}

TEST_CASE("bf16 dot products (vdpbf16ps) match a double loop over the rounded operands and split without a bit changed",
          "[kernels][gemm][gemm_kernels][bf16]") {
    if (!loom::kernels::host::cpu_features().avx512_bf16) {
        CHECK(message_of([] { loom::kernels::host::set_bf16_dot_products(true); })
                  .rfind("set_bf16_dot_products: this CPU has no AVX512_BF16 (vdpbf16ps)", 0) == 0);
        return;
    }
    KeepHostGemm keep;
    loom::kernels::host::set_host_gemm({HostGemmBackend::loom, CpuIsa::avx512});
    loom::kernels::host::set_bf16_dot_products(true);
    CHECK(loom::kernels::host::host_gemm_description().find("vdpbf16ps") != std::string::npos);
    const std::vector<Shape> shapes{{1, 1, 1},    {1, 37, 6},    {15, 17, 19}, {14, 32, 2},
                                    {256, 64, 64}, {31, 65, 1025}, {150, 150, 77}};
    for (const Shape& s : shapes)
        for (Trans ta : {Trans::no, Trans::yes})
            for (Trans tb : {Trans::no, Trans::yes})
                for (float beta : {0.0f, 1.0f}) {
                    CAPTURE(s.M, s.N, s.K, static_cast<bool>(ta), static_cast<bool>(tb), beta);
                    const auto [M, N, K] = s;
                    const std::int64_t lda = (ta == Trans::no ? K : M) + 3, ldb = (tb == Trans::no ? N : K) + 1;
                    const std::int64_t ldc = N + 2;
                    const auto A = normal_values(static_cast<std::size_t>((ta == Trans::no ? M : K) * lda), 15);
                    const auto B = normal_values(static_cast<std::size_t>((tb == Trans::no ? K : N) * ldb), 16);
                    auto C = normal_values(static_cast<std::size_t>(M * ldc), 17);
                    const auto C_before = C;
                    loom::kernels::host::gemm_bf16_inputs(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, beta,
                                                          C.data(), ldc);
                    const auto Ar = loom_test::rounded_to_bf16(A), Br = loom_test::rounded_to_bf16(B);
                    std::int64_t wrong = 0;
                    for (std::int64_t i = 0; i < M; ++i)
                        for (std::int64_t j = 0; j < ldc; ++j) {
                            const auto at = static_cast<std::size_t>(i * ldc + j);
                            if (j >= N) {
                                wrong += C[at] != C_before[at] ? 1 : 0;
                                continue;
                            }
                            double product = 0.0, magnitude = 0.0;
                            for (std::int64_t k = 0; k < K; ++k) {
                                const double term = op_at(Ar, lda, ta, i, k) * op_at(Br, ldb, tb, k, j);
                                product += term;
                                magnitude += std::fabs(term);
                            }
                            const double expected = product + (beta == 0.0f ? 0.0 : double{C_before[at]});
                            const double scale = magnitude + std::fabs(double{C_before[at]});
                            wrong += std::fabs(C[at] - expected) <= (static_cast<double>(K) + 3.0) * 6e-8 * scale + 1e-12
                                         ? 0
                                         : 1;
                        }
                    CHECK(wrong == 0);
                    // The same product in three column shards and on two threads: the same bits.
                    auto sharded = C_before, threaded = C_before;
                    for (std::int64_t j0 = 0; j0 < N; j0 += 40) {
                        const std::int64_t n = std::min<std::int64_t>(40, N - j0);
                        const float* b = tb == Trans::no ? B.data() + j0 : B.data() + j0 * ldb;
                        loom::kernels::host::gemm_bf16_inputs(ta, tb, M, n, K, 1.0f, A.data(), lda, b, ldb, beta,
                                                              sharded.data() + j0, ldc);
                    }
                    loom::kernels::host::set_gemm_threads(2);
                    loom::kernels::host::gemm_bf16_inputs(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, beta,
                                                          threaded.data(), ldc);
                    loom::kernels::host::set_gemm_threads(1);
                    CHECK(std::memcmp(sharded.data(), C.data(), C.size() * 4) == 0);
                    CHECK(std::memcmp(threaded.data(), C.data(), C.size() * 4) == 0);
                }
}

}  // namespace LOOM_TEST_FILE
