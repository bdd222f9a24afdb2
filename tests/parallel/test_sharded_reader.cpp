// Sharded checkpoints read by the element (exec/sharded_reader.hpp) and
// written from any contents (ShardContents): hand-made shards with
// interleaved and gapped runs, a shard that holds nothing and one without
// runs at all; exactly the bytes asked for are read; every broken request or
// checkpoint is one line.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <loom/comm/thread_world.hpp>
#include <loom/exec/sharded_checkpoint.hpp>
#include <loom/exec/sharded_reader.hpp>
#include <loom/io/safetensors.hpp>

#include "io/temp_dir.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Tensor;
using loom::exec::ShardedIndex;
using loom::exec::ShardedReader;
using loom_test::message_of;

namespace {

constexpr std::int64_t parameters = 20;


// The value of whole element k in the hand-made checkpoints.
float value_of(std::int64_t k) { return 100.0f + static_cast<float>(k); }

// A shard holding `runs` (nullptr: no runs tensor at all), values 100 + k.
void write_shard(const std::filesystem::path& file, const std::vector<std::int64_t>* runs) {
    std::vector<float> values;
    if (runs != nullptr)
        for (std::size_t i = 0; i < runs->size(); i += 2)
            for (std::int64_t k = 0; k < (*runs)[i + 1]; ++k) values.push_back(value_of((*runs)[i] + k));
    std::vector<float> m(values.size(), 0.5f);
    const auto n = static_cast<std::int64_t>(values.size());
    std::vector<std::int64_t> other{7, 8, 9};
    std::vector<loom::io::NamedTensor> tensors{{"values", Tensor::of(values.data(), {n})},
                                               {"m", Tensor::of(m.data(), {n})},
                                               {"other", Tensor::of(other.data(), {3})}};
    if (runs != nullptr)
        tensors.push_back({"runs", Tensor(const_cast<std::int64_t*>(runs->data()), loom::DType::i64,
                                          loom::Shape{static_cast<std::int64_t>(runs->size() / 2), 2})});
    loom::io::save_safetensors(file, tensors);
}

// Five shards: 0 and 1 interleave, 2 holds nothing (runs [0, 2]), 3 has no
// runs tensor, 4 holds two runs out of order. Together: 0..19 once each.
ShardedIndex hand_made(const std::filesystem::path& dir, std::vector<std::vector<std::int64_t>> runs = {
                                                            {10, 3, 0, 2}, {2, 4, 13, 2}, {}, {}, {15, 5, 6, 4}}) {
    ShardedIndex index{parameters, 0, {}, {}};
    for (std::size_t s = 0; s < runs.size(); ++s) {
        std::string name = "s";  // appended, not +: GCC 12's -Wrestrict misfires on "s" + string at -O3
        name += std::to_string(s);
        name += ".safetensors";
        index.shards.push_back(name);
        write_shard(dir / index.shards.back(), s == 3 ? nullptr : &runs[s]);
    }
    return index;
}

std::vector<float> read(ShardedReader& reader, const std::vector<std::int64_t>& wanted, const char* name = "values") {
    std::int64_t total = 0;
    for (std::size_t i = 1; i < wanted.size(); i += 2) total += wanted[i];
    std::vector<float> out(static_cast<std::size_t>(total));
    reader.read(name, "runs", wanted, out);
    return out;
}

}  // namespace

