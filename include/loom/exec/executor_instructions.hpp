// How the Executor runs its step program, instruction by instruction
// (schedule/instruction.hpp): the layers' forward and backward passes, ZeRO's
// parameter gathers and gradient reductions, the pipeline's sends, receives
// and hand-overs between chunks on one rank, the waits on communication in
// flight, the custom policies, the optimizer step and the loss; computation
// and waits are timed into the trace when tracing is on (how a gradient
// bucket travels is the gradient exchange's, parallel/gradient_exchange.hpp).
// These are exec::Executor's out-of-class members, apart from the
// class so that exec/executor.hpp reads as what an executor holds and offers:
// that header includes this one after the class, and this one includes it
// before its own definitions, so either can be included alone.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "loom/exec/executor.hpp"
#include "loom/exec/stage_messages.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/nn/units.hpp"

namespace loom::exec {

template <comm::Communicator C>
float Executor<C>::run_program(const Tensor& inputs, const Tensor& targets, bool optimizer) {
    if (optimizer) store_.check_moments("Executor::step");
    batch_.take(inputs, targets, micro_batches_, device_);
    groups_.check_micro_batch_rows(batch_.rows_per_micro_batch);
    optim::check_config(adamw_);
    groups_.keep_local_part(batch_.inputs, batch_.targets);
    loss_sum_ = 0;
    pool_.start_step(rank_.stages.stages(), micro_batches_, drops_activations_ ? static_cast<int>(units_.size()) : 0);
    measuring_ = std::any_of(components_.begin(), components_.end(), [](const auto& c) { return c->measuring(); });
    for (std::size_t i = 0; i < rank_.program.code.size(); ++i)
        if (optimizer || rank_.program.code[i].op != schedule::Op::optimizer_step)
            execute(static_cast<int>(i), rank_.program.code[i]);
    ++step_count_;
    if (measuring_) relower_components();
    return loss_;
}

template <comm::Communicator C>
template <class Name, class F>
void Executor<C>::timed(Name&& name_of, const char* category, int mb, F&& f) {
    if (!trace_.enabled()) {
        f();
        return;
    }
    synchronize_device(device_);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    synchronize_device(device_);
    trace_.add(name_of(), category, compute_lane, t0, std::chrono::steady_clock::now(), step_count_, mb);
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <comm::Communicator C>
std::string Executor<C>::describe_comm(const schedule::Instruction& in) const {
    if (in.op == schedule::Op::send)
        return loom::detail::concat("send ", name(in.payload), " c", in.chunk, " mb", in.micro_batch, " to rank ",
                                    in.peer);
    const auto& g = rank_.layout.group(in.group);
    std::string what = in.op == schedule::Op::gather_params ? "all_gather"
                       : in.reduction == schedule::Reduction::all_reduce ? "all_reduce"
                                                                          : "reduce_scatter";
    return what + " g" + std::to_string(in.group) + " (" + readable_bytes(g.padded * 4) + ")";
}

template <comm::Communicator C>
void Executor<C>::execute(int index, const schedule::Instruction& in) {
    using schedule::Op;
    const int r = comm_->rank();
    switch (in.op) {
        case Op::zero_grads:
            timed([] { return std::string("zero gradients"); }, "zero_grads", -1, [&] {
                const DeviceBuffer& g = store_.gradient_array();
                fill_zero_bytes(g.raw(), device_, g.nbytes());
            });
            reduced_.assign(rank_.layout.groups().size(), false);
            return;
        case Op::forward: {
            auto& unit = units_[static_cast<std::size_t>(in.unit)];
            const int v = chunk_of(in), mb = in.micro_batch;
            timed([&] { return "forward " + unit.name; }, "forward", mb, [&] {
                if (in.unit == rank_.stages.first(v)) {
                    nn::Context& ctx = pool_.open(v, mb);
                    // The host's batch goes to the context's device (a copy there, none on the host).
                    ctx.set_targets(ctx.on_device(batch_.targets_of(mb)));
                    activation_ = v == 0 ? ctx.on_device(batch_.inputs_of(mb))
                                         : pool_.inbox(schedule::Payload::activation, v, mb);
                }
                nn::Context& chunk_ctx = pool_.context(v, mb);
                const bool dropped = in.keep != schedule::Keep::all;
                if (dropped) pool_.keep_input(v, mb, in.unit, activation_);
                // A dropped forward runs in a context of its own, returned once its output is copied out;
                // the products it keeps go to the micro-batch's.
                nn::Context& ctx = dropped ? pool_.open_unit(v, mb, in.unit) : chunk_ctx;
                const auto keeping = ctx.keeping_products_in(in.keep == schedule::Keep::products ? &chunk_ctx : nullptr,
                                                             /*replay=*/false);
                // A measuring step times each unit for the components; other steps read no clock here.
                const auto t0 = measuring_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
                const std::size_t before = ctx.bytes_in_use();
                activation_ = unit.forward(ctx, activation_);
                if (measuring_)
                    for (auto& c : components_)
                        c->forward_measured(in.unit, seconds_since(t0), static_cast<std::int64_t>(ctx.bytes_in_use() - before),
                                            static_cast<std::int64_t>(activation_.nbytes() + 63) / 64 * 64);
                if (in.unit + 1 == static_cast<int>(units_.size())) loss_sum_ += ctx.loss();
                if (dropped) {
                    const Tensor output = chunk_ctx.alloc(activation_.shape(), activation_.dtype());
                    copy_tensor(output, activation_);
                    activation_ = output;
                    pool_.close_unit(v, mb, in.unit);
                }
                if (in.unit + 1 == rank_.stages.end(v) && v + 1 < rank_.stages.stages()) hand_on(schedule::Payload::activation, v, v + 1, mb, activation_);
            });
            return;
        }
        case Op::recompute: {
            // The forward again, from the input its first run kept (and
            // replaying the products it kept), into a context that lives
            // until the unit's last backward.
            auto& unit = units_[static_cast<std::size_t>(in.unit)];
            const int v = chunk_of(in), mb = in.micro_batch;
            timed([&] { return "recompute " + unit.name; }, "recompute", mb, [&] {
                nn::Context& ctx = pool_.open_unit(v, mb, in.unit);
                const auto keeping = ctx.keeping_products_in(
                    in.keep == schedule::Keep::products ? &pool_.context(v, mb) : nullptr, /*replay=*/true);
                (void)unit.forward(ctx, pool_.kept_input(v, mb, in.unit));
            });
            return;
        }
        case Op::backward:
        case Op::backward_input:
        case Op::backward_weight: {
            auto& unit = units_[static_cast<std::size_t>(in.unit)];
            const int v = chunk_of(in), mb = in.micro_batch;
            const char* category = in.op == Op::backward ? "backward"
                                   : in.op == Op::backward_input ? "backward_input" : "backward_weight";
            timed([&] { return std::string(category) + " " + unit.name; }, category, mb, [&] {
                // A recomputed unit's saved state is in its own context.
                const bool own = pool_.unit_open(v, mb, in.unit);
                nn::Context& ctx = own ? pool_.unit_context(v, mb, in.unit) : pool_.context(v, mb);
                const std::size_t before = ctx.bytes_in_use();
                if (in.op != Op::backward_weight) {
                    if (in.unit + 1 == static_cast<int>(units_.size())) {
                        // Each micro-batch's mean loss counts 1/M of the step's.
                        seed_ = 1.0f / static_cast<float>(micro_batches_);
                        activation_ = Tensor::of(&seed_, {1});
                    } else if (in.unit + 1 == rank_.stages.end(v)) {
                        activation_ = pool_.inbox(schedule::Payload::gradient, v, mb);
                    }
                    activation_ = unit.backward_input(ctx, activation_);
                    if (own && in.op == Op::backward) {
                        // Out of the unit's context, which goes back below.
                        const Tensor parcel = pool_.gradient_parcel(in.unit, activation_.dtype(), activation_.shape());
                        copy_tensor(parcel, activation_);
                        activation_ = parcel;
                    }
                    if (in.unit == rank_.stages.first(v) && v > 0) hand_on(schedule::Payload::gradient, v, v - 1, mb, activation_);
                }
                if (in.op != Op::backward_input) unit.backward_weight(ctx);
                if (measuring_)
                    for (auto& c : components_)
                        c->backward_measured(in.unit, static_cast<std::int64_t>(ctx.bytes_in_use() - before),
                                             in.op == Op::backward_weight);
                if (own && in.op == Op::backward) pool_.close_unit(v, mb, in.unit);
                if (drops_activations_ && in.op != Op::backward_input)
                    pool_.unit_backward_done(v, mb, in.unit, rank_.stages.first(v), rank_.stages.end(v));
                // The chunk's last use of this micro-batch: its memory goes back to the pool.
                if (in.unit == rank_.stages.first(v) && in.op != Op::backward_input) pool_.close(v, mb);
            });
            return;
        }
        case Op::gather_params: {
            const auto& g = rank_.layout.group(in.group);
            if (in.slot >= 0) {
                DeviceBuffer& slot = store_.param_slots[static_cast<std::size_t>(in.slot)];
                in_flight_.issue(index, comm_->all_gather_async(store_.slice(store_.value_shard, g.shard_offset, g.block),
                                                     store_.slice(slot, 0, g.padded)));
                bind(in.group, slot.data<float>(), nullptr, nn::Bind::values);
            } else {
                in_flight_.issue(index, comm_->all_gather_async(store_.slice(store_.values, rank_.layout.block_offset(in.group, r), g.block),
                                                     store_.slice(store_.values, g.offset, g.padded)));
            }
            return;
        }
        case Op::release_params:
            bind(in.group, nullptr, nullptr, nn::Bind::values);
            return;
        case Op::bind_grads: {
            DeviceBuffer& slot = store_.grad_slots[static_cast<std::size_t>(in.slot)];
            // The group's padded elements: all it writes and reduces (the slot fits the largest group).
            const auto bytes = static_cast<std::size_t>(rank_.layout.group(in.group).padded) * sizeof(float);
            timed([&] { return "zero gradient slot " + std::to_string(in.slot); }, "zero_grads", in.micro_batch,
                  [&] { fill_zero_bytes(slot.raw(), device_, bytes); });
            bind(in.group, nullptr, slot.data<float>(), nn::Bind::grads);
            return;
        }
        case Op::reduce_grads: {
            // Where the bucket's gradient is and where its average goes; the
            // gradient exchange decides how it travels.
            const auto& g = rank_.layout.group(in.group);
            parallel::GradientBucket bucket;
            bucket.group = in.group;
            bucket.all_reduce = in.reduction == schedule::Reduction::all_reduce;
            bool accumulate = false;
            if (bucket.all_reduce) {
                bucket.grad = bucket.out = store_.slice(store_.grads, g.offset, g.padded);
            } else if (in.slot < 0) {
                bucket.grad = store_.slice(store_.grads, g.offset, g.padded);
                bucket.out = store_.slice(store_.grads, rank_.layout.block_offset(in.group, r), g.block);
            } else {
                // The group's first reduction of the step writes the
                // shard; later ones reduce in place and are added when
                // waited for.
                const DeviceBuffer& slot = store_.grad_slots[static_cast<std::size_t>(in.slot)];
                const bool first = !reduced_[static_cast<std::size_t>(in.group)];
                reduced_[static_cast<std::size_t>(in.group)] = true;
                bucket.grad = store_.slice(slot, 0, g.padded);
                bucket.out = first ? store_.slice(store_.grad_shard, g.shard_offset, g.block) : store_.slice(slot, r * g.block, g.block);
                accumulate = !first;
            }
            in_flight_.issue(index, exchange_->reduce_async(bucket, optimizer_arrays()), {}, accumulate);
            return;
        }
        case Op::wait: {
            finish(in.target);
            return;
        }
        case Op::optimizer_step:
            timed([] { return std::string("optimizer step"); }, "optimizer", -1, [&] { optimizer_step(); });
            return;
        case Op::send: send(index, in); return;
        case Op::recv: recv(in); return;
        case Op::policy:
            timed([&] { return rank_.program.policies[static_cast<std::size_t>(in.policy)]; }, "policy", -1,
                  [&] { run_policy(in.policy); });
            return;
        case Op::reduce_loss: {
            // Only the rank holding the loss unit has a loss; the pp sum
            // (of it and zeros) gives it to every stage.
            float loss = loss_sum_ / static_cast<float>(micro_batches_);
            if (device_.kind != DeviceKind::host) {
                // A device communicator sums and averages device memory.
                if (loss_buffer_.raw() == nullptr) loss_buffer_ = store_.floats(1);
                const Tensor t = loss_buffer_.tensor();
                write_scalar(t, loss);
                if (pipelined_ && pp_ != nullptr) pp_->all_reduce(t, t, comm::ReduceOp::sum);
                comm_->all_reduce(t, t, comm::ReduceOp::avg);
                loss_ = read_scalar<float>(loss_buffer_.tensor());
                return;
            }
            const Tensor t = Tensor::of(&loss, {1});
            if (pipelined_ && pp_ != nullptr) pp_->all_reduce(t, t, comm::ReduceOp::sum);
            comm_->all_reduce(t, t, comm::ReduceOp::avg);
            loss_ = loss;
            return;
        }
    }
}

template <comm::Communicator C>
void Executor<C>::hand_on(schedule::Payload payload, int from, int to, int mb, const Tensor& t) {
    if (chunk_held(to)) {
        if (payload == schedule::Payload::activation) {
            pool_.put_inbox(payload, to, mb, t);
        } else {
            const Tensor copy = pool_.inbox_parcel(payload, to, mb, t.dtype(), t.shape());
            copy_tensor(copy, t);
            pool_.put_inbox(payload, to, mb, copy);
        }
    } else {
        pool_.put_outbox(payload, from, mb, t);
    }
}

template <comm::Communicator C>
void Executor<C>::send(int index, const schedule::Instruction& in) {
    auto [header, body] = send_stage_tensor(*pp_, pool_, in, stage_cast_);
    in_flight_.issue(index, std::move(header), std::move(body));
}

template <comm::Communicator C>
void Executor<C>::recv(const schedule::Instruction& in) {
    timed([&] { return describe_recv(in); }, "recv", in.micro_batch, [&] { recv_stage_tensor(*pp_, pool_, in); });
}

template <comm::Communicator C>
void Executor<C>::finish(int target) {
    const auto [flight, t0, t1] = in_flight_.wait(target);
    const auto& in = rank_.program.code.at(static_cast<std::size_t>(target));
    if (trace_.enabled()) {
        const std::string what = describe_comm(in);
        const auto& timing = flight.request.timing();
        // A send is its header, then its body: it ends when the body arrived.
        const auto& last = flight.second.timing().known ? flight.second.timing() : timing;
        const auto start = timing.known ? timing.started : flight.issued;
        const auto end = last.known ? last.finished : t1;
        trace_.add(what, what.substr(0, what.find(' ')).c_str(), communication_lane, start, end, step_count_,
                   in.micro_batch);
        if (t1 - t0 >= std::chrono::microseconds(5))
            trace_.add("wait for " + what, "wait", compute_lane, t0, t1, step_count_, in.micro_batch);
    }
    if (flight.accumulate) {
        const auto& g = rank_.layout.group(in.group);
        const DeviceBuffer& slot = store_.grad_slots[static_cast<std::size_t>(in.slot)];
        kernels::accumulate(store_.slice(store_.grad_shard, g.shard_offset, g.block), store_.slice(slot, comm_->rank() * g.block, g.block),
                            g.block);
    }
}

// Points the Params of layout group g at `values` / `grads`.
template <comm::Communicator C>
void Executor<C>::bind(int g, float* values, float* grads, nn::Bind which) {
    const auto& group = rank_.layout.group(g);
    nn::bind_units(units_, group.first_unit, group.last_unit, values, grads, device_, which);
}

// Op::policy: the adopted policy `index` runs on the step's gradients, as
// this rank's optimizer will read them, over every axis that spreads them.
template <comm::Communicator C>
void Executor<C>::run_policy(int index) {
    adopted_.run(index, optimizer_steps_, [&] {
        return gradient_view<C>(gradient_blocks(updated_elements(), store_), {comm_, pipelined_ ? pp_ : nullptr, tp_});
    });
}

template <comm::Communicator C>
parallel::OptimizerArrays Executor<C>::optimizer_arrays() const {
    return {optimizer_steps_, store_.grads.tensor(), store_.m.tensor()};
}

// Op::optimizer_step: what the gradient exchange does first (one-bit Adam's
// momentum, say), then AdamW on what this rank owns.
template <comm::Communicator C>
void Executor<C>::optimizer_step() {
    const std::int64_t step = ++optimizer_steps_;
    exchange_->before_optimizer_step(optimizer_arrays());
    store_.optimizer_step(rank_.layout, comm_->rank(), step, adamw_);
}

template <comm::Communicator C>
void Executor<C>::lowered() {
    verify(rank_);
    in_flight_.resize(rank_.program.code.size());
    drops_activations_ = rank_.program.count(schedule::Op::recompute) > 0;
}

// The peers that must agree are every axis the rank's program is tied to:
// the gradient axis, the pipeline's and tp's (the world's first rank speaks).
template <comm::Communicator C>
void Executor<C>::relower_components() {
    const parallel::RankOfProgram<C> rank{{comm_, pipelined_ ? pp_ : nullptr, tp_}, &rank_.stages, &rank_.chunk_of_unit,
                                          device_, first_of_world() ? notice_sink(notice_) : nullptr};
    for (auto& component : components_) component->relower(rank, rank_.program);
    lowered();
    pool_.drop_unit_contexts();
}

}  // namespace loom::exec
