// Pipeline partitioning: the min-max dynamic program against brute force,
// heterogeneous speeds and memory, and the errors of --partition.
#include <catch2/catch.hpp>

#include <loom/schedule/partition.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::schedule::StageDevice;
using loom_test::message_of;

namespace {

// Every split into consecutive non-empty stages; the smallest slowest stage.
double brute_force(const std::vector<double>& cost, const std::vector<double>& memory, const std::vector<StageDevice>& devices) {
    double best = std::numeric_limits<double>::infinity();
    std::vector<int> sizes;
    std::function<void(std::size_t, std::size_t)> go = [&](std::size_t stage, std::size_t first) {
        if (stage == devices.size()) {
            if (first == cost.size()) {
                double slowest = 0;
                std::size_t at = 0;
                for (std::size_t s = 0; s < sizes.size(); ++s) {
                    double c = 0, m = 0;
                    for (int k = 0; k < sizes[s]; ++k, ++at) {
                        c += cost[at];
                        m += memory[at];
                    }
                    if (m > devices[s].memory) return;
                    slowest = std::max(slowest, c / devices[s].speed);
                }
                best = std::min(best, slowest);
            }
            return;
        }
        for (std::size_t last = first + 1; last <= cost.size(); ++last) {
            sizes.push_back(static_cast<int>(last - first));
            go(stage + 1, last);
            sizes.pop_back();
        }
    };
    go(0, 0);
    return best;
}

}  // namespace

TEST_CASE("balanced partitions equal brute force on equal and unequal devices", "[parallel][partition]") {
    std::uint32_t state = 12345;
    auto next = [&] {
        state = state * 1664525u + 1013904223u;
        return static_cast<double>(state >> 8) / static_cast<double>(1u << 24);
    };
    for (int trial = 0; trial < 200; ++trial) {
        const std::size_t layers = 1 + static_cast<std::size_t>(next() * 9);
        const std::size_t stages = 1 + static_cast<std::size_t>(next() * static_cast<double>(layers));
        std::vector<double> cost(layers), memory(layers);
        for (auto& c : cost) c = 0.5 + next() * 4;
        for (auto& m : memory) m = 1 + next() * 3;
        std::vector<StageDevice> devices(stages);
        for (auto& d : devices) d = StageDevice{0.5 + next() * 2, trial % 2 ? 4 + next() * 8 : std::numeric_limits<double>::infinity()};
        const double expected = brute_force(cost, memory, devices);
        INFO("trial " << trial << ": " << layers << " layers on " << stages << " devices");
        if (expected == std::numeric_limits<double>::infinity()) {
            CHECK_THAT(message_of([&] { (void)loom::schedule::balance(cost, memory, devices); }),
                       Catch::Contains("do not fit the memory"));
            continue;
        }
        const auto p = loom::schedule::balance(cost, memory, devices);
        CHECK(p.slowest == Approx(expected).epsilon(1e-12));
        int sum = 0;
        for (int s : p.layers_per_stage) {
            CHECK(s >= 1);
            sum += s;
        }
        CHECK(sum == static_cast<int>(layers));
    }
}

TEST_CASE("equal layers on equal devices split evenly; a faster device takes more", "[parallel][partition]") {
    CHECK(loom::schedule::balance(std::vector<double>(8, 1.0), 4).layers_per_stage == std::vector<int>{2, 2, 2, 2});
    const auto p = loom::schedule::balance(std::vector<double>(9, 1.0), std::vector<double>(9, 0.0),
                                       {StageDevice{2.0}, StageDevice{1.0}});
    CHECK(p.layers_per_stage == std::vector<int>{6, 3});
    CHECK(p.slowest == 3.0);
    // The embedding and head are heavier than a block: the middle stages take more blocks.
    const auto gpt = loom::schedule::balance({3, 1, 1, 1, 1, 1, 1, 3}, 4);
    CHECK(gpt.slowest == 3.0);
}

TEST_CASE("bad partitions are refused with the values and what is valid", "[parallel][partition]") {
    CHECK(message_of([] { (void)loom::schedule::balance(std::vector<double>(3, 1.0), 4); }) ==
          "partition: 4 stages but the model has 3 layers; every stage needs at least one layer, so use at most 3 stages");
    // A front end's spelling of the settings names them in its words (core/setting_names.hpp).
    const loom::SettingNames flags{[](std::string_view s) { return "--" + std::string(s); }};
    CHECK(message_of([] { (void)loom::schedule::parse_partition("3,3,1", 8, 3); }) ==
          "partition 3,3,1 sums to 7 layers but the model has 8");
    CHECK(message_of([] { (void)loom::schedule::parse_partition("4,4", 8, 3); }) ==
          "partition 4,4 has 2 stages but pp is 3; give one layer count per stage");
    CHECK(message_of([&] { (void)loom::schedule::parse_partition("4,4", 8, 4, flags, "--pp 2 x 2 chunks is 4"); }) ==
          "--partition 4,4 has 2 stages but --pp 2 x 2 chunks is 4; give one layer count per stage");
    CHECK(message_of([&] { (void)loom::schedule::parse_partition("4,x,2", 8, 3, flags); }) ==
          "--partition 4,x,2: 'x' is not a layer count in 1..8");
    CHECK(message_of([&] { (void)loom::schedule::parse_partition("4,0,4", 8, 3, flags); }) ==
          "--partition 4,0,4: '0' is not a layer count in 1..8");
    CHECK(loom::schedule::parse_partition("3,3,2", 8, 3) == std::vector<int>{3, 3, 2});
    CHECK(message_of([] { (void)loom::schedule::balance({1, 1}, {5, 5}, {StageDevice{1, 4}, StageDevice{1, 4}}); }) ==
          "partition: the model's 2 layers (10 bytes) do not fit the memory of the 2 devices in any split into consecutive stages");
}

}  // namespace LOOM_TEST_FILE
