// Mesh: rank order (tp innermost, then sp, other axes, dp, pp outermost), the
// sub-communicator of each axis, and bad sizes named against the world size.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "loom/comm/mesh.hpp"
#include "loom/comm/thread_world.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

using loom::Tensor;
using loom::comm::Mesh;
using loom::comm::ThreadComm;
using loom::comm::ThreadWorld;

namespace {

// World ranks of the members of `comm`, in its rank order.
std::vector<int> members(ThreadComm& comm) {
    std::int32_t mine = comm.world_rank();
    std::vector<std::int32_t> all(static_cast<std::size_t>(comm.size()));
    comm.all_gather(Tensor::of(&mine, {1}), Tensor::of(all.data(), {comm.size()}));
    return {all.begin(), all.end()};
}

void expect(bool ok, const std::string& what) {
    if (!ok) throw std::runtime_error(what);
}

}  // namespace

TEST_CASE("Mesh orders ranks tp innermost, then sp, dp, pp, and splits one group per axis") {
    CHECK_NOTHROW(ThreadWorld(8).run([](ThreadComm& world) {
        Mesh<ThreadComm> mesh(world, {{"dp", 2}, {"tp", 2}, {"pp", 2}});
        const int r = world.rank();
        const std::string at = "world rank " + std::to_string(r);
        expect(mesh.coordinate("tp") == r % 2 && mesh.coordinate("dp") == (r / 2) % 2 && mesh.coordinate("pp") == r / 4,
               at + ": wrong coordinates");
        expect(mesh.size("sp") == 1 && mesh.axis("sp").size() == 1, at + ": absent axis sp is not size 1");
        expect(members(mesh.axis("tp")) == std::vector<int>{r & ~1, r | 1}, at + ": wrong tp group");
        expect(members(mesh.axis("dp")) == std::vector<int>{r & ~2, r | 2}, at + ": wrong dp group");
        expect(members(mesh.axis("pp")) == std::vector<int>{r & ~4, r | 4}, at + ": wrong pp group");
        expect(mesh.axis("tp").rank() == mesh.coordinate("tp"), at + ": tp rank is not the tp coordinate");
        expect(mesh.world_rank({{"pp", 1}, {"tp", 0}}) == 4 + (r & 2), at + ": world_rank of coordinates");
        // The groups are live communicators: a dp all-reduce sums over dp only.
        float value = static_cast<float>(r);
        mesh.axis("dp").all_reduce(Tensor::of(&value, {1}), Tensor::of(&value, {1}), loom::comm::ReduceOp::sum);
        expect(value == static_cast<float>((r & ~2) + (r | 2)), at + ": dp all_reduce");
    }));
}

TEST_CASE("Mesh places a policy's own axis between dp and sp") {
    CHECK_NOTHROW(ThreadWorld(8).run([](ThreadComm& world) {
        Mesh<ThreadComm> mesh(world, {{"tp", 2}, {"ep", 2}, {"dp", 2}});
        std::vector<std::string> names;
        for (const auto& axis : mesh.axes()) names.push_back(axis.name);
        expect(names == std::vector<std::string>{"pp", "dp", "ep", "sp", "tp"}, "axis order");
        expect(mesh.coordinate("ep") == (world.rank() / 2) % 2, "ep coordinate");
    }));
}

TEST_CASE("Mesh rejects sizes that do not multiply to the world size, naming both") {
    using Catch::Matchers::Contains;
    std::string message;
    try {
        ThreadWorld(4).run([](ThreadComm& world) { Mesh<ThreadComm> mesh(world, {{"dp", 3}}); });
    } catch (const std::exception& e) {
        message = e.what();
    }
    CHECK_THAT(message, Contains("Mesh(pp=1 x dp=3 x sp=1 x tp=1) has 3 ranks but the world has 4"));
    auto first_error = [](std::vector<loom::comm::MeshAxis> axes) {
        try {
            ThreadWorld(2).run([&](ThreadComm& world) { Mesh<ThreadComm> mesh(world, axes); });
        } catch (const std::exception& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    CHECK_THAT(first_error({{"dp", 0}}), Contains("Mesh: axis dp has size 0; sizes are 1 or more"));
    CHECK_THAT(first_error({{"dp", 2}, {"dp", 1}}), Contains("Mesh: axis dp is given twice"));
    CHECK_THAT(first_error({{"", 2}}), Contains("Mesh: an axis has an empty name"));
    std::string unknown;
    ThreadWorld(2).run([&](ThreadComm& world) {
        Mesh<ThreadComm> mesh(world, {{"dp", 2}});
        try {
            (void)mesh.axis("ep");
        } catch (const std::exception& e) {
            if (world.rank() == 0) unknown = e.what();
        }
    });
    CHECK_THAT(unknown, Contains("Mesh has no axis 'ep'; its axes are pp, dp, sp, tp"));
}

}  // namespace LOOM_TEST_FILE
