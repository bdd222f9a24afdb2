// What Recompute<...> (parallel/recompute.hpp) does at run time on one rank,
// the component the policy installs in the executor (RecomputationComponent,
// a parallel::ProgramComponent): which units it
// recomputes, and for Budget the measurements its choice is made from. It
// lowers the choice into the rank's step program (schedule/recompute.hpp),
// which the executor verifies and interprets; this component decides, so
// the executor holds no recomputation logic.
//
// Full recomputes every unit this rank holds whose layer is worth it
// (nn::Unit::worth_recomputing); Selective the same units, keeping their
// matrix products (nn::Context::product). Budget runs its first step as Full (so that
// step fits too, and the same losses follow: recomputation is exact), measures
// each unit there (its forward's seconds, the bytes its forward and backward
// allocate, its output's bytes), agrees on the measurements with every other
// rank (a max over the axes, so the tensor- and sequence-parallel peers that
// must recompute in lockstep choose alike), and then picks the least seconds
// of recomputation whose activations fit the budget
// (schedule/recompute_solver.hpp); the program is lowered again once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <typeindex>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device_buffer.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/units.hpp"
#include "loom/parallel/program_component.hpp"
#include "loom/parallel/recompute.hpp"
#include "loom/schedule/pipeline_step.hpp"  // StageBounds
#include "loom/schedule/program.hpp"
#include "loom/schedule/recompute.hpp"
#include "loom/schedule/recompute_solver.hpp"

namespace loom::parallel {

class Recomputation {
public:
    Recomputation() = default;
    // For the units of a rank's program: those whose chunk_of_unit is not -1
    // are the ones it runs.
    Recomputation(RecomputeSpec spec, const std::vector<nn::Unit>& units, const std::vector<int>& chunk_of_unit)
        : spec_(spec) {
        for (std::size_t u = 0; u < units.size(); ++u) {
            worth_.push_back(units[u].worth_recomputing);
            held_.push_back(chunk_of_unit.at(u) >= 0);
        }
        measured_.assign(units.size(), Measured{});
    }

    // Budget before its choice: the step running now measures the units.
    [[nodiscard]] bool measuring() const noexcept { return spec_.mode == RecomputeMode::budget && !chosen_; }

    // What a recomputed unit's forward keeps: its input, and its products
    // too under Selective.
    [[nodiscard]] schedule::Keep keep() const noexcept {
        return spec_.mode == RecomputeMode::selective ? schedule::Keep::products : schedule::Keep::input;
    }

    // What Full and Selective recompute, and Budget's measuring step.
    [[nodiscard]] std::vector<bool> full() const {
        std::vector<bool> out(worth_.size());
        for (std::size_t u = 0; u < out.size(); ++u) out[u] = worth_[u] && held_[u];
        return out;
    }

    // Lowers recomputation of the units `which` names into `program` (an
    // earlier lowering undone first); the caller verifies it again.
    void lower_into(schedule::StepProgram& program, const std::vector<bool>& which) const {
        schedule::lower_recompute(program, which, keep());
    }

    // One forward of unit u (kept or dropped): its seconds, the bytes it
    // allocated (all it saved, its output included) and its output's bytes.
    void measured_forward(int u, double seconds, std::int64_t bytes, std::int64_t output_bytes) {
        Measured& m = measured_.at(static_cast<std::size_t>(u));
        m.seconds = std::max(m.seconds, seconds);
        m.forward_bytes = std::max(m.forward_bytes, bytes);
        m.output_bytes = std::max(m.output_bytes, output_bytes);
    }
    // One backward of unit u, or its B half, or (`weight_half`) its W half:
    // the bytes it allocated.
    void measured_backward(int u, std::int64_t bytes, bool weight_half) {
        Measured& m = measured_.at(static_cast<std::size_t>(u));
        std::int64_t& most = weight_half ? m.weight_bytes : m.backward_bytes;
        most = std::max(most, bytes);
    }

