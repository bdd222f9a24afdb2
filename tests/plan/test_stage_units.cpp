// plan/stage_units.hpp: a partition over a model's layers in the executor's
// units, unit costs folded into layers, and the line naming each stage's units.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "loom/plan/gpt_description.hpp"
#include "loom/plan/stage_units.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("stage units: the GPT's layers per stage as units, costs and a line", "[plan][partition]") {
    const auto gpt = loom::plan::describe_gpt({8, 32, 2, 16, 64}, 4);  // units: embed, blocks[0..7], ln_f, head, loss
    CHECK(loom::plan::units_per_stage(gpt, {4, 4}) == std::vector<int>{5, 7});
    CHECK(loom::plan::units_per_stage(gpt, {1, 3, 3, 1}) == std::vector<int>{2, 3, 3, 4});
    CHECK(loom::plan::describe_stages(gpt, {4, 4}) == "embed+blocks[0..3] | blocks[4..7]+ln_f+head+loss");
    CHECK(loom::plan::describe_stages(gpt, {1, 6, 1}) ==
          "embed+blocks[0..0] | blocks[1..6] | blocks[7..7]+ln_f+head+loss");
    std::vector<double> unit_costs(12);
    for (std::size_t u = 0; u < unit_costs.size(); ++u) unit_costs[u] = static_cast<double>(u);
    // embed 0 + block 1; blocks 2..7; block 8 + ln_f 9 + head 10 + loss 11.
    CHECK(loom::plan::layer_costs(gpt, unit_costs) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 38});
}

TEST_CASE("stage units: a partition or costs that do not fit the model are refused in one line", "[plan][partition]") {
    const auto gpt = loom::plan::describe_gpt({4, 32, 2, 16, 64}, 4);
    CHECK(loom_test::message_of([&] { (void)loom::plan::units_per_stage(gpt, {2, 1}); }) ==
          "a partition of 2 stages covers 3 layers but model " + gpt.name +
              " has 4; give counts of 1 or more summing to 4");
    CHECK(loom_test::message_of([&] { (void)loom::plan::layer_costs(gpt, std::vector<double>(7, 1.0)); }) ==
          "model " + gpt.name + " has 8 units but 7 costs were given; give one cost per executor unit");
    CHECK(loom_test::message_of([&] { (void)loom::plan::layer_costs(gpt, std::vector<double>(9, 1.0)); }) ==
          "model " + gpt.name + " has 8 units but 9 costs were given; give one cost per executor unit");
}

}  // namespace LOOM_TEST_FILE
