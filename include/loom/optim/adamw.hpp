// AdamW on spans of a flat f32 arena: the update of torch.optim.AdamW, written
// so a data-parallel or ZeRO rank can update just the slice it owns.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <system_error>

#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/host/adamw.hpp"
#include "loom/kernels/kernel_list.hpp"

namespace loom::optim {

struct AdamWConfig {
    float lr = 3e-4f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.01f;
    // > 0: the second moment stops changing after this many steps and keeps
    // that step's bias correction (1-bit Adam's frozen variance). Gradient
    // compression with error feedback needs it: with v frozen the update is
    // linear in the gradients, so a residual sent late moves the weights as
    // far as it would have on time; Adam's per-step normalisation would
    // shrink a hundred steps' worth, arriving at once, to one step.
    std::int64_t freeze_variance_after = 0;
};

// Throws loom::Error naming the first bad field, its value and the valid range.
inline void check_config(const AdamWConfig& config) {
    LOOM_CHECK(std::isfinite(config.lr) && config.lr > 0.0f, "AdamW lr = ", config.lr,
               " is invalid; it must be finite and > 0");
    LOOM_CHECK(config.beta1 >= 0.0f && config.beta1 < 1.0f, "AdamW beta1 = ", config.beta1,
               " is invalid; it must be in [0, 1)");
    LOOM_CHECK(config.beta2 >= 0.0f && config.beta2 < 1.0f, "AdamW beta2 = ", config.beta2,
               " is invalid; it must be in [0, 1)");
    LOOM_CHECK(std::isfinite(config.eps) && config.eps > 0.0f, "AdamW eps = ", config.eps,
               " is invalid; it must be finite and > 0");
    LOOM_CHECK(config.freeze_variance_after >= 0, "AdamW freeze_variance_after = ", config.freeze_variance_after,
               " is invalid; it must be >= 0 (0: never)");
    LOOM_CHECK(std::isfinite(config.weight_decay) && config.weight_decay >= 0.0f, "AdamW weight_decay = ",
               config.weight_decay, " is invalid; it must be finite and >= 0");
}

namespace detail {

// The decimal a float setting was written as, as a double: the shortest
// decimal that rounds to it (0.999f -> 0.999). PyTorch's settings are Python
// doubles, so 1 - beta2 there is 1 - 0.999, which rounds to 0.001f; from the
// float 0.999f (= 0.99899999797...) it would be 0.0010000020f, 2e-6 off.
// Deriving the per-step scalars from the written decimals makes every one of
// them equal to PyTorch's.
[[nodiscard]] inline double as_written(float value) {
    char text[32];
    const auto printed = std::to_chars(text, text + sizeof text, value);
    double written = value;
    if (printed.ec == std::errc{}) std::from_chars(text, printed.ptr, written);
    return written;
}

// The per-step scalars (kernels/host/adamw.hpp) and the update, which is a
// kernel of the table: the host's, or a device's.
using kernels::host::AdamWScalars;
using kernels::host::adamw_update;

[[nodiscard]] inline AdamWScalars adamw_scalars(const AdamWConfig& config, std::int64_t step) {
    // Bias corrections once per step, in double: std::pow per element would
    // stop the loop from vectorising, and float pow loses digits for beta2^t.
    const double lr = as_written(config.lr);
    const double beta1 = as_written(config.beta1);
    const double beta2 = as_written(config.beta2);
    const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const bool frozen = config.freeze_variance_after > 0 && step > config.freeze_variance_after;
    const double bias_correction2 =
        1.0 - std::pow(beta2, static_cast<double>(frozen ? config.freeze_variance_after : step));
    return AdamWScalars{
        .decay = static_cast<float>(1.0 - lr * as_written(config.weight_decay)),
        .beta1 = config.beta1,
        .one_minus_beta1 = static_cast<float>(1.0 - beta1),
        .beta2 = frozen ? 1.0f : config.beta2,  // v = 1 v + 0 g g: unchanged
        .one_minus_beta2 = frozen ? 0.0f : static_cast<float>(1.0 - beta2),
        .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
        .eps = config.eps,
        .neg_step_size = static_cast<float>(-(lr / bias_correction1)),
    };
}

// Whether two arrays share any element; std::less gives a total order on
// pointers into different allocations.
[[nodiscard]] inline bool overlap(const float* a, std::size_t a_size, const float* b, std::size_t b_size) {
    if (a_size == 0 || b_size == 0) return false;
    const std::less<const float*> before;
    return before(a, b + b_size) && before(b, a + a_size);
}

}  // namespace detail

// One AdamW step on a slice: params, grads, m and v are parallel spans of the
// same length (any contiguous slice of the arenas, so a shard updates alone and
// gets exactly the bits the whole-arena update gives those elements). `step`
// counts from 1 and drives the bias corrections. torch.optim.AdamW semantics
// (amsgrad off, maximize off). params, m and v must not overlap each other or
// grads.
inline void adamw_step(std::span<float> params, std::span<const float> grads, std::span<float> m,
                       std::span<float> v, std::int64_t step, const AdamWConfig& config) {
    check_config(config);
    LOOM_CHECK(step >= 1, "adamw_step: step = ", step, " is invalid; steps count from 1");
    LOOM_CHECK(grads.size() == params.size() && m.size() == params.size() && v.size() == params.size(),
               "adamw_step: params has ", params.size(), " elements, grads ", grads.size(), ", m ", m.size(),
               ", v ", v.size(), "; all four must have the same size");
    const std::size_t n = params.size();
    LOOM_CHECK(!detail::overlap(params.data(), n, grads.data(), n) && !detail::overlap(params.data(), n, m.data(), n) &&
                   !detail::overlap(params.data(), n, v.data(), n) && !detail::overlap(m.data(), n, v.data(), n) &&
                   !detail::overlap(m.data(), n, grads.data(), n) && !detail::overlap(v.data(), n, grads.data(), n),
               "adamw_step: params, grads, m and v overlap in memory; they must be distinct arrays");
    detail::adamw_update(params.data(), grads.data(), m.data(), v.data(), static_cast<std::int64_t>(n),
                         detail::adamw_scalars(config, step));
}

// The same step on tensors wherever they live: params, grads, m and v are
// contiguous f32 of one length on one device. Host tensors take the span
// form above; a device's take its backend's kernel with the same constants
// (adamw_scalars), so the two agree bit for bit where the device rounds as
// the host does (optim/adamw.cuh).
inline void adamw_step(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v, std::int64_t step,
                       const AdamWConfig& config) {
    const Device where = params.device();
    for (const Tensor* t : {&params, &grads, &m, &v}) {
        LOOM_CHECK(t->dtype() == DType::f32 && t->is_contiguous() && t->numel() == params.numel(), "adamw_step: ",
                   *t, " does not match params ", params, "; all four must be contiguous f32 of one length");
        LOOM_CHECK(t->device() == where, "adamw_step: ", *t, " is not on ", where, " with params; move all four to one device");
    }
    const auto n = static_cast<std::size_t>(params.numel());
    if (where.kind == DeviceKind::host) {
        adamw_step(std::span<float>(params.data<float>(), n), std::span<const float>(grads.data<float>(), n),
                   std::span<float>(m.data<float>(), n), std::span<float>(v.data<float>(), n), step, config);
        return;
    }
    check_config(config);
    LOOM_CHECK(step >= 1, "adamw_step: step = ", step, " is invalid; steps count from 1");
    const float *p = params.data<float>(), *g = grads.data<float>(), *pm = m.data<float>(), *pv = v.data<float>();
    LOOM_CHECK(!detail::overlap(p, n, g, n) && !detail::overlap(p, n, pm, n) && !detail::overlap(p, n, pv, n) &&
                   !detail::overlap(pm, n, pv, n) && !detail::overlap(pm, n, g, n) && !detail::overlap(pv, n, g, n),
               "adamw_step: params, grads, m and v overlap in memory; they must be distinct arrays");
    const detail::AdamWScalars scalars = detail::adamw_scalars(config, step);
    kernels::run<kernels::kernel::adamw_update>(where, params.data<float>(), grads.data<float>(), m.data<float>(),
                                                v.data<float>(), params.numel(), scalars);
}

// AdamW over `n` elements: owns m and v (zero-initialised, 64-byte aligned)
// and counts steps. For a ZeRO shard, `n` is the shard's size.
class AdamW {
public:
    AdamW(std::int64_t n, AdamWConfig config)
        : config_(checked(config)), n_(checked_size(n)), m_(DType::f32, Shape{n}), v_(DType::f32, Shape{n}) {}

