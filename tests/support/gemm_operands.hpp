// Operands for the GEMM tests: seeded normal values, an element of op(X) read
// through a stride, and the bf16-rounded copy the bf16 products must equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/rng.hpp"
#include "loom/kernels/host/gemm.hpp"

namespace loom_test {

// n normal values of stream `stream` of the generator seeded with `seed`.
inline std::vector<float> normal_values(std::size_t n, std::uint64_t stream, std::uint64_t seed = 11) {
    std::vector<float> v(n);
    loom::RngStream{seed, stream}.fill_normal(v, 0);
    return v;
}

// Element (i, j) of op(X) for X stored row-major with row stride ld.
inline double op_at(const std::vector<float>& x, std::int64_t ld, loom::kernels::host::Trans t, std::int64_t i,
                    std::int64_t j) {
    return t == loom::kernels::host::Trans::no ? x[static_cast<std::size_t>(i * ld + j)]
                                               : x[static_cast<std::size_t>(j * ld + i)];
}

// x with every element rounded to bf16 (and back to f32), same strides.
inline std::vector<float> rounded_to_bf16(std::vector<float> x) {
    for (float& v : x) v = loom::to_float(loom::to_bf16(v));
    return x;
}

}  // namespace loom_test
