// This rank's rows of one step's global batch, split into micro-batches: what
// Executor::step() is given, checked once, and what each micro-batch's first
// forward reads. The rows stay where the caller keeps them (host memory); a
// micro-batch's rows are a view, copied to the device by its context.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::exec {

struct StepBatch {
    Tensor inputs, targets;  // [rows, T] token ids
    std::int64_t rows_per_micro_batch = 0;

    // Takes the step's rows: inputs and targets [rows, T] in host memory,
    // rows a multiple of `micro_batches` (`device`: where they will be copied).
    void take(const Tensor& in, const Tensor& out, int micro_batches, Device device) {
        LOOM_CHECK(in.rank() == 2 && out.shape() == in.shape(), "Executor::step: inputs ", in.shape(), " and targets ",
                   out.shape(), " must both be [rows, T]");
        LOOM_CHECK(in.device().kind == DeviceKind::host && out.device().kind == DeviceKind::host,
                   "Executor::step: the batch is on ", in.device(), " and ", out.device(),
                   "; pass it in host memory (each micro-batch is copied to ", device, ")");
        const std::int64_t rows = in.dim(0);
        LOOM_CHECK(rows % micro_batches == 0, "Executor::step: ", rows, " rows on this rank do not split into ",
                   micro_batches, " micro-batches; the rows per rank must be a multiple of the micro-batches");
        inputs = in;
        targets = out;
        rows_per_micro_batch = rows / micro_batches;
    }

    [[nodiscard]] Tensor inputs_of(int mb) const { return rows_of(inputs, mb); }
    [[nodiscard]] Tensor targets_of(int mb) const { return rows_of(targets, mb); }
    // Tokens of each row (after a sequence split, this rank's positions of it); 0 before the first step.
    [[nodiscard]] std::int64_t tokens_per_sequence() const { return inputs.rank() == 2 ? inputs.dim(1) : 0; }

private:
    [[nodiscard]] Tensor rows_of(const Tensor& t, int mb) const {
        const std::int64_t T = t.dim(1);
        return Tensor(static_cast<std::byte*>(t.raw()) + mb * rows_per_micro_batch * T * size_of(t.dtype()), t.dtype(),
                      Shape{rows_per_micro_batch, T});
    }
};

}  // namespace loom::exec
