// Memory accounting: the bytes one rank holds for training, by what they are
// for. ZeroShard's prediction of the model states to check them against is
// loom::zero_model_state_bytes (parallel/zero_shard.hpp).
#pragma once

#include <cstdint>
#include <ostream>

#include "loom/core/error.hpp"
#include "loom/parallel/policy.hpp"  // readable_bytes

namespace loom {

struct MemoryReport {
    int rank = 0;
    std::int64_t parameters = 0;             // bytes of parameter values this rank keeps
    std::int64_t gradients = 0;              // bytes of gradient accumulators
    std::int64_t optimizer_state = 0;        // bytes of AdamW moments
    std::int64_t activations = 0;            // peak bytes of the micro-batch contexts
    std::int64_t communication_buffers = 0;  // working buffers: gathered parameters, gradient slots
    std::int64_t exchange_state = 0;         // the gradient exchange's own: a compressor's error feedback, warm starts

    [[nodiscard]] std::int64_t model_states() const noexcept { return parameters + gradients + optimizer_state; }
    [[nodiscard]] std::int64_t total() const noexcept { return model_states() + activations + communication_buffers + exchange_state; }

    friend std::ostream& operator<<(std::ostream& out, const MemoryReport& m) {
        out << "rank " << m.rank << ": parameters " << readable_bytes(m.parameters) << ", gradients "
            << readable_bytes(m.gradients) << ", optimizer state " << readable_bytes(m.optimizer_state)
            << ", activations " << readable_bytes(m.activations) << ", communication buffers "
            << readable_bytes(m.communication_buffers);
        if (m.exchange_state > 0) out << ", gradient exchange state " << readable_bytes(m.exchange_state);
        return out << "; total " << readable_bytes(m.total());
    }
};

}  // namespace loom
