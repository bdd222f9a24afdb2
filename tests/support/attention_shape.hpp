// The shape of a causal attention problem, B sequences of T tokens, H heads
// of size D, with the sizes of the kernels' tensors, as the host and the
// CUDA attention tests (tests/kernels/test_attention.cpp,
// tests/cuda/test_kernels_attention.cu) both describe it. CUDA-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom_test {

struct AttentionShape {
    std::int64_t B, T, H, D;
    [[nodiscard]] std::int64_t C() const { return H * D; }
    [[nodiscard]] std::size_t qkv_size() const { return static_cast<std::size_t>(B * T * 3 * C()); }
    [[nodiscard]] std::size_t out_size() const { return static_cast<std::size_t>(B * T * C()); }
    [[nodiscard]] std::size_t lse_size() const { return static_cast<std::size_t>(B * H * T); }
};

// "B=2 T=70 H=3 D=16", for INFO.
inline std::string describe(const AttentionShape& s) {
    return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
           " D=" + std::to_string(s.D);
}

}  // namespace loom_test
