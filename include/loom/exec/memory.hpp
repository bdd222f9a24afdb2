// Memory accounting: the bytes one rank holds for training, by what they are
// for, and the ZeRO paper's prediction for the model states (parameters,
// gradients, optimizer state) to check them against. loom trains in f32 with
// AdamW: 4 bytes of parameter, 4 of gradient and 8 of moments per parameter,
// so with Psi parameters on N ranks (REFERENCE.md, ZeRO):
//   data parallel 16 Psi; stage 1 8 Psi + 8 Psi/N; stage 2 4 Psi + 12 Psi/N; stage 3 16 Psi/N.
#pragma once

#include <cstdint>
#include <ostream>

#include "loom/core/error.hpp"
#include "loom/parallel/policy.hpp"

namespace loom {

struct MemoryReport {
    int rank = 0;
    std::int64_t parameters = 0;             // bytes of parameter values this rank keeps
    std::int64_t gradients = 0;              // bytes of gradient accumulators
    std::int64_t optimizer_state = 0;        // bytes of AdamW moments
    std::int64_t activations = 0;            // peak bytes of the micro-batch contexts
    std::int64_t communication_buffers = 0;  // working buffers: gathered parameters, gradient slots
    std::int64_t compression_state = 0;      // GradCompress: error feedback, warm starts

    [[nodiscard]] std::int64_t model_states() const noexcept { return parameters + gradients + optimizer_state; }
    [[nodiscard]] std::int64_t total() const noexcept { return model_states() + activations + communication_buffers + compression_state; }

    friend std::ostream& operator<<(std::ostream& out, const MemoryReport& m) {
        out << "rank " << m.rank << ": parameters " << readable_bytes(m.parameters) << ", gradients "
            << readable_bytes(m.gradients) << ", optimizer state " << readable_bytes(m.optimizer_state)
            << ", activations " << readable_bytes(m.activations) << ", communication buffers "
            << readable_bytes(m.communication_buffers);
        if (m.compression_state > 0) out << ", compression state " << readable_bytes(m.compression_state);
        return out << "; total " << readable_bytes(m.total());
    }
};

// The ZeRO paper's model-state bytes per rank for f32 AdamW training of
// `parameters` parameters on `ranks` ranks at `stage` (0: plain data parallel).
[[nodiscard]] inline double zero_model_state_bytes(int stage, std::int64_t parameters, int ranks) {
    LOOM_CHECK(stage >= 0 && stage <= 3, "zero_model_state_bytes: stage ", stage, " is not 0, 1, 2 or 3");
    LOOM_CHECK(ranks >= 1, "zero_model_state_bytes: ", ranks, " ranks; there must be at least one");
    const double psi = static_cast<double>(parameters), n = ranks;
    switch (stage) {
        case 0: return 16 * psi;
        case 1: return 8 * psi + 8 * psi / n;
        case 2: return 4 * psi + 12 * psi / n;
        default: return 16 * psi / n;
    }
}

}  // namespace loom