    // One step: steps() + 1 is the step number the bias corrections use.
    void step(std::span<float> params, std::span<const float> grads) {
        LOOM_CHECK(params.size() == size_t_n() && grads.size() == size_t_n(), "AdamW::step: params has ",
                   params.size(), " elements and grads ", grads.size(), "; this optimizer holds state for ", n_);
        adamw_step(params, grads, m(), v(), steps_ + 1, config_);
        ++steps_;  // only after a step that happened, so a refused call changes nothing
    }

    // Deep copies: OptEx's proxy steps run on a copy of the state. Assigning
    // to an optimizer of the same size reuses its memory.
    AdamW(const AdamW& other)
        : config_(other.config_), n_(other.n_), steps_(other.steps_), m_(DType::f32, Shape{other.m_.numel()}), v_(DType::f32, Shape{other.v_.numel()}) {
        copy_buffer(other.m_, m_);
        copy_buffer(other.v_, v_);
    }
    AdamW& operator=(const AdamW& other) {
        if (this == &other) return *this;
        if (other.n_ != n_) return *this = AdamW(other);  // a new allocation, moved in
        config_ = other.config_;
        n_ = other.n_;
        steps_ = other.steps_;
        copy_buffer(other.m_, m_);
        copy_buffer(other.v_, v_);
        return *this;
    }
    AdamW(AdamW&&) noexcept = default;
    AdamW& operator=(AdamW&&) noexcept = default;

