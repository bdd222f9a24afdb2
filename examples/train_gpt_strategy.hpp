// The Strategy train_gpt's flags name, as the compile-time type a user would
// write (Strategy<DataParallel<>, Pipeline<OneFOneB>, TensorParallel, ...>),
// picked at run time from every combination the flags allow, with the
// compressors (run-time values) joined to its plan and its name. Included by
// train_gpt.cpp inside its anonymous namespace, after train_gpt_flags.hpp.
#pragma once

// The strategy the flags name, as the compile-time type a user would write:
// Strategy<DataParallel<>[, Pipeline<Schedule>][, TensorParallel | Optimus2D]
//          [, SequenceParallel<RingAttention | Ulysses[, Contiguous]>][, ZeroShard<S>]>.
// Tensor: 0 none, 1 Megatron 1D, 2 Optimus 2D. Sequence: 0 none, then by
// pairs (zigzag, contiguous): 1-2 ring, 3-4 Ulysses, 5-6 UlyssesRing<2>,
// 7-8 UlyssesRing<4>.
template <int Tensor>
using TensorPolicyOf = std::conditional_t<Tensor == 2, loom::Optimus2D, loom::TensorParallel>;
template <int Sequence>
using SequenceAttentionOf = std::conditional_t<
    (Sequence <= 2), loom::RingAttention,
    std::conditional_t<(Sequence <= 4), loom::Ulysses,
                       std::conditional_t<(Sequence <= 6), loom::UlyssesRing<2>, loom::UlyssesRing<4>>>>;
template <int Sequence>
using SequencePolicyOf = loom::SequenceParallel<SequenceAttentionOf<Sequence>,
                                                std::conditional_t<Sequence % 2 == 0, loom::Contiguous, loom::Zigzag>>;

// Policies in order; with_if appends one when a flag asks for it.
template <class... Ps>
struct PolicyList {
    using strategy = loom::Strategy<Ps...>;
    template <class P>
    using with = PolicyList<Ps..., P>;
};
template <class List, bool Add, class P>
using with_if = std::conditional_t<Add, typename List::template with<P>, List>;

template <int Stage, int Tensor, int Sequence, class... Pipeline>
using StrategyOf = typename with_if<
    with_if<with_if<PolicyList<loom::DataParallel<>, Pipeline...>, Tensor != 0, TensorPolicyOf<Tensor>>, Sequence != 0,
            SequencePolicyOf<Sequence>>,
    Stage != 0, loom::ZeroShard<Stage == 0 ? 1 : Stage>>::strategy;

template <int Tensor, int Sequence, class... Pipeline>
std::pair<loom::exec::ExecutionPlan, std::string> plan_for(int zero) {
    const auto of = [](auto strategy) {
        std::ostringstream name;
        name << strategy;
        return std::pair{loom::exec::ExecutionPlan::of<decltype(strategy)>(), name.str()};
    };
    switch (zero) {
        case 1: return of(StrategyOf<1, Tensor, Sequence, Pipeline...>{});
        case 2: return of(StrategyOf<2, Tensor, Sequence, Pipeline...>{});
        case 3: return of(StrategyOf<3, Tensor, Sequence, Pipeline...>{});
        default: return of(StrategyOf<0, Tensor, Sequence, Pipeline...>{});
    }
}

template <int Tensor, int Sequence>
std::pair<loom::exec::ExecutionPlan, std::string> strategy_with(const Flags& flags) {
    if (flags.pp == 1) return plan_for<Tensor, Sequence>(flags.zero);
    switch (flags.schedule) {
        case loom::ScheduleKind::gpipe: return plan_for<Tensor, Sequence, loom::Pipeline<loom::GPipe>>(flags.zero);
        case loom::ScheduleKind::one_f_one_b:
            return plan_for<Tensor, Sequence, loom::Pipeline<loom::OneFOneB>>(flags.zero);
        case loom::ScheduleKind::zero_bubble_h1:
            return plan_for<Tensor, Sequence, loom::Pipeline<loom::ZeroBubbleH1>>(flags.zero);
        case loom::ScheduleKind::zero_bubble_v:
            return plan_for<Tensor, Sequence, loom::Pipeline<loom::ZeroBubbleV>>(flags.zero);
        case loom::ScheduleKind::interleaved:
            switch (flags.chunks_per_rank()) {
                case 3: return plan_for<Tensor, Sequence, loom::Pipeline<loom::Interleaved<3>>>(flags.zero);
                case 4: return plan_for<Tensor, Sequence, loom::Pipeline<loom::Interleaved<4>>>(flags.zero);
                default: return plan_for<Tensor, Sequence, loom::Pipeline<loom::Interleaved<2>>>(flags.zero);
            }
    }
    usage_error("unknown schedule");
}

template <int Tensor>
std::pair<loom::exec::ExecutionPlan, std::string> strategy_with_tensor(const Flags& flags) {
    if (flags.sp == 1) return strategy_with<Tensor, 0>(flags);
    const int attention = flags.sp_hybrid ? (flags.ulysses == 4 ? 7 : 5) : flags.sp_ulysses ? 3 : 1;
    switch (attention + (flags.sp_contiguous ? 1 : 0)) {
        case 2: return strategy_with<Tensor, 2>(flags);
        case 3: return strategy_with<Tensor, 3>(flags);
        case 4: return strategy_with<Tensor, 4>(flags);
        case 5: return strategy_with<Tensor, 5>(flags);
        case 6: return strategy_with<Tensor, 6>(flags);
        case 7: return strategy_with<Tensor, 7>(flags);
        case 8: return strategy_with<Tensor, 8>(flags);
        default: return strategy_with<Tensor, 1>(flags);
    }
}

inline std::pair<loom::exec::ExecutionPlan, std::string> strategy_without_compression(const Flags& flags) {
    if (flags.tp == 1) return strategy_with_tensor<0>(flags);
    return flags.tp_grid ? strategy_with_tensor<2>(flags) : strategy_with_tensor<1>(flags);
}

// The compressors are run-time values (--compress topk:R takes any ratio),
// so they join the plan here, and the name as GradCompress<...> policies at
// the end of the Strategy, as a user would write them.
inline std::pair<loom::exec::ExecutionPlan, std::string> strategy_for(const Flags& flags) {
    auto [plan, name] = strategy_without_compression(flags);
    plan.dp_compression = flags.compress;
    plan.pp_compression = flags.compress_pp;
    plan.tp_compression = flags.compress_tp;
    name.pop_back();  // the Strategy's closing '>'
    if (flags.compress.on()) name += ", GradCompress<" + flags.compress.describe() + ">";
    if (flags.compress_pp.on()) name += ", GradCompress<" + flags.compress_pp.describe() + ", PpAxis>";
    if (flags.compress_tp.on()) name += ", GradCompress<" + flags.compress_tp.describe() + ", TpAxis>";
    return {plan, name + ">"};
}
