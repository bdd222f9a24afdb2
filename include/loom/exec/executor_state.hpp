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
#include <string>
#include <vector>

#include "loom/exec/executor.hpp"

namespace loom::exec {

// Collective: the whole model's parameters and AdamW moments in the serial
// (dense, reflection) order, on every rank: what a checkpoint holds.
// Pipelines: every stage fills in its units and a sum over the pp axis (of
// values and zeros, so exact) completes the arrays everywhere. Tensor
// parallelism: each tp rank's cut arrays are put back together whole.
template <comm::Communicator C>
void Executor<C>::gather_state(std::span<float> values, std::span<float> m, std::span<float> v) {
    store_.check_moments("Executor::gather_state");
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

// Sets parameters and moments from the dense arrays every rank holds (a
// checkpoint), keeping what this rank owns; the next step continues the one
// after `optimizer_steps`.
template <comm::Communicator C>
void Executor<C>::load_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                             std::int64_t optimizer_steps) {
    store_.check_moments("Executor::load_state");
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

// This rank's part of a sharded checkpoint (exec/updated_runs.hpp). No communication.
template <comm::Communicator C>
OwnedState Executor<C>::owned_state() const {
    store_.check_moments("Executor::owned_state");
    // On a device each array is read into host memory once.
    std::vector<float> staged[3];
    const auto readable = [&](const DeviceBuffer& b, std::vector<float>& keep) -> const float* {
        if (device_.kind == DeviceKind::host) return b.data<float>();
        keep = to_host<float>(b.tensor());
        return keep.data();
    };
    const parallel::Placement& placed = store_.placement();
    const float* const values_at = readable(placed.values_sharded ? store_.value_shard : store_.values, staged[0]);
    const float* const m_at = readable(store_.m, staged[1]);
    const float* const v_at = readable(store_.v, staged[2]);
    OwnedState out;
    const int r = comm_->rank();
    for_each_updated_run(updated_elements(), [&](int gi, std::int64_t, std::int64_t a, std::int64_t b, bool owner) {
        if (!owner) return;
        const auto& g = rank_.layout.group(gi);
        // Where element k of the group is in each array: whole arrays are
        // padded like the layout, shards hold the rank's block.
        const auto whole_at = [&](const float* base, std::int64_t k) { return base + g.offset + k; };
        const auto shard_at = [&](const float* base, std::int64_t k) { return base + g.shard_offset + (k - r * g.block); };
        const auto n = static_cast<std::size_t>(b - a);
        const float* values = placed.values_sharded ? shard_at(values_at, a) : whole_at(values_at, a);
        const float* m = placed.moments_sharded ? shard_at(m_at, a) : whole_at(m_at, a);
        const float* v = placed.moments_sharded ? shard_at(v_at, a) : whole_at(v_at, a);
        out.values.insert(out.values.end(), values, values + n);
        out.m.insert(out.m.end(), m, m + n);
        out.v.insert(out.v.end(), v, v + n);
        shards_.append_whole_runs(g.dense_offset + a, g.dense_offset + b, out.runs);
    });
    return out;
}

// What a loader must read for this rank alone, in the order load_held_state
// takes it (exec/updated_runs.hpp). No communication.
template <comm::Communicator C>
HeldRuns Executor<C>::held_runs() const {
    HeldRuns out;
    const int r = comm_->rank();
    for (const bool moments : {false, true}) {
        std::vector<std::int64_t>& runs = moments ? out.moments : out.values;
        for (const auto& g : rank_.layout.groups()) {
            const auto [first, end] = store_.kept(g, r, moments);
            shards_.append_whole_runs(g.dense_offset + first, g.dense_offset + end, runs);
        }
    }
    return out;
}

// Sets parameters and moments from the elements held_runs names, in its
// order: the same state as load_state from the whole arrays.
template <comm::Communicator C>
void Executor<C>::load_held_state(std::span<const float> values, std::span<const float> m, std::span<const float> v,
                                  std::int64_t optimizer_steps) {
    store_.check_moments("Executor::load_held_state");
    LOOM_CHECK(optimizer_steps >= 0, "Executor::load_held_state: optimizer_steps = ", optimizer_steps, " is negative");
    store_.load_kept(rank_.layout, comm_->rank(), values, m, v);
    optimizer_steps_ = optimizer_steps;
}

template <comm::Communicator C>
std::string Executor<C>::whole_arrays_refusal() const {
    if (!store_.placement().all_whole()) return loom::detail::concat("the strategy keeps ", store_.placement(), " over dp");
    if (pipelined_) return "the pp axis spreads the model over stages";
    if (tp_ != nullptr) return "the tp axis cuts the model";
    if (sp_ != nullptr) return "the sp axis splits the gradient over ranks";
    return {};
}

template <comm::Communicator C>
void Executor<C>::set_parameters(std::span<const float> values) {
    const std::string refusal = whole_arrays_refusal();
    LOOM_CHECK(refusal.empty(), "Executor::set_parameters needs every array whole on every rank, but ", refusal,
               "; use load_state");
    LOOM_CHECK(static_cast<std::int64_t>(values.size()) == parameter_count(), "Executor::set_parameters: ",
               values.size(), " values for a model of ", parameter_count(), " parameters; give one per parameter");
    store_.load_values(rank_.layout, values);
}

template <comm::Communicator C>
float Executor<C>::gradient(const Tensor& inputs, const Tensor& targets, std::span<float> g) {
    const std::string refusal = whole_arrays_refusal();
    LOOM_CHECK(refusal.empty(), "Executor::gradient needs every array whole on every rank, but ", refusal,
               "; step() runs every strategy");
    LOOM_CHECK(static_cast<std::int64_t>(g.size()) == parameter_count(), "Executor::gradient: room for ", g.size(),
               " gradient elements for a model of ", parameter_count(), " parameters; give one per parameter");
    // The exchange may hand the optimizer step something other than the
    // averaged gradient (a compressor's, momentum mixed in) until its step puts it back.
    const std::string altered = exchange_->not_the_average();
    LOOM_CHECK(altered.empty(), "Executor::gradient: ", altered, "; gradient() needs an exchange that averages");
    const float loss = run_program(inputs, targets, false);
    store_.gradient(rank_.layout, g);
    return loss;
}

// This rank's (tp-cut) state in its local dense order, on every rank of its
// tp position: collective over dp and pp.
template <comm::Communicator C>
void Executor<C>::gather_local_state(std::span<float> values, std::span<float> m, std::span<float> v) {
    if (pipelined_)
        for (auto dense : {values, m, v}) std::fill(dense.begin(), dense.end(), 0.0f);
    store_.gather(rank_.layout, *comm_, values, m, v);  // this rank's units' state, collective over dp
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

namespace loom::exec {

// What this rank holds for training, by purpose (exec/memory.hpp).
template <comm::Communicator C>
MemoryReport Executor<C>::memory_report() const {
    MemoryReport report;
    report.rank = comm_->rank();
    report.parameters = store_.parameter_bytes();
    report.gradients = store_.gradient_bytes();
    report.optimizer_state = store_.optimizer_bytes();
    report.exchange_state = exchange_->state_bytes();
    report.communication_buffers = exchange_->buffer_bytes() + pool_.parcel_bytes() + store_.slot_bytes();
    report.activations = pool_.activation_bytes();
    return report;
}

}  // namespace loom::exec

namespace loom {

// What one rank holds for training, by purpose (see exec/memory.hpp).
template <comm::Communicator C>
[[nodiscard]] MemoryReport memory_report(const exec::Executor<C>& executor) {
    return executor.memory_report();
}

}  // namespace loom
