// What a policy is: a small type that names its kind and prints itself.
// Strategy<Policies...> composes them; each of loom's kinds may appear once.
// A policy of kind `custom` is one written outside loom: it lowers itself
// into every rank's step program (`static void lower(StepProgram&, int self)`)
// and the executor runs its instructions through the policy's own `run`
// (exec/policy_component.hpp); any number of them may appear.
#pragma once

#include <concepts>
#include <cstdint>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

#include "loom/schedule/program.hpp"

namespace loom {

enum class PolicyKind : std::uint8_t {
    data_parallel,
    zero_shard,
    pipeline,
    tensor_parallel,
    sequence_parallel,
    compression,
    optex,
    recompute,
    custom,
};

[[nodiscard]] constexpr std::string_view name(PolicyKind kind) {
    switch (kind) {
        case PolicyKind::data_parallel: return "DataParallel";
        case PolicyKind::zero_shard: return "ZeroShard";
        case PolicyKind::pipeline: return "Pipeline";
        case PolicyKind::tensor_parallel: return "TensorParallel";
        case PolicyKind::sequence_parallel: return "SequenceParallel";
        case PolicyKind::compression: return "GradCompress";
        case PolicyKind::optex: return "OptEx";
        case PolicyKind::recompute: return "Recompute";
        case PolicyKind::custom: return "custom";
    }
    return "?";
}

// A policy: `static constexpr PolicyKind kind` and `static void describe(std::ostream&)`.
template <class P>
concept Policy = requires(std::ostream& out) {
    { P::kind } -> std::convertible_to<PolicyKind>;
    P::describe(out);
};

// A policy that adds its own instructions to a generated step program;
// `self` is the index its Op::policy instructions carry.
template <class P>
concept LowersItself = requires(schedule::StepProgram& program) { P::lower(program, 0); };

// "DataParallel<bucket 2 MiB>": a policy's own words.
template <Policy P>
[[nodiscard]] std::string describe() {
    std::ostringstream out;
    P::describe(out);
    return out.str();
}

// "2 MiB", "1.5 MiB", "512.0 KiB", "100 B": byte counts as people read them (one
// decimal; whole MiB without one, as in bucket sizes).
[[nodiscard]] inline std::string readable_bytes(std::int64_t bytes) {
    std::ostringstream out;
    out.precision(1);
    out << std::fixed;
    if (bytes >= (std::int64_t{1} << 30)) out << static_cast<double>(bytes) / (1 << 30) << " GiB";
    else if (bytes >= (std::int64_t{1} << 20) && bytes % (std::int64_t{1} << 20) == 0) out << std::setprecision(0) << static_cast<double>(bytes) / (1 << 20) << " MiB";
    else if (bytes >= (std::int64_t{1} << 20)) out << static_cast<double>(bytes) / (1 << 20) << " MiB";
    else if (bytes >= (std::int64_t{1} << 10)) out << static_cast<double>(bytes) / (1 << 10) << " KiB";
    else out << bytes << " B";
    return out.str();
}

}  // namespace loom
