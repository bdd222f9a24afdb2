// train/gpt_training_rules.hpp: a run's settings checked before anything is
// built, each refusal in one line naming the settings as the front end
// spells them (a config file's plain names here; train_gpt's flags are
// checked through the binary, examples/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <loom/core/setting_names.hpp>
#include <loom/train/gpt_training_rules.hpp>

#include <string>
#include <string_view>

#include "io/temp_dir.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom_test::message_of;

loom::train::GptTraining tiny_run() {
    loom::train::GptTraining run;
    run.model = {.layers = 2, .width = 16, .heads = 2, .seq = 8, .vocab = 16};
    run.batch = 4;
    run.steps = 10;
    return run;
}

TEST_CASE("settled_training fills what follows from the settings", "[train][training_rules]") {
    auto run = tiny_run();
    run.optex = 2;
    const auto settled = loom::train::settled_training(run, {});
    CHECK(settled.until == 10);
    CHECK(settled.optex_config.workers == 2);
    CHECK(settled.optex_config.tune_every == 25);  // tuned by default from a history of 3 or more
    run.optex_tune = 0;
    CHECK(loom::train::settled_training(run, {}).optex_config.tune_every == 0);
}

TEST_CASE("settled_training refuses settings that disagree, in the front end's names", "[train][training_rules]") {
    const loom::SettingNames flags{[](std::string_view s) { return "--" + std::string(s); }};
    const auto refusal = [](loom::train::GptTraining run, const loom::SettingNames& names = {}) {
        return message_of([&] { (void)loom::train::settled_training(run, names); });
    };
    auto run = tiny_run();
    run.save_every = 5;
    CHECK(refusal(run) == "save_every 5 needs save FILE");
    CHECK(refusal(run, flags) == "--save_every 5 needs --save FILE");
    run = tiny_run();
    run.until = 11;
    CHECK(refusal(run) == "until 11 is past steps 10");
    run = tiny_run();
    run.compress_warmup = 3;
    CHECK(refusal(run) == "compress_warmup 3 needs a compressor; add compress");
    run = tiny_run();
    run.optex = 2;
    run.pp = 2;
    CHECK(refusal(run) == "optex 2 composes with dp only; drop pp 2");
    run.pp = 1;
    run.trace = "t.json";
    CHECK(refusal(run) == "optex 2 composes with dp only; drop trace (the step program is the executor's; OptEx steps outside it)");
    run = tiny_run();
    run.partition = "1,1";
    CHECK(refusal(run) == "partition 1,1 needs a pipeline; add pp 2 or more");
}

TEST_CASE("dp_degree checks the degrees against the world and the model", "[train][training_rules]") {
    auto run = tiny_run();
    CHECK(loom::train::dp_degree(run, 2, {}) == 2);  // what the world leaves
    run.dp = 3;
    CHECK(message_of([&] { (void)loom::train::dp_degree(run, 3, {}); }) ==
          "batch 4 does not split into dp 3 x 1 micro-batches of whole samples; use a batch that is a multiple of 3");
    run = tiny_run();
    run.pp = 2;
    run.strategy.pipelined = true;
    run.partition = "1,2";
    CHECK(message_of([&] { (void)loom::train::dp_degree(run, 2, {}); }) ==
          "partition 1,2 sums to 3 layers but the model has 2");
    run = tiny_run();
    run.optex = 4;
    CHECK(message_of([&] { (void)loom::train::dp_degree(run, 2, {}); }) ==
          "optex 4 needs a multiple of 4 ranks (one group per worker), but there are 2; use optex 2 or 4 x dp ranks");
}

TEST_CASE("check_device_settings names the heads a CUDA run can take", "[train][training_rules]") {
    auto run = tiny_run();
    run.model.width = 512;
    run.model.heads = 2;
    loom::train::check_device_settings(run, {});  // the host takes any head
    run.device = loom::cuda_device(0);
    CHECK(message_of([&] { loom::train::check_device_settings(run, {}); }) ==
          "device cuda:0: width 512 over heads 2 gives heads of 256 features; the CUDA attention kernels take at most "
          "128: use heads 4 (or another divisor of width giving heads of at most 128), or device host");
}

TEST_CASE("check_training_files names an output it cannot write by its setting", "[train][training_rules]") {
    const loom_test::TempDir dir;
    auto run = tiny_run();
    run.save = (dir / "missing" / "run.st").string();
    CHECK_THAT(message_of([&] { (void)loom::train::check_training_files(run, false, {}); }),
               Catch::StartsWith("save " + run.save + " cannot be written (checked before training): "));
    run.save = (dir / "run.st").string();
    CHECK(loom::train::check_training_files(run, false, {}).empty());
}

}  // namespace LOOM_TEST_FILE
