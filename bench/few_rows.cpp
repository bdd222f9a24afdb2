// The Linear of a decode step or a verification pass (infer/few_rows_linear.hpp)
// against loom's packed GEMM (kernels::host::gemm_bias, what a forward of
// more than infer::few_rows rows runs), row counts 1-96, at GPT config A's
// shapes (width 256: qkv 256 -> 768, MLP 256 -> 1024 and 1024 -> 256) and at
// width 384's, one thread. Prints each shape's times and GFLOP/s and the row
// count from which the GEMM wins, which infer::few_rows is chosen from.
//
//   bench_few_rows [--reps 9]
#include <loom/infer/few_rows_linear.hpp>
#include <loom/kernels/host/gemm.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu_model.hpp"
#include "timing.hpp"

int main(int argc, char** argv) {
    int reps = 9;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "bench_few_rows: unknown flag %s (--reps N)\n", argv[i]);
            return 2;
        }
    }
    if (reps < 1) {
        std::fprintf(stderr, "bench_few_rows: --reps must be >= 1\n");
        return 2;
    }
    namespace host = loom::kernels::host;
    host::set_blas_threads(1);
    std::printf("CPU: %s; GEMM: %s; few_rows = %lld\n\n", bench::cpu_model().c_str(),
                host::host_gemm_description().c_str(), static_cast<long long>(loom::infer::few_rows()));
    struct Shape {
        std::int64_t in, out;
    };
    const std::vector<Shape> shapes{{256, 768}, {256, 1024}, {1024, 256}, {384, 1152}, {384, 1536}, {1536, 384}};
    const std::vector<std::int64_t> rows_list{1, 2, 4, 5, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96};
    std::printf("| in -> out | rows | few rows (us) | GEMM (us) | few rows GFLOP/s | GEMM GFLOP/s |\n"
                "| --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (const Shape& s : shapes) {
        std::vector<float> w(static_cast<std::size_t>(s.in * s.out), 0.01f), b(static_cast<std::size_t>(s.out), 0.5f);
        std::int64_t crossover = 0;
        for (std::int64_t rows : rows_list) {
            std::vector<float> x(static_cast<std::size_t>(rows * s.in), 0.25f), y(static_cast<std::size_t>(rows * s.out));
            auto few = [&] {
                for (int k = 0; k < 20; ++k)
                    loom::infer::few_rows_linear(x.data(), w.data(), b.data(), y.data(), rows, s.in, s.out);
                bench::keep_memory(y.data());
            };
            auto gemm = [&] {
                for (int k = 0; k < 20; ++k)
                    host::gemm_bias(false, host::Trans::no, host::Trans::yes, rows, s.out, s.in, 1.0f, x.data(), s.in,
                                    w.data(), s.in, b.data(), y.data(), s.out);
                bench::keep_memory(y.data());
            };
            few();
            gemm();
            const double tf = bench::median_seconds(reps, few) / 20, tg = bench::median_seconds(reps, gemm) / 20;
            const double flops = 2.0 * static_cast<double>(rows * s.in * s.out);
            if (crossover == 0 && tg < tf) crossover = rows;
            std::printf("| %lld -> %lld | %lld | %.1f | %.1f | %.1f | %.1f |\n", static_cast<long long>(s.in),
                        static_cast<long long>(s.out), static_cast<long long>(rows), tf * 1e6, tg * 1e6,
                        flops / tf * 1e-9, flops / tg * 1e-9);
        }
        const std::string from = crossover > 0 ? std::to_string(crossover) + " rows" : "none up to 96 rows";
        std::printf("| %lld -> %lld | GEMM first faster at: %s | | | | |\n", static_cast<long long>(s.in),
                    static_cast<long long>(s.out), from.c_str());
    }
    return 0;
}
