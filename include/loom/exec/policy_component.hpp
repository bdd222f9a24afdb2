// What a policy outside loom's own kinds runs with: its component. A policy
// (parallel/policy.hpp, PolicyKind::custom) lowers itself into each rank's
// step program as Op::policy instructions; the executor keeps one instance of
// the policy type per rank (its run-time state: whatever members it has) and,
// at each of its instructions, calls its run() with a GradientView: the
// step's reduced gradients as this rank's optimizer will read them, and the
// axes they are spread over. The executor knows no policy by name; it only
// interprets the instruction.
//
//   struct MyPolicy {
//       static constexpr loom::PolicyKind kind = loom::PolicyKind::custom;
//       static void describe(std::ostream& out) { out << "MyPolicy"; }
//       static void lower(loom::schedule::StepProgram& p, int self) {
//           p.insert_before(loom::schedule::Op::optimizer_step, {.op = loom::schedule::Op::policy, .policy = self});
//       }
//       template <class View> void run(View& gradients) { ... }
//   };
//
// examples/custom_policy.cpp is one in full (global gradient-norm clipping).
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/parallel/policy.hpp"

namespace loom::exec {

// A run of gradient elements this rank's optimizer step updates, in host memory.
struct GradientBlock {
    std::span<float> values;
    // Whether this rank counts these elements in a sum over GradientView::axes.
    // Every element of the model's gradient has exactly one owner in the
    // world; the other ranks that hold it (dp replicas without ZeRO, tp ranks
    // with a copy of a Param the cut left whole) hold the same values.
    bool owner = true;
};

template <comm::Communicator C>
struct GradientView {
    std::vector<GradientBlock> blocks;
    // The axes over which the owners' blocks together make up the model's
    // whole gradient (those of more than one rank): a value summed over them
    // is the same on every rank.
    std::vector<C*> axes;
    std::int64_t optimizer_steps = 0;  // taken before this step's

    // sum(x) over every axis: the whole world's total of each rank's part.
    [[nodiscard]] float sum_over_axes(float x) const {
        for (C* axis : axes) {
            const Tensor t = Tensor::of(&x, {1});
            axis->all_reduce(t, t, comm::ReduceOp::sum);
        }
        return x;
    }

    // The sum of squares of the gradient elements this rank owns, in double.
    [[nodiscard]] double owned_squared_norm() const {
        double sum = 0;
        for (const GradientBlock& b : blocks)
            if (b.owner)
                for (float g : b.values) sum += static_cast<double>(g) * g;
        return sum;
    }

    // Every element this rank holds (owned or a copy) times `factor`.
    void scale(float factor) const {
        for (const GradientBlock& b : blocks)
            for (float& g : b.values) g *= factor;
    }
};

// The view of `blocks` spread over `axes` (null entries and axes of one rank left out).
template <comm::Communicator C>
[[nodiscard]] GradientView<C> gradient_view(std::vector<GradientBlock> blocks, std::initializer_list<C*> axes) {
    GradientView<C> view{std::move(blocks), {}, 0};
    for (C* axis : axes)
        if (axis != nullptr && axis->size() > 1) view.axes.push_back(axis);
    return view;
}

// The executor's handle on a policy instance (type-erased over the policy).
template <comm::Communicator C>
class PolicyComponent {
public:
    virtual ~PolicyComponent() = default;
    virtual void run(GradientView<C>& gradients) = 0;
    [[nodiscard]] virtual const void* policy() const noexcept = 0;  // the instance, for Executor::policy<P>()
};

template <class P, comm::Communicator C>
class PolicyComponentOf final : public PolicyComponent<C> {
public:
    void run(GradientView<C>& gradients) override { policy_.run(gradients); }
    [[nodiscard]] const void* policy() const noexcept override { return &policy_; }

private:
    P policy_{};
};

// A policy that lowers itself and runs as a component, checked with one
// sentence rather than a page of failed constraints.
template <class P, class C>
concept ComponentPolicy = LowersItself<P> && std::default_initializable<P> && requires(P p, GradientView<C>& view) {
    p.run(view);
};

}  // namespace loom::exec
