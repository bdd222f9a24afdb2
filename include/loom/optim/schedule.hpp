// Learning-rate schedules: linear warmup then cosine decay, the GPT recipe.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "loom/core/error.hpp"

namespace loom::optim {

// The learning rate for optimizer step `step` (counted from 1, like
// AdamW::steps() + 1) of a `total`-step run: steps 1..warmup rise linearly to
// `peak` (step s gets peak * s / warmup, so the first step is never 0); then
// the rate follows half a cosine from peak down to floor_fraction * peak at
// step `total`, and stays there for steps past `total`. floor_fraction must be
// in (0, 1], not 0: the result goes to set_lr, which refuses a rate of 0.
[[nodiscard]] inline float cosine_lr(std::int64_t step, std::int64_t total, float peak, std::int64_t warmup,
                                     float floor_fraction = 0.1f) {
    LOOM_CHECK(step >= 1, "cosine_lr: step = ", step, " is invalid; steps count from 1");
    LOOM_CHECK(total >= 1, "cosine_lr: total = ", total, " steps is invalid; it must be >= 1");
    LOOM_CHECK(warmup >= 0 && warmup <= total, "cosine_lr: warmup = ", warmup, " steps is invalid; it must be in [0, ",
               total, "] (total)");
    LOOM_CHECK(std::isfinite(peak) && peak > 0.0f, "cosine_lr: peak = ", peak,
               " is invalid; it must be finite and > 0");
    LOOM_CHECK(floor_fraction > 0.0f && floor_fraction <= 1.0f, "cosine_lr: floor_fraction = ", floor_fraction,
               " is invalid; it must be in (0, 1]");
    const double top = peak;
    if (step <= warmup) return static_cast<float>(top * static_cast<double>(step) / static_cast<double>(warmup));
    const double bottom = top * floor_fraction;
    if (step >= total) return static_cast<float>(bottom);
    // Fraction of the decay done, in (0, 1): warmup < step < total here.
    const double progress = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    return static_cast<float>(bottom + (top - bottom) * cosine);
}

}  // namespace loom::optim
