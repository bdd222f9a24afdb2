// DeviceRuntime: memory and copies on a device chosen at run time (a Tensor's
// device()), behind an interface the host core defines and a backend
// implements. The host core never names a CUDA type: the CUDA backend
// (loom/cuda_backend.cuh, compiled by nvcc) registers its runtime when a
// translation unit of the program includes it, and until then a tensor on a
// CUDA device is refused with a message that says how to get the backend.
//
// Layers, contexts and arenas allocate and copy through this interface, so
// one layer type runs on the host or on a device without being a template.
#pragma once

#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "loom/core/device.hpp"
#include "loom/core/error.hpp"

namespace loom {

class DeviceRuntime {
public:
    virtual ~DeviceRuntime() = default;

    // Throws, naming the reason (no driver, no device, index out of range),
    // unless device `index` can run work.
    virtual void check_usable(int index) const = 0;
    // How many devices this process sees (0 where none, or no driver).
    [[nodiscard]] virtual int device_count() const = 0;
    // "NVIDIA H200 (sm_90, 139 GiB)": device `index` for a person to read.
    [[nodiscard]] virtual std::string describe(int index) const = 0;
    // Zero-filled memory on `where`, ordered before any later work of any
    // thread on that device.
    [[nodiscard]] virtual void* allocate(std::size_t bytes, Device where) = 0;
    virtual void deallocate(void* p, std::size_t bytes, Device where) noexcept = 0;
    // Copies `bytes` between two places, at least one of them on this
    // backend's devices, in the calling thread's order of work; returns once
    // any host memory involved may be reused or read.
    virtual void copy(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes) = 0;
    virtual void fill_zero(void* p, Device where, std::size_t bytes) = 0;
    // n floats at p set to `value` (a run of -inf, say), in the same order.
    virtual void fill_floats(float* p, Device where, float value, std::int64_t n) = 0;
    // `rows` rows of `width` bytes, row r from from + r * from_pitch to
    // to + r * to_pitch (a column block of a matrix), as copy() orders it.
    virtual void copy_rows(void* to, std::size_t to_pitch, Device to_device, const void* from, std::size_t from_pitch,
                           Device from_device, std::size_t width, std::size_t rows) = 0;
    // Returns once the work the calling thread ordered on `where` is done
    // (what a host clock around device work must wait for).
    virtual void synchronize(Device where) = 0;
};

namespace detail {

// The implementation of `Interface` installed for each device kind (the
// host's slot stays empty). One per interface across the program: a static
// in a function template is shared by every translation unit.
template <class Interface>
[[nodiscard]] Interface*& backend_slot(DeviceKind kind) {
    static std::array<Interface*, 2> slots{};
    return slots[static_cast<std::size_t>(kind)];
}

}  // namespace detail

// Installs `implementation` of `Interface` (DeviceRuntime, or
// comm::DeviceRankRunner) for `kind`; it must outlive its use. Returns the
// one it replaces, so a scope can put it back; null removes it.
template <class Interface>
Interface* install_backend(DeviceKind kind, Interface* implementation) {
    LOOM_CHECK(kind != DeviceKind::host, "install_backend: the host needs none; its memory and kernels are built in");
    return std::exchange(detail::backend_slot<Interface>(kind), implementation);
}

// Installs an implementation for a scope and restores the previous one
// (tests, and programs that bring a backend instance of their own).
template <class Interface>
class BackendScope {
public:
    BackendScope(DeviceKind kind, Interface* implementation)
        : kind_(kind), previous_(install_backend(kind, implementation)) {}
    BackendScope(const BackendScope&) = delete;
    BackendScope& operator=(const BackendScope&) = delete;
    ~BackendScope() { install_backend(kind_, previous_); }

private:
    DeviceKind kind_;
    Interface* previous_;
};

// The runtime for `kind`, or null when the program was built without it.
[[nodiscard]] inline DeviceRuntime* find_device_runtime(DeviceKind kind) {
    return kind == DeviceKind::host ? nullptr : detail::backend_slot<DeviceRuntime>(kind);
}

// The runtime of a device that is not the host; throws naming how to build
// the backend in when it is missing.
[[nodiscard]] inline DeviceRuntime& device_runtime(Device where) {
    LOOM_CHECK(where.kind != DeviceKind::host, "device_runtime: ", where, " is the host, which has no device runtime");
    DeviceRuntime* runtime = find_device_runtime(where.kind);
    LOOM_CHECK(runtime != nullptr, "memory on ", where, " needs the ", where.kind,
               " backend, which this program was built without: compile one .cu file that includes "
               "loom/cuda_backend.cuh and link loom::cuda");
    return *runtime;
}

// Throws unless `where` can hold tensors and run work now: the host always
// can; a device needs its backend built in and the device present.
inline void check_device_usable(Device where) {
    if (where.kind == DeviceKind::host) return;
    device_runtime(where).check_usable(where.index);
}

// Copies `bytes` from `from` on `from_device` to `to` on `to_device`.
inline void copy_bytes(void* to, Device to_device, const void* from, Device from_device, std::size_t bytes) {
    if (bytes == 0) return;
    if (to_device.kind == DeviceKind::host && from_device.kind == DeviceKind::host) {
        std::memmove(to, from, bytes);
        return;
    }
    device_runtime(to_device.kind != DeviceKind::host ? to_device : from_device)
        .copy(to, to_device, from, from_device, bytes);
}

// `rows` rows of `width` bytes between pitched places (copy_bytes, row by row).
inline void copy_rows(void* to, std::size_t to_pitch, Device to_device, const void* from, std::size_t from_pitch,
                      Device from_device, std::size_t width, std::size_t rows) {
    if (width == 0 || rows == 0) return;
    if (to_device.kind == DeviceKind::host && from_device.kind == DeviceKind::host) {
        for (std::size_t r = 0; r < rows; ++r)
            std::memmove(static_cast<char*>(to) + r * to_pitch, static_cast<const char*>(from) + r * from_pitch, width);
        return;
    }
    device_runtime(to_device.kind != DeviceKind::host ? to_device : from_device)
        .copy_rows(to, to_pitch, to_device, from, from_pitch, from_device, width, rows);
}

// Returns once the calling thread's work on `where` is done (the host's is,
// always).
inline void synchronize_device(Device where) {
    if (where.kind != DeviceKind::host) device_runtime(where).synchronize(where);
}

// Sets `bytes` at `p` on `where` to zero.
inline void fill_zero_bytes(void* p, Device where, std::size_t bytes) {
    if (bytes == 0) return;
    if (where.kind == DeviceKind::host) std::memset(p, 0, bytes);
    else device_runtime(where).fill_zero(p, where, bytes);
}

}  // namespace loom
