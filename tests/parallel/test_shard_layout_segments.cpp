// The shard layout with segments (parallel/shard_layout.hpp), as a pipeline
// rank builds it: groups stay inside a segment with global offsets, a run of
// units held elsewhere ends a group, and to_dense / from_dense touch only the
// ranges the rank holds. On the fake units of tests/support/fake_pipeline.hpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "support/fake_pipeline.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::ScheduleKind;
using loom::parallel::Grouping;
using loom::parallel::ShardLayout;
using loom_test::message_of;

namespace {

using namespace loom_test::fake_pipeline;

}  // namespace

// --- the shard layout with segments --------------------------------------------

TEST_CASE("ShardLayout with segments: groups stay inside a segment, offsets are global", "[parallel][layout][pipeline]") {
    for (ScheduleKind kind : all_schedules)
        for (int p = 1; p <= 4; ++p) {
            const auto pipe = loom::schedule::pipeline_program(kind, p, p, chunks_of(kind));
            const auto bounds = balanced(pipe.virtual_stages());
            for (int r = 0; r < p; ++r)
                for (Grouping grouping : {Grouping::buckets, Grouping::per_unit, Grouping::per_segment})
                    for (int dp : {1, 3}) {
                        INFO(loom::name(kind) << " p=" << p << " rank " << r << " grouping "
                                              << static_cast<int>(grouping) << " dp " << dp);
                        const auto segment = bounds.chunk_of_unit(pipe.rank_of_chunk, r);
                        const ShardLayout layout(fake_units(), dp, grouping, small_bucket, segment);
                        CHECK(layout.dense_size() == fake_total);
                        std::int64_t held = 0, padded = 0;
                        std::vector<int> covered(fake_count, -1);
                        for (int g = 0; g < static_cast<int>(layout.groups().size()); ++g) {
                            const auto& group = layout.group(g);
                            const int seg = segment[static_cast<std::size_t>(group.first_unit)];
                            CHECK(seg >= 0);
                            std::int64_t numel = 0;
                            for (int u = group.first_unit; u <= group.last_unit; ++u) {
                                CHECK(segment[static_cast<std::size_t>(u)] == seg);
                                numel += fake_numels[static_cast<std::size_t>(u)];
                                if (fake_numels[static_cast<std::size_t>(u)] > 0) {
                                    CHECK(layout.group_of_unit(u) == g);
                                    covered[static_cast<std::size_t>(u)] = g;
                                }
                            }
                            CHECK(group.numel == numel);
                            CHECK(group.dense_offset == dense_start(group.first_unit));
                            CHECK(fake_numels[static_cast<std::size_t>(group.first_unit)] > 0);
                            CHECK(fake_numels[static_cast<std::size_t>(group.last_unit)] > 0);
                            CHECK(group.offset == padded);
                            CHECK(group.padded % (16 * dp) == 0);
                            CHECK(group.padded >= group.numel);
                            CHECK(group.padded - group.numel < 16 * dp);
                            padded += group.padded;
                            held += numel;
                        }
                        CHECK(layout.padded_size() == padded);
                        // Every held unit with parameters is in a group; nothing else is.
                        std::int64_t held_expected = 0;
                        for (int u = 0; u < fake_count; ++u) {
                            const bool in_group = segment[static_cast<std::size_t>(u)] >= 0 &&
                                                  fake_numels[static_cast<std::size_t>(u)] > 0;
                            CHECK((covered[static_cast<std::size_t>(u)] >= 0) == in_group);
                            CHECK((layout.group_of_unit(u) >= 0) == in_group);
                            if (in_group) held_expected += fake_numels[static_cast<std::size_t>(u)];
                        }
                        CHECK(held == held_expected);
                        if (grouping == Grouping::per_segment) {
                            // One group per segment with parameters, from its first to its last such unit.
                            std::map<int, std::pair<int, int>> span;  // segment -> (first, last) unit with params
                            for (int u = 0; u < fake_count; ++u) {
                                const int s = segment[static_cast<std::size_t>(u)];
                                if (s < 0 || fake_numels[static_cast<std::size_t>(u)] == 0) continue;
                                auto [it, fresh] = span.emplace(s, std::pair{u, u});
                                if (!fresh) it->second.second = u;
                            }
                            REQUIRE(layout.groups().size() == span.size());
                            std::size_t g = 0;
                            for (const auto& [s, range] : span) {
                                CHECK(layout.group(static_cast<int>(g)).first_unit == range.first);
                                CHECK(layout.group(static_cast<int>(g)).last_unit == range.second);
                                ++g;
                            }
                        }
                    }
        }
}

