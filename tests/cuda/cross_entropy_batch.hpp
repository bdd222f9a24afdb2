// The seeded logits and targets the CUDA cross-entropy tests (whole rows in
// test_kernels_quantize_norm.cu, vocabulary slices in
// test_kernels_signs_vocab.cu) feed both sides. Test code only; include it
// as "cross_entropy_batch.hpp" from a file in tests/cuda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "device_support.hpp"

namespace loom_test {

struct CrossEntropyBatch {
    std::vector<float> logits;  // [rows, classes]
    std::vector<std::int32_t> targets;
};

// Logits ~ N(0, 2), random targets; then targets at given classes (slice
// edges, say), one per row from row 4 on; where the rows exist, a row
// shifted by +100 (e^x would overflow without the max), a confident row
// (the target 15 above the rest) and a row whose target is far below the
// rest.
inline CrossEntropyBatch cross_entropy_batch(std::int64_t rows, std::int64_t classes, std::mt19937& rng,
                                             const std::vector<std::int32_t>& pinned = {}) {
    CrossEntropyBatch batch;
    batch.logits = normal_values(static_cast<std::size_t>(rows * classes), rng, 0.0f, 2.0f);
    std::uniform_int_distribution<std::int32_t> klass(0, static_cast<std::int32_t>(classes - 1));
    batch.targets.resize(static_cast<std::size_t>(rows));
    for (std::int32_t& t : batch.targets) t = klass(rng);
    for (std::size_t k = 0; k < pinned.size() && 4 + static_cast<std::int64_t>(k) < rows; ++k)
        batch.targets[4 + k] = pinned[k];
    if (rows > 1)
        for (std::int64_t j = 0; j < classes; ++j) batch.logits[1 * classes + j] += 100.0f;
    if (rows > 2) batch.logits[2 * classes + batch.targets[2]] += 15.0f;
    if (rows > 3) batch.logits[3 * classes + batch.targets[3]] = -20.0f;
    return batch;
}

}  // namespace loom_test
