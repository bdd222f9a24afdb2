// The shape of a causal attention problem, B sequences of T tokens, H heads
// of size D, with the sizes of the kernels' tensors, as the host and the
// CUDA attention tests (tests/kernels/test_attention.cpp,
// tests/cuda/test_kernels_attention.cu) both describe it. CUDA-free.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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

// Columns [part * C, (part + 1) * C) of every row of a [B, T, 3C] tensor
// (qkv or dqkv): part 0 is q, 1 is k, 2 is v.
inline std::vector<float> qkv_part(const std::vector<float>& rows, const AttentionShape& s, std::int64_t part) {
    std::vector<float> values;
    values.reserve(s.out_size());
    for (std::int64_t row = 0; row < s.B * s.T; ++row)
        for (std::int64_t c = 0; c < s.C(); ++c)
            values.push_back(rows[static_cast<std::size_t>(row * 3 * s.C() + part * s.C() + c)]);
    return values;
}

// max |x| over the values (0 for none).
inline double largest_magnitude(const std::vector<float>& values) {
    double m = 0.0;
    for (float v : values) m = std::max(m, std::fabs(static_cast<double>(v)));
    return m;
}

}  // namespace loom_test
