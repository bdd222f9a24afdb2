// The lines a training run opens with, from plain values: what it trains
// (the model, its size, the batch, the data), how (the strategy, its degrees,
// the transport, the threads, the matrix products, the host GEMM, the
// pipeline's stages, what tensor parallelism cut), and what a reader should
// know before the first step (cores oversubscribed, a resume, a compressor's
// state that starts from zero, an uncompressed warm-up). Written once, so
// that every trainer's logs read alike and a test can check them without
// running anything.
//
//   for (const std::string& line : train::run_summary(facts)) std::printf("%s\n", line.c_str());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::train {

// What the summary says; empty strings and zeros are left out.
struct RunFacts {
    std::string model{};             // the configuration as it prints ("GPT(4 layers, width 256, ...)")
    std::int64_t parameters = 0;   // the whole model's
    std::int64_t batch = 0, seq = 0;
    std::string data{};              // the corpus, described
    std::string strategy{};          // as Strategy<...> prints
    int ranks = 1;
    std::string transport{};         // "rank threads", "MPI processes", ...
    int dp = 1, pp = 1, tp = 1, sp = 1;
    int micro_batches = 1;
    int blas_threads = 1;          // per rank
    std::string matmul{};            // a line on the matrix products' precision; empty: plain f32
    std::string gemm{};              // the host GEMM's report; empty: not said
    std::string stages{};            // the pipeline's stages, described; empty without a pipeline
    std::string stages_from{};       // where their split came from
    std::string cuts{};              // what tensor parallelism did to the layers; empty without it
    unsigned cores = 0;            // this machine's, when the ranks are threads of this process; 0: not threads
    std::int64_t resumed_at = 0;   // the step a resume starts at; 0: a fresh run
    std::string resumed_from{};
    std::string compression_note{};  // why a resume starts the compressor's error feedback from zero
    std::string compressor{};        // the dp compressor, described
    std::int64_t warmup = 0;       // uncompressed steps before it starts
};

// The opening lines, in the order a reader wants them.
[[nodiscard]] inline std::vector<std::string> run_summary(const RunFacts& f) {
    const auto plural = [](long long n, const char* one, const char* many) {
        return std::to_string(n) + " " + (n == 1 ? one : many);
    };
    std::vector<std::string> lines;
    lines.push_back(f.model + ", " + std::to_string(f.parameters) + " parameters, batch " + std::to_string(f.batch) +
                    " x " + std::to_string(f.seq) + " tokens, " + f.data);
    // The degrees are said when anything but data parallelism cuts the model.
    const std::string degrees =
        f.pp == 1 && f.tp == 1 && f.sp == 1
            ? ""
            : " (dp " + std::to_string(f.dp) + " x pp " + std::to_string(f.pp) + " x tp " + std::to_string(f.tp) +
                  (f.sp > 1 ? " x sp " + std::to_string(f.sp) : "") + ")";
    lines.push_back(f.strategy + " on " + std::to_string(f.ranks) + " " + f.transport + degrees + ", " +
                    plural(f.micro_batches, "micro-batch", "micro-batches") + ", " +
                    plural(f.blas_threads, "BLAS thread", "BLAS threads") + " per rank");
    if (!f.matmul.empty()) lines.push_back(f.matmul);
    if (!f.gemm.empty()) lines.push_back("host GEMM: " + f.gemm);
    if (!f.stages.empty()) lines.push_back("pipeline stages (" + f.stages_from + "): " + f.stages);
    if (!f.cuts.empty()) lines.push_back(f.cuts);
    // Threads beyond the cores time-share them: the speed a run shows is not the strategy's.
    if (f.cores > 0 && static_cast<unsigned>(f.ranks * f.blas_threads) > f.cores)
        lines.push_back("note: " + std::to_string(f.ranks) + " ranks x " + std::to_string(f.blas_threads) +
                        " BLAS threads oversubscribe the " + std::to_string(f.cores) + " cores; expect lower speed");
    if (f.resumed_at > 0) lines.push_back("resumed from " + f.resumed_from + " at step " + std::to_string(f.resumed_at));
    if (!f.compression_note.empty()) lines.push_back("note: " + f.compression_note + "; the error feedback starts from zero");
    if (f.warmup > 0)
        lines.push_back(f.compressor + " starts after " + std::to_string(f.warmup) + " uncompressed warm-up steps");
    return lines;
}

}  // namespace loom::train