TEST_CASE("the sharded reader finds wanted elements across interleaved and gapped runs", "[checkpoint]") {
    const loom_test::TempDir dir;
    const ShardedIndex index = hand_made(dir.path());
    ShardedReader reader(dir.path(), index);
    const std::vector<float> got = read(reader, {1, 3, 9, 7});
    std::vector<float> expected;
    for (std::int64_t k : {1, 2, 3, 9, 10, 11, 12, 13, 14, 15}) expected.push_back(value_of(k));
    CHECK(got == expected);
    const std::vector<float> all = read(reader, {0, parameters});
    for (std::int64_t k = 0; k < parameters; ++k) CHECK(all[static_cast<std::size_t>(k)] == value_of(k));
    CHECK(read(reader, {0, 3}, "m") == std::vector<float>(3, 0.5f));
    CHECK(read(reader, {}).empty());
    // The loader's order need not ascend (a tp cut's): read sorted, put back in order.
    CHECK(loom::exec::detail::read_in_order(reader, "values", {14, 2, 0, 3, 5, 1}) ==
          std::vector<float>{value_of(14), value_of(15), value_of(0), value_of(1), value_of(2), value_of(5)});
    CHECK(reader.has(3, "other"));
    CHECK_FALSE(reader.has(3, "runs"));
    CHECK(reader.read_whole<std::int64_t>(3, "other") == std::vector<std::int64_t>{7, 8, 9});
    CHECK(reader.read_whole<float>(2, "values").empty());
}

TEST_CASE("the sharded reader reads only the bytes of the wanted elements", "[checkpoint]") {
    const loom_test::TempDir dir;
    const ShardedIndex index = hand_made(dir.path());
    // What opening costs: each header with its length, and the runs of the
    // shards that have them (shards 0, 1 and 4: two runs of 16 bytes each).
    std::uint64_t headers = 0, files = 0;
    for (const auto& name : index.shards) {
        headers += loom::io::SafetensorsFile(dir.path() / name, loom::io::SafetensorsRead::on_demand).bytes_read();
        files += std::filesystem::file_size(dir.path() / name);
    }
    const std::uint64_t runs = 3 * 32;
    ShardedReader reader(dir.path(), index);
    // Elements 15 and 16: the first two of shard 4's values; no other shard's data.
    CHECK(read(reader, {15, 2}) == std::vector<float>{value_of(15), value_of(16)});
    CHECK(reader.bytes_read() == headers + runs + 2 * sizeof(float));
    CHECK(reader.bytes_read() < files);
    // Elements 8..19 from three shards (two ranges of shard 4): each byte once.
    (void)read(reader, {8, 12});
    CHECK(reader.bytes_read() == headers + runs + (2 + 12) * sizeof(float));
}

TEST_CASE("the sharded reader names a missing, a doubled and a non-finite element", "[checkpoint][errors]") {
    const loom_test::TempDir dir;
    const std::string where = "sharded checkpoint " + dir.path().string();
    SECTION("missing") {
        const ShardedIndex index = hand_made(dir.path(), {{10, 3, 0, 2}, {2, 4, 13, 2}, {}, {}, {15, 5, 6, 1, 8, 2}});
        ShardedReader reader(dir.path(), index);
        CHECK(read(reader, {5, 2}) == std::vector<float>{value_of(5), value_of(6)});
        CHECK(message_of([&] { (void)read(reader, {0, parameters}); }) ==
              where + ": element 7 of the model is in no shard; the checkpoint is incomplete");
    }
    SECTION("doubled") {
        const ShardedIndex index = hand_made(dir.path(), {{10, 3, 0, 2}, {2, 5, 13, 2}, {}, {}, {15, 5, 6, 4}});
        ShardedReader reader(dir.path(), index);
        CHECK(message_of([&] { (void)read(reader, {4, 4}); }) ==
              where + ": element 6 is in two shards (s4.safetensors and an earlier one)");
    }
    SECTION("non-finite") {
        const ShardedIndex index = hand_made(dir.path());
        std::vector<float> values{value_of(15), value_of(16), std::numeric_limits<float>::infinity(), value_of(18),
                                  value_of(19), value_of(6), value_of(7), value_of(8), value_of(9)};
        std::vector<std::int64_t> runs{15, 5, 6, 4};
        loom::io::save_safetensors(dir.path() / "s4.safetensors",
                                   {{"values", Tensor::of(values.data(), {9})},
                                    {"runs", Tensor(runs.data(), loom::DType::i64, loom::Shape{2, 2})}});
        ShardedReader reader(dir.path(), index);
        CHECK(read(reader, {0, 17}).size() == 17);  // the bad element is not asked for
        CHECK(message_of([&] { (void)read(reader, {16, 2}); }) ==
              where + ": tensor values holds inf at element 17 of the model (in s4.safetensors); only finite values are valid");
    }
}

