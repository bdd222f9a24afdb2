// ProgramComponent: what a policy installs in each rank's executor when its
// lowering into the step program needs run-time state. It lowers itself
// when the executor is built; it may ask for the units to be measured while
// a step runs (each unit's forward seconds and bytes, its backward's bytes);
// and after that step it lowers itself again, agreeing with the peers that
// must run the same program. Recompute<...> is one (parallel/recomputation.hpp:
// Budget measures its first step, then chooses). The executor calls these
// hooks, verifies the program after each lowering and knows no component by
// name; a strategy's components come from program_components_for
// (parallel/plan_exchanges.hpp).
//
// (A policy whose lowering is fixed needs none of this: it lowers itself
// once, exec/adopted_policies.hpp.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <typeindex>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/nn/units.hpp"
#include "loom/schedule/pipeline_step.hpp"  // StageBounds
#include "loom/schedule/program.hpp"

namespace loom::parallel {

// What a component may read when it lowers itself again after a measured step.
template <comm::Communicator C>
struct RankOfProgram {
    // The axes whose ranks must run the same lowering (collectives: every
    // rank of each calls relower together); null entries and axes of one rank
    // count for nothing.
    std::vector<C*> peers;
    const schedule::StageBounds* stages = nullptr;   // units of each virtual stage
    const std::vector<int>* chunk_of_unit = nullptr;  // -1: held by another stage
    Device device = host_device;                      // where a collective's tensors must live
    // Where a one-time line goes; empty on every rank but the world's first.
    std::function<void(const std::string&)> notice{};
};

template <comm::Communicator C>
class ProgramComponent {
public:
    virtual ~ProgramComponent() = default;

    // Lowers itself into `program` (this rank's, verified by the caller after).
    virtual void lower(schedule::StepProgram& program) = 0;

    // Whether the coming step should be measured: the executor reads the clock
    // and the contexts' bytes only then.
    [[nodiscard]] virtual bool measuring() const noexcept { return false; }
    // One forward of `unit` (kept or dropped): its seconds, the bytes it
    // allocated (all it saved, its output included) and its output's bytes.
    virtual void forward_measured(int unit, double seconds, std::int64_t bytes, std::int64_t output_bytes) {
        (void)unit, (void)seconds, (void)bytes, (void)output_bytes;
    }
    // One backward of `unit`, or its B half, or (`weight_half`) its W half: the bytes it allocated.
    virtual void backward_measured(int unit, std::int64_t bytes, bool weight_half) {
        (void)unit, (void)bytes, (void)weight_half;
    }
    // After a measured step: lowers itself again into `program`.
    virtual void relower(const RankOfProgram<C>& rank, schedule::StepProgram& program) { (void)rank, (void)program; }

    // The component itself, for Executor::policy<T>().
    [[nodiscard]] virtual const void* instance() const noexcept = 0;
    [[nodiscard]] virtual std::type_index type() const noexcept = 0;
};

template <comm::Communicator C>
using ProgramComponents = std::vector<std::unique_ptr<ProgramComponent<C>>>;

// This rank's instance of component type T among `components`; null when none is T.
template <class T, comm::Communicator C>
[[nodiscard]] const T* find_component(const ProgramComponents<C>& components) {
    for (const auto& c : components)
        if (c->type() == std::type_index(typeid(T))) return static_cast<const T*>(c->instance());
    return nullptr;
}

}  // namespace loom::parallel
