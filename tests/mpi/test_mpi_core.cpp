// Core facts that must hold across MPI processes: every rank regenerates the
// same initial weights from (seed, path) and its shard matches the serial
// values; LOOM_MPI_CHECK names the call and MPI's error; a failed check reads
// the same on every rank.
#include <catch2/catch.hpp>
#include <mpi.h>

#include <loom/core/check_mpi.hpp>
#include <loom/core/init.hpp>
#include <loom/core/reflect.hpp>

#include <cstring>
#include <string>
#include <vector>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Init;
using loom::Param;
using loom::Shape;

namespace {

int world_rank() {
    int rank = 0;
    LOOM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    return rank;
}

int world_size() {
    int size = 0;
    LOOM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    return size;
}

struct Layer {
    Param weight{Shape{33, 17}, Init::normal(0.02f)};
    Param bias{Shape{33}, Init::uniform(-0.5f, 0.5f)};
};

std::uint64_t fnv1a(const void* data, std::size_t bytes) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 0x100000001b3ull;
    return h;
}

}  // namespace

TEST_CASE("every process regenerates identical initial weights", "[mpi][init]") {
    std::vector<Layer> model(4);
    std::vector<float> values;
    loom::reflect::visit_params(model, [&](const Param& p, std::string_view path) {
        std::vector<float> v(static_cast<std::size_t>(p.numel()));
        loom::initialize(p, path, 2024, loom::Tensor::of(v.data(), p.shape));
        values.insert(values.end(), v.begin(), v.end());
    });
    const std::uint64_t mine = fnv1a(values.data(), values.size() * sizeof(float));
    std::uint64_t lo = 0, hi = 0;
    LOOM_MPI_CHECK(MPI_Allreduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD));
    LOOM_MPI_CHECK(MPI_Allreduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
    CHECK(lo == mine);
    CHECK(hi == mine);
}

TEST_CASE("shards initialised on each process gather to the serial weights", "[mpi][init]") {
    const Param p{Shape{1001}, Init::normal(1.0f)};  // 1001 is not divisible by 2 or 3
    const int rank = world_rank(), size = world_size();
    std::vector<float> serial(1001);
    loom::initialize(p, "w", 99, loom::Tensor::of(serial.data(), p.shape));

    std::vector<int> counts(size), displs(size);
    for (int r = 0; r < size; ++r) {
        displs[r] = 1001 * r / size;
        counts[r] = 1001 * (r + 1) / size - displs[r];
    }
    std::vector<float> shard(static_cast<std::size_t>(counts[rank]));
    loom::initialize_shard(p, "w", 99, shard, displs[rank]);
    std::vector<float> gathered(1001, -1.0f);
    LOOM_MPI_CHECK(MPI_Allgatherv(shard.data(), counts[rank], MPI_FLOAT, gathered.data(), counts.data(),
                                  displs.data(), MPI_FLOAT, MPI_COMM_WORLD));
    CHECK(std::memcmp(gathered.data(), serial.data(), serial.size() * sizeof(float)) == 0);
}

TEST_CASE("LOOM_MPI_CHECK names the call and MPI's error", "[mpi][errors]") {
    int value = 0;
    try {
        LOOM_MPI_CHECK(MPI_Bcast(&value, 1, MPI_INT, 1 << 20, MPI_COMM_WORLD));
        FAIL("an out-of-range root was accepted");
    } catch (const loom::Error& e) {
        CHECK_THAT(e.message(),
                   Catch::StartsWith("MPI_Bcast(&value, 1, MPI_INT, 1 << 20, MPI_COMM_WORLD) failed: MPI error"));
        CHECK_THAT(e.message(), Catch::Contains("root"));
    }
}

TEST_CASE("a failed check reads the same on every process", "[mpi][errors]") {
    std::string message;
    try {
        const Param p{Shape{4}};
        std::vector<float> out(8);
        loom::initialize_shard(p, "blocks.0.bias", 1, out, 0);
    } catch (const loom::Error& e) {
        message = e.what();
    }
    REQUIRE_FALSE(message.empty());
    const std::uint64_t mine = fnv1a(message.data(), message.size());
    std::uint64_t lo = 0, hi = 0;
    LOOM_MPI_CHECK(MPI_Allreduce(&mine, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD));
    LOOM_MPI_CHECK(MPI_Allreduce(&mine, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD));
    CHECK(lo == hi);
}

}  // namespace LOOM_TEST_FILE
