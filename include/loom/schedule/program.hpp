// The step program: one rank's training step as a list of instructions,
// generated before the step runs, verified, then interpreted by the executor
// every step; the tracer draws what it did. Schedules are generators of these
// lists (schedule/data_parallel.hpp here; pipelines add their own), and the
// one interpreter is exec/executor_instructions.hpp.
//
// Units are the model's units (exec/units.hpp); groups are shard groups
// (exec/shard_layout.hpp); slots are the executor's working buffers for a
// group's gathered parameters or gradients (ZeRO-2/3). Asynchronous
// instructions (gathers, gradient reductions) are finished by a `wait` that
// names them by their index in the program.
#pragma once

#include <cstdint>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace loom::schedule {

enum class Op : std::uint8_t {
    zero_grads,       // the rank's gradient accumulators (whole arena or shard) to zero
    forward,          // unit, micro_batch
    backward,         // unit, micro_batch: input and weight gradients together
    backward_input,   // unit, micro_batch: the input gradient alone (zero-bubble B)
    backward_weight,  // unit, micro_batch: the weight gradient alone (zero-bubble W)
    gather_params,    // group [, slot]: all-gather the group's parameter blocks (async)
    release_params,   // group, slot: the gathered copy is no longer needed (ZeRO-3)
    bind_grads,       // group, slot: zero a gradient slot and point the group's gradients at it
    reduce_grads,     // group [, slot], micro_batch: average the group's gradients over dp (async)
    wait,             // target: finish the asynchronous instruction at that index
    optimizer_step,   // the rank's parameters: all of them, or its shard
    reduce_loss,      // the step's loss averaged over the dp axis
    send,             // peer, payload, micro_batch, chunk: to the rank that holds the next (activation) or previous (gradient) chunk (async)
    recv,             // peer, payload, micro_batch, chunk: blocks until the matching send arrives
    policy,           // policy: what a policy lowered into the program (StepProgram::policies names it), run by its component
    recompute,        // unit, micro_batch, keep: its forward again from the kept input (and products), just before its backward (Recompute)
};

// What a forward keeps until the unit's backward: everything it saved (the
// default); only its input and output, the rest recomputed by an
// Op::recompute before the backward (Recompute<Full>, parallel/recompute.hpp);
// or its input, output and matrix products (nn::Context::product), which the
// Op::recompute replays instead of computing them again (Recompute<Selective>).
// An Op::recompute carries its forward's Keep.
enum class Keep : std::uint8_t { all, input, products };

// What a pipeline send/recv carries: the activation leaving a chunk's
// forward, or the gradient leaving its backward (input gradient).
enum class Payload : std::uint8_t { none, activation, gradient };

[[nodiscard]] constexpr std::string_view name(Payload p) {
    switch (p) {
        case Payload::none: return "none";
        case Payload::activation: return "activation";
        case Payload::gradient: return "gradient";
    }
    return "?";
}

[[nodiscard]] constexpr std::string_view name(Op op) {
    switch (op) {
        case Op::zero_grads: return "zero_grads";
        case Op::forward: return "forward";
        case Op::backward: return "backward";
        case Op::backward_input: return "backward_input";
        case Op::backward_weight: return "backward_weight";
        case Op::gather_params: return "gather_params";
        case Op::release_params: return "release_params";
        case Op::bind_grads: return "bind_grads";
        case Op::reduce_grads: return "reduce_grads";
        case Op::wait: return "wait";
        case Op::optimizer_step: return "optimizer_step";
        case Op::reduce_loss: return "reduce_loss";
        case Op::send: return "send";
        case Op::recv: return "recv";
        case Op::policy: return "policy";
        case Op::recompute: return "recompute";
    }
    return "?";
}

// How a reduce_grads reduces: whole gradients on every rank, or each rank's block.
enum class Reduction : std::uint8_t { none, all_reduce, reduce_scatter };

[[nodiscard]] constexpr bool is_async(Op op) {
    return op == Op::gather_params || op == Op::reduce_grads || op == Op::send;
}
[[nodiscard]] constexpr bool is_compute(Op op) {
    return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight ||
           op == Op::optimizer_step || op == Op::zero_grads || op == Op::recompute;
}

