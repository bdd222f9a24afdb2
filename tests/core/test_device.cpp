// parse_device: the inverse of how a Device prints, and a one-line refusal.
#include <catch2/catch.hpp>

#include <loom/core/device.hpp>

#include <sstream>
#include <string>
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

TEST_CASE("parse_device reads what a Device prints, and refuses the rest by name", "[core][device]") {
    CHECK(loom::parse_device("host") == loom::host_device);
    CHECK(loom::parse_device("cuda") == loom::cuda_device(0));
    for (const loom::Device device : {loom::host_device, loom::cuda_device(0), loom::cuda_device(7)}) {
        std::ostringstream printed;
        printed << device;
        CHECK(loom::parse_device(printed.str()) == device);
    }
    for (const std::string bad : {"tpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1024", "cuda:1x", "Host"})
        CHECK_THROWS_WITH(loom::parse_device(bad),
                          Catch::StartsWith(bad + " is not host, cuda or cuda:N (N a device index)"));
}

}  // namespace LOOM_TEST_FILE
