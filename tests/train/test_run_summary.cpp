// run_summary: the lines a run opens with, each said only when it applies.
#include <catch2/catch.hpp>

#include <loom/train/run_summary.hpp>

#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

loom::train::RunFacts plain() {
    return {.model = "GPT(layers=1)", .parameters = 11632, .batch = 2, .seq = 8, .data = "synthetic text",
            .strategy = "Strategy<DataParallel<>>", .ranks = 1, .transport = "rank thread", .gemm = "OpenBLAS"};
}

TEST_CASE("run_summary: a plain run says what it trains, how, and the GEMM", "[train][run_summary]") {
    CHECK(loom::train::run_summary(plain()) ==
          std::vector<std::string>{"GPT(layers=1), 11632 parameters, batch 2 x 8 tokens, synthetic text",
                                   "Strategy<DataParallel<>> on 1 rank thread, 1 micro-batch, 1 BLAS thread per rank",
                                   "host GEMM: OpenBLAS"});
}

TEST_CASE("run_summary: degrees, stages, cuts, oversubscription, a resume and a compressor", "[train][run_summary]") {
    auto facts = plain();
    facts.ranks = 8;
    facts.transport = "rank threads";
    facts.dp = 2, facts.pp = 2, facts.tp = 2;
    facts.micro_batches = 2, facts.blas_threads = 2;
    facts.matmul = "matrix products: bf16";
    facts.stages = "[0-1) [1-2)", facts.stages_from = "balanced";
    facts.cuts = "tp cut 4 layers";
    facts.cores = 4;
    facts.resumed_at = 7, facts.resumed_from = "run.st";
    facts.compression_note = "the checkpoint has no state for TopK";
    facts.compressor = "TopK<0.1>", facts.warmup = 3;
    const auto lines = loom::train::run_summary(facts);
    REQUIRE(lines.size() == 10);
    CHECK(lines[1] == "Strategy<DataParallel<>> on 8 rank threads (dp 2 x pp 2 x tp 2), 2 micro-batches, 2 BLAS threads per rank");
    CHECK(lines[2] == "matrix products: bf16");
    CHECK(lines[4] == "pipeline stages (balanced): [0-1) [1-2)");
    CHECK(lines[5] == "tp cut 4 layers");
    CHECK(lines[6] == "note: 8 ranks x 2 BLAS threads oversubscribe the 4 cores; expect lower speed");
    CHECK(lines[7] == "resumed from run.st at step 7");
    CHECK(lines[8] == "note: the checkpoint has no state for TopK; the error feedback starts from zero");
    CHECK(lines[9] == "TopK<0.1> starts after 3 uncompressed warm-up steps");

    facts.sp = 2;  // sp is named only when it is used
    CHECK_THAT(loom::train::run_summary(facts)[1], Catch::Contains("(dp 2 x pp 2 x tp 2 x sp 2)"));
    facts.cores = 16;  // enough cores: no note
    CHECK(loom::train::run_summary(facts).size() == 9);
}

}  // namespace LOOM_TEST_FILE
