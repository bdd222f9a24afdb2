// Strategy<Policies...>: the compile-time set of policies a model trains with,
// and its value, Strategy<...>::spec (parallel/strategy_spec.hpp).
// Mistakes are caught here, as sentences: something that is not a policy, the
// same kind of policy twice (two bucket sizes, two ZeRO stages). Degrees (how
// many ranks on each axis) are not part of the type: they come from the mesh
// at run time, so one binary serves every cluster size.
//
//   using S = loom::Strategy<loom::DataParallel<>, loom::ZeroShard<2>>;
//   std::cout << S{};   // Strategy<DataParallel<bucket 2 MiB>, ZeroShard<2>>
//   using P = loom::Strategy<loom::DataParallel<>, loom::Pipeline<loom::ZeroBubbleH1>, loom::ZeroShard<3>>;  // ZeroPP
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

#include "loom/parallel/data_parallel.hpp"
#include "loom/parallel/grad_compress.hpp"
#include "loom/parallel/pipeline.hpp"
#include "loom/parallel/policy.hpp"
#include "loom/parallel/recompute.hpp"
#include "loom/parallel/sequence_parallel.hpp"
#include "loom/parallel/strategy_rules.hpp"
#include "loom/parallel/strategy_spec.hpp"
#include "loom/parallel/zero_shard.hpp"

namespace loom {

namespace detail {

// A non-policy counts as no kind, so that only check_is_policy's sentence
// reports it.
template <class P>
constexpr bool is_of_kind(PolicyKind k) {
    if constexpr (Policy<P>) return P::kind == k;
    else return false;
}

// GradCompress policies on one axis (any other policy counts as none).
template <class P>
constexpr bool compresses(CompressedAxis axis) {
    if constexpr (is_of_kind<P>(PolicyKind::compression)) return P::axis == axis;
    else return false;
}
template <CompressedAxis A, class... Ps>
inline constexpr int compressors_on = (0 + ... + (compresses<Ps>(A) ? 1 : 0));

template <CompressedAxis A, class... Ps>
constexpr Compression compression_on() {
    Compression c{};
    (
        [&] {
            if constexpr (compresses<Ps>(A)) c = Ps::compression;
        }(),
        ...);
    return c;
}

template <PolicyKind K, class... Ps>
inline constexpr int count_of_kind = (0 + ... + (is_of_kind<Ps>(K) ? 1 : 0));

template <PolicyKind K, class Fallback, class... Ps>
struct first_of_kind {
    using type = Fallback;
};
template <PolicyKind K, class Fallback, class P, class... Rest>
struct first_of_kind<K, Fallback, P, Rest...> {
    using type = std::conditional_t<is_of_kind<P>(K), P, typename first_of_kind<K, Fallback, Rest...>::type>;
};

// Checked one by one so the compiler stops at the first non-policy with this
// sentence rather than a page of failed constraints.
template <class P>
constexpr bool check_is_policy() {
    static_assert(Policy<P>,
                  "loom::Strategy<...>: every argument must be a policy such as DataParallel<>, ZeroShard<1|2|3>; "
                  "this one has no `kind` and `describe`");
    if constexpr (Policy<P>)
        static_assert(P::kind != PolicyKind::custom || LowersItself<P>,
                      "loom::Strategy<...>: a policy of kind custom must lower itself: give it "
                      "`static void lower(loom::schedule::StepProgram&, int self)` (exec/policy_component.hpp)");
    return Policy<P>;
}

}  // namespace detail

template <class... Ps>
struct Strategy {
    static_assert((detail::check_is_policy<Ps>() && ...));
    static_assert(detail::count_of_kind<PolicyKind::data_parallel, Ps...> <= 1, LOOM_RULE_ONE_DATA_PARALLEL);
    static_assert(detail::count_of_kind<PolicyKind::zero_shard, Ps...> <= 1, LOOM_RULE_ONE_ZERO_STAGE);
    static_assert(detail::count_of_kind<PolicyKind::tensor_parallel, Ps...> <= 1, LOOM_RULE_ONE_TENSOR_POLICY);
    static_assert(detail::count_of_kind<PolicyKind::sequence_parallel, Ps...> <= 1, LOOM_RULE_ONE_SEQUENCE_POLICY);
    static_assert(detail::count_of_kind<PolicyKind::pipeline, Ps...> <= 1, LOOM_RULE_ONE_PIPELINE);
    static_assert(detail::count_of_kind<PolicyKind::recompute, Ps...> <= 1, LOOM_RULE_ONE_RECOMPUTE);
    static_assert(detail::compressors_on<CompressedAxis::dp, Ps...> <= 1 &&
                      detail::compressors_on<CompressedAxis::pp, Ps...> <= 1 &&
                      detail::compressors_on<CompressedAxis::tp, Ps...> <= 1, LOOM_RULE_ONE_COMPRESSOR_PER_AXIS);

