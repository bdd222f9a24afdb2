// The static verifier: checks a step program before it ever runs, so a
// generator's mistake is a message naming the instruction, not a hang or a
// silently wrong gradient. What it checks (for the programs of data
// parallelism and ZeRO; pipelines add p2p matching to it):
//   - every unit runs forward and backward once per micro-batch, in order
//     (forward u after forward u-1, backward u after backward u+1 and after
//     the last forward; backward_weight after backward_input);
//   - a forward that keeps only its input (Recompute) is recomputed once,
//     after it and before its backward, and only such a forward is;
//   - every asynchronous instruction is waited exactly once, after it was issued;
//   - a unit of a sharded (slot) group computes only while its parameters are
//     gathered and waited for, and its gradients are bound to a slot;
//   - a slot is not rebound or regathered while an operation on it is pending;
//   - a group's gradients are reduced only after backward has finished every
//     unit of the group, exactly once (per micro-batch from slots, once from
//     the arena), and the optimizer runs after every reduction is waited.
// A pipeline rank's program (program.pipelined, checked with the chunk of
// every unit, -1 for units held elsewhere): only its own units run; a chunk's
// first forward needs the activation of the unit before it (run here, or
// received), its last unit's backward the gradient of the unit after it; a
// send follows the compute that produced what it sends; each group is reduced
// once per step, after every micro-batch's weight gradients. Matching sends
// with recvs across ranks and deadlock freedom are verify_pipeline's part.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/parallel/shard_layout.hpp"
#include "loom/schedule/program.hpp"

namespace loom::schedule {

namespace detail {

class Verifier {
public:
    Verifier(const StepProgram& program, const parallel::ShardLayout& layout, int units,
             std::vector<int> chunk_of_unit = {})
        : program_(program), layout_(layout), units_(units), chunk_of_unit_(std::move(chunk_of_unit)) {
        if (chunk_of_unit_.empty()) chunk_of_unit_.assign(static_cast<std::size_t>(units), 0);
        LOOM_CHECK(static_cast<int>(chunk_of_unit_.size()) == units, "verify: ", chunk_of_unit_.size(),
                   " chunk entries for ", units, " units");
    }

    void run() {
        const int mbs = program_.micro_batches;
        forward_done_.assign(static_cast<std::size_t>(mbs), std::vector<int>(static_cast<std::size_t>(units_), 0));
        input_done_ = forward_done_;
        weight_done_ = forward_done_;
        recompute_ = forward_done_;
        kept_.assign(forward_done_.size(), std::vector<Keep>(forward_done_.empty() ? 0 : forward_done_[0].size(), Keep::all));
        param_slot_.assign(static_cast<std::size_t>(program_.param_slots), Slot{});
        grad_slot_.assign(static_cast<std::size_t>(program_.grad_slots), Slot{});
        for (index_ = 0; index_ < static_cast<int>(program_.code.size()); ++index_) step(program_.code[static_cast<std::size_t>(index_)]);
        index_ = static_cast<int>(program_.code.size());
        for (const auto& [issued, waited] : async_)
            check(waited, "instruction #", issued, " (", program_.code[static_cast<std::size_t>(issued)],
                  ") is never waited for");
        for (int mb = 0; mb < mbs; ++mb)
            for (int u = 0; u < units_; ++u)
                check(!held(u) || (forward_done_[mb][u] == 1 && input_done_[mb][u] == 1 && weight_done_[mb][u] == 1), "unit ", u,
                      " of micro-batch ", mb, " ran forward ", forward_done_[mb][u], " times and backward ",
                      input_done_[mb][u], "/", weight_done_[mb][u], " times; each must run once");
        check(optimizer_steps_ == 1, "the optimizer runs ", optimizer_steps_, " times; a step runs it once");
    }

private:
    struct Slot {
        int group = -1;
        int pending = -1;  // async instruction not yet waited
    };

    template <class... Args>
    void check(bool ok, const Args&... args) const {
        if (!ok)
            throw Error(loom::detail::concat("step program (", program_.generator, ") is invalid at #", index_, ": ",
                                             args...));
    }

    [[nodiscard]] bool held(int u) const { return chunk_of_unit_[static_cast<std::size_t>(u)] >= 0; }
    [[nodiscard]] int chunk(int u) const { return chunk_of_unit_[static_cast<std::size_t>(u)]; }

