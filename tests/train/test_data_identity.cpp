// A checkpoint records the data and seed it was trained on; a resume on
// other ones is refused naming both, unless allowed.
#include <catch2/catch.hpp>

#include <loom/core/tensor.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/train/data_identity.hpp>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "io/temp_dir.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom_test::message_of;
using loom_test::TempDir;
using loom_test::write_bytes;

namespace {
// A one-tensor safetensors file carrying `metadata`, read back.
loom::io::SafetensorsFile file_with(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata) {
    std::vector<float> x{1.0f};
    loom::io::save_safetensors(path, {{"x", loom::Tensor::of(x.data(), {1})}}, metadata);
    return loom::io::SafetensorsFile(path);
}
}  // namespace

TEST_CASE("data_identity is the size and a hash of the content, not the path", "[identity]") {
    TempDir dir;
    write_bytes(dir / "a.txt", "hello world");
    write_bytes(dir / "copy.txt", "hello world");
    write_bytes(dir / "b.txt", "hello World");
    CHECK(loom::train::data_identity("") == "synthetic");
    CHECK(loom::train::data_identity((dir / "a.txt").string()).rfind("11 bytes, fnv1a64 ", 0) == 0);
    CHECK(loom::train::data_identity((dir / "a.txt").string()) == loom::train::data_identity((dir / "copy.txt").string()));
    CHECK(loom::train::data_identity((dir / "a.txt").string()) != loom::train::data_identity((dir / "b.txt").string()));
    CHECK_THAT(message_of([&] { (void)loom::train::data_identity((dir / "none.txt").string()); }),
               Catch::StartsWith("cannot read the size of the data file " + (dir / "none.txt").string() + ": "));
}

TEST_CASE("check_run_identity refuses other data or seed, allows them when told, and notes an old checkpoint",
          "[identity]") {
    TempDir dir;
    write_bytes(dir / "a.txt", "hello world");
    const std::string a = (dir / "a.txt").string();
    const auto ckpt = dir / "c.st";
    const auto file = file_with(ckpt, loom::train::run_identity_metadata(a, 7));
    // The settings are named as the front end spells them (here a command line's flags).
    const loom::SettingNames flags{[](std::string_view s) { return "--" + std::string(s == "resume_anyway" ? "resume-anyway" : s); }};
    CHECK(loom::train::check_run_identity(file.metadata(), ckpt, a, 7, false, flags).empty());
    const std::string seed_message = "checkpoint " + ckpt.string() + " was trained with --seed 7 but this run has --seed 8";
    CHECK(message_of([&] { (void)loom::train::check_run_identity(file.metadata(), ckpt, a, 8, false, flags); }) ==
          seed_message + "; resuming would not continue the same run (give the same settings, or --resume-anyway to continue anyway)");
    CHECK(loom::train::check_run_identity(file.metadata(), ckpt, a, 8, true, flags) ==
          seed_message + "; continuing anyway (--resume-anyway)");
    CHECK_THAT(message_of([&] { (void)loom::train::check_run_identity(file.metadata(), ckpt, "", 7, false, {}); }),
               Catch::Contains("was trained on data '11 bytes, fnv1a64 ") &&
                   Catch::Contains("' but data (none: synthetic) is 'synthetic'; resuming would not continue"));
    const auto old = file_with(dir / "old.st", {{"format", "loom-gpt-checkpoint-1"}});
    CHECK(loom::train::check_run_identity(old.metadata(), dir / "old.st", a, 7, false, flags) ==
          "checkpoint " + (dir / "old.st").string() + " records no data identity or seed (written before they were); not checked");
}

}  // namespace LOOM_TEST_FILE
