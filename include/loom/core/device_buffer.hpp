// DeviceBuffer: owning, zero-filled storage on a device chosen at run time
// (Buffer<D> fixes the device at compile time). The host's bytes come from
// Allocator<Host>, a device's from its registered DeviceRuntime. Also the
// whole-tensor copies between places: to_host, copy_tensor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <ostream>
#include <utility>
#include <vector>

#include "loom/core/buffer.hpp"
#include "loom/core/device.hpp"
#include "loom/core/device_runtime.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"

namespace loom {

class DeviceBuffer : public detail::BufferBase {
public:
    DeviceBuffer() = default;

    DeviceBuffer(DType dtype, Shape shape, Device where) : BufferBase(dtype, shape, where) {
        data_ = where.kind == DeviceKind::host ? Allocator<Host>::allocate(bytes_, where)
                                               : device_runtime(where).allocate(bytes_, where);
    }

    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
        DeviceBuffer(std::move(other)).swap(*this);
        return *this;
    }
    ~DeviceBuffer() {
        if (data_ == nullptr) return;
        if (device_.kind == DeviceKind::host) Allocator<Host>::deallocate(data_, bytes_, device_);
        else if (DeviceRuntime* runtime = find_device_runtime(device_.kind)) runtime->deallocate(data_, bytes_, device_);
    }

    void swap(DeviceBuffer& other) noexcept { swap_base(other); }

    friend std::ostream& operator<<(std::ostream& out, const DeviceBuffer& b) {
        return out << "DeviceBuffer(" << b.dtype_ << ", " << b.shape_ << ", " << b.device_ << ')';
    }
};

// Copies the elements of `from` into `to`: same dtype and element count,
// both contiguous, on any two places.
inline void copy_tensor(const Tensor& to, const Tensor& from) {
    LOOM_CHECK(to.dtype() == from.dtype() && to.numel() == from.numel(), "copy_tensor: ", from, " does not fit ", to,
               "; the dtype and the element count must match");
    LOOM_CHECK(to.is_contiguous() && from.is_contiguous(), "copy_tensor: ", from, " -> ", to,
               " needs contiguous tensors");
    copy_bytes(to.raw(), to.device(), from.raw(), from.device(), from.nbytes());
}

// The elements of a contiguous tensor on any device, as host values.
template <class T>
[[nodiscard]] std::vector<T> to_host(const Tensor& t) {
    LOOM_CHECK(t.dtype() == dtype_of<T>, "to_host: ", t, " does not hold ", dtype_of<T>, " elements");
    std::vector<T> out(static_cast<std::size_t>(t.numel()));
    copy_tensor(Tensor::of(out.data(), t.shape()), t);
    return out;
}

// One element of a tensor on any device (a loss, a scale).
template <class T>
[[nodiscard]] T read_scalar(const Tensor& t) {
    LOOM_CHECK(t.numel() >= 1 && t.dtype() == dtype_of<T>, "read_scalar: ", t, " holds no ", dtype_of<T>, " element");
    T value{};
    copy_bytes(&value, host_device, t.raw(), t.device(), sizeof(T));
    return value;
}

// Writes `value` into the first element of a tensor on any device.
template <class T>
void write_scalar(const Tensor& t, T value) {
    LOOM_CHECK(t.numel() >= 1 && t.dtype() == dtype_of<T>, "write_scalar: ", t, " holds no ", dtype_of<T>, " element");
    copy_bytes(t.raw(), t.device(), &value, host_device, sizeof(T));
}

// Every element of the f32 tensor `t` set to `value`, where it lives (a
// device's by its runtime, in the thread's order of work, without a wait).
inline void fill_floats(const Tensor& t, float value) {
    LOOM_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "fill_floats: ", t, " is not contiguous f32");
    if (t.numel() == 0) return;
    if (t.device().kind == DeviceKind::host) std::fill_n(t.data<float>(), t.numel(), value);
    else device_runtime(t.device()).fill_floats(t.data<float>(), t.device(), value, t.numel());
}

}  // namespace loom
