// GptTraining: the compressor's warm-up by default, the memory preflight's
// layout (OptEx's own), and the corpus checked to hold a sequence.
#include <catch2/catch.hpp>

#include <loom/train/gpt_training.hpp>

#include <fstream>
#include "io/temp_dir.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("GptTraining::warmup_steps: given, or the compressor's share of the steps", "[train][gpt_training]") {
    loom::train::GptTraining run;
    run.steps = 100;
    CHECK(run.warmup_steps() == 0);
    run.strategy.dp_compression = loom::parse_compression("topk:0.1");
    CHECK(run.warmup_steps() == 10);
    run.strategy.dp_compression = loom::parse_compression("onebit");
    CHECK(run.warmup_steps() == 20);
    run.strategy.dp_compression = loom::parse_compression("int8");
    CHECK(run.warmup_steps() == 0);
    run.compress_warmup = 7;
    CHECK(run.warmup_steps() == 7);
    CHECK(run.compress().on());
}

TEST_CASE("GptTraining::step_loop: its settings, and a resume past the last step refused", "[train][gpt_training]") {
    loom::train::GptTraining run;
    run.steps = 10, run.save = "x.st", run.save_every = 2, run.keep = 3, run.metrics = "m.jsonl";
    const auto loop = run.step_loop(4, 64, loom::host_device);
    CHECK(loop.first_step == 4);
    CHECK(loop.until == 10);  // until -1: the schedule's end
    CHECK(loop.tokens_per_step == 64);
    CHECK(loop.save == "x.st");
    CHECK(loop.save_every == 2);
    CHECK(loop.keep == 3);
    CHECK(loop.metrics == "m.jsonl");
    run.until = 6, run.resume = "r.st";
    CHECK(run.step_loop(6, 64, loom::host_device).until == 6);
    CHECK_THROWS_WITH(run.step_loop(7, 64, loom::host_device),
                      Catch::StartsWith("the checkpoint r.st is at step 7, past the run's last step 6"));
}

TEST_CASE("training_layout: the strategy's, but OptEx keeps no ZeRO and one micro-batch", "[train][gpt_training]") {
    loom::train::GptTraining run;
    run.batch = 16, run.pp = 2, run.micro_batches = 4;
    run.strategy.zero_stage = 2;
    auto layout = loom::train::training_layout(run, 2, 4);
    CHECK(layout.batch == 16);
    CHECK(layout.dp == 2);
    CHECK(layout.pp == 2);
    CHECK(layout.zero == 2);
    CHECK(layout.micro_batches == 4);
    CHECK(layout.ranks_in_process == 4);
    run.optex = 2;
    layout = loom::train::training_layout(run, 2, 4);
    CHECK(layout.zero == 0);
    CHECK(layout.micro_batches == 1);
}

TEST_CASE("training_corpus: synthetic, from a file, and a file too short for one sequence", "[train][gpt_training]") {
    loom::train::GptTraining run;
    run.model.seq = 8;
    CHECK(loom::train::training_corpus(run).size() == std::int64_t{1} << 20);
    const loom_test::TempDir dir;
    run.data = (dir / "short.txt").string();
    std::ofstream(run.data) << "abc";
    CHECK_THROWS_AS(loom::train::training_corpus(run), loom::Error);
    std::ofstream(run.data) << "a text long enough for one sequence and its targets";
    CHECK(loom::train::training_corpus(run).size() > 9);
}

}  // namespace LOOM_TEST_FILE
