// prepare_output, check_resume_identity and checkpoint_step: a run's files
// checked before anything is built.
#include <catch2/catch.hpp>

#include <loom/io/safetensors.hpp>
#include <loom/train/data_identity.hpp>
#include <loom/train/file_preflight.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include "io/temp_dir.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom_test::TempDir;

// A checkpoint file whose metadata is `metadata` (one small tensor, as a real one has).
void write_checkpoint(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata) {
    float value = 1.0f;
    loom::io::save_safetensors(path, {{"w", loom::Tensor::of(&value, {1})}}, metadata);
}

TEST_CASE("prepare_output: files and directories that can be written, and a path that cannot", "[train][file_preflight]") {
    const TempDir dir;
    loom::train::prepare_output("", false, true);  // nothing asked: nothing done
    loom::train::prepare_output((dir / "run.st").string(), false, true);
    CHECK_FALSE(std::filesystem::exists(dir / "run.st"));  // probed, not written
    loom::train::prepare_output((dir / "shards").string(), true, true);
    CHECK(std::filesystem::is_directory(dir / "shards"));
    CHECK_FALSE(std::filesystem::exists(dir / "shards" / "index.json"));
    CHECK_THROWS_WITH(loom::train::prepare_output((dir / "missing" / "run.st").string(), false, false),
                      Catch::StartsWith((dir / "missing" / "run.st").string() +
                                        " cannot be written (checked before training): cannot create the temporary file"));
    // A killed run's temporary beside the checkpoint goes (pid 999999999 is above any pid_max).
    std::ofstream(dir / "run.st.tmp-999999999") << "dead";
    loom::train::prepare_output((dir / "run.st").string(), false, false);
    CHECK(std::filesystem::exists(dir / "run.st.tmp-999999999"));  // not a checkpoint: left alone
    loom::train::prepare_output((dir / "run.st").string(), false, true);
    CHECK_FALSE(std::filesystem::exists(dir / "run.st.tmp-999999999"));
}

TEST_CASE("check_resume_identity and checkpoint_step read a checkpoint file's metadata", "[train][file_preflight]") {
    const TempDir dir;
    const std::string path = (dir / "run.st").string();
    auto metadata = loom::train::run_identity_metadata("", 7);
    metadata["step"] = "12";
    write_checkpoint(path, metadata);
    CHECK(loom::train::checkpoint_step(path) == 12);
    const loom::SettingNames anyway{[](std::string_view s) { return s == "resume_anyway" ? std::string("--anyway") : std::string(s); }};
    CHECK(loom::train::check_resume_identity(path, "", 7, false, anyway).empty());
    CHECK_THROWS_WITH(loom::train::check_resume_identity(path, "", 8, false, anyway),
                      Catch::Contains("--anyway to continue anyway"));
    CHECK_THAT(loom::train::check_resume_identity(path, "", 8, true, anyway), Catch::Contains("continuing anyway"));

    const std::string old = (dir / "old.st").string();
    write_checkpoint(old, {});
    CHECK_FALSE(loom::train::checkpoint_step(old).has_value());  // the resume itself names what is missing
    CHECK_THAT(loom::train::check_resume_identity(old, "", 7, false, anyway), Catch::Contains("not checked"));
}

}  // namespace LOOM_TEST_FILE
