// The kernel table (kernels/kernel_table.hpp, loom/kernels/kernel_list.hpp): a
// kernel declared once by its tag runs its host function on host memory and
// the device backend's entry on a device; a backend's table with an empty
// entry is refused by name; a device without its backend, or a backend
// without the kernel, is named in one line. The fenced test device fills
// every entry of the list with one template, so running an op there shows
// the list and the tags agree.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/kernels/kernel_list.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/kernels/kernel_table.hpp"
#include "loom/kernels/ops.hpp"
#include "support/fenced_device.hpp"
#include "support/message_of.hpp"
#include "support/test_file.hpp"

namespace LOOM_TEST_FILE {

namespace {

// A kernel a user might add: its host function and its tag.
void scale_host(float* x, std::int64_t n, float by) noexcept {
    for (std::int64_t i = 0; i < n; ++i) x[i] *= by;
}

namespace kernel {
LOOM_DEVICE_KERNEL(scale, scale_host);
}  // namespace kernel

// Its "device" entry for the fenced device: the host function on the
// unfenced pointer, marked so the test sees which ran.
void scale_on_fenced(loom::Device, float* x, std::int64_t n, float by) {
    scale_host(loom_test::unfence(x), n, by + 1.0f);
}

}  // namespace

TEST_CASE("kernel table: a kernel's tag gives its name, host function and device entry type", "[kernels][table]") {
    STATIC_REQUIRE(kernel::scale::name == "scale");
    STATIC_REQUIRE(std::is_same_v<loom::kernels::DeviceEntry<kernel::scale>, void (*)(loom::Device, float*,
                                                                                       std::int64_t, float)>);
    STATIC_REQUIRE(std::is_same_v<loom::kernels::DeviceEntry<loom::kernels::kernel::cross_entropy_forward>,
                                  float (*)(loom::Device, const float*, const std::int32_t*, float*, std::int64_t,
                                            std::int64_t)>);
    std::vector<float> x{1.0f, 2.0f};
    loom::kernels::run<kernel::scale>(loom::host_device, x.data(), std::int64_t{2}, 3.0f);
    CHECK(x == std::vector<float>{3.0f, 6.0f});
}

TEST_CASE("kernel table: a device's entry runs for device memory, and a missing one is named", "[kernels][table]") {
    loom_test::FencedDevice device;
    const loom::Device cuda = loom::cuda_device(0);
    loom::DeviceBuffer buffer(loom::DType::f32, loom::Shape{2}, cuda);
    loom::fill_floats(buffer.tensor(), 1.0f);

    CHECK(loom_test::message_of([&] {
              loom::kernels::run<kernel::scale>(cuda, buffer.tensor().data<float>(), std::int64_t{2}, 3.0f);
          }) == "the cuda backend has no kernel scale; its table must fill every kernel of loom/kernels/kernel_list.hpp");

    loom::kernels::device_entry<kernel::scale>(loom::DeviceKind::cuda) = &scale_on_fenced;
    loom::kernels::run<kernel::scale>(cuda, buffer.tensor().data<float>(), std::int64_t{2}, 3.0f);
    loom::kernels::device_entry<kernel::scale>(loom::DeviceKind::cuda) = nullptr;
    CHECK(loom::to_host<float>(buffer.tensor()) == std::vector<float>{4.0f, 4.0f});  // the device's entry ran

    // A listed kernel through its op: the fenced device's entry counts it.
    loom::DeviceBuffer sum(loom::DType::f32, loom::Shape{2}, cuda);
    loom::kernels::add(buffer.tensor(), buffer.tensor(), sum.tensor());
    CHECK(device.calls("add") == 1);
    CHECK(loom::to_host<float>(sum.tensor()) == std::vector<float>{8.0f, 8.0f});
}

TEST_CASE("kernel table: a backend's table with an empty entry is refused by name", "[kernels][table]") {
    loom::kernels::BackendKernels table = loom_test::fenced_detail::table();
    CHECK(table.missing().empty());
    table.gelu_backward = nullptr;
    table.adamw_update = nullptr;
    CHECK(table.missing() == std::vector<std::string>{"gelu_backward", "adamw_update"});
    CHECK(loom_test::message_of([&] { (void)loom::kernels::install_kernels(loom::DeviceKind::cuda, table); }) ==
          "install_kernels: the cuda backend leaves 2 kernels empty, the first gelu_backward; a backend fills every "
          "kernel of loom/kernels/kernel_list.hpp");
    CHECK(loom::kernels::BackendKernels::installed(loom::DeviceKind::cuda).gelu_backward == nullptr);  // unchanged
    CHECK(loom_test::message_of([] { (void)loom::kernels::device_entry<kernel::scale>(loom::DeviceKind::host); }) ==
          "device_entry<scale>: the host runs its kernels directly; only a device's entries are filled");
}

TEST_CASE("kernel table: device memory without its backend is named", "[kernels][table]") {
    const loom::Device cuda = loom::cuda_device(0);
    float* not_allocated = nullptr;
    CHECK(loom_test::message_of([&] { loom::kernels::run<kernel::scale>(cuda, not_allocated, std::int64_t{0}, 1.0f); }) ==
          "tensors on cuda:0 need the cuda backend's kernels, which this program was built without: compile one .cu "
          "file that includes loom/cuda_backend.cuh and link loom::cuda");
}

}  // namespace LOOM_TEST_FILE