TEST_CASE("ShardLayout with segments: a run of units held elsewhere ends a group", "[parallel][layout][pipeline]") {
    // Units 0, 1 and 7-9 in segment 0 (not a pipeline's shape, but the rule
    // is the gap): per_segment still makes two groups, and buckets as large as
    // the model too.
    const std::vector<int> segment{0, 0, -1, -1, -1, -1, -1, 0, 0, 0};
    for (Grouping grouping : {Grouping::per_segment, Grouping::buckets}) {
        const ShardLayout layout(fake_units(), 2, grouping, std::int64_t{1} << 30, segment);
        REQUIRE(layout.groups().size() == 2);
        CHECK(layout.group(0).first_unit == 0);
        CHECK(layout.group(0).last_unit == 1);
        CHECK(layout.group(0).numel == 650);
        CHECK(layout.group(1).first_unit == 7);
        CHECK(layout.group(1).last_unit == 9);
        CHECK(layout.group(1).numel == 277);
        CHECK(layout.group(1).dense_offset == 1470);
    }
    // A segment boundary ends a group even between two neighbours with parameters.
    const ShardLayout two(fake_units(), 1, Grouping::buckets, std::int64_t{1} << 30, {0, 0, 0, 0, 1, 1, 1, 1, 1, 1});
    REQUIRE(two.groups().size() == 2);
    CHECK(two.group(0).last_unit == 3);
    CHECK(two.group(1).first_unit == 4);
    // Without segments, the small bucket's groups (closed from the last unit backwards).
    const ShardLayout plain(fake_units(), 1, Grouping::buckets, small_bucket);
    std::vector<std::pair<int, int>> spans;
    for (const auto& g : plain.groups()) spans.emplace_back(g.first_unit, g.last_unit);
    CHECK(spans == std::vector<std::pair<int, int>>{{0, 0}, {1, 1}, {3, 4}, {5, 5}, {6, 7}, {8, 9}});
    // The wrong number of segment entries is refused.
    CHECK(message_of([] { (void)ShardLayout(fake_units(), 1, Grouping::buckets, 400, {0, 0}); }) ==
          "ShardLayout: 2 segment entries for 10 units");
}

TEST_CASE("ShardLayout with segments: to_dense and from_dense touch only held ranges", "[parallel][layout][pipeline]") {
    // Interleaved<2>, p=2: rank 1 holds chunks 1 (u1-u3) and 3 (u7-u9) of {1,3,3,3}.
    const auto pipe = loom::schedule::interleaved(2, 2, 2);
    const auto bounds = balanced(4);
    const auto segment = bounds.chunk_of_unit(pipe.rank_of_chunk, 1);
    REQUIRE(segment == std::vector<int>{-1, 1, 1, 1, -1, -1, -1, 3, 3, 3});
    for (Grouping grouping : {Grouping::buckets, Grouping::per_segment}) {
        const ShardLayout layout(fake_units(), 2, grouping, small_bucket, segment);
        const auto n = static_cast<std::size_t>(layout.dense_size());
        std::vector<float> dense(n);
        for (std::size_t k = 0; k < n; ++k) dense[k] = static_cast<float>(k);
        // Elements held elsewhere are NaN: from_dense must not read them.
        const auto held = [&](std::size_t k) {
            for (int u = 0; u < fake_count; ++u) {
                const auto lo = static_cast<std::size_t>(dense_start(u));
                if (k >= lo && k < lo + static_cast<std::size_t>(fake_numels[static_cast<std::size_t>(u)]))
                    return segment[static_cast<std::size_t>(u)] >= 0;
            }
            return false;
        };
        for (std::size_t k = 0; k < n; ++k)
            if (!held(k)) dense[k] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> padded(static_cast<std::size_t>(layout.padded_size()), -1.0f);
        layout.from_dense(dense, padded);
        for (float x : padded) CHECK_FALSE(std::isnan(x));
        // Padding zeroed.
        for (const auto& g : layout.groups())
            for (std::int64_t k = g.numel; k < g.padded; ++k) CHECK(padded[static_cast<std::size_t>(g.offset + k)] == 0.0f);
        std::vector<float> back(n, -7.0f);
        layout.to_dense(padded, back);
        int held_count = 0;
        for (std::size_t k = 0; k < n; ++k) {
            if (held(k)) {
                ++held_count;
                CHECK(back[k] == static_cast<float>(k));
            } else {
                CHECK(back[k] == -7.0f);  // untouched
            }
        }
        CHECK(held_count == 130 + 0 + 260 + 33 + 180 + 64);
    }
}

}  // namespace LOOM_TEST_FILE