TEST_CASE("the sharded reader refuses bad requests and mismatched tensors in one line", "[checkpoint][errors]") {
    const loom_test::TempDir dir;
    const std::string where = "sharded checkpoint " + dir.path().string();
    const ShardedIndex index = hand_made(dir.path());
    ShardedReader reader(dir.path(), index);
    CHECK(message_of([&] { (void)read(reader, {18, 5}); }) ==
          where + ": run 0 asked for is 5 elements from 18; runs must be sorted, disjoint and within the 20 elements of "
                  "the model (the previous ends at 0)");
    CHECK(message_of([&] { (void)read(reader, {5, 2, 3, 1}); }) ==
          where + ": run 1 asked for is 1 elements from 3; runs must be sorted, disjoint and within the 20 elements of "
                  "the model (the previous ends at 7)");
    std::vector<float> three(3);
    CHECK(message_of([&] { reader.read("values", "runs", std::vector<std::int64_t>{0, 2}, three); }) ==
          where + ": 2 elements asked for into 3");
    CHECK(message_of([&] { (void)reader.read_whole<float>(0, "runs"); }) ==
          where + ": s0.safetensors's tensor runs is i64 [2, 2]; expected 1-D f32");
    CHECK(message_of([&] { (void)reader.read_whole<float>(3, "other"); }) ==
          where + ": s3.safetensors's tensor other is i64 [3]; expected 1-D f32");
    CHECK(message_of([&] { (void)reader.has(5, "values"); }) == where + " has 5 shards; shard 5 is not one of them");
    CHECK(message_of([&] { (void)read(reader, {0, 1}, "other"); }) ==
          where + ": s0.safetensors's other is i64 [3]; its runs place 5 f32 elements");
    // The file level: a range past the end of a tensor, a wrong dtype.
    const loom::io::SafetensorsFile shard(dir.path() / "s0.safetensors", loom::io::SafetensorsRead::on_demand);
    const std::string file = "checkpoint " + (dir.path() / "s0.safetensors").string();
    CHECK(message_of([&] { shard.read_elements("values", 3, 3, Tensor::of(three.data(), {3})); }) ==
          file + ": elements [3, 6) of tensor values asked for; it has 5 (valid: within [0, 5))");
    std::vector<std::int64_t> integers(2);
    CHECK(message_of([&] { shard.read_elements("values", 0, 2, Tensor::of(integers.data(), {2})); }) ==
          file + ": tensor values holds f32 but the elements are read as i64");
    CHECK(message_of([&] { shard.read_elements("runs", 0, 2, Tensor::of(integers.data(), {2})); }) ==
          file + ": tensor runs has shape [2, 2]; elements are read by range from 1-D tensors only");
    CHECK(message_of([&] { (void)shard.tensor("values"); }) ==
          file + ": tensor values is not in memory (the file is read on demand); use read_into or read_elements");
    shard.read_elements("values", 1, 3, Tensor::of(three.data(), {3}));
    CHECK(three == std::vector<float>{value_of(11), value_of(12), value_of(0)});
}