struct Instruction {
    Op op = Op::wait;
    int unit = -1;
    int micro_batch = -1;
    int group = -1;
    int slot = -1;    // -1: the group's place in the arena itself
    int target = -1;  // wait: the instruction it finishes
    Reduction reduction = Reduction::none;
    // Pipelines: the model chunk (virtual stage) a forward/backward runs or a
    // send/recv belongs to, the peer rank, and what travels.
    int chunk = -1;
    int peer = -1;
    Payload payload = Payload::none;
    int policy = -1;  // Op::policy: the index of the policy in StepProgram::policies
    Keep keep = Keep::all;  // Op::forward: what stays until the backward; Op::recompute: its forward's

    friend bool operator==(const Instruction&, const Instruction&) = default;

    // "backward u5 mb1", "reduce_grads g2 slot 0 mb1 (reduce_scatter)", "wait #17".
    friend std::ostream& operator<<(std::ostream& out, const Instruction& in) {
        out << name(in.op);
        if (in.op == Op::wait) return out << " #" << in.target;
        if (in.op == Op::policy) return out << " p" << in.policy;
        if (in.op == Op::send || in.op == Op::recv)
            out << " " << name(in.payload) << (in.op == Op::send ? " to rank " : " from rank ") << in.peer;
        if (in.unit >= 0) out << " u" << in.unit;
        if (in.chunk >= 0) out << " c" << in.chunk;
        if (in.group >= 0) out << " g" << in.group;
        if (in.slot >= 0) out << " slot " << in.slot;
        if (in.micro_batch >= 0) out << " mb" << in.micro_batch;
        if (in.reduction == Reduction::all_reduce) out << " (all_reduce)";
        if (in.reduction == Reduction::reduce_scatter) out << " (reduce_scatter)";
        if (in.op == Op::recompute) return out << (in.keep == Keep::products ? " (kept products)" : "");
        if (in.keep == Keep::input) out << " (keep input)";
        if (in.keep == Keep::products) out << " (keep input, products)";
        return out;
    }
};

struct StepProgram {
    std::string generator;  // what made it, e.g. "data parallel, ZeRO-2, 4 micro-batches"
    int micro_batches = 1;
    int grad_slots = 0;     // gradient working buffers the program uses (ZeRO-2/3)
    int param_slots = 0;    // gathered-parameter working buffers (ZeRO-3)
    // A pipeline rank's program (pipeline_step.hpp): it holds only some units,
    // forwards and backwards name their chunk, and a gradient slot holds its
    // group for the whole step (reduced once) rather than per micro-batch.
    bool pipelined = false;
    std::vector<Instruction> code;
    // What each Op::policy instruction runs, by its `policy` index: the
    // policy's own words ("ClipGradNorm<1>"), so the program prints it.
    std::vector<std::string> policies;

    // Appends and returns the index, which a later wait names.
    int emit(const Instruction& in) {
        code.push_back(in);
        return static_cast<int>(code.size()) - 1;
    }

    // Puts `in` at index `at`; the waits of later instructions are renumbered,
    // so a policy can lower itself into a generated program.
    void insert(int at, const Instruction& in) {
        code.insert(code.begin() + at, in);
        for (auto& later : code)
            if (later.op == Op::wait && later.target >= at) ++later.target;
    }

    // Removes the instruction at `at`, which no wait may name; later waits
    // are renumbered (a policy lowering itself again).
    void erase(int at) {
        code.erase(code.begin() + at);
        for (auto& later : code)
            if (later.op == Op::wait && later.target > at) --later.target;
    }

    // Puts `in` before every instruction of kind `before` (one optimizer_step
    // a step); returns how many it put.
    int insert_before(Op before, const Instruction& in) {
        int put = 0;
        for (int i = 0; i < static_cast<int>(code.size()); ++i)
            if (code[static_cast<std::size_t>(i)].op == before) {
                insert(i, in);
                ++i;
                ++put;
            }
        return put;
    }

    [[nodiscard]] std::int64_t count(Op op) const {
        std::int64_t n = 0;
        for (const auto& in : code) n += in.op == op ? 1 : 0;
        return n;
    }

    friend std::ostream& operator<<(std::ostream& out, const StepProgram& program) {
        out << "step program (" << program.generator << "): " << program.code.size() << " instructions\n";
        for (std::size_t i = 0; i < program.code.size(); ++i) {
            const Instruction& in = program.code[i];
            out << "  #" << i << " " << in;
            if (in.op == Op::policy && in.policy >= 0 && in.policy < static_cast<int>(program.policies.size()))
                out << " " << program.policies[static_cast<std::size_t>(in.policy)];
            out << "\n";
        }
        return out;
    }
};

}  // namespace loom::schedule
