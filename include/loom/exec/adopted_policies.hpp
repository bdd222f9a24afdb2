// The policies a strategy brings from outside loom (PolicyKind::custom), as
// one rank's executor holds them: each lowered itself into the rank's step
// program as Op::policy instructions, and its instance (the policy type's
// run-time state) runs at each of them with the step's gradients
// (exec/policy_component.hpp). The executor interprets Op::policy by index
// and knows no policy by name.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/error.hpp"
#include "loom/exec/policy_component.hpp"
#include "loom/exec/rank_program.hpp"
#include "loom/parallel/gradient_exchange.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/schedule/program.hpp"

namespace loom::exec {

template <comm::Communicator C>
class AdoptedPolicies {
public:
    // What adopting one policy takes: its printed name, how it lowers itself
    // into a program (given its index among the program's policies), its
    // instance and its type.
    struct Adoption {
        std::string name;
        void (*lower)(schedule::StepProgram&, int) = nullptr;
        std::unique_ptr<PolicyComponent<C>> component;
        std::type_index type = typeid(void);
    };

    // Calls adopt(Adoption) for each policy of kind custom in Strategy, in order.
    template <class Strategy, class Adopt>
    static void for_each_custom(Adopt&& adopt) {
        Strategy::for_each_policy([&]<class P>(std::type_identity<P>) {
            if constexpr (Policy<P>) {
                if constexpr (P::kind == PolicyKind::custom) {
                    static_assert(ComponentPolicy<P, C>,
                                  "loom::Executor: a policy of kind custom needs a default constructor and "
                                  "`template <class View> void run(View& gradients)` (exec/policy_component.hpp)");
                    adopt(Adoption{describe<P>(), [](schedule::StepProgram& program, int self) { P::lower(program, self); },
                                   std::make_unique<PolicyComponentOf<P, C>>(), typeid(P)});
                }
            }
        });
    }

    // Adopts each policy of kind custom in Strategy, in order: it lowers
    // itself into `rank`'s program, which is verified again, and its instance
    // is kept to run the Op::policy instructions it put there. A policy reads
    // host memory, and what `exchange` leaves in the gradients.
    template <class Strategy>
    void adopt_all(RankProgram& rank, Device device, const parallel::GradientExchange<C>& exchange) {
        for_each_custom<Strategy>([&](Adoption adopted) {
            LOOM_CHECK(device.kind == DeviceKind::host, "Executor: policy ", adopted.name, " runs on gradients in ",
                       "host memory; the executor's device is ", device, "; run it on the host");
            exchange.check_readable_by(adopted.name);
            rank.program.policies.push_back(adopted.name);
            adopted.lower(rank.program, static_cast<int>(components_.size()));
            verify(rank);
            components_.push_back(std::move(adopted.component));
            types_.push_back(adopted.type);
        });
    }

    // This rank's instance of policy type P; null when the strategy has none.
    template <class P>
    [[nodiscard]] const P* find() const {
        for (std::size_t i = 0; i < components_.size(); ++i)
            if (types_[i] == std::type_index(typeid(P))) return static_cast<const P*>(components_[i]->policy());
        return nullptr;
    }

    // Runs policy `index` on the step's gradients. `view_of()` makes the view
    // the first time (the blocks stay where the store keeps them); later steps
    // only update the optimizer's step count.
    template <class ViewOf>
    void run(int index, std::int64_t optimizer_steps, ViewOf&& view_of) {
        if (!viewed_) {
            view_ = view_of();
            viewed_ = true;
        }
        view_.optimizer_steps = optimizer_steps;
        components_.at(static_cast<std::size_t>(index))->run(view_);
    }

private:
    std::vector<std::unique_ptr<PolicyComponent<C>>> components_;
    std::vector<std::type_index> types_;
    GradientView<C> view_;
    bool viewed_ = false;
};

}  // namespace loom::exec
