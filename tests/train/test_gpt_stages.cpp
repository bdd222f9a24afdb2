// gpt_stage_layers and profiled_unit_seconds: a partition as given, an even
// split for interleaving, a balance over measured times that every rank
// receives alike.
#include <catch2/catch.hpp>

#include <loom/comm/any_comm.hpp>
#include <loom/comm/thread_world.hpp>
#include <loom/plan/gpt_description.hpp>
#include <loom/train/gpt_stages.hpp>

#include <mutex>
#include <numeric>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

const loom::gpt::Config tiny{.layers = 4, .width = 16, .heads = 2, .seq = 8};

TEST_CASE("gpt_stage_layers: given, even for interleaving, balanced over unit times", "[train][gpt_stages]") {
    const auto config = tiny;
    const auto gpt = loom::plan::describe_gpt(config, 2);
    CHECK(loom::train::gpt_stage_layers(gpt, 4, 2, loom::ScheduleKind::one_f_one_b, "3,1", {}) == std::vector<int>{3, 1});
    CHECK(loom::train::gpt_stage_layers(gpt, 4, 4, loom::ScheduleKind::interleaved, "", {}) == std::vector<int>{1, 1, 1, 1});
    CHECK_THROWS(loom::train::gpt_stage_layers(gpt, 4, 3, loom::ScheduleKind::interleaved, "", {}));
    // embed, 4 blocks, ln_f, head, loss: the first block is slow, so it stands alone.
    const std::vector<double> seconds{0.0, 9.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0};
    CHECK(loom::train::gpt_stage_layers(gpt, 4, 2, loom::ScheduleKind::one_f_one_b, "", seconds) == std::vector<int>{1, 3});
}

TEST_CASE("profiled_unit_seconds: rank 0 measures, every rank gets its times", "[train][gpt_stages]") {
    const auto config = tiny;
    const auto corpus = loom::data::ByteCorpus::synthetic(1 << 12, 1, static_cast<int>(config.vocab));
    std::mutex mutex;
    std::vector<std::vector<double>> seen;
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        loom::comm::AnyComm world = loom::comm::AnyComm::view(comm);
        const auto seconds = loom::train::profiled_unit_seconds(world, config, corpus, 1, 1, loom::host_device,
                                                                loom::kernels::MatmulPrecision::f32);
        std::lock_guard lock(mutex);
        seen.push_back(seconds);
    });
    REQUIRE(seen.size() == 2);
    CHECK(seen[0] == seen[1]);
    REQUIRE(seen[0].size() == 8);
    CHECK(std::accumulate(seen[0].begin(), seen[0].end(), 0.0) > 0.0);
}

}  // namespace LOOM_TEST_FILE
