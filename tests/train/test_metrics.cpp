// MetricsWriter: one valid JSON object per line, flushed as it is written.
#include <catch2/catch.hpp>

#include <loom/io/json.hpp>
#include <loom/train/metrics.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "io/temp_dir.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace json = loom::io::json;
using loom::train::MetricsWriter;
using loom_test::read_bytes;
using loom_test::TempDir;

namespace {

std::vector<json::Document> records(const std::filesystem::path& path) {
    const std::string text = read_bytes(path);
    std::vector<json::Document> result;
    std::size_t begin = 0;
    for (std::size_t end = text.find('\n'); end != std::string::npos; end = text.find('\n', begin)) {
        result.push_back(json::parse_or_throw(std::string_view(text).substr(begin, end - begin), "metrics line"));
        begin = end + 1;
    }
    REQUIRE(begin == text.size());  // every line ends with a newline
    return result;
}

}  // namespace

TEST_CASE("MetricsWriter writes one JSON object per line with the standard and extra fields", "[metrics]") {
    TempDir dir;
    const auto path = dir / "metrics.jsonl";
    MetricsWriter metrics(path);
    CHECK(metrics.path() == path);
    metrics.write(1, 5.5f, 1000.0);
    CHECK(records(path).size() == 1);  // flushed at once, before the writer closes
    metrics.write(2, 2.3141f, 12345.6, {{"lr", json::number(3e-4)}, {"phase", json::quote("warm \"up\"")},
                                         {"grad_norm", "1.25"}, {"ok", "true"}});
    metrics.write(3, std::nanf(""), 0.0);

    CHECK(read_bytes(path).substr(0, read_bytes(path).find('\n')) ==
          R"({"step": 1, "loss": 5.5, "tokens_per_s": 1000})");
    const std::vector<json::Document> documents = records(path);
    std::vector<json::Value> lines;
    for (const json::Document& d : documents) lines.push_back(d.root());
    REQUIRE(lines.size() == 3);
    for (std::size_t i = 0; i < lines.size(); ++i) {
        REQUIRE(lines[i].is_object());
        CHECK(lines[i].find("step")->as_uint64() == i + 1);
        CHECK(lines[i].find("tokens_per_s") .has_value());
    }
    std::vector<std::string> keys;
    for (const json::Member& m : lines[1].members()) keys.emplace_back(m.key);
    CHECK(keys == std::vector<std::string>{"step", "loss", "tokens_per_s", "lr", "phase", "grad_norm", "ok"});
    CHECK(static_cast<float>(*lines[1].find("loss")->as_double()) == 2.3141f);
    CHECK(lines[1].find("tokens_per_s")->as_double() == 12345.6);
    CHECK(lines[1].find("lr")->as_double() == 3e-4);
    CHECK(lines[1].find("phase")->text() == "warm \"up\"");
    CHECK(lines[1].find("ok")->boolean());
    CHECK(lines[2].find("loss")->kind() == json::Kind::null);  // NaN is not JSON
}

TEST_CASE("MetricsWriter appends for a resumed run and replaces otherwise", "[metrics]") {
    TempDir dir;
    const auto path = dir / "m.jsonl";
    { MetricsWriter(path).write(1, 1.0f, 1.0); }
    { MetricsWriter(path, MetricsWriter::Mode::append).write(2, 1.0f, 1.0); }
    CHECK(records(path).size() == 2);
    { MetricsWriter(path).write(1, 1.0f, 1.0); }
    CHECK(records(path).size() == 1);
}

TEST_CASE("MetricsWriter refuses a path it cannot open and fields that would break the line", "[metrics][errors]") {
    TempDir dir;
    const auto nowhere = dir / "no_such_dir" / "m.jsonl";
    CHECK_THROWS_WITH(MetricsWriter(nowhere), Catch::StartsWith("cannot open the metrics file " + nowhere.string() +
                                                                ": No such file or directory"));
    MetricsWriter metrics(dir / "m.jsonl");
    CHECK_THROWS_WITH(metrics.write(1, 1.0f, 1.0, {{"phase", "warmup"}}),
                      Catch::StartsWith("metrics field \"phase\" has the value `warmup`, which is not valid JSON ("));
    CHECK_THROWS_WITH(metrics.write(1, 1.0f, 1.0, {{"loss", "2"}}),
                      Catch::StartsWith("metrics field \"loss\" appears twice in the line for step 1"));
    CHECK_THROWS_WITH(metrics.write(1, 1.0f, 1.0, {{"a", "1"}, {"a", "2"}}),
                      Catch::StartsWith("metrics field \"a\" appears twice"));
    CHECK_THROWS_WITH(metrics.write(1, 1.0f, 1.0, {{"v", "[1,\n2]"}}),
                      Catch::StartsWith("metrics field \"v\" has a value spanning lines"));
    CHECK(read_bytes(dir / "m.jsonl").empty());  // nothing half-written
}

}  // namespace LOOM_TEST_FILE
