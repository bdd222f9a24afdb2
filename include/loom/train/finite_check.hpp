// Stopping a diverged run where it diverges. A NaN or an infinity in the
// loss or a parameter never heals: every later step, and every checkpoint
// saved from it, inherits it, and a run that "succeeds" with `final loss
// nan` would replace the last good checkpoint. So the training loop checks
// the loss each step (and the parameters before each save), and checkpoint
// loading checks every tensor, each stopping with one line that names the
// step or file, the tensor and the first bad element.
//
//   train::check_finite_loss(loss, step);                     // every step
//   train::check_finite(tensor, "blocks.0.mlp.w", "step 12"); // before a save
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::train {

// The first element that is NaN or infinite, and its value as a float.
struct NonFinite {
    std::size_t index = 0;
    float value = 0;
};

namespace detail {

template <class T>
[[nodiscard]] std::optional<NonFinite> first_non_finite_of(const T* data, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
        float x = 0;
        if constexpr (std::is_same_v<T, float>) x = data[i];
        else x = to_float(data[i]);
        if (!std::isfinite(x)) return NonFinite{i, x};
    }
    return std::nullopt;
}

// "nan", "inf" or "-inf" (a NaN's sign means nothing, so it is not shown).
[[nodiscard]] inline std::string non_finite_name(double x) {
    if (std::isnan(x)) return "nan";
    return x < 0 ? "-inf" : "inf";
}

}  // namespace detail

// The first non-finite element of a host, contiguous tensor in element
// order; nullopt if there is none. Integer tensors are always finite.
[[nodiscard]] inline std::optional<NonFinite> first_non_finite(const Tensor& tensor) {
    LOOM_CHECK(tensor.device().kind == DeviceKind::host, "first_non_finite: ", tensor,
               " is not in host memory; copy it to the host first");
    LOOM_CHECK(tensor.is_contiguous(), "first_non_finite: ", tensor, " with strides ", tensor.strides(),
               " is not contiguous");
    const auto count = static_cast<std::size_t>(tensor.numel());
    if (count == 0) return std::nullopt;
    switch (tensor.dtype()) {
        case DType::f32: return detail::first_non_finite_of(static_cast<const float*>(tensor.raw()), count);
        case DType::bf16: return detail::first_non_finite_of(static_cast<const bf16*>(tensor.raw()), count);
        case DType::f16: return detail::first_non_finite_of(static_cast<const f16*>(tensor.raw()), count);
        case DType::i32:
        case DType::i64: return std::nullopt;
    }
    return std::nullopt;
}

// Throws "<context>: tensor <name> holds nan at element 4 of 64; only finite
// values are valid" if the tensor holds a NaN or an infinity. `context` says
// where: "step 12", "checkpoint run.st".
inline void check_finite(const Tensor& tensor, std::string_view name, std::string_view context) {
    const std::optional<NonFinite> bad = first_non_finite(tensor);
    if (!bad) return;
    LOOM_FAIL(context, ": tensor ", name, " holds ", detail::non_finite_name(bad->value), " at element ", bad->index,
              " of ", tensor.numel(), "; only finite values are valid");
}

// Throws "step 12: the loss is nan; the run has diverged (lower the learning
// rate or resume from the last checkpoint, which was not overwritten)".
inline void check_finite_loss(double loss, std::int64_t step) {
    LOOM_CHECK(std::isfinite(loss), "step ", step, ": the loss is ", detail::non_finite_name(loss),
               "; the run has diverged (lower the learning rate, or resume from the last checkpoint, which was not "
               "overwritten)");
}

}  // namespace loom::train
