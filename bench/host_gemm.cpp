// The host GEMM's rate on this machine, single-core and on two threads, at
// 1024^3 and at the products of config B (bench/gpt_bench_configs.hpp: 256
// rows x 64..256, both transposes a Linear runs), for loom's kernels (f32 and
// bf16) beside the linked OpenBLAS as it loads by default and, in a child
// process of this bench, with OPENBLAS_CORETYPE forced to the CPU's level.
// Prints the CPU model and the kernels used. Medians of timed repetitions.
//
//   bench/host_gemm [--reps N]
#include <loom/kernels/host/gemm.hpp>

#include "cpu_model.hpp"
#include "timing.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {

using loom::kernels::host::CpuIsa;
using loom::kernels::host::HostGemmBackend;
using loom::kernels::host::Trans;

struct Product {
    const char* name;
    Trans ta, tb;
    std::int64_t M, N, K;
};

// 1024^3, then the Linear products of config B (C = 64, rows = B x T = 256):
// forward x W^T (no, yes), input gradient dy W (no, no), weight gradient
// dy^T x (yes, no).
const std::vector<Product>& products() {
    static const std::vector<Product> list{
        {"1024^3 nn", Trans::no, Trans::no, 1024, 1024, 1024},
        {"256x64x64 nt", Trans::no, Trans::yes, 256, 64, 64},
        {"256x192x64 nt", Trans::no, Trans::yes, 256, 192, 64},
        {"256x256x64 nt", Trans::no, Trans::yes, 256, 256, 64},
        {"256x64x256 nt", Trans::no, Trans::yes, 256, 64, 256},
        {"256x64x192 nn", Trans::no, Trans::no, 256, 64, 192},
        {"256x64x256 nn", Trans::no, Trans::no, 256, 64, 256},
        {"192x64x256 tn", Trans::yes, Trans::no, 192, 64, 256},
        {"64x256x256 tn", Trans::yes, Trans::no, 64, 256, 256},
    };
    return list;
}

// GFLOP/s of one product on the host GEMM as currently set.
double rate(const Product& p, bool bf16, int reps) {
    const std::int64_t a_size = p.M * p.K, b_size = p.K * p.N;
    std::vector<float> a(static_cast<std::size_t>(a_size)), b(static_cast<std::size_t>(b_size)),
        c(static_cast<std::size_t>(p.M * p.N), 0.0f);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5f + static_cast<float>(i % 7) * 0.125f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = 1.0f - static_cast<float>(i % 5) * 0.125f;
    const std::int64_t lda = p.ta == Trans::no ? p.K : p.M, ldb = p.tb == Trans::no ? p.N : p.K;
    const double flops = 2.0 * static_cast<double>(p.M) * static_cast<double>(p.N) * static_cast<double>(p.K);
    // Enough calls per timing for ~2 ms, so that small products are timed in bulk.
    const int calls = std::max(1, static_cast<int>(2e-3 * 50e9 / flops));
    const auto run = [&] {
        for (int i = 0; i < calls; ++i) {
            if (bf16)
                loom::kernels::host::gemm_bf16_inputs(p.ta, p.tb, p.M, p.N, p.K, 1.0f, a.data(), lda, b.data(), ldb,
                                                      0.0f, c.data(), p.N);
            else
                loom::kernels::host::gemm(p.ta, p.tb, p.M, p.N, p.K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                                          c.data(), p.N);
        }
        bench::keep_memory(c.data());
    };
    run();
    return flops * calls / bench::median_seconds(reps, run) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
    int reps = 9;
    bool blas_only = false;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--reps" && i + 1 < argc)
            reps = std::atoi(argv[++i]);
        else if (flag == "--blas-only")
            blas_only = true;
        else {
            std::fprintf(stderr, "host_gemm bench: unknown flag %s; flags are --reps N\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1) {
        std::fprintf(stderr, "host_gemm bench: --reps %d; pass at least 1\n", reps);
        return 2;
    }
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    loom::kernels::host::set_blas_threads(1);
    const CpuIsa level = loom::kernels::host::cpu_features().best();
    if (blas_only) {  // the child: the BLAS's rate per product, one per line
        loom::kernels::host::set_host_gemm({HostGemmBackend::blas, level});
        for (const Product& p : products()) std::printf("%s|%.1f\n", p.name, rate(p, false, reps));
        return 0;
    }
    const std::string core = loom::kernels::host::gemm_detail::openblas_corename();
    const char* fix = level == CpuIsa::avx512 ? "SkylakeX" : level == CpuIsa::avx2 ? "Haswell" : "";
    std::map<std::string, double> forced;
    if (!core.empty() && *fix != '\0') {
        const std::string command = std::string("OPENBLAS_CORETYPE=") + fix + " '" + argv[0] + "' --blas-only --reps " +
                                    std::to_string(reps);
        if (FILE* pipe = popen(command.c_str(), "r")) {
            char line[256];
            while (std::fgets(line, sizeof line, pipe) != nullptr) {
                const std::string text(line);
                const auto bar = text.find('|');
                if (bar != std::string::npos) forced[text.substr(0, bar)] = std::atof(text.c_str() + bar + 1);
            }
            pclose(pipe);
        }
    }
    std::printf("# CPU: %s; loom's level %s%s\n", bench::cpu_model().c_str(), loom::kernels::host::name_of(level),
                loom::kernels::host::cpu_features().avx512_bf16 ? " (avx512_bf16)" : "");
    const loom::kernels::host::HostGemm chosen = loom::kernels::host::host_gemm();
    std::printf("# host GEMM in use: %s\n", loom::kernels::host::host_gemm_report().c_str());
    std::printf("# OpenBLAS as loaded: %s; forced: OPENBLAS_CORETYPE=%s\n", core.empty() ? "(not OpenBLAS)" : core.c_str(),
                *fix != '\0' ? fix : "-");
    std::printf("# GFLOP/s, median of %d; 1 thread unless said\n", reps);
    std::printf("# %-15s %10s %10s %12s %10s %12s %9s\n", "product", "loom f32", "loom bf16", "loom f32 2t",
                "blas", "blas forced", "loom/best");
    for (const Product& p : products()) {
        loom::kernels::host::set_host_gemm({HostGemmBackend::loom, level});
        loom::kernels::host::set_gemm_threads(1);
        const double f32 = rate(p, false, reps), bf16 = rate(p, true, reps);
        loom::kernels::host::set_gemm_threads(2);
        const double two = rate(p, false, reps);
        loom::kernels::host::set_gemm_threads(1);
        loom::kernels::host::set_host_gemm({HostGemmBackend::blas, level});
        const double blas = rate(p, false, reps);
        const double blas_forced = forced.count(p.name) != 0 ? forced[p.name] : 0.0;
        std::printf("  %-15s %10.1f %10.1f %12.1f %10.1f %12.1f %9.2f\n", p.name, f32, bf16, two, blas, blas_forced,
                    f32 / std::max(blas, blas_forced));
    }
    loom::kernels::host::set_host_gemm(chosen);
    return 0;
}
