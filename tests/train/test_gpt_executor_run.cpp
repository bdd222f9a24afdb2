// run_gpt_executor and run_optex_gpt: the GPT's whole runs from its
// settings (GptTraining), each resumed where it stopped, and a model sampled
// from its flat values as from itself.
#include <catch2/catch.hpp>

#include <loom/comm/any_comm.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/gpt/checkpoint.hpp>
#include <loom/gpt/sample.hpp>
#include <loom/nn/param_arena.hpp>
#include <loom/train/gpt_executor_run.hpp>
#include <loom/train/gpt_training.hpp>
#include <loom/train/optex_run.hpp>

#include <atomic>
#include <filesystem>
#include <vector>
#include "io/temp_dir.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom_test::TempDir;

const loom::gpt::Config tiny{.layers = 2, .width = 16, .heads = 2, .seq = 8};

TEST_CASE("gpt::sample from flat values is the model's own sample", "[train][gpt_executor_run]") {
    const auto config = tiny;
    loom::gpt::Model model = loom::gpt::make_model(config);
    loom::nn::ParamArena arena(model);
    arena.initialize(model, 5);
    const std::vector<float> values(arena.values().begin(), arena.values().end());
    CHECK(loom::gpt::sample(config, values, "ab", 12, 7) == loom::gpt::sample(model, config, "ab", 12, 7));
    CHECK_THROWS(loom::gpt::sample(config, std::vector<float>(3), "ab", 12, 7));
}

TEST_CASE("run_gpt_executor: a pipeline of two stages trains, saves and resumes", "[train][gpt_executor_run]") {
    const TempDir dir;
    const auto config = tiny;
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 12, 1, static_cast<int>(config.vocab));
    loom::StrategySpec strategy;
    strategy.pipelined = true;
    const auto run_until = [&](std::int64_t until, const std::string& resume, const std::string& save) {
        std::atomic<std::int64_t> done{-1};
        loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
            loom::comm::AnyComm world = loom::comm::AnyComm::view(comm);
            loom::train::GptTraining run;
            run.model = config, run.batch = 2, run.pp = 2, run.micro_batches = 2, run.strategy = strategy;
            run.steps = 4, run.until = until, run.resume = resume, run.save = save, run.sample = 8;
            done = loom::train::run_gpt_executor(
                world, run, {.dp = 1, .transport = "rank threads", .partition_from = "given"}, corpus,
                [&](const std::vector<int>& partition) {
                    return loom::exec::ExecutorOptions{.micro_batches = 2,
                                                       .field_names = {"embed", "blocks", "ln_f", "head", "loss"},
                                                       .partition = partition};
                });
        });
        return done.load();
    };
    CHECK(run_until(2, "", (dir / "half.st").string()) == 2);
    CHECK(run_until(4, (dir / "half.st").string(), (dir / "whole.st").string()) == 4);
    loom::gpt::Model model = loom::gpt::make_model(config);
    const loom::nn::ParamArena arena(model);
    std::vector<float> values(arena.values().size()), m(values.size()), v(values.size());
    CHECK(loom::gpt::load_checkpoint(dir / "whole.st", config, values, m, v).step == 4);
}

TEST_CASE("run_optex_gpt: two workers train, save and resume with their history", "[train][optex_run]") {
    const TempDir dir;
    const auto config = tiny;
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 12, 1, static_cast<int>(config.vocab));
    loom::optim::OptExConfig optex;
    optex.workers = 2;
    const auto run_until = [&](std::int64_t until, const std::string& resume, const std::string& save) {
        std::atomic<std::int64_t> done{-1};
        loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
            loom::comm::AnyComm world = loom::comm::AnyComm::view(comm);
            loom::train::GptTraining run;
            run.model = config, run.batch = 2, run.steps = 4, run.optex = 2, run.optex_config = optex;
            run.until = until, run.resume = resume, run.save = save, run.sharded = true, run.sample = 8;
            done = loom::train::run_optex_gpt(world, run, {.dp = 1, .transport = "rank threads"}, corpus);
        });
        return done.load();
    };
    CHECK(run_until(2, "", (dir / "half").string()) == 2);
    CHECK(std::filesystem::exists(dir / "half" / "index.json"));
    CHECK(run_until(4, (dir / "half").string(), "") == 4);
}

}  // namespace LOOM_TEST_FILE
