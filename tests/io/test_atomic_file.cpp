// write_file_atomically: the old file or the whole new one, never a mix, and
// no temporary file left behind whatever fails.
#include <catch2/catch.hpp>

#include <loom/io/atomic_file.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "io/temp_dir.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::io::AtomicFile;
using loom::io::write_file_atomically;
using loom_test::read_bytes;
using loom_test::TempDir;
using loom_test::write_bytes;

namespace {
std::string temp_name_for(const std::string& name) { return name + ".tmp-" + std::to_string(::getpid()); }
}  // namespace

TEST_CASE("write_file_atomically creates and replaces a file, leaving no temporary", "[atomic]") {
    TempDir dir;
    const auto path = dir / "state.bin";
    write_file_atomically(path, "first version");
    CHECK(read_bytes(path) == "first version");
    write_file_atomically(path, std::string("second\0version", 14));
    CHECK(read_bytes(path) == std::string("second\0version", 14));
    write_file_atomically(path, "");
    CHECK(std::filesystem::exists(path));
    CHECK(read_bytes(path).empty());
    CHECK(dir.entries() == std::vector<std::string>{"state.bin"});
}

TEST_CASE("write_file_atomically streams through a callback", "[atomic]") {
    TempDir dir;
    const auto path = dir / "big.bin";
    std::string expected;
    write_file_atomically(path, [&](AtomicFile& file) {
        CHECK(file.path() == path);
        CHECK(file.temp_path().filename().string() == temp_name_for("big.bin"));
        CHECK(std::filesystem::exists(file.temp_path()));
        CHECK_FALSE(std::filesystem::exists(path));  // invisible until commit
        for (int i = 0; i < 1000; ++i) {
            const std::string chunk = std::to_string(i) + ",";
            file.write(chunk);
            expected += chunk;
        }
    });
    CHECK(read_bytes(path) == expected);
    CHECK(dir.entries() == std::vector<std::string>{"big.bin"});
}

TEST_CASE("a failure while writing keeps the old file and removes the temporary", "[atomic][errors]") {
    TempDir dir;
    const auto path = dir / "model.st";
    write_bytes(path, "old contents");
    struct DiskFull : std::runtime_error {
        using std::runtime_error::runtime_error;
    };
    CHECK_THROWS_AS(write_file_atomically(path,
                                          [](AtomicFile& file) {
                                              file.write("half of the new con");
                                              throw DiskFull("simulated failure mid-write");
                                          }),
                    DiskFull);
    CHECK(read_bytes(path) == "old contents");
    CHECK(dir.entries() == std::vector<std::string>{"model.st"});
}

TEST_CASE("writing into a directory that does not exist names the temporary, the path and the reason",
          "[atomic][errors]") {
    TempDir dir;
    const auto path = dir / "no_such_dir" / "x.bin";
    const std::string expected = "cannot create the temporary file " + (dir / "no_such_dir" / temp_name_for("x.bin")).string() +
                                 " to write " + path.string() + ": No such file or directory";
    CHECK_THROWS_WITH(write_file_atomically(path, "data"), Catch::StartsWith(expected));
    CHECK(dir.entries().empty());
}

TEST_CASE("a temporary that cannot be created leaves the existing file unchanged", "[atomic][errors]") {
    TempDir dir;
    const auto path = dir / "ckpt.st";
    write_bytes(path, "precious");
    // A directory squatting on the temporary's name makes open() fail.
    std::filesystem::create_directory(dir / temp_name_for("ckpt.st"));
    CHECK_THROWS_WITH(write_file_atomically(path, "replacement"),
                      Catch::Contains("cannot create the temporary file") && Catch::Contains(path.string()) &&
                          Catch::Contains("Is a directory"));
    CHECK(read_bytes(path) == "precious");
    CHECK(dir.entries() == std::vector<std::string>{"ckpt.st", temp_name_for("ckpt.st")});
    CHECK(std::filesystem::is_directory(dir / temp_name_for("ckpt.st")));  // not ours to remove
}

TEST_CASE("a failed rename removes the temporary and names both paths", "[atomic][errors]") {
    TempDir dir;
    const auto path = dir / "occupied";
    std::filesystem::create_directory(path);
    write_bytes(path / "inside", "x");  // a non-empty directory cannot be replaced by a file
    CHECK_THROWS_WITH(write_file_atomically(path, "data"),
                      Catch::StartsWith("cannot rename " + (dir / temp_name_for("occupied")).string() +
                                        " over it (writing " + path.string() + "): ") &&
                          Catch::Contains("Is a directory"));
    CHECK(dir.entries() == std::vector<std::string>{"occupied"});
    CHECK(read_bytes(path / "inside") == "x");
}

TEST_CASE("an AtomicFile dropped without commit leaves no trace", "[atomic]") {
    TempDir dir;
    const auto path = dir / "never.bin";
    {
        AtomicFile file(path);
        file.write("abandoned");
        CHECK(std::filesystem::exists(file.temp_path()));
    }
    CHECK(dir.entries().empty());
    AtomicFile committed(path);
    committed.commit();
    CHECK_THROWS_WITH(committed.write("late"), Catch::StartsWith("cannot write to " + path.string() + " after commit()"));
    CHECK_THROWS_WITH(committed.commit(), Catch::StartsWith("commit() of " + path.string() + " was already called"));
    CHECK(dir.entries() == std::vector<std::string>{"never.bin"});
}

TEST_CASE("a relative path works in the current directory", "[atomic]") {
    TempDir dir;
    const auto previous = std::filesystem::current_path();
    std::filesystem::current_path(dir.path());
    try {
        write_file_atomically("relative.txt", "here");
        std::filesystem::current_path(previous);
    } catch (...) {
        std::filesystem::current_path(previous);
        throw;
    }
    CHECK(read_bytes(dir / "relative.txt") == "here");
}

TEST_CASE("probe_writable creates and removes the temporary a save would use, or says why it cannot", "[atomic]") {
    TempDir dir;
    loom::io::probe_writable(dir / "run.st");
    CHECK(dir.entries().empty());
    CHECK_THAT(loom_test::message_of([&] { loom::io::probe_writable(dir / "no" / "run.st"); }),
               Catch::StartsWith("cannot create the temporary file " + temp_name_for((dir / "no" / "run.st").string())) &&
                   Catch::EndsWith(": No such file or directory"));
    CHECK(loom_test::message_of([&] { loom::io::probe_writable(dir.path()); }) ==
          "cannot write " + dir.path().string() + ": it is a directory; give a file name");
}

TEST_CASE("remove_stale_temporaries removes a dead process's temporaries, not a live one's", "[atomic]") {
    TempDir dir;
    write_bytes(dir / "run.st.tmp-999999999", "dead");          // above any pid_max
    write_bytes(dir / "run.st.step-4.tmp-999999998", "dead");   // a periodic save's
    write_bytes(dir / temp_name_for("run.st"), "ours: live");   // this process
    write_bytes(dir / "run.st.tmp-1", "init: live");
    write_bytes(dir / "other.st.tmp-999999999", "another file's");
    write_bytes(dir / "run.st", "the checkpoint");
    const auto removed = loom::io::remove_stale_temporaries(dir / "run.st");
    CHECK(removed.size() == 2);
    std::vector<std::string> kept{"other.st.tmp-999999999", "run.st", temp_name_for("run.st"), "run.st.tmp-1"};
    std::sort(kept.begin(), kept.end());
    CHECK(dir.entries() == kept);
}

}  // namespace LOOM_TEST_FILE
