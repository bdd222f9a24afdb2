// The Executor's checkpoint state: the whole model's parameters and AdamW
// moments gathered into, or loaded from, the serial (dense, reflection)
// order every rank holds, whatever the strategy cut and placed: tp's cuts put
// back together or cut again, a pipeline's stages summed over the pp axis,
// ZeRO's shards gathered over dp. exec::Executor's out-of-class members, apart
// from the class for the reason exec/executor_instructions.hpp gives. This
// header and exec/executor.hpp include each other, so either can be included
// alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "loom/exec/executor.hpp"

namespace loom::exec {

template <comm::Communicator C>
void Executor<C>::gather_state(std::span<float> values, std::span<float> m, std::span<float> v) {
    if (tp_ == nullptr) {
        gather_local_state(values, m, v);
        return;
    }
    const auto n = static_cast<std::size_t>(shards_.local_size());
    std::vector<float> lv(n), lm(n), lvv(n);
    gather_local_state(lv, lm, lvv);
    shards_.to_whole(*tp_, lv, values, device_);
    shards_.to_whole(*tp_, lm, m, device_);
    shards_.to_whole(*tp_, lvv, v, device_);
}

template <comm::Communicator C>
void Executor<C>::load_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                             std::int64_t optimizer_steps) {
    if (tp_ != nullptr) {
        const auto n = static_cast<std::size_t>(shards_.local_size());
        std::vector<float> lv(n), lm(n), lvv(n);
        shards_.to_local(values, lv);
        shards_.to_local(m, lm);
        shards_.to_local(v, lvv);
        load_local_state(lv, lm, lvv, optimizer_steps);
        return;
    }
    load_local_state(values, m, v, optimizer_steps);
}

template <comm::Communicator C>
void Executor<C>::gather_local_state(std::span<float> values, std::span<float> m, std::span<float> v) {
    if (pipelined_)
        for (auto dense : {values, m, v}) std::fill(dense.begin(), dense.end(), 0.0f);
    gather_held_state(values, m, v);
    if (pipelined_ && pp_ != nullptr)
        for (auto dense : {values, m, v})
            comm::staged_all_reduce(*pp_, Tensor::of(dense.data(), {static_cast<std::int64_t>(dense.size())}),
                                    comm::ReduceOp::sum, device_);
}

template <comm::Communicator C>
void Executor<C>::load_local_state(std::span<const float> values, std::span<const float> m,
                                   std::span<const float> v, std::int64_t optimizer_steps) {
    LOOM_CHECK(optimizer_steps >= 0, "Executor::load_state: optimizer_steps = ", optimizer_steps, " is negative");
    store_.load(rank_.layout, comm_->rank(), values, m, v);
    optimizer_steps_ = optimizer_steps;
}

}  // namespace loom::exec
