// SGD with momentum on spans of a flat f32 arena: the update of
// torch.optim.SGD (dampening 0), written so a data-parallel or ZeRO rank can
// update just the slice it owns.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "loom/core/buffer.hpp"
#include "loom/core/error.hpp"

namespace loom::optim {

struct SgdConfig {
    float lr = 0.01f;
    float momentum = 0.9f;
    float weight_decay = 0.0f;
    bool nesterov = false;
};

// Throws loom::Error naming the first bad field, its value and the valid range.
inline void check_config(const SgdConfig& config) {
    LOOM_CHECK(std::isfinite(config.lr) && config.lr > 0.0f, "SGD lr = ", config.lr,
               " is invalid; it must be finite and > 0");
    LOOM_CHECK(std::isfinite(config.momentum) && config.momentum >= 0.0f, "SGD momentum = ", config.momentum,
               " is invalid; it must be finite and >= 0");
    LOOM_CHECK(std::isfinite(config.weight_decay) && config.weight_decay >= 0.0f, "SGD weight_decay = ",
               config.weight_decay, " is invalid; it must be finite and >= 0");
    LOOM_CHECK(!config.nesterov || config.momentum > 0.0f,
               "SGD nesterov = true needs momentum > 0, got momentum = ", config.momentum);
}

namespace detail {

// Which momentum update a step performs; fixed for the whole step, so it is a
// template argument and the loop body has no branches.
enum class SgdMomentum { none, first, running };

inline constexpr std::size_t sgd_block = 16;

// `blocks` blocks of 16 elements, in the order of PyTorch's _single_tensor_sgd:
// d = g + wd p (only when wd != 0, as PyTorch skips it); with momentum,
// buf = d at the first step, else momentum buf + d; nesterov: d += momentum buf,
// else d = buf; p += -lr d.
// __restrict: the arrays do not overlap (sgd_step checked). Loops of 16 have
// a constant trip count, which GCC vectorises even at -O2 (its cheap cost
// model refuses unknown counts). noinline on purpose: the tail of an arena
// goes through this same machine code on a zero-padded block, so every element
// gets the same instructions wherever it sits (separately inlined copies may
// contract to FMA differently), and a shard's update equals the whole arena's
// bit for bit.
template <bool kDecay, SgdMomentum kMomentum, bool kNesterov>
[[gnu::noinline]] inline void sgd_blocks(float* __restrict params, const float* __restrict grads,
                                         float* __restrict buffer, std::size_t blocks, float neg_lr,
                                         float weight_decay, float momentum) {
    for (std::size_t base = 0; base < blocks * sgd_block; base += sgd_block) {
        float* __restrict p = params + base;
        const float* __restrict g = grads + base;
        for (std::size_t i = 0; i < sgd_block; ++i) {
            float d = g[i];
            if constexpr (kDecay) d = d + weight_decay * p[i];
            if constexpr (kMomentum != SgdMomentum::none) {
                float& buf = buffer[base + i];
                if constexpr (kMomentum == SgdMomentum::first)
                    buf = d;
                else
                    buf = momentum * buf + d;
                if constexpr (kNesterov)
                    d = d + momentum * buf;
                else
                    d = buf;
            }
            p[i] = p[i] + neg_lr * d;
        }
    }
}

// The whole update, one pass: full blocks in place, then the last n % 16
// elements through the same code on a block padded with zeros.
template <bool kDecay, SgdMomentum kMomentum, bool kNesterov>
inline void sgd_update(float* params, const float* grads, float* buffer, std::size_t n, float neg_lr,
                       float weight_decay, float momentum) {
    constexpr bool kBuffer = kMomentum != SgdMomentum::none;
    const std::size_t blocks = n / sgd_block;
    const std::size_t done = blocks * sgd_block;
    if (blocks > 0)
        sgd_blocks<kDecay, kMomentum, kNesterov>(params, grads, buffer, blocks, neg_lr, weight_decay, momentum);
    const std::size_t rest = n - done;
    if (rest == 0) return;
    alignas(64) float p[sgd_block] = {}, g[sgd_block] = {}, b[sgd_block] = {};
    std::copy_n(params + done, rest, p);
    std::copy_n(grads + done, rest, g);
    if constexpr (kBuffer) std::copy_n(buffer + done, rest, b);
    sgd_blocks<kDecay, kMomentum, kNesterov>(p, g, b, 1, neg_lr, weight_decay, momentum);
    std::copy_n(p, rest, params + done);
    if constexpr (kBuffer) std::copy_n(b, rest, buffer + done);
}

// Whether two arrays share any element; std::less gives a total order on
// pointers into different allocations.
[[nodiscard]] inline bool sgd_overlap(const float* a, std::size_t a_size, const float* b, std::size_t b_size) {
    if (a_size == 0 || b_size == 0) return false;
    const std::less<const float*> before;
    return before(a, b + b_size) && before(b, a + a_size);
}

}  // namespace detail

// One SGD step on a slice: params, grads and momentum_buffer are parallel spans
// of the same length (any contiguous slice of the arenas, so a shard updates
// alone and gets exactly the bits the whole-arena update gives those
// elements). With momentum 0 the buffer is unused and may be empty. `step`
// counts from 1; at step 1 the buffer is overwritten with the first direction,
// as PyTorch creates it, so its previous contents do not matter. params and
// the buffer must not overlap each other or grads.
inline void sgd_step(std::span<float> params, std::span<const float> grads, std::span<float> momentum_buffer,
                     std::int64_t step, const SgdConfig& config) {
    check_config(config);
    LOOM_CHECK(step >= 1, "sgd_step: step = ", step, " is invalid; steps count from 1");
    const bool uses_buffer = config.momentum != 0.0f;
    LOOM_CHECK(grads.size() == params.size(), "sgd_step: params has ", params.size(), " elements and grads ",
               grads.size(), "; they must have the same size");
    LOOM_CHECK(momentum_buffer.size() == params.size() || (!uses_buffer && momentum_buffer.empty()),
               "sgd_step: params has ", params.size(), " elements and momentum_buffer ", momentum_buffer.size(),
               uses_buffer ? "; with momentum they must have the same size"
                           : "; without momentum the buffer must be empty or the same size");
    const std::size_t n = params.size();
    const std::size_t buffer_n = uses_buffer ? n : 0;
    LOOM_CHECK(!detail::sgd_overlap(params.data(), n, grads.data(), n) &&
                   !detail::sgd_overlap(params.data(), n, momentum_buffer.data(), buffer_n) &&
                   !detail::sgd_overlap(momentum_buffer.data(), buffer_n, grads.data(), n),
               "sgd_step: params, grads and momentum_buffer overlap in memory; they must be distinct arrays");

    // Scalars as PyTorch hands them to its f32 kernels: -lr is exact in float.
    const float neg_lr = -config.lr;
    const float weight_decay = config.weight_decay;
    const float momentum = config.momentum;
    float* params_data = params.data();
    const float* grads_data = grads.data();
    float* buffer_data = momentum_buffer.data();
    // Picks the branch-free loop for this step's flags.
    auto run = [&]<bool kDecay, detail::SgdMomentum kMomentum, bool kNesterov>() {
        detail::sgd_update<kDecay, kMomentum, kNesterov>(params_data, grads_data, buffer_data, n, neg_lr,
                                                         weight_decay, momentum);
    };
    auto with_momentum = [&]<bool kDecay>() {
        using enum detail::SgdMomentum;
        if (!uses_buffer)
            run.template operator()<kDecay, none, false>();
        else if (step == 1)
            config.nesterov ? run.template operator()<kDecay, first, true>()
                            : run.template operator()<kDecay, first, false>();
        else
            config.nesterov ? run.template operator()<kDecay, running, true>()
                            : run.template operator()<kDecay, running, false>();
    };
    if (weight_decay != 0.0f)
        with_momentum.template operator()<true>();
    else
        with_momentum.template operator()<false>();
}

// SGD over `n` elements: owns the momentum buffer (none when momentum is 0, as
// PyTorch keeps none) and counts steps. For a ZeRO shard, `n` is the shard's size.
class Sgd {
public:
    Sgd(std::int64_t n, SgdConfig config)
        : config_(checked(config)),
          n_(checked_size(n)),
          buffer_(DType::f32, Shape{config_.momentum != 0.0f ? n : std::int64_t{0}}) {}

