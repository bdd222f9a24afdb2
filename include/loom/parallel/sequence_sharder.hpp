// The sequence sharder: under SequenceParallel, every rank of an sp group is
// given its data-parallel replica's whole sequences, and trains on its own
// positions of each (nn/sequence_layout.hpp). The sharder copies those
// positions out of a [rows, T] batch of token ids, in the layout's order,
// into storage it keeps, so a step allocates nothing once the size is known.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/nn/sequence_layout.hpp"

namespace loom::parallel {

class SequenceSharder {
public:
    // `inputs` and `targets` ([rows, T] i32 in host memory) become this
    // rank's positions of every sequence, [rows, local tokens]; they point
    // into the sharder, valid until its next call.
    void keep_local_positions(const nn::SequenceLayout& layout, Tensor& inputs, Tensor& targets) {
        const std::int64_t rows = inputs.dim(0), T = inputs.dim(1);
        const std::int64_t local = layout.local_tokens(T);
        local_inputs_.resize(static_cast<std::size_t>(rows * local));
        local_targets_.resize(local_inputs_.size());
        const auto runs = layout.runs(T);
        for (std::int64_t r = 0; r < rows; ++r)
            for (const nn::SequenceRun& run : runs)
                for (std::int64_t t = 0; t < run.length; ++t) {
                    const auto at = static_cast<std::size_t>(r * local + run.local + t);
                    local_inputs_[at] = inputs.data<std::int32_t>()[r * T + run.position + t];
                    local_targets_[at] = targets.data<std::int32_t>()[r * T + run.position + t];
                }
        inputs = Tensor::of(local_inputs_.data(), {rows, local});
        targets = Tensor::of(local_targets_.data(), {rows, local});
    }

private:
    std::vector<std::int32_t> local_inputs_, local_targets_;
};

}  // namespace loom::parallel