    [[nodiscard]] std::pair<int, int> unit_mb(const Instruction& in) const {
        check(in.unit >= 0 && in.unit < units_, in, " names unit ", in.unit, " but the model has ", units_);
        check(in.micro_batch >= 0 && in.micro_batch < program_.micro_batches, in, " names micro-batch ", in.micro_batch,
              " of ", program_.micro_batches);
        check(held(in.unit), in, " runs a unit this rank does not hold");
        check(!program_.pipelined || in.chunk == chunk(in.unit), in, " names chunk ", in.chunk, " but u", in.unit,
              " is in chunk ", chunk(in.unit));
        return {in.unit, in.micro_batch};
    }

    // The activation entering unit u: its predecessor's forward here, or a
    // recv for u's chunk.
    [[nodiscard]] bool input_ready(int u, int mb) const {
        if (u == 0) return true;
        if (held(u - 1)) return forward_done_[mb][u - 1] == 1;
        return received_.count({Payload::activation, chunk(u), mb}) > 0;
    }
    // The gradient entering unit u's backward: its successor's here, a recv,
    // or (the model's last unit) the loss itself.
    [[nodiscard]] bool gradient_ready(int u, int mb) const {
        if (u == units_ - 1) return true;
        if (held(u + 1)) return input_done_[mb][u + 1] == 1;
        return received_.count({Payload::gradient, chunk(u), mb}) > 0;
    }
    [[nodiscard]] bool all_weights_done(int u) const {
        for (int mb = 0; mb < program_.micro_batches; ++mb)
            if (weight_done_[mb][u] != 1) return false;
        return true;
    }

    // A unit computes only with its parameters in place (ZeRO-3) and its
    // gradients bound (ZeRO-2/3).
    void check_unit_ready(const Instruction& in, int u, bool needs_grads) const {
        const int g = layout_.group_of_unit(u);
        if (g < 0) return;
        if (!param_slot_.empty()) {
            bool ready = false;
            for (const auto& s : param_slot_) ready = ready || (s.group == g && s.pending < 0);
            check(ready, in, " runs while group ", g, "'s parameters are not gathered and waited for");
        }
        if (needs_grads && !grad_slot_.empty()) {
            bool bound = false;
            for (const auto& s : grad_slot_) bound = bound || (s.group == g && s.pending < 0);
            check(bound, in, " runs while group ", g, "'s gradients are not bound to a free slot");
        }
    }

    Slot& slot_of(std::vector<Slot>& slots, const Instruction& in, const char* what) {
        check(in.slot >= 0 && in.slot < static_cast<int>(slots.size()), in, " names ", what, " slot ", in.slot,
              " but the program has ", slots.size());
        return slots[static_cast<std::size_t>(in.slot)];
    }

