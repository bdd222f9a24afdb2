// The AdamW kernel tests' case (configurations and gradients), shared by the CUDA test
// (tests/cuda/test_kernels_elementwise.cu) and its run on simulated threads
// (tests/simulated/test_elementwise_simulated.cpp). No CUDA here.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "loom/optim/adamw.hpp"

namespace loom_test {

// Two configurations: learning rate 1e-3 with weight decay 0.1, and the same
// with beta2 = 0.95 and the variance frozen after step 2.
inline std::vector<loom::optim::AdamWConfig> adamw_test_configs() {
    loom::optim::AdamWConfig plain;
    plain.lr = 1e-3f;
    plain.weight_decay = 0.1f;
    loom::optim::AdamWConfig frozen = plain;
    frozen.freeze_variance_after = 2;
    frozen.beta2 = 0.95f;
    return {plain, frozen};
}

// Gradients spread over 23 decades (10^-22 to 10): g g (1 - beta2) is
// subnormal or zero at the small end, so the device must keep subnormals as
// the host does. Every 97th is exactly 0.
inline std::vector<float> adamw_gradients(std::size_t n, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> decade(-22.0f, 1.0f);
    std::bernoulli_distribution negative(0.5);
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) {
        const float magnitude = std::pow(10.0f, decade(rng));
        g[i] = i % 97 == 96 ? 0.0f : (negative(rng) ? -magnitude : magnitude);
    }
    return g;
}

}  // namespace loom_test
