// The kernel table: how one layer type runs on the host or on a device chosen
// at run time. A kernel is a tag, kernels::kernel::X, declared once in the
// list of kernels (kernels/kernel_list.hpp) from its host function:
//
//   X(gelu_forward, host::gelu_forward)
//
// The device form of the kernel is the host function's signature with the
// Device first (the device's index, for a backend to make it current), so
// the signature is written once, in the host file. run<kernel::X>(d, ...)
// calls the host function for host memory and the device backend's entry
// otherwise. A backend fills its entries (cuda_backend.cuh; the tests'
// FencedDevice) and installs them with install_kernels (kernel_list.hpp).
//
// So adding a kernel is its host file, its CUDA file and one line in the
// list; there is no virtual interface, wrapper and override to keep in step.
// The host core names no CUDA type: entries are plain function pointers.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "loom/core/device.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/error.hpp"

namespace loom::kernels {

// A kernel's device entry: its host signature with the Device first. A host
// kernel's noexcept does not carry over: a device launch reports errors by
// throwing.
template <class HostSignature>
struct DeviceEntryOf;
template <class R, class... Args>
struct DeviceEntryOf<R(Args...)> {
    using type = R (*)(Device, Args...);
};
template <class R, class... Args>
struct DeviceEntryOf<R(Args...) noexcept> {
    using type = R (*)(Device, Args...);
};

template <class Kernel>
using DeviceEntry = typename DeviceEntryOf<typename Kernel::Signature>::type;

namespace detail {

inline constexpr std::size_t device_kinds = 2;  // host, cuda (core/device.hpp)

[[nodiscard]] constexpr std::size_t kind_index(DeviceKind kind) noexcept { return static_cast<std::size_t>(kind); }

// One entry per device kind and kernel. A function-local static in a
// function template: one object per program, shared by every translation
// unit, usable while static initialisers run (a backend installs from one).
template <class Kernel>
[[nodiscard]] std::array<DeviceEntry<Kernel>, device_kinds>& entries() {
    static std::array<DeviceEntry<Kernel>, device_kinds> table{};
    return table;
}

}  // namespace detail

// The entry of `kernel` on `kind`, for a backend to fill (null: missing).
template <class Kernel>
[[nodiscard]] DeviceEntry<Kernel>& device_entry(DeviceKind kind) {
    LOOM_CHECK(kind != DeviceKind::host, "device_entry<", Kernel::name,
               ">: the host runs its kernels directly; only a device's entries are filled");
    return detail::entries<Kernel>()[detail::kind_index(kind)];
}

// Runs `Kernel` where its operands live: its host function on host memory,
// the device's entry otherwise (on the calling thread's order of work there).
// Throws, naming the kernel, when the device's backend is missing or lacks it.
template <class Kernel, class... Args>
decltype(auto) run(Device where, Args&&... args) {
    if (where.kind == DeviceKind::host) return Kernel::host(std::forward<Args>(args)...);
    const DeviceEntry<Kernel> entry = detail::entries<Kernel>()[detail::kind_index(where.kind)];
    if (entry == nullptr) {
        LOOM_CHECK(find_device_runtime(where.kind) != nullptr, "tensors on ", where, " need the ", where.kind,
                   " backend's kernels, which this program was built without: compile one .cu file that includes "
                   "loom/cuda_backend.cuh and link loom::cuda");
        LOOM_FAIL("the ", where.kind, " backend has no kernel ", Kernel::name, "; its table must fill every kernel of "
                  "loom/kernels/kernel_list.hpp");
    }
    return entry(where, std::forward<Args>(args)...);
}

}  // namespace loom::kernels

// Declares the kernel `name_` (a tag type in the current namespace) whose
// host form is `host_function`: the list's tags, or a program's own kernel.
#define LOOM_DEVICE_KERNEL(name_, host_function)                           \
    struct name_ {                                                         \
        static constexpr std::string_view name = #name_;                   \
        static constexpr auto host = &host_function;                       \
        using Signature = std::remove_pointer_t<decltype(host)>;           \
    }