    void step(const Instruction& in) {
        check(in.keep == Keep::all || in.op == Op::forward || in.op == Op::recompute, in,
              " keeps only part of its activations; only a forward (and its recompute) can");
        switch (in.op) {
            case Op::zero_grads: break;
            case Op::forward: {
                const auto [u, mb] = unit_mb(in);
                check(input_ready(u, mb), in, " runs before forward u", u - 1, program_.pipelined ? " (or its recv)" : "");
                check(forward_done_[mb][u] == 0, in, " runs twice");
                check_unit_ready(in, u, false);
                forward_done_[mb][u] = 1;
                // 1: its activations must be recomputed before its backward.
                recompute_[mb][u] = in.keep != Keep::all ? 1 : 0;
                kept_[mb][u] = in.keep;
                break;
            }
            case Op::recompute: {
                const auto [u, mb] = unit_mb(in);
                check(forward_done_[mb][u] == 1 && recompute_[mb][u] == 1, in, " recomputes u", u,
                      recompute_[mb][u] == 2 ? " a second time" : ", whose forward kept all it saved (or has not run)");
                check(input_done_[mb][u] == 0, in, " runs after the backward it serves");
                check(in.keep == kept_[mb][u], in, kept_[mb][u] == Keep::products
                                                       ? " recomputes everything, but its forward kept its products"
                                                       : " replays products its forward did not keep");
                check_unit_ready(in, u, false);
                recompute_[mb][u] = 2;
                break;
            }
            case Op::backward:
            case Op::backward_input: {
                const auto [u, mb] = unit_mb(in);
                check(program_.pipelined ? forward_done_[mb][u] == 1 : forward_done_[mb][units_ - 1] == 1, in,
                      " runs before the forward pass ended");
                check(gradient_ready(u, mb), in, " runs before the backward of u", u + 1,
                      program_.pipelined ? " (or its recv)" : "");
                check(input_done_[mb][u] == 0, in, " runs twice");
                check(recompute_[mb][u] != 1, in, " runs before the recompute of the activations its forward dropped");
                check_unit_ready(in, u, in.op == Op::backward);
                input_done_[mb][u] = 1;
                if (in.op == Op::backward) weight_done_[mb][u] = 1;
                break;
            }
            case Op::backward_weight: {
                const auto [u, mb] = unit_mb(in);
                check(input_done_[mb][u] == 1, in, " runs before its backward_input");
                check(weight_done_[mb][u] == 0, in, " runs twice");
                check_unit_ready(in, u, true);
                weight_done_[mb][u] = 1;
                break;
            }
            case Op::gather_params: {
                check_group(in);
                if (in.slot >= 0) {
                    Slot& s = slot_of(param_slot_, in, "parameter");
                    check(s.group == -1, in, " overwrites slot ", in.slot, " still holding group ", s.group);
                    s = Slot{in.group, index_};
                } else {
                    check(optimizer_steps_ == 1, in, " gathers unsharded parameters before the optimizer updated them");
                }
                async_[index_] = false;
                break;
            }
            case Op::release_params: {
                Slot& s = slot_of(param_slot_, in, "parameter");
                check(s.group == in.group && s.pending < 0, in, " releases a slot holding group ", s.group,
                      s.pending >= 0 ? " with its gather still pending" : "");
                s = Slot{};
                break;
            }
            case Op::bind_grads: {
                check_group(in);
                Slot& s = slot_of(grad_slot_, in, "gradient");
                check(s.pending < 0, in, " rebinds slot ", in.slot, " while its reduction #", s.pending,
                      " is still pending");
                s = Slot{in.group, -1};
                break;
            }
            case Op::reduce_grads: {
                check_group(in);
                const auto& group = layout_.group(in.group);
                const int mb = in.micro_batch;
                check(mb >= 0 && mb < program_.micro_batches, in, " names micro-batch ", mb);
                const bool whole_step = program_.pipelined;
                for (int u = group.first_unit; u <= group.last_unit; ++u)
                    check(whole_step ? all_weights_done(u) : weight_done_[mb][u] == 1, in,
                          " reduces before the weight gradients of u", u, whole_step ? " of every micro-batch" : "",
                          " exist");
                if (in.slot >= 0) {
                    Slot& s = slot_of(grad_slot_, in, "gradient");
                    check(s.group == in.group && s.pending < 0, in, " reduces slot ", in.slot, " which holds group ", s.group);
                    s.pending = index_;
                } else {
                    check(mb == program_.micro_batches - 1, in,
                          " reduces arena gradients before the last micro-batch has added its share");
                }
                ++reductions_[{in.group, program_.pipelined ? 0 : mb}];
                async_[index_] = false;
                break;
            }
            case Op::wait: {
                const auto it = async_.find(in.target);
                check(it != async_.end(), in, " waits for #", in.target, ", which is not an earlier asynchronous instruction");
                check(!it->second, in, " waits for #", in.target, " a second time");
                it->second = true;
                for (auto* slots : {&param_slot_, &grad_slot_})
                    for (auto& s : *slots)
                        if (s.pending == in.target) {
                            s.pending = -1;
                            // A waited reduction frees its gradient slot.
                            if (slots == &grad_slot_) s.group = -1;
                        }
                break;
            }
            case Op::optimizer_step:
                for (const auto& [issued, waited] : async_) {
                    const auto& target = program_.code[static_cast<std::size_t>(issued)];
                    check(waited || target.op != Op::reduce_grads, in, " runs before reduction #", issued, " finished");
                }
                // Every group's gradients reduced exactly once: per micro-batch
                // from slots, once (in the last micro-batch) from the arena.
                for (int g = 0; g < static_cast<int>(layout_.groups().size()); ++g) {
                    const bool slots = !grad_slot_.empty();
                    // A pipeline reduces each group once a step (counted under micro-batch 0).
                    const int reduced_mbs = program_.pipelined ? 1 : program_.micro_batches;
                    for (int mb = 0; mb < reduced_mbs; ++mb) {
                        const int expected = slots || program_.pipelined || mb == program_.micro_batches - 1 ? 1 : 0;
                        const auto it = reductions_.find({g, mb});
                        const int seen = it == reductions_.end() ? 0 : it->second;
                        if (program_.pipelined)
                            check(seen == expected, in, " runs after group ", g, "'s gradients were reduced ", seen,
                                  " times in the step; a pipeline reduces each group once");
                        else
                            check(seen == expected, in, " runs after group ", g, "'s gradients of micro-batch ", mb,
                                  " were reduced ", seen, " times; expected ", expected);
                    }
                }
                ++optimizer_steps_;
                break;
            case Op::reduce_loss: break;
            case Op::policy:
                check(in.policy >= 0 && in.policy < static_cast<int>(program_.policies.size()), in, " names policy ",
                      in.policy, " but the program has ", program_.policies.size());
                break;
            case Op::send:
            case Op::recv: {
                check(program_.pipelined, in, " is a pipeline instruction; a data-parallel program has none");
                const int mb = in.micro_batch;
                check(mb >= 0 && mb < program_.micro_batches && in.chunk >= 0, in, " names micro-batch ", mb,
                      " and chunk ", in.chunk);
                const auto first = std::find(chunk_of_unit_.begin(), chunk_of_unit_.end(), in.chunk);
                check(first != chunk_of_unit_.end(), in, " names chunk ", in.chunk, ", which this rank does not hold");
                const int lo = static_cast<int>(first - chunk_of_unit_.begin());
                const int hi = static_cast<int>(std::find_if(first, chunk_of_unit_.end(),
                                                             [&](int c) { return c != in.chunk; }) -
                                                chunk_of_unit_.begin()) - 1;
                if (in.op == Op::recv) {
                    check(received_.insert({in.payload, in.chunk, mb}).second, in, " receives twice");
                } else {
                    check(in.payload == Payload::activation ? forward_done_[mb][hi] == 1 : input_done_[mb][lo] == 1,
                          in, " sends before the ", in.payload == Payload::activation ? "forward" : "backward",
                          " that produces it");
                    async_[index_] = false;
                }
                break;
            }
        }
    }