    [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
    [[nodiscard]] std::int64_t size() const noexcept { return n_; }
    [[nodiscard]] const AdamWConfig& config() const noexcept { return config_; }

    // For learning-rate schedules; the rest of the config is fixed with the state.
    void set_lr(float lr) {
        AdamWConfig next = config_;
        next.lr = lr;
        config_ = checked(next);
    }

    // The moments, for checkpoints: write them back, then call restore(steps).
    [[nodiscard]] std::span<float> m() noexcept { return {static_cast<float*>(m_.raw()), size_t_n()}; }
    [[nodiscard]] std::span<float> v() noexcept { return {static_cast<float*>(v_.raw()), size_t_n()}; }
    [[nodiscard]] std::span<const float> m() const noexcept {
        return {static_cast<const float*>(m_.raw()), size_t_n()};
    }
    [[nodiscard]] std::span<const float> v() const noexcept {
        return {static_cast<const float*>(v_.raw()), size_t_n()};
    }

    // Sets the step count after m and v were filled from a checkpoint taken
    // after `steps` steps; the next step() then continues bit for bit.
    void restore(std::int64_t steps) {
        LOOM_CHECK(steps >= 0, "AdamW::restore: steps = ", steps, " is invalid; it must be >= 0");
        steps_ = steps;
    }

private:
    // Checked before anything is allocated.
    static AdamWConfig checked(const AdamWConfig& config) {
        check_config(config);
        return config;
    }
    static std::int64_t checked_size(std::int64_t n) {
        LOOM_CHECK(n >= 0, "AdamW: n = ", n, " elements is invalid; it must be >= 0");
        return n;
    }
    [[nodiscard]] std::size_t size_t_n() const noexcept { return static_cast<std::size_t>(n_); }
    static void copy_buffer(const Buffer<Host>& from, Buffer<Host>& to) {
        const auto n = static_cast<std::size_t>(from.numel());
        if (n > 0) std::copy_n(static_cast<const float*>(from.raw()), n, static_cast<float*>(to.raw()));
    }

    AdamWConfig config_;
    std::int64_t n_ = 0;
    std::int64_t steps_ = 0;
    Buffer<Host> m_;
    Buffer<Host> v_;
};

}  // namespace loom::optim
