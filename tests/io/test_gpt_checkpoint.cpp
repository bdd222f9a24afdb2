// GPT checkpoints refuse what would poison a resumed run: metadata step
// counts that are not whole numbers in range, and non-finite weights or
// optimizer moments; each message names the file, the field or tensor.
#include <catch2/catch.hpp>

#include <loom/gpt/checkpoint.hpp>
#include <loom/io/safetensors.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "io/temp_dir.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using Catch::Contains;
using loom_test::message_of;
using loom_test::TempDir;

namespace {

loom::gpt::Config tiny() {
    loom::gpt::Config c;
    c.layers = 1;
    c.width = 4;
    c.heads = 2;
    c.seq = 4;
    c.vocab = 8;
    return c;
}

struct Arrays {
    std::vector<float> values, m, v;
    explicit Arrays(const loom::gpt::Config& c)
        : values(static_cast<std::size_t>(c.parameters()), 0.5f),
          m(values.size(), 0.25f),
          v(values.size(), 0.125f) {}
};

// Rewrites `path` with one metadata entry replaced and, if given, one
// element of one tensor replaced.
void rewrite(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata_changes,
             const std::string& tensor = {}, std::size_t element = 0, float value = 0) {
    std::vector<loom::io::NamedTensor> tensors;
    std::vector<std::vector<float>> copies;
    std::map<std::string, std::string> metadata;
    {
        const loom::io::SafetensorsFile file(path);
        metadata = file.metadata().to_map();
        const auto names = file.names();
        copies.reserve(names.size());
        for (const std::string& name : names) {
            const loom::Tensor t = file.tensor(name);
            copies.emplace_back(static_cast<const float*>(t.raw()),
                                static_cast<const float*>(t.raw()) + t.numel());
            if (name == tensor) copies.back().at(element) = value;
            tensors.push_back({name, loom::Tensor::of(copies.back().data(), t.shape())});
        }
    }
    for (const auto& [key, text] : metadata_changes) metadata[key] = text;
    loom::io::save_safetensors(path, tensors, metadata);
}

}  // namespace

TEST_CASE("GPT checkpoints round trip their steps", "[checkpoint]") {
    TempDir dir;
    const auto config = tiny();
    Arrays saved(config), loaded(config);
    loom::gpt::save_checkpoint(dir / "c.st", config, saved.values, saved.m, saved.v, 7, 9, "data.txt");
    const auto steps = loom::gpt::load_checkpoint(dir / "c.st", config, loaded.values, loaded.m, loaded.v);
    CHECK(steps.step == 9);
    CHECK(steps.optimizer_steps == 7);
    CHECK(loaded.values == saved.values);
}

TEST_CASE("GPT checkpoints refuse step counts that are not whole numbers in range", "[checkpoint]") {
    const auto config = tiny();
    for (const char* field : {"step", "optimizer_steps"}) {
        for (const char* bad : {"99999999999999999999", "9223372036854775807", "-1", "+5", " 5", "5 ", "0x10",
                                      "1e3", "", "12abc"}) {
            TempDir dir;
            Arrays a(config);
            loom::gpt::save_checkpoint(dir / "c.st", config, a.values, a.m, a.v, 1, 1, "data.txt");
            rewrite(dir / "c.st", {{field, bad}});
            const std::string message =
                message_of([&] { (void)loom::gpt::load_checkpoint(dir / "c.st", config, a.values, a.m, a.v); });
            INFO(field << " = '" << bad << "'");
            CHECK_THAT(message, Contains((dir / "c.st").string()) && Contains(std::string("'") + field + "'") &&
                                    Contains(std::string("'") + bad + "'") && Contains("give a whole number from 0 to"));
        }
    }
}

TEST_CASE("GPT checkpoints accept the largest step count they allow", "[checkpoint]") {
    TempDir dir;
    const auto config = tiny();
    Arrays a(config);
    const std::int64_t most = loom::gpt::max_checkpoint_steps;
    loom::gpt::save_checkpoint(dir / "c.st", config, a.values, a.m, a.v, most, most, "data.txt");
    const auto steps = loom::gpt::load_checkpoint(dir / "c.st", config, a.values, a.m, a.v);
    CHECK(steps.step == most);
    CHECK(steps.optimizer_steps == most);
}

TEST_CASE("GPT checkpoints holding NaN or infinity are refused, naming the tensor, the element and the file",
          "[checkpoint]") {
    const auto config = tiny();
    const auto names = loom::gpt::parameter_names(config);
    for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()}) {
        for (const std::string& tensor : {names.front(), "optimizer.m." + names[2], "optimizer.v." + names[1]}) {
            TempDir dir;
            Arrays a(config);
            loom::gpt::save_checkpoint(dir / "c.st", config, a.values, a.m, a.v, 1, 1, "data.txt");
            rewrite(dir / "c.st", {}, tensor, 3, bad);
            Arrays b(config);
            const std::string message =
                message_of([&] { (void)loom::gpt::load_checkpoint(dir / "c.st", config, b.values, b.m, b.v); });
            INFO(tensor << " holds " << bad);
            CHECK_THAT(message, Contains((dir / "c.st").string()) && Contains("tensor " + tensor) &&
                                    Contains("element 3") && Contains(std::isnan(bad) ? "nan" : "inf"));
        }
    }
}

TEST_CASE("GPT checkpoints cannot be saved with a negative or oversized step", "[checkpoint]") {
    TempDir dir;
    const auto config = tiny();
    Arrays a(config);
    CHECK_THAT(message_of([&] { loom::gpt::save_checkpoint(dir / "c.st", config, a.values, a.m, a.v, 1, -1, "d"); }),
               Contains("step -1") && Contains("give a whole number from 0 to"));
    CHECK_THAT(message_of([&] {
                   loom::gpt::save_checkpoint(dir / "c.st", config, a.values, a.m, a.v,
                                              std::numeric_limits<std::int64_t>::max(), 1, "d");
               }),
               Contains("optimizer_steps 9223372036854775807"));
    CHECK(dir.entries().empty());
}

TEST_CASE("GPT training state with a NaN is named by step and tensor before a save", "[checkpoint]") {
    const auto config = tiny();
    const auto names = loom::gpt::parameter_names(config);
    Arrays a(config);
    CHECK_NOTHROW(loom::gpt::check_finite_state(config, a.values, a.m, a.v, "step 3"));
    a.v[5] = std::nanf("");  // the 6th element of the first parameter's second moment
    CHECK_THAT(message_of([&] { loom::gpt::check_finite_state(config, a.values, a.m, a.v, "step 3"); }),
               Contains("step 3: tensor optimizer.v." + names.front() + " holds nan at element 5"));
}

}  // namespace LOOM_TEST_FILE
