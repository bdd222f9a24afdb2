// FencedDevice: a stand-in for a GPU on a machine without one, installed as
// the DeviceRuntime and the kernel table of DeviceKind::cuda for a test's scope.
// Its memory is host memory, but the pointers it hands out are fenced: bit 62
// is flipped, which makes them non-canonical x86-64 addresses, so any code
// that reads or writes "device" memory directly on the host crashes at once
// instead of passing. Its kernel table (loom/kernels/kernel_list.hpp) is filled,
// kernel by kernel, with one adapter that unfences the pointer arguments and
// runs the kernel's host function, so results must equal the host's bit for
// bit, and a kernel added to the list needs nothing here. A layer, context,
// arena or trainer that runs on this device therefore goes through the
// runtime and the kernel table for everything, as it must on a real GPU.
// Test code only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/core/buffer.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/kernels/kernel_list.hpp"

namespace loom_test {

inline constexpr std::uintptr_t fence_bit = std::uintptr_t{1} << 62;

template <class T>
T* fence(T* p) {
    return p == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) ^ fence_bit);
}
template <class T>
T* unfence(T* p) {
    return fence(p);  // the flip is its own inverse
}

class FencedDevice;

namespace fenced_detail {

// The one FencedDevice alive, which counts the kernels' calls.
inline FencedDevice*& current() {
    static FencedDevice* device = nullptr;
    return device;
}

template <class T>
T unfence_argument(T value) {
    if constexpr (std::is_pointer_v<T>) return unfence(value);
    else return value;
}

inline void count_call(std::string_view kernel);

// A kernel's device entry: count the call, then the host function on the
// unfenced pointers.
template <class Kernel, class Signature>
struct Entry;
template <class Kernel, class R, class... Args>
struct Entry<Kernel, R(Args...)> {
    static R call(loom::Device, Args... args) {
        count_call(Kernel::name);
        return Kernel::host(unfence_argument(args)...);
    }
};
template <class Kernel, class R, class... Args>
struct Entry<Kernel, R(Args...) noexcept> : Entry<Kernel, R(Args...)> {};

inline loom::kernels::BackendKernels table() {
    loom::kernels::BackendKernels t;
#define LOOM_FENCED_ENTRY(k, host_function) t.k = &Entry<loom::kernels::kernel::k, loom::kernels::kernel::k::Signature>::call;
    LOOM_BACKEND_KERNELS(LOOM_FENCED_ENTRY)
#undef LOOM_FENCED_ENTRY
    return t;
}

}  // namespace fenced_detail

class FencedDevice final : public loom::DeviceRuntime {
public:
    FencedDevice()
        : runtime_scope_(loom::DeviceKind::cuda, static_cast<loom::DeviceRuntime*>(this)),
          kernels_scope_(loom::DeviceKind::cuda, fenced_detail::table()),
          previous_(std::exchange(fenced_detail::current(), this)) {}
    ~FencedDevice() override { fenced_detail::current() = previous_; }
    FencedDevice(const FencedDevice&) = delete;
    FencedDevice& operator=(const FencedDevice&) = delete;

    // Calls made, by name: a test can check that work went through the table.
    // Rank threads share the device, so the counts are behind a lock.
    [[nodiscard]] int calls(const std::string& name) const {
        const std::lock_guard lock(mutex_);
        const auto it = counts_.find(name);
        return it == counts_.end() ? 0 : it->second;
    }

    void check_usable(int index) const override {
        LOOM_CHECK(index == 0, "cuda:", index, " does not exist: the fenced test device has cuda:0 only");
    }
    int device_count() const override { return 1; }
    std::string describe(int) const override { return "fenced test device"; }
    void* allocate(std::size_t bytes, loom::Device where) override {
        return fence(loom::Allocator<loom::Host>::allocate(bytes, where));
    }
    void deallocate(void* p, std::size_t bytes, loom::Device where) noexcept override {
        if (p == nullptr) return;
        loom::Allocator<loom::Host>::deallocate(unfence(p), bytes, where);
    }
    void copy(void* to, loom::Device to_device, const void* from, loom::Device from_device,
              std::size_t bytes) override {
        count("copy");
        void* t = to_device.kind == loom::DeviceKind::host ? to : unfence(to);
        const void* f = from_device.kind == loom::DeviceKind::host ? from : unfence(from);
        std::memmove(t, f, bytes);
    }
    void fill_zero(void* p, loom::Device, std::size_t bytes) override { std::memset(unfence(p), 0, bytes); }
    void fill_floats(float* p, loom::Device, float value, std::int64_t n) override {
        count("fill_floats");
        std::fill_n(unfence(p), n, value);
    }
    void copy_rows(void* to, std::size_t to_pitch, loom::Device to_device, const void* from, std::size_t from_pitch,
                   loom::Device from_device, std::size_t width, std::size_t rows) override {
        count("copy_rows");
        auto* t = static_cast<char*>(to_device.kind == loom::DeviceKind::host ? to : unfence(to));
        const auto* f = static_cast<const char*>(from_device.kind == loom::DeviceKind::host ? from : unfence(from));
        for (std::size_t r = 0; r < rows; ++r) std::memmove(t + r * to_pitch, f + r * from_pitch, width);
    }
    void synchronize(loom::Device) override { count("synchronize"); }

    // Counts a call by name (kernels count through fenced_detail::count_call).
    void count(std::string_view name) {
        const std::lock_guard lock(mutex_);
        ++counts_[std::string(name)];
    }

private:

    mutable std::mutex mutex_;
    std::map<std::string, int> counts_;
    loom::BackendScope<loom::DeviceRuntime> runtime_scope_;
    loom::kernels::KernelsScope kernels_scope_;
    FencedDevice* previous_;
};

inline void fenced_detail::count_call(std::string_view kernel) {
    if (FencedDevice* device = current()) device->count(kernel);
}

}  // namespace loom_test
