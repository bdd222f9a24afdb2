// The shard layout (parallel/shard_layout.hpp) on the units of a small GPT:
// the units are the model's fields with blocks opened, bucket and per-unit
// grouping, to_dense / from_dense, and bad inputs refused with a sentence.
// The model: tests/support/small_gpt_units.hpp.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/message_of.hpp"
#include "support/small_gpt_units.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::parallel::Grouping;
using loom::parallel::ShardLayout;
using loom_test::message_of;

namespace {

using namespace loom_test::small_gpt;

}  // namespace

// --- the units and the shard layout -----------------------------------------

TEST_CASE("the units of a GPT are its fields, blocks opened", "[parallel][layout]") {
    const auto& u = units();
    REQUIRE(u.size() == unit_count);
    const std::vector<std::string> names{"embed Embedding", "blocks[0] Block", "blocks[1] Block",
                                         "ln_f LayerNorm",  "head Linear",     "loss CrossEntropy"};
    const std::vector<std::int64_t> numels{2560, 12704, 12704, 64, 2048, 0};
    std::int64_t total = 0;
    for (std::size_t k = 0; k < u.size(); ++k) {
        CHECK(u[k].name == names[k]);
        CHECK(u[k].numel == numels[k]);
        total += u[k].numel;
    }
    CHECK(total == parameters);
    CHECK(loom::gpt::Config{.layers = 2, .width = 32, .heads = 2, .seq = 16, .vocab = 64}.parameters() == parameters);
}

TEST_CASE("bucket grouping closes groups from the last unit backwards", "[parallel][layout]") {
    // 16 KiB = 4096 floats: head + ln_f (2112) stay open until blocks[1] makes
    // 14816; blocks[0] (12704) closes alone; embed (2560) is what is left.
    const ShardLayout layout(units(), 3, Grouping::buckets, small_bucket);
    REQUIRE(layout.groups().size() == 3);
    struct Expected {
        int first, last;
        std::int64_t numel, dense_offset, offset, padded, block, shard_offset;
    };
    // Padded to multiples of 16 x 3 = 48: 2560 -> 2592, 12704 -> 12720, 14816 -> 14832.
    const std::vector<Expected> expected{{0, 0, 2560, 0, 0, 2592, 864, 0},
                                         {1, 1, 12704, 2560, 2592, 12720, 4240, 864},
                                         {2, 4, 14816, 15264, 15312, 14832, 4944, 5104}};
    for (int g = 0; g < 3; ++g) {
        INFO("group " << g);
        const auto& group = layout.group(g);
        const auto& e = expected[static_cast<std::size_t>(g)];
        CHECK(group.first_unit == e.first);
        CHECK(group.last_unit == e.last);
        CHECK(group.numel == e.numel);
        CHECK(group.dense_offset == e.dense_offset);
        CHECK(group.offset == e.offset);
        CHECK(group.padded == e.padded);
        CHECK(group.block == e.block);
        CHECK(group.shard_offset == e.shard_offset);
    }
    CHECK(layout.ranks() == 3);
    CHECK(layout.dense_size() == parameters);
    CHECK(layout.padded_size() == 2592 + 12720 + 14832);
    CHECK(layout.shard_size() == 864 + 4240 + 4944);
    CHECK(layout.shard_size() * 3 == layout.padded_size());
    CHECK(layout.largest_group() == 14832);
    const std::vector<int> group_of{0, 1, 2, 2, 2, -1};
    for (int u = 0; u < unit_count; ++u) CHECK(layout.group_of_unit(u) == group_of[static_cast<std::size_t>(u)]);
    CHECK(layout.block_offset(2, 0) == 15312);
    CHECK(layout.block_offset(2, 2) == 15312 + 2 * 4944);
    std::ostringstream out;
    out << layout;
    CHECK(out.str() == "ShardLayout(3 groups over 3 ranks, 30080 parameters, padded 30144, shard 10048)");

    // A bucket of 1 byte closes after every unit; one as large as the model makes one group.
    const ShardLayout tiny(units(), 2, Grouping::buckets, 1);
    CHECK(tiny.groups().size() == 5);
    const ShardLayout huge(units(), 2, Grouping::buckets, std::int64_t{1} << 30);
    REQUIRE(huge.groups().size() == 1);
    CHECK(huge.group(0).first_unit == 0);
    CHECK(huge.group(0).last_unit == 4);
    CHECK(huge.group(0).numel == parameters);
    CHECK(huge.group_of_unit(5) == -1);
}

