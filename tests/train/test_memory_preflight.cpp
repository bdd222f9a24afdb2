// The memory preflight: the memory model's figures for the GPT, the probe of
// available memory (from a fake cgroup and /proc/meminfo), and the one-line
// refusal naming both figures and what to lower.
#include <catch2/catch.hpp>

#include <loom/train/launcher.hpp>
#include <loom/train/memory_preflight.hpp>

#include <cstdlib>  // setenv, unsetenv
#include <fstream>
#include <string>

#include "io/temp_dir.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::train::AvailableMemory;
using loom::train::MemoryNeed;
using loom_test::TempDir;

namespace {

void write_text(const std::filesystem::path& file, const std::string& text) {
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
}

std::string refusal(const MemoryNeed& need, double available) {
    try {
        loom::train::check_memory_fits(need, AvailableMemory{available, "a fake limit"},
                                       {.lower_activations = "--batch", .lower_model_states = "--width",
                                        .skip_check = "--no-memory-check"});
    } catch (const loom::Error& e) {
        return e.message();
    }
    return "";
}

}  // namespace

TEST_CASE("gpt_training_memory counts 16 bytes a parameter and one micro-batch's activations, split by the degrees",
          "[train][memory_preflight]") {
    loom::gpt::Config config;
    config.layers = 2;
    config.width = 64;
    config.heads = 4;
    config.seq = 32;
    config.vocab = 256;
    const auto one = loom::train::gpt_training_memory(config, {.batch = 8});
    const double parameters = static_cast<double>(loom::plan::describe_gpt(config, 8).parameters());
    CHECK(one.model_states == Approx(16 * parameters));
    CHECK(one.activations > 0);
    CHECK(one.ranks == 1);
    // ZeRO-3 on 4 ranks: a quarter of the states; dp 4: a quarter of the batch each; 4 ranks in the process.
    const auto sharded = loom::train::gpt_training_memory(config, {.batch = 8, .dp = 4, .zero = 3, .ranks_in_process = 4});
    CHECK(sharded.model_states == Approx(one.model_states / 4));
    CHECK(sharded.activations == Approx(one.activations / 4));
    CHECK(sharded.total() == Approx(one.total()));
    // Two micro-batches halve the activations one micro-batch keeps.
    CHECK(loom::train::gpt_training_memory(config, {.batch = 8, .micro_batches = 2}).activations ==
          Approx(one.activations / 2));
    CHECK_THROWS_WITH(loom::train::gpt_training_memory(config, {.batch = 8, .dp = 0}),
                      Catch::Contains("degrees, micro-batches, ranks and batch must be at least 1"));
}

TEST_CASE("check_memory_fits refuses in one line naming the need, the available bytes and what to lower",
          "[train][memory_preflight]") {
    const MemoryNeed activations_heavy{.model_states = 1e9, .activations = 5e9, .ranks = 1};
    CHECK(refusal(activations_heavy, 6.5e9).empty());
    CHECK(refusal(activations_heavy, 3.0 * (1 << 30)) ==
          "the run needs at least 5.6 GiB of memory (model states 953.7 MiB, activations 4.7 GiB) but 3.0 GiB is "
          "available (a fake limit); lower --batch, or pass --no-memory-check to try anyway");
    const MemoryNeed states_heavy{.model_states = 4e9, .activations = 1e9, .ranks = 2};
    const std::string message = refusal(states_heavy, 1e9);
    CHECK_THAT(message, Catch::StartsWith("the run needs at least 9.3 GiB of memory (per rank 4.7 GiB x 2 ranks: "));
    CHECK_THAT(message, Catch::Contains("lower --width, or pass --no-memory-check"));
    // No figure for the available memory: nothing to compare, nothing refused.
    CHECK_NOTHROW(loom::train::check_memory_fits(states_heavy, std::nullopt, {}));
}

TEST_CASE("available_memory takes the smaller of the cgroup's room and MemAvailable", "[train][memory_preflight]") {
    TempDir dir;
    write_text(dir / "meminfo", "MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n");
    SECTION("cgroup v2 with a limit below MemAvailable: the limit less its usage") {
        write_text(dir / "cg" / "memory.max", "3221225472\n");
        write_text(dir / "cg" / "memory.current", "221225472\n");
        const auto available = loom::train::available_memory(dir / "cg", dir / "meminfo");
        REQUIRE(available);
        CHECK(available->bytes == 3e9);
        CHECK_THAT(available->source, Catch::Contains("memory.max 3.0 GiB"));
    }
    SECTION("cgroup v2 without a limit, and v1's huge no-limit value: MemAvailable") {
        write_text(dir / "cg" / "memory.max", "max\n");
        write_text(dir / "cg" / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");
        const auto available = loom::train::available_memory(dir / "cg", dir / "meminfo");
        REQUIRE(available);
        CHECK(available->bytes == 8000000.0 * 1024);
        CHECK_THAT(available->source, Catch::Contains("MemAvailable"));
    }
    SECTION("cgroup v1 with a limit") {
        write_text(dir / "cg" / "memory" / "memory.limit_in_bytes", "1073741824\n");
        const auto available = loom::train::available_memory(dir / "cg", dir / "meminfo");
        REQUIRE(available);
        CHECK(available->bytes == 1073741824.0);
    }
    SECTION("neither file: no figure") { CHECK_FALSE(loom::train::available_memory(dir / "none", dir / "none")); }
}

TEST_CASE("launcher: rank and world size from mpirun's or srun's environment", "[train][launcher]") {
    // Not started by a launcher here (ctest runs the binary directly).
    if (loom::train::launched_by_mpi()) return;
    CHECK(loom::train::launcher_rank() == 0);
    CHECK(loom::train::launcher_world_size() == 1);
}

TEST_CASE("launcher: the local rank a launcher names, and one that is not a number", "[train][launcher]") {
    // The variables read before SLURM_LOCALID are mpirun's, unset when not launched.
    if (loom::train::launched_by_mpi()) return;
    ::setenv("SLURM_LOCALID", "3", 1);
    const loom::train::LocalRank local = loom::train::launcher_local_rank();
    CHECK(local.rank == 3);
    CHECK(std::string(local.variable) == "SLURM_LOCALID");
    ::setenv("SLURM_LOCALID", "x", 1);
    std::string message;
    try {
        (void)loom::train::launcher_local_rank();
    } catch (const loom::Error& e) {
        message = e.message();
    }
    ::unsetenv("SLURM_LOCALID");
    CHECK(message == "SLURM_LOCALID = 'x' is not a local rank (a whole number from 0)");
}

}  // namespace LOOM_TEST_FILE