    // Budget, after its measuring step: agrees on the measurements over
    // `axes` (collective on each; null entries are skipped) and chooses for
    // the rank's program (how many micro-batches of each chunk it holds at
    // once, from its chunks' stages and the units they hold; whether it
    // splits backwards into B and W, as zero-bubble does). Says what it
    // chose through `notice` (the world's first rank passes one), or that
    // even recomputing every unit does not fit.
    template <comm::Communicator C>
    [[nodiscard]] std::vector<bool> choose(const std::vector<C*>& axes, const schedule::StepProgram& program,
                                           const schedule::StageBounds& stages, const std::vector<int>& chunk_of_unit,
                                           Device device, const std::function<void(const std::string&)>& notice) {
        const std::vector<int> in_flight = micro_batches_in_flight(program, stages, chunk_of_unit);
        const bool split = program.count(schedule::Op::backward_input) > 0;
        const std::size_t n = measured_.size();
        std::vector<float> values(4 * n);
        for (std::size_t u = 0; u < n; ++u) {
            values[u] = static_cast<float>(measured_[u].seconds);
            values[n + u] = static_cast<float>(measured_[u].forward_bytes);
            values[2 * n + u] = static_cast<float>(measured_[u].backward_bytes + measured_[u].weight_bytes);
            values[3 * n + u] = static_cast<float>(measured_[u].output_bytes);
        }
        agree(axes, values, device);
        std::vector<schedule::RecomputeUnit> units(n);
        const auto bytes_of = [&](std::size_t u) {
            return static_cast<std::int64_t>(values[n + u]) + static_cast<std::int64_t>(values[2 * n + u]);
        };
        for (std::size_t u = 0; u < n; ++u) {
            const auto bytes = [&](std::size_t k) { return static_cast<std::int64_t>(values[k * n + u]); };
            schedule::RecomputeUnit& unit = units[u];
            unit.forward_seconds = values[u];
            unit.kept_bytes = held_[u] ? bytes_of(u) : 0;
            unit.output_bytes = held_[u] ? std::min(bytes(3), unit.kept_bytes) : 0;
            // A split backward keeps its context while the unit below runs
            // its B (which reads the gradient left there): count that one too.
            unit.transient_bytes =
                unit.kept_bytes + (split && u > 0 && held_[u - 1] && worth_[u - 1] ? bytes_of(u - 1) : 0);
            unit.copies = std::max(1, in_flight.at(u));
            unit.recomputable = worth_[u] && held_[u];
        }
        choice_ = schedule::solve_recompute(units, spec_.budget_bytes);
        chosen_ = true;
        if (!notice) return choice_.recompute;
        std::ostringstream line;
        line << "Recompute<" << spec_.describe() << ">: ";
        if (choice_.fits) line << "from the first step's measurements, " << choice_;
        else
            line << "this rank's activations need " << readable_bytes(choice_.peak_bytes)
                 << " even with every unit recomputed; recomputing every unit (raise the budget, or shard more: more "
                    "pipeline stages, tensor or sequence parallelism)";
        notice(line.str());
        return choice_.recompute;
    }

    // Budget's choice (empty before it is made, and for Full).
    [[nodiscard]] const schedule::RecomputeChoice& choice() const noexcept { return choice_; }

private:
    struct Measured {
        double seconds = 0;
        std::int64_t forward_bytes = 0, backward_bytes = 0, weight_bytes = 0, output_bytes = 0;
    };

    // By unit: the micro-batches of its chunk the rank holds at once (1 for units held elsewhere).
    [[nodiscard]] static std::vector<int> micro_batches_in_flight(const schedule::StepProgram& program,
                                                                  const schedule::StageBounds& stages,
                                                                  const std::vector<int>& chunk_of_unit) {
        std::vector<int> first_units;
        for (int v = 0; v < stages.stages(); ++v) first_units.push_back(stages.first(v));
        const std::vector<int> open = schedule::micro_batches_in_flight(program, first_units);
        std::vector<int> out(chunk_of_unit.size(), 1);
        for (std::size_t u = 0; u < out.size(); ++u)
            if (chunk_of_unit[u] >= 0) out[u] = open.at(static_cast<std::size_t>(chunk_of_unit[u]));
        return out;
    }

    // The largest of each value over every rank of `axes`, on every rank.
    template <comm::Communicator C>
    static void agree(const std::vector<C*>& axes, std::vector<float>& values, Device device) {
        const Tensor host = Tensor::of(values.data(), {static_cast<std::int64_t>(values.size())});
        DeviceBuffer there;
        Tensor t = host;
        if (device.kind != DeviceKind::host) {
            there = DeviceBuffer(DType::f32, host.shape(), device);
            t = there.tensor();
            copy_tensor(t, host);
        }
        for (C* axis : axes)
            if (axis != nullptr && axis->size() > 1) axis->all_reduce(t, t, comm::ReduceOp::max);
        if (device.kind != DeviceKind::host) copy_tensor(host, t);
    }

    RecomputeSpec spec_{};
    std::vector<bool> worth_, held_;
    std::vector<Measured> measured_;
    bool chosen_ = false;
    schedule::RecomputeChoice choice_{};
};

// Recomputation as the executor holds it: lowered as Full when the executor
// is built (Budget's measuring step too), and, after Budget's measured step,
// lowered again as its choice.
template <comm::Communicator C>
class RecomputationComponent final : public ProgramComponent<C> {
public:
    explicit RecomputationComponent(Recomputation recomputation) : r_(std::move(recomputation)) {}

    void lower(schedule::StepProgram& program) override { r_.lower_into(program, r_.full()); }
    [[nodiscard]] bool measuring() const noexcept override { return r_.measuring(); }
    void forward_measured(int unit, double seconds, std::int64_t bytes, std::int64_t output_bytes) override {
        r_.measured_forward(unit, seconds, bytes, output_bytes);
    }
    void backward_measured(int unit, std::int64_t bytes, bool weight_half) override {
        r_.measured_backward(unit, bytes, weight_half);
    }
    void relower(const RankOfProgram<C>& rank, schedule::StepProgram& program) override {
        if (!r_.measuring()) return;
        r_.lower_into(program, r_.choose<C>(rank.peers, program, *rank.stages, *rank.chunk_of_unit, rank.device,
                                            rank.notice));
    }
    [[nodiscard]] const void* instance() const noexcept override { return &r_; }
    [[nodiscard]] std::type_index type() const noexcept override { return typeid(Recomputation); }

private:
    Recomputation r_;
};

}  // namespace loom::parallel
