// ExecutorSaves: periodic and final saves of an executor run, whole files or
// sharded directories, the values a sample uses, and the trace after them.
#include <catch2/catch.hpp>

#include <loom/comm/any_comm.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/gpt/checkpoint.hpp>
#include <loom/train/executor_saves.hpp>
#include <loom/train/file_preflight.hpp>

#include <filesystem>
#include <mutex>
#include <vector>
#include "io/temp_dir.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom_test::TempDir;

const loom::gpt::Config tiny{.layers = 1, .width = 16, .heads = 2, .seq = 8};

TEST_CASE("ExecutorSaves: whole files, sharded directories, values and the trace", "[train][executor_saves]") {
    const TempDir dir;
    const auto config = tiny;
    std::mutex mutex;
    std::vector<std::vector<float>> gathered;
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        using C = loom::comm::AnyComm;
        C world = C::view(comm);
        loom::gpt::Model model = loom::gpt::make_model(config);
        loom::exec::Executor<C> exec(model, world, nullptr, nullptr, nullptr, loom::StrategySpec{},
                                     {.trace = true, .field_names = {"embed", "blocks", "ln_f", "head", "loss"}});
        exec.initialize(3);
        loom::train::ExecutorSaves<C> whole(world, exec, config, "test data", {{"run", "x"}}, "", false);
        whole((dir / "periodic.st").string(), 1);
        whole.finish({.save = (dir / "final.st").string(), .step = 2, .trace = (dir / "trace.json").string()},
                     [&](const std::vector<float>& values) {
                         std::lock_guard lock(mutex);
                         gathered.push_back(values);
                     });
        loom::train::ExecutorSaves<C> sharded(world, exec, config, "test data", {}, "", true);
        sharded((dir / "shards-1").string(), 1);  // still writing while the next one starts
        sharded.finish({.save = (dir / "shards-2").string(), .step = 2});
    });
    CHECK(std::filesystem::exists(dir / "periodic.st"));
    CHECK(std::filesystem::exists(dir / "trace.json"));
    CHECK(std::filesystem::exists(dir / "shards-1" / "index.json"));
    CHECK(std::filesystem::exists(dir / "shards-2" / "index.json"));
    // A sharded checkpoint's step and identity read from its index, as a resume's preflight reads them.
    CHECK(loom::train::checkpoint_step((dir / "shards-2").string()) == 2);
    CHECK(loom::train::checkpoint_step((dir / "final.st").string()) == 2);
    REQUIRE(gathered.size() == 2);
    CHECK(gathered[0] == gathered[1]);
    // The final file holds the values the sample was given, at its step.
    std::vector<float> values(gathered[0].size()), m(values.size()), v(values.size());
    CHECK(loom::gpt::load_checkpoint(dir / "final.st", config, values, m, v).step == 2);
    CHECK(values == gathered[0]);
}

}  // namespace LOOM_TEST_FILE
