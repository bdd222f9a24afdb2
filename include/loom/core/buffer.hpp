// Buffer<D>: owning, aligned, zero-initialised storage on device D, allocated
// through the Allocator<D> customisation point; hands out Tensor views.
#pragma once

#include <cstddef>
#include <cstring>
#include <limits>
#include <new>
#include <ostream>
#include <utility>

#include "loom/core/device.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"
#include "loom/core/tensor.hpp"

namespace loom {

// How device D gets and returns memory. Specialised for Host here and for
// Cuda in buffer_cuda.hpp, so the host core never sees a CUDA type.
//   static void* allocate(std::size_t bytes, Device where);   // zero-filled
//   static void deallocate(void* p, std::size_t bytes, Device where) noexcept;
template <DeviceTag D>
struct Allocator;

template <>
struct Allocator<Host> {
    // Cache-line and AVX-512 aligned, so vector loads never split a line and
    // parameter arena slices that start on a boundary stay aligned.
    static constexpr std::size_t alignment = 64;

    static void* allocate(std::size_t bytes, Device /*where*/) {
        if (bytes == 0) return nullptr;
        const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
        void* p = ::operator new(rounded, std::align_val_t{alignment}, std::nothrow);
        LOOM_CHECK(p != nullptr, "host allocation of ", bytes, " bytes failed: out of memory");
        // Zero-filled so no uninitialised value can ever reach a result; the
        // pages are touched on first use anyway.
        std::memset(p, 0, rounded);
        return p;
    }

    static void deallocate(void* p, std::size_t /*bytes*/, Device /*where*/) noexcept {
        if (p != nullptr) ::operator delete(p, std::align_val_t{alignment});
    }
};

namespace detail {

// What an owning buffer holds and shows, whoever allocated it: Buffer<D>
// (device fixed at compile time) and DeviceBuffer (chosen at run time)
// differ only in how the bytes are obtained and returned.
class BufferBase {
public:
    [[nodiscard]] DType dtype() const noexcept { return dtype_; }
    [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
    [[nodiscard]] Device device() const noexcept { return device_; }
    [[nodiscard]] std::int64_t numel() const noexcept { return shape_.numel(); }
    [[nodiscard]] std::size_t nbytes() const noexcept { return bytes_; }
    [[nodiscard]] void* raw() const noexcept { return data_; }

    // Typed pointer (on a device, a device pointer: never dereference it on the host).
    template <class T>
    [[nodiscard]] T* data() const {
        return tensor().template data<T>();
    }

    // A contiguous view of the whole buffer.
    [[nodiscard]] Tensor tensor() const { return Tensor(data_, dtype_, shape_, device_); }
    // A view of the same bytes under another shape with as many elements.
    [[nodiscard]] Tensor tensor(Shape shape) const { return tensor().reshape(shape); }

protected:
    BufferBase() = default;
    BufferBase(DType dtype, Shape shape, Device where) : dtype_(dtype), shape_(shape), device_(where) {
        // The margin leaves room for the host allocator's rounding up to its alignment.
        const auto numel = static_cast<std::size_t>(shape.numel());
        LOOM_CHECK(numel <= (std::numeric_limits<std::size_t>::max() - 64) / size_of(dtype), "a Buffer of ", shape,
                   " ", dtype, " elements exceeds the address space");
        bytes_ = numel * size_of(dtype);
    }

    void swap_base(BufferBase& other) noexcept {
        std::swap(data_, other.data_);
        std::swap(bytes_, other.bytes_);
        std::swap(dtype_, other.dtype_);
        std::swap(shape_, other.shape_);
        std::swap(device_, other.device_);
    }

    void* data_ = nullptr;
    std::size_t bytes_ = 0;
    DType dtype_ = DType::f32;
    Shape shape_ = Shape{0};  // empty until constructed with a shape (a scalar's [] would count 1)
    Device device_ = host_device;
};

}  // namespace detail

template <DeviceTag D>
class Buffer : public detail::BufferBase {
public:
    Buffer() { device_ = Device{D::kind, 0}; }

    // Zero-filled storage for `shape` elements of `dtype` on `where`.
    Buffer(DType dtype, Shape shape, Device where = Device{D::kind, 0})
        : BufferBase(dtype, shape, checked(where)) {
        data_ = Allocator<D>::allocate(bytes_, device_);
    }

    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    Buffer(Buffer&& other) noexcept : Buffer() { swap(other); }
    Buffer& operator=(Buffer&& other) noexcept {
        Buffer(std::move(other)).swap(*this);
        return *this;
    }
    ~Buffer() { Allocator<D>::deallocate(data_, bytes_, device_); }

    void swap(Buffer& other) noexcept { swap_base(other); }

    friend std::ostream& operator<<(std::ostream& out, const Buffer& b) {
        return out << "Buffer(" << b.dtype_ << ", " << b.shape_ << ", " << b.device_ << ')';
    }

private:
    static Device checked(Device where) {
        LOOM_CHECK(where.kind == D::kind, "a Buffer<", D::kind, "> cannot live on ", where);
        return where;
    }
};

}  // namespace loom
