// The copies and fills between places that layers and the executor use
// around kernels: copy_rows (a column block of a matrix, row by row),
// fill_floats, and the staged collectives of host arrays over a communicator
// that moves device memory (comm/staged.hpp). On the host, and on the fenced
// test device, whose pointers crash if the host touches them, so every byte
// must go through the runtime.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/staged.hpp"
#include "loom/comm/thread_world.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "support/fenced_comm.hpp"
#include "support/fenced_device.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

// Columns 2..4 of a 4 x 6 matrix into a packed 4 x 3 block, on `where`, and back
// into columns 1..3 of a zero 4 x 5 matrix; returns that matrix on the host.
std::vector<float> column_block_round_trip(loom::Device where) {
    std::vector<float> matrix(24);
    std::iota(matrix.begin(), matrix.end(), 0.0f);
    const loom::DeviceBuffer on(loom::DType::f32, loom::Shape{24}, where), block(loom::DType::f32, loom::Shape{12}, where),
        back(loom::DType::f32, loom::Shape{20}, where);
    loom::copy_tensor(on.tensor(), loom::Tensor::of(matrix.data(), {24}));
    loom::fill_zero_bytes(back.raw(), where, back.nbytes());
    constexpr std::size_t f = sizeof(float);
    loom::copy_rows(block.data<float>(), 3 * f, where, on.data<float>() + 2, 6 * f, where, 3 * f, 4);
    loom::copy_rows(back.data<float>() + 1, 5 * f, where, block.data<float>(), 3 * f, where, 3 * f, 4);
    return loom::to_host<float>(back.tensor());
}

const std::vector<float> expected_round_trip{0, 2,  3,  4,  0,  //
                                             0, 8,  9,  10, 0,  //
                                             0, 14, 15, 16, 0,  //
                                             0, 20, 21, 22, 0};

}  // namespace

TEST_CASE("copy_rows moves a column block between pitched places, on the host and on a device", "[comm][device]") {
    CHECK(column_block_round_trip(loom::host_device) == expected_round_trip);
    loom_test::FencedDevice device;
    CHECK(column_block_round_trip(loom::cuda_device(0)) == expected_round_trip);
    CHECK(device.calls("copy_rows") == 2);
}

TEST_CASE("fill_floats sets every element, on the host and on a device, and refuses what it cannot fill",
          "[comm][device]") {
    loom_test::FencedDevice device;
    for (const loom::Device where : {loom::host_device, loom::cuda_device(0)}) {
        const loom::DeviceBuffer b(loom::DType::f32, loom::Shape{5}, where);
        loom::fill_floats(b.tensor(), -std::numeric_limits<float>::infinity());
        CHECK(loom::to_host<float>(b.tensor()) == std::vector<float>(5, -std::numeric_limits<float>::infinity()));
    }
    std::vector<std::int32_t> ints(3);
    try {
        loom::fill_floats(loom::Tensor::of(ints.data(), {3}), 1.0f);
        FAIL("no error");
    } catch (const loom::Error& e) {
        CHECK(std::string(e.message()).find("fill_floats: ") == 0);
        CHECK(std::string(e.message()).find("is not contiguous f32") != std::string::npos);
    }
}

TEST_CASE("staged collectives carry host arrays over a communicator that moves device memory", "[comm][device]") {
    loom_test::FencedDevice device;
    std::vector<std::vector<float>> gathered(2), summed(2), broadcast(2);
    loom::comm::ThreadWorld(2).run([&](loom::comm::ThreadComm& comm) {
        // FencedComm refuses host memory: each call below must stage through the device.
        loom_test::FencedComm<loom::comm::ThreadComm> fenced(std::move(comm));
        const int r = fenced.rank();
        const auto at = static_cast<std::size_t>(r);
        std::vector<float> mine{static_cast<float>(r + 1), static_cast<float>(10 * (r + 1))}, all(4);
        loom::comm::staged_all_gather(fenced, loom::Tensor::of(mine.data(), {2}), loom::Tensor::of(all.data(), {4}),
                                      loom::cuda_device(0));
        gathered[at] = all;
        std::vector<float> sum{static_cast<float>(r + 1)};
        loom::comm::staged_all_reduce(fenced, loom::Tensor::of(sum.data(), {1}), loom::comm::ReduceOp::sum,
                                      loom::cuda_device(0));
        summed[at] = sum;
        std::vector<float> root{static_cast<float>(r == 1 ? 7 : 0)};
        loom::comm::staged_broadcast(fenced, loom::Tensor::of(root.data(), {1}), 1, loom::cuda_device(0));
        broadcast[at] = root;
    });
    for (int r = 0; r < 2; ++r) {
        const auto at = static_cast<std::size_t>(r);
        CHECK(gathered[at] == std::vector<float>{1, 10, 2, 20});
        CHECK(summed[at] == std::vector<float>{3});
        CHECK(broadcast[at] == std::vector<float>{7});
    }
}

}  // namespace LOOM_TEST_FILE