    // ZeroShard alone implies data parallelism with the default bucket.
    using data_parallel_policy = typename detail::first_of_kind<PolicyKind::data_parallel, DataParallel<>, Ps...>::type;
    using zero_policy = typename detail::first_of_kind<PolicyKind::zero_shard, void, Ps...>::type;

    static constexpr bool data_parallel = detail::count_of_kind<PolicyKind::data_parallel, Ps...> +
                                              detail::count_of_kind<PolicyKind::zero_shard, Ps...> > 0;
    static constexpr int zero_stage = [] {
        if constexpr (std::is_void_v<zero_policy>) return 0;
        else return zero_policy::stage;
    }();
    static constexpr std::int64_t bucket_bytes = data_parallel_policy::bucket_bytes;

    static constexpr bool tensor_parallel = detail::count_of_kind<PolicyKind::tensor_parallel, Ps...> > 0;
    // Optimus2D: the tp axis is a q x q grid.
    using tensor_policy = typename detail::first_of_kind<PolicyKind::tensor_parallel, void, Ps...>::type;
    static constexpr bool tensor_grid = [] {
        if constexpr (std::is_void_v<tensor_policy>) return false;
        else return requires { tensor_policy::grid; } && tensor_policy::grid;
    }();

    // SequenceParallel<Attention, Layout>: every sequence split over the sp axis.
    using sequence_policy = typename detail::first_of_kind<PolicyKind::sequence_parallel, void, Ps...>::type;
    static constexpr bool sequence_parallel = !std::is_void_v<sequence_policy>;
    static constexpr nn::SequenceAttention sequence_attention = [] {
        if constexpr (sequence_parallel) return sequence_policy::attention;
        else return nn::SequenceAttention::ring;
    }();
    static constexpr bool sequence_zigzag = [] {
        if constexpr (sequence_parallel) return sequence_policy::zigzag;
        else return true;
    }();
    static constexpr int sequence_ulysses = [] {
        if constexpr (sequence_parallel) return sequence_policy::ulysses;
        else return 1;
    }();

    // Pipeline<S>: the schedule and its chunks per rank; without one, the
    // model runs whole on every rank (a pipeline of one stage).
    using pipeline_policy = typename detail::first_of_kind<PolicyKind::pipeline, void, Ps...>::type;
    static constexpr bool pipelined = !std::is_void_v<pipeline_policy>;
    static constexpr ScheduleKind schedule = [] {
        if constexpr (pipelined) return pipeline_policy::schedule_kind;
        else return ScheduleKind::one_f_one_b;
    }();
    static constexpr int chunks = [] {
        if constexpr (pipelined) return pipeline_policy::chunks;
        else return 1;
    }();

    // GradCompress<Compressor, Axis>: what each axis's traffic is compressed with.
    static constexpr Compression dp_compression = detail::compression_on<CompressedAxis::dp, Ps...>();
    static constexpr Compression pp_compression = detail::compression_on<CompressedAxis::pp, Ps...>();
    static constexpr Compression tp_compression = detail::compression_on<CompressedAxis::tp, Ps...>();

    // Recompute<Which>: which activations are recomputed rather than kept.
    using recompute_policy = typename detail::first_of_kind<PolicyKind::recompute, void, Ps...>::type;
    static constexpr RecomputeSpec recompute = [] {
        if constexpr (std::is_void_v<recompute_policy>) return RecomputeSpec{};
        else return recompute_policy::spec;
    }();

    // The whole strategy as one value: what the executor runs, and what
    // parse_strategy reads back from this type's printed text.
    static constexpr StrategySpec spec{zero_stage,        bucket_bytes,      pipelined,         schedule,
                                       chunks,            tensor_parallel,   tensor_grid,       sequence_parallel,
                                       sequence_attention, sequence_zigzag,  sequence_ulysses,  dp_compression,
                                       pp_compression,    tp_compression,    recompute};

    // f(std::type_identity<P>{}) for each policy, in order: how the executor
    // finds the policies that lower themselves.
    template <class F>
    static constexpr void for_each_policy(F&& f) {
        (f(std::type_identity<Ps>{}), ...);
    }

    static void describe(std::ostream& out) {
        out << "Strategy<";
        [[maybe_unused]] const char* separator = "";  // unused by Strategy<>
        ((out << separator, Ps::describe(out), separator = ", "), ...);
        out << ">";
    }
    friend std::ostream& operator<<(std::ostream& out, const Strategy&) {
        describe(out);
        return out;
    }
};

}  // namespace loom