    // One step: steps() + 1 is the step number (1 creates the momentum buffer).
    void step(std::span<float> params, std::span<const float> grads) {
        LOOM_CHECK(params.size() == size_t_n() && grads.size() == size_t_n(), "Sgd::step: params has ",
                   params.size(), " elements and grads ", grads.size(), "; this optimizer holds state for ", n_);
        sgd_step(params, grads, buffer(), steps_ + 1, config_);
        ++steps_;  // only after a step that happened, so a refused call changes nothing
    }

    // Deep copies: OptEx's proxy steps run on a copy of the state. Assigning
    // to an optimizer of the same size reuses its memory.
    Sgd(const Sgd& other)
        : config_(other.config_), n_(other.n_), steps_(other.steps_), buffer_(DType::f32, Shape{other.buffer_.numel()}) {
        copy_buffer(other.buffer_, buffer_);
    }
    Sgd& operator=(const Sgd& other) {
        if (this == &other) return *this;
        if (other.n_ != n_) return *this = Sgd(other);  // a new allocation, moved in
        config_ = other.config_;
        n_ = other.n_;
        steps_ = other.steps_;
        copy_buffer(other.buffer_, buffer_);
        return *this;
    }
    Sgd(Sgd&&) noexcept = default;
    Sgd& operator=(Sgd&&) noexcept = default;

