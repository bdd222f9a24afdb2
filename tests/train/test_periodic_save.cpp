// --save-every N --keep K: <save>.step-<n> files, the K newest kept, the
// final file and temporaries never taken for periodic checkpoints.
#include <catch2/catch.hpp>

#include <loom/train/periodic_save.hpp>

#include <string>
#include <vector>

#include "io/temp_dir.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom_test::message_of;
using loom_test::TempDir;
using loom_test::write_bytes;

TEST_CASE("prune_periodic_checkpoints keeps the newest K by step, not by name", "[periodic]") {
    TempDir dir;
    const auto save = dir / "run.st";
    CHECK(loom::train::periodic_checkpoint_path(save, 40).filename() == "run.st.step-40");
    for (const int step : {5, 10, 40, 100, 20}) write_bytes(loom::train::periodic_checkpoint_path(save, step), "x");
    write_bytes(save, "final");
    write_bytes(dir / "run.st.step-200.tmp-123", "a temporary");
    write_bytes(dir / "other.st.step-1", "another run");
    write_bytes(dir / "run.st.step-x", "not a step");
    loom::train::prune_periodic_checkpoints(save, 2);
    CHECK(dir.entries() == std::vector<std::string>{"other.st.step-1", "run.st", "run.st.step-100", "run.st.step-200.tmp-123",
                                                    "run.st.step-40", "run.st.step-x"});
    loom::train::prune_periodic_checkpoints(save, 5);  // fewer than K: nothing removed
    CHECK(loom::train::periodic_checkpoints(save).size() == 2);
    CHECK(message_of([&] { loom::train::prune_periodic_checkpoints(save, 0); }) ==
          "prune_periodic_checkpoints: keep 0 must be 1 or more");
}

}  // namespace LOOM_TEST_FILE
