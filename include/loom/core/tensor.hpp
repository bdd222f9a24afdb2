// Tensor: a non-owning view of typed memory (dtype, shape, strides, device,
// pointer). Views are cheap to copy; Buffer owns the bytes they point into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>
#include <type_traits>

#include "loom/core/device.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/shape.hpp"

namespace loom {

class Tensor {
public:
    Tensor() = default;

    // A contiguous (row-major) view of `shape` at `data`.
    Tensor(void* data, DType dtype, Shape shape, Device device = host_device)
        : Tensor(data, dtype, shape, contiguous_strides(shape), device) {}

    Tensor(void* data, DType dtype, Shape shape, Strides strides, Device device = host_device)
        : data_(data), dtype_(dtype), shape_(shape), strides_(strides), device_(device) {
        LOOM_CHECK(strides.rank() == shape.rank(), "strides ", strides, " have rank ", strides.rank(),
                   " but shape ", shape, " has rank ", shape.rank());
    }

    // A contiguous view of typed memory; the dtype follows from T.
    template <class T>
    static Tensor of(T* data, Shape shape, Device device = host_device) {
        return Tensor(const_cast<std::remove_const_t<T>*>(data), dtype_of<std::remove_const_t<T>>, shape,
                      device);
    }

    [[nodiscard]] DType dtype() const noexcept { return dtype_; }
    [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
    [[nodiscard]] const Strides& strides() const noexcept { return strides_; }
    [[nodiscard]] Device device() const noexcept { return device_; }
    [[nodiscard]] int rank() const noexcept { return shape_.rank(); }
    [[nodiscard]] std::int64_t dim(int i) const { return shape_.dim(i); }
    [[nodiscard]] std::int64_t numel() const noexcept { return shape_.numel(); }
    [[nodiscard]] std::size_t element_size() const noexcept { return size_of(dtype_); }
    [[nodiscard]] bool empty() const noexcept { return numel() == 0; }
    [[nodiscard]] bool defined() const noexcept { return data_ != nullptr || numel() == 0; }

    // Bytes spanned by the elements of a contiguous view.
    [[nodiscard]] std::size_t nbytes() const noexcept {
        return static_cast<std::size_t>(numel()) * element_size();
    }

    // True when the elements are densely packed in row-major order; extents
    // of 1 may carry any stride, as in PyTorch.
    [[nodiscard]] bool is_contiguous() const noexcept {
        if (numel() == 0) return true;
        std::int64_t expected = 1;
        for (int i = rank() - 1; i >= 0; --i) {
            if (shape_[i] != 1 && strides_[i] != expected) return false;
            expected *= shape_[i];
        }
        return true;
    }

    [[nodiscard]] void* raw() const noexcept { return data_; }

    // Typed pointer; the element type must match the tensor's dtype.
    template <class T>
    [[nodiscard]] T* data() const {
        LOOM_CHECK(dtype_of<std::remove_const_t<T>> == dtype_, "tensor ", *this, " holds ", dtype_,
                   " elements, not ", dtype_of<std::remove_const_t<T>>);
        return static_cast<T*>(data_);
    }

    // The elements as a span: host memory and a contiguous layout only.
    template <class T>
    [[nodiscard]] std::span<T> span() const {
        LOOM_CHECK(device_.kind == DeviceKind::host, "tensor ", *this,
                   " is not in host memory; copy it to the host before reading it as a span");
        LOOM_CHECK(is_contiguous(), "tensor ", *this, " with strides ", strides_,
                   " is not contiguous; a span needs contiguous elements");
        return {data<T>(), static_cast<std::size_t>(numel())};
    }

    // The same contiguous elements under another shape with as many elements.
    [[nodiscard]] Tensor reshape(Shape shape) const {
        LOOM_CHECK(shape.numel() == numel(), "cannot reshape ", shape_, " (", numel(), " elements) to ",
                   shape, " (", shape.numel(), " elements)");
        LOOM_CHECK(is_contiguous(), "cannot reshape non-contiguous tensor ", *this, " with strides ",
                   strides_);
        return Tensor(data_, dtype_, shape, device_);
    }

    // Elements [begin, end) along dimension `dim` (negative counts from the back).
    [[nodiscard]] Tensor slice(int dim, std::int64_t begin, std::int64_t end) const {
        const std::int64_t extent = shape_.dim(dim);
        const int at = dim < 0 ? dim + rank() : dim;
        LOOM_CHECK(0 <= begin && begin <= end && end <= extent, "slice [", begin, ", ", end,
                   ") of dimension ", dim, " is out of range for shape ", shape_, "; need 0 <= begin <= end <= ",
                   extent);
        Shape shape = shape_;
        shape[at] = end - begin;
        auto* base = static_cast<std::byte*>(data_);
        void* first = base == nullptr ? nullptr
                                      : base + begin * strides_[at] * static_cast<std::int64_t>(element_size());
        return Tensor(first, dtype_, shape, strides_, device_);
    }

    // Prints "Tensor(f32, [2, 3], host)".
    friend std::ostream& operator<<(std::ostream& out, const Tensor& t) {
        return out << "Tensor(" << t.dtype_ << ", " << t.shape_ << ", " << t.device_ << ')';
    }

private:
    void* data_ = nullptr;
    DType dtype_ = DType::f32;
    Shape shape_{};
    Strides strides_{};
    Device device_ = host_device;
};

// Checks that `t` has shape `expected`; `what` names the tensor in the error.
inline void expect_shape(const Tensor& t, const Shape& expected, std::string_view what) {
    LOOM_CHECK(t.shape() == expected, what, " has shape ", t.shape(), ", expected ", expected);
}

// Checks that two tensors have the same shape and dtype, naming both.
inline void expect_same_layout(const Tensor& a, std::string_view a_name, const Tensor& b,
                               std::string_view b_name) {
    LOOM_CHECK(a.shape() == b.shape(), a_name, " has shape ", a.shape(), " but ", b_name, " has shape ",
               b.shape());
    LOOM_CHECK(a.dtype() == b.dtype(), a_name, " holds ", a.dtype(), " but ", b_name, " holds ", b.dtype());
}

}  // namespace loom