TEST_CASE("per-unit grouping gives every unit with parameters its own group", "[parallel][layout]") {
    for (int ranks : {1, 2, 3, 4, 7}) {
        INFO(ranks << " ranks");
        const ShardLayout layout(units(), ranks, Grouping::per_unit, small_bucket);
        REQUIRE(layout.groups().size() == 5);
        std::int64_t dense = 0, padded = 0, shard = 0;
        for (int g = 0; g < 5; ++g) {
            INFO("group " << g);
            const auto& group = layout.group(g);
            CHECK(group.first_unit == g);
            CHECK(group.last_unit == g);
            CHECK(layout.group_of_unit(g) == g);
            CHECK(group.numel == units()[static_cast<std::size_t>(g)].numel);
            // Padded to the next multiple of 16 x ranks, and no further.
            const std::int64_t multiple = 16 * ranks;
            CHECK(group.padded % multiple == 0);
            CHECK(group.padded >= group.numel);
            CHECK(group.padded - group.numel < multiple);
            CHECK(group.block * ranks == group.padded);
            CHECK(group.block % 16 == 0);   // every block is 64-byte aligned ...
            CHECK(group.offset % 16 == 0);  // ... in a 64-byte aligned arena
            CHECK(group.dense_offset == dense);
            CHECK(group.offset == padded);
            CHECK(group.shard_offset == shard);
            for (int r = 0; r < ranks; ++r) CHECK(layout.block_offset(g, r) == group.offset + r * group.block);
            dense += group.numel;
            padded += group.padded;
            shard += group.block;
        }
        CHECK(layout.group_of_unit(5) == -1);  // the loss has no parameters
        CHECK(layout.dense_size() == parameters);
        CHECK(layout.padded_size() == padded);
        CHECK(layout.shard_size() == shard);
        CHECK(layout.shard_size() == layout.padded_size() / ranks);
        CHECK(layout.largest_group() == layout.group(1).padded);  // a block
    }
    // ln_f's 64 parameters over 3 ranks: padded to 96, blocks of 32.
    const ShardLayout three(units(), 3, Grouping::per_unit, 1);
    CHECK(three.group(3).padded == 96);
    CHECK(three.group(3).block == 32);
}

TEST_CASE("to_dense and from_dense round-trip and zero the padding", "[parallel][layout]") {
    for (auto grouping : {Grouping::buckets, Grouping::per_unit})
        for (int ranks : {1, 3, 4}) {
            INFO("ranks " << ranks << (grouping == Grouping::buckets ? " buckets" : " per unit"));
            const ShardLayout layout(units(), ranks, grouping, small_bucket);
            std::vector<float> dense(static_cast<std::size_t>(layout.dense_size()));
            for (std::size_t k = 0; k < dense.size(); ++k) dense[k] = static_cast<float>(k) + 0.5f;
            std::vector<float> padded(static_cast<std::size_t>(layout.padded_size()),
                                      std::numeric_limits<float>::quiet_NaN());
            layout.from_dense(dense, padded);
            std::int64_t padding = 0;
            for (const auto& g : layout.groups()) {
                for (std::int64_t k = 0; k < g.numel; ++k)
                    REQUIRE(padded[static_cast<std::size_t>(g.offset + k)] == dense[static_cast<std::size_t>(g.dense_offset + k)]);
                for (std::int64_t k = g.numel; k < g.padded; ++k) {
                    REQUIRE(padded[static_cast<std::size_t>(g.offset + k)] == 0.0f);
                    ++padding;
                }
            }
            CHECK(padding == layout.padded_size() - layout.dense_size());
            std::vector<float> back(dense.size(), -1.0f);
            layout.to_dense(padded, back);
            CHECK(back == dense);
            // to_dense leaves the padding alone: garbage there does not reach the dense copy.
            for (const auto& g : layout.groups())
                for (std::int64_t k = g.numel; k < g.padded; ++k) padded[static_cast<std::size_t>(g.offset + k)] = 1e30f;
            layout.to_dense(padded, back);
            CHECK(back == dense);
        }
}

TEST_CASE("the shard layout refuses bad inputs with a sentence", "[parallel][layout]") {
    CHECK(message_of([] { ShardLayout(units(), 0, Grouping::buckets, 1024); }) ==
          "ShardLayout: 0 ranks; there must be at least one");
    CHECK(message_of([] { ShardLayout(units(), -2, Grouping::per_unit, 1024); }) ==
          "ShardLayout: -2 ranks; there must be at least one");
    CHECK(message_of([] { ShardLayout(units(), 2, Grouping::buckets, 0); }) ==
          "ShardLayout: bucket size 0 bytes; it must be at least 1");
    const ShardLayout layout(units(), 3, Grouping::buckets, small_bucket);
    std::vector<float> padded(30144), dense(30080), short_dense(30079), short_padded(30080);
    CHECK(message_of([&] { layout.to_dense(padded, short_dense); }) ==
          "ShardLayout: arrays of 30144 (padded) and 30079 (dense) elements; this layout has 30144 and 30080");
    CHECK(message_of([&] { layout.from_dense(dense, short_padded); }) ==
          "ShardLayout: arrays of 30080 (padded) and 30080 (dense) elements; this layout has 30144 and 30080");
    CHECK(message_of([&] { layout.to_dense(padded, dense); }) == "(no error)");
    CHECK_THROWS_AS(layout.group(3), std::out_of_range);
    CHECK_THROWS_AS(layout.group_of_unit(6), std::out_of_range);

    // A model without parameters has no groups and nothing to pad.
    const ShardLayout empty(std::vector<loom::nn::Unit>(2), 4, Grouping::buckets, 1024);
    CHECK(empty.groups().empty());
    CHECK(empty.padded_size() == 0);
    CHECK(empty.group_of_unit(0) == -1);
    CHECK(empty.group_of_unit(1) == -1);
}

}  // namespace LOOM_TEST_FILE
