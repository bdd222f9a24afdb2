// Step programs in the schedule and verifier tests (tests/parallel/): their
// printed text, the edits that break a correct program on purpose (an
// instruction moved, copied or dropped, every wait renumbered to follow its
// instruction), finding an instruction, and the verifier's message prefix.
// Test code only, all inline.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "loom/schedule/program.hpp"

namespace loom_test {

// What `<<` prints for an instruction, a step program or a pipeline program.
template <class Printable>
std::string printed(const Printable& value) {
    std::ostringstream out;
    out << value;
    return out.str();
}

inline std::string text_of(const loom::schedule::Instruction& in) { return printed(in); }

// The instructions that compute a unit: forward and the backward halves.
inline bool is_unit_compute(loom::schedule::Op op) {
    using loom::schedule::Op;
    return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight;
}

// A unit's compute instruction, and a p2p one, as the pipeline lowering writes them.
inline loom::schedule::Instruction unit_op(loom::schedule::Op op, int unit, int mb, int chunk) {
    return {.op = op, .unit = unit, .micro_batch = mb, .chunk = chunk};
}
inline loom::schedule::Instruction p2p(loom::schedule::Op op, loom::schedule::Payload payload, int peer, int mb,
                                       int chunk) {
    return {.op = op, .micro_batch = mb, .chunk = chunk, .peer = peer, .payload = payload};
}

// 0, 1, ..., size-1: the order that leaves the program as it is.
inline std::vector<int> in_order(const loom::schedule::StepProgram& program) {
    std::vector<int> order(program.code.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    return order;
}

// A program with its instructions rearranged: code[k] = old code[order[k]],
// every wait's target renumbered to where its instruction went (the first
// copy, if duplicated; left as it was if the instruction was dropped).
inline loom::schedule::StepProgram rearranged(const loom::schedule::StepProgram& program,
                                              const std::vector<int>& order) {
    loom::schedule::StepProgram out = program;
    out.code.clear();
    std::map<int, int> moved_to;
    for (int k = 0; k < static_cast<int>(order.size()); ++k) {
        const int from = order[static_cast<std::size_t>(k)];
        out.code.push_back(program.code[static_cast<std::size_t>(from)]);
        moved_to.emplace(from, k);
    }
    for (loom::schedule::Instruction& in : out.code)
        if (in.op == loom::schedule::Op::wait)
            if (const auto it = moved_to.find(in.target); it != moved_to.end()) in.target = it->second;
    return out;
}

// The program without instruction `index`.
inline loom::schedule::StepProgram without(const loom::schedule::StepProgram& program, int index) {
    auto order = in_order(program);
    order.erase(order.begin() + index);
    return rearranged(program, order);
}

// Instruction `from` moved to just before the instruction (originally) at `before`.
inline loom::schedule::StepProgram moved_before(const loom::schedule::StepProgram& program, int from, int before) {
    auto order = in_order(program);
    order.erase(order.begin() + from);
    order.insert(std::find(order.begin(), order.end(), before), from);
    return rearranged(program, order);
}

// A second copy of instruction `index` just before the instruction (originally) at `before`.
inline loom::schedule::StepProgram copied_before(const loom::schedule::StepProgram& program, int index,
                                                 int before) {
    auto order = in_order(program);
    order.insert(std::find(order.begin(), order.end(), before), index);
    return rearranged(program, order);
}

// Where `in` first appears in the program; the test stops if it is absent.
inline int index_of(const loom::schedule::StepProgram& program, const loom::schedule::Instruction& in) {
    const auto it = std::find(program.code.begin(), program.code.end(), in);
    REQUIRE(it != program.code.end());
    return static_cast<int>(it - program.code.begin());
}

// The first instruction that satisfies `pred`; the test stops if none does.
template <class Pred>
int index_where(const loom::schedule::StepProgram& program, Pred pred) {
    const auto it = std::find_if(program.code.begin(), program.code.end(), pred);
    REQUIRE(it != program.code.end());
    return static_cast<int>(it - program.code.begin());
}

// How the verifier's message begins when instruction `index` is the first it refuses.
inline std::string invalid_at(const loom::schedule::StepProgram& program, int index) {
    return "step program (" + program.generator + ") is invalid at #" + std::to_string(index) + ": ";
}

}  // namespace loom_test