TEST_CASE("ShardContents with extra tensors round-trips, and a rank may hold nothing", "[checkpoint]") {
    const loom_test::TempDir dir;
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& world) {
        loom::exec::ShardContents contents;
        contents.parameters = 6;
        contents.optimizer_steps = 4;
        if (world.rank() == 0) {
            contents.values = {1, 2, 3, 4, 5, 6};
            contents.m = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
            contents.v = {1, 1, 1, 1, 1, 1};
            contents.runs = {3, 3, 0, 3};
            contents.extra_floats["scale"] = {2.5f, -1.0f};
            contents.extra_integers["counts"] = {9, 8, 7};
        }
        loom::exec::ShardedSave<loom::comm::ThreadComm>(world, dir.path(), std::move(contents), {{"kind", "test"}}).finish();
    });
    const ShardedIndex index = loom::exec::read_sharded_index(dir.path());
    CHECK(index.parameters == 6);
    CHECK(index.optimizer_steps == 4);
    CHECK(index.metadata.at("kind") == "test");
    ShardedReader reader(dir.path(), index);
    CHECK(read(reader, {0, 6}) == std::vector<float>{4, 5, 6, 1, 2, 3});
    CHECK(reader.read_whole<float>(0, "scale") == std::vector<float>{2.5f, -1.0f});
    CHECK(reader.read_whole<std::int64_t>(0, "counts") == std::vector<std::int64_t>{9, 8, 7});
    CHECK_FALSE(reader.has(1, "scale"));
    const loom::io::SafetensorsFile empty(dir.path() / index.shards[1], loom::io::SafetensorsRead::on_demand);
    CHECK(empty.shape("runs") == loom::Shape{0, 2});
    CHECK(empty.shape("values") == loom::Shape{0});
}

TEST_CASE("ShardContents that do not add up are refused on every rank", "[checkpoint][errors]") {
    const loom_test::TempDir dir;
    const std::string where = "sharded checkpoint " + dir.path().string();
    const auto save_message = [&](const loom::exec::ShardContents& bad) {
        std::vector<std::string> messages(2);
        loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& world) {
            loom::exec::ShardContents mine;
            mine.parameters = 4;
            if (world.rank() == 1) mine = bad;
            messages[static_cast<std::size_t>(world.rank())] = message_of(
                [&] { loom::exec::ShardedSave<loom::comm::ThreadComm>(world, dir.path(), mine).finish(); });
        });
        CHECK(messages[0] == where + ": rank 1 could not write its shard (its message says why); the previous checkpoint is kept");
        // The failing rank's own message, without where it was raised (kept
        // from what() when the save rethrows it).
        return messages[1].substr(0, messages[1].find(" [include/"));
    };
    const auto contents = [](std::vector<float> values, std::size_t m, std::vector<std::int64_t> runs) {
        loom::exec::ShardContents c;
        c.parameters = 4;
        c.m = std::vector<float>(m, 1.0f);
        c.v = values;
        c.values = std::move(values);
        c.runs = std::move(runs);
        return c;
    };
    auto clash = contents({1}, 1, {0, 1});
    clash.extra_floats["runs"] = {1.0f};
    CHECK(save_message(clash) ==
          where + ": an extra tensor is named runs; values, m, v, runs and rank_state are the checkpoint's own");
    auto twice = contents({1}, 1, {0, 1});
    twice.extra_floats["scale"] = {1.0f};
    twice.extra_integers["scale"] = {1};
    CHECK(save_message(twice) ==
          where + ": scale is both an extra float and an extra integer tensor; names must be unique");
    CHECK(save_message(contents({1, 2}, 2, {3, 2})) ==
          where + ": ShardContents has a run of 2 elements from 3; the model has 4");
    CHECK(save_message(contents({1, 2}, 2, {0, 1})) == where + ": ShardContents holds 2 elements but its runs place 1");
    CHECK(save_message(contents({1, 2}, 1, {0, 2})) ==
          where + ": ShardContents has 2 values, 1 m and 2 v; one of each per element");
    CHECK(save_message(contents({1, 2}, 2, {0})) ==
          where + ": ShardContents has 1 run numbers; runs are (first, count) pairs");
    auto diverged = contents({1}, 1, {0, 1});
    diverged.extra_floats["scale"] = {std::numeric_limits<float>::quiet_NaN()};
    CHECK(save_message(diverged) ==
          where + " was not written: tensor scale holds nan at element 0 of 1; only finite values are valid");
    CHECK_FALSE(std::filesystem::exists(dir.path() / "index.json"));
}

}  // namespace LOOM_TEST_FILE