    [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
    [[nodiscard]] std::int64_t size() const noexcept { return n_; }
    [[nodiscard]] const SgdConfig& config() const noexcept { return config_; }

    // For learning-rate schedules; the rest of the config is fixed with the state.
    void set_lr(float lr) {
        SgdConfig next = config_;
        next.lr = lr;
        config_ = checked(next);
    }

    // The momentum buffer, for checkpoints (empty when momentum is 0): write it
    // back, then call restore(steps).
    [[nodiscard]] std::span<float> buffer() noexcept {
        return {static_cast<float*>(buffer_.raw()), static_cast<std::size_t>(buffer_.numel())};
    }
    [[nodiscard]] std::span<const float> buffer() const noexcept {
        return {static_cast<const float*>(buffer_.raw()), static_cast<std::size_t>(buffer_.numel())};
    }

    // Sets the step count after the buffer was filled from a checkpoint taken
    // after `steps` steps; the next step() then continues bit for bit.
    void restore(std::int64_t steps) {
        LOOM_CHECK(steps >= 0, "Sgd::restore: steps = ", steps, " is invalid; it must be >= 0");
        steps_ = steps;
    }

private:
    // Checked before anything is allocated.
    static SgdConfig checked(const SgdConfig& config) {
        check_config(config);
        return config;
    }
    static std::int64_t checked_size(std::int64_t n) {
        LOOM_CHECK(n >= 0, "Sgd: n = ", n, " elements is invalid; it must be >= 0");
        return n;
    }
    [[nodiscard]] std::size_t size_t_n() const noexcept { return static_cast<std::size_t>(n_); }
    static void copy_buffer(const Buffer<Host>& from, Buffer<Host>& to) {
        const auto n = static_cast<std::size_t>(from.numel());
        if (n > 0) std::copy_n(static_cast<const float*>(from.raw()), n, static_cast<float*>(to.raw()));
    }

    SgdConfig config_;
    std::int64_t n_ = 0;
    std::int64_t steps_ = 0;
    Buffer<Host> buffer_;
};

}  // namespace loom::optim
