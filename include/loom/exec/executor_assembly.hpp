// How an Executor assembles its components from the plan, once, after its
// members are built: the parameter store placed as the plan says (and the
// whole groups bound), the program components lowered into the rank's
// program, the gradient exchange, the stage messages' cast and the layer
// groups the contexts talk to. Each comes from the policy that owns it
// (parallel/plan_exchanges.hpp, parallel/layer_groups.hpp); this file only
// wires them. exec::Executor's out-of-class members, apart from the class for
// the reason exec/executor_instructions.hpp gives.
#pragma once

#include <string>

#include "loom/exec/executor.hpp"

namespace loom::exec {

template <comm::Communicator C>
void Executor<C>::assemble(const ExecutionPlan& plan, const ExecutorOptions& options) {
    optim::check_config(options.adamw);
    if (device_.kind != DeviceKind::host) check_device_usable(device_);  // before anything is allocated there
    pool_.set_device(device_);
    pool_.set_matmul_precision(options.matmul);
    const parallel::Placement placed = plan.placement();
    store_ = ParameterStore(rank_.layout, placed, rank_.program.grad_slots, rank_.program.param_slots, device_,
                            options.optimizer_state);
    for (int g = 0; g < static_cast<int>(rank_.layout.groups().size()); ++g)  // whole ones, bound once here
        bind(g, placed.values_sharded ? nullptr : store_.values.data<float>() + rank_.layout.group(g).offset,
             placed.gradients_sharded ? nullptr : store_.grads.data<float>() + rank_.layout.group(g).offset);
    components_ = parallel::program_components_for<C>(plan, units_, rank_.chunk_of_unit);
    for (auto& component : components_) component->lower(rank_.program);
    lowered();
    notice_ = options.notice;
    // The exchange's notices come from the first rank of each gradient group at tp position 0.
    const bool speaks = comm_->rank() == 0 && (tp_ == nullptr || tp_->rank() == 0);
    exchange_ = parallel::gradient_exchange_for<C>(
        plan, *comm_, rank_.layout, units_, parallel::exchange_setup(options.exchange, speaks ? notice_sink(options.notice) : nullptr,
                                                            options.device), adamw_);
    const parallel::MessageCasts casts = parallel::message_casts(plan);
    stage_cast_ = casts.stage;
    groups_ = parallel::LayerGroups<C>(tp_, sp_, plan, comm_->size(), casts.tensor);
    groups_.attach(pool_);
    // A tensor-parallel strategy that cuts nothing in a unit with weights says so once.
    if (const std::string line = cuts_.warning(); !line.empty() && first_of_world()) notice_sink(options.notice)(line);
}

}  // namespace loom::exec