    void check_group(const Instruction& in) const {
        check(in.group >= 0 && in.group < static_cast<int>(layout_.groups().size()), in, " names group ", in.group,
              " but the layout has ", layout_.groups().size());
    }

    const StepProgram& program_;
    const parallel::ShardLayout& layout_;
    int units_;
    std::vector<int> chunk_of_unit_;
    std::set<std::tuple<Payload, int, int>> received_;  // (payload, chunk, micro-batch)
    // By micro-batch and unit: 0 nothing to recompute, 1 its forward kept
    // only the input, 2 recomputed.
    std::vector<std::vector<int>> recompute_;
    std::vector<std::vector<Keep>> kept_;  // by micro-batch and unit: what its forward kept
    int index_ = 0;
    std::vector<std::vector<int>> forward_done_, input_done_, weight_done_;
    std::vector<Slot> param_slot_, grad_slot_;
    std::map<int, bool> async_;  // issued index -> waited
    std::map<std::pair<int, int>, int> reductions_;  // (group, micro-batch) -> reduce_grads seen
    int optimizer_steps_ = 0;
};

}  // namespace detail

// Throws loom::Error naming the first instruction that breaks a rule.
inline void verify(const StepProgram& program, const parallel::ShardLayout& layout, int units) {
    detail::Verifier(program, layout, units).run();
}

// A pipeline rank's program: chunk_of_unit[u] is the virtual stage holding
// unit u on this rank, -1 where another rank holds it.
inline void verify(const StepProgram& program, const parallel::ShardLayout& layout,
                   const std::vector<int>& chunk_of_unit) {
    detail::Verifier(program, layout, static_cast<int>(chunk_of_unit.size()), chunk_of_unit).run();
}

}  // namespace loom::schedule
