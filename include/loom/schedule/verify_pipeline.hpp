// The pipeline verifier: checks a PipelineProgram (every rank's program
// together) before it runs, so a generator's mistake is one line naming the
// rank, the instruction and the rule instead of a hang on the cluster. Checks,
// in this order (the first broken rule is reported):
//   1. shape: ranks.size() == stages, rank_of_chunk has stages*chunks entries
//      in [0, stages);
//   2. fields: every instruction names a chunk, micro-batch and payload in
//      range; compute runs on the rank that owns its chunk; backward is
//      combined or split as the program says; a send goes to the rank owning
//      chunk v+1 (activation) / v-1 (gradient), a recv comes from the rank
//      owning v-1 / v+1, never between chunks of one rank;
//   3. completeness: each (virtual stage, micro-batch) runs forward once and
//      backward once (or backward_input and backward_weight once each);
//   4. matching: every send has exactly one recv and every recv one send;
//   5. order within a rank: F(v,k) after the activation of (v-1,k) exists
//      there (F(v-1,k) on the same rank, else its recv), B(v,k) after F(v,k)
//      and after the gradient of (v+1,k) (B(v+1,k) or its recv), W(v,k) after
//      B(v,k), a send after the compute that produced it, every asynchronous
//      instruction waited exactly once after it was issued;
//   6. no deadlock: all ranks run together, recvs blocking until their send
//      has run, everything else never blocking;
//   7. memory: no rank holds more activations than activation_bound promises.
// Order within a rank is checked before the deadlock simulation so that a
// program that cannot finish because it is wrong on one rank gets the local
// message, and the simulation only ever reports real cycles between ranks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/program.hpp"

namespace loom::schedule {

namespace detail {

// A p2p message: what travels, for which micro-batch, from which virtual stage.
// A send names its sender chunk directly; a recv's sender is its own chunk -1
// (activation) or +1 (gradient).
using Message = std::tuple<Payload, int, int>;  // payload, micro-batch, sender chunk

[[nodiscard]] inline Message message_of_send(const Instruction& in) { return {in.payload, in.micro_batch, in.chunk}; }
[[nodiscard]] inline Message message_of_recv(const Instruction& in) {
    return {in.payload, in.micro_batch, in.chunk + (in.payload == Payload::activation ? -1 : 1)};
}
[[nodiscard]] constexpr bool is_backward_input(Op op) { return op == Op::backward || op == Op::backward_input; }
[[nodiscard]] constexpr bool is_pipeline_compute(Op op) {
    return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight;
}

class PipelineVerifier {
public:
    explicit PipelineVerifier(const PipelineProgram& program) : p_(program) {}

    void run() {
        check_shape();
        for (int r = 0; r < p_.stages; ++r)
            for (int i = 0; i < size(r); ++i) check_fields(r, i);
        check_complete();
        check_matching();
        for (int r = 0; r < p_.stages; ++r) check_order(r);
        check_deadlock();
        for (int r = 0; r < p_.stages; ++r) check_memory(r);
    }

    // Live activations: (v,k) holds its activation from F(v,k) until the
    // backward that last reads it (the combined backward, or W when split:
    // the weight gradient needs the layer inputs too).
    [[nodiscard]] std::pair<int, int> peak(int r) const {  // peak, index where first reached
        int live = 0, best = 0, at = -1;
        for (int i = 0; i < size(r); ++i) {
            const Op op = code(r, i).op;
            if (op == Op::forward && ++live > best) best = live, at = i;
            if (op == (p_.split_backward ? Op::backward_weight : Op::backward)) --live;
        }
        return {best, at};
    }

    void check_shape() const {
        fail_if(p_.stages < 1 || p_.micro_batches < 1 || p_.chunks < 1, "stages ", p_.stages, ", micro-batches ",
                p_.micro_batches, " and chunks ", p_.chunks, " must all be at least 1");
        fail_if(static_cast<int>(p_.ranks.size()) != p_.stages, "it has ", p_.ranks.size(), " rank programs for ",
                p_.stages, " stages");
        fail_if(static_cast<int>(p_.rank_of_chunk.size()) != p_.virtual_stages(), "rank_of_chunk has ",
                p_.rank_of_chunk.size(), " entries for ", p_.virtual_stages(), " virtual stages");
        for (int v = 0; v < p_.virtual_stages(); ++v)
            fail_if(owner(v) < 0 || owner(v) >= p_.stages, "rank_of_chunk[", v, "] = ", owner(v), " is not a rank in [0, ",
                    p_.stages, ")");
    }

private:
    [[nodiscard]] int size(int r) const { return static_cast<int>(p_.ranks[static_cast<std::size_t>(r)].code.size()); }
    [[nodiscard]] const Instruction& code(int r, int i) const {
        return p_.ranks[static_cast<std::size_t>(r)].code[static_cast<std::size_t>(i)];
    }
    [[nodiscard]] int owner(int v) const { return p_.rank_of_chunk[static_cast<std::size_t>(v)]; }
    [[nodiscard]] bool in_range(int v) const { return v >= 0 && v < p_.virtual_stages(); }

    template <class... Args>
    [[noreturn]] void fail(const Args&... args) const {
        std::ostringstream head;
        head << "pipeline program (" << p_.schedule << ", p=" << p_.stages << ", m=" << p_.micro_batches;
        if (p_.chunks != 1) head << ", v=" << p_.chunks;
        head << ") is invalid: ";
        throw Error(loom::detail::concat(head.str(), args...));
    }
    template <class... Args>
    void fail_if(bool bad, const Args&... args) const {
        if (bad) fail(args...);
    }
    // "rank 2 #14 (recv activation from rank 1 c2 mb3)", formatted only when
    // a check fails (checks pass it by value on every instruction).
    struct At {
        int rank, index;
        const Instruction* in;
        friend std::ostream& operator<<(std::ostream& out, const At& a) {
            return out << "rank " << a.rank << " #" << a.index << " (" << *a.in << ")";
        }
    };
    [[nodiscard]] At at(int r, int i) const { return {r, i, &code(r, i)}; }

    void check_fields(int r, int i) const {
        const Instruction& in = code(r, i);
        const bool p2p = in.op == Op::send || in.op == Op::recv;
        if (!is_pipeline_compute(in.op) && !p2p) return;  // waits, optimizer, dp reductions: nothing pipeline-specific
        fail_if(!in_range(in.chunk), at(r, i), " names chunk ", in.chunk, " of ", p_.virtual_stages(), " virtual stages");
        fail_if(in.micro_batch < 0 || in.micro_batch >= p_.micro_batches, at(r, i), " names micro-batch ",
                in.micro_batch, " of ", p_.micro_batches);
        if (!p2p) {
            fail_if(owner(in.chunk) != r, at(r, i), " runs on rank ", r, " but c", in.chunk, " lives on rank ",
                    owner(in.chunk));
            fail_if(p_.split_backward && in.op == Op::backward, at(r, i),
                    " is a combined backward in a program that splits backward_input and backward_weight");
            fail_if(!p_.split_backward && (in.op == Op::backward_input || in.op == Op::backward_weight), at(r, i),
                    " splits the backward in a program that runs it combined");
            return;
        }
        fail_if(in.payload != Payload::activation && in.payload != Payload::gradient, at(r, i),
                " carries no payload; a pipeline send/recv carries an activation or a gradient");
        fail_if(owner(in.chunk) != r, at(r, i), " belongs to c", in.chunk, ", which lives on rank ", owner(in.chunk),
                ", not rank ", r);
        // The chunk at the other end: the receiver of a send, the sender of a recv.
        const bool forward_flow = in.payload == Payload::activation;
        const int other = in.op == Op::send ? in.chunk + (forward_flow ? 1 : -1) : in.chunk + (forward_flow ? -1 : 1);
        fail_if(!in_range(other), at(r, i), " needs c", other, ", which does not exist (", p_.virtual_stages(),
                " virtual stages)");
        fail_if(owner(other) == r, at(r, i), " crosses from c", std::min(in.chunk, other), " to c",
                std::max(in.chunk, other), ", both on rank ", r, "; chunks on one rank exchange nothing");
        fail_if(in.peer != owner(other), at(r, i), " names rank ", in.peer, " but c", other, " lives on rank ",
                owner(other));
    }

    void check_complete() const {
        const int V = p_.virtual_stages(), m = p_.micro_batches;
        // (op, v, k) -> first (rank, index) seen; a second occurrence is reported there.
        std::map<std::tuple<Op, int, int>, std::pair<int, int>> seen;
        for (int r = 0; r < p_.stages; ++r)
            for (int i = 0; i < size(r); ++i) {
                const Instruction& in = code(r, i);
                if (!is_pipeline_compute(in.op)) continue;
                const auto [it, fresh] = seen.try_emplace({in.op, in.chunk, in.micro_batch}, r, i);
                fail_if(!fresh, at(r, i), " runs a second time; the first was #", it->second.second);
            }
        const std::vector<Op> needed = p_.split_backward
                                           ? std::vector<Op>{Op::forward, Op::backward_input, Op::backward_weight}
                                           : std::vector<Op>{Op::forward, Op::backward};
        for (int v = 0; v < V; ++v)
            for (int k = 0; k < m; ++k)
                for (Op op : needed)
                    fail_if(!seen.contains({op, v, k}), name(op), " c", v, " mb", k, " never runs (rank ", owner(v),
                            " holds c", v, ")");
    }

    void check_matching() const {
        std::map<Message, std::vector<std::pair<int, int>>> sends, recvs;
        for (int r = 0; r < p_.stages; ++r)
            for (int i = 0; i < size(r); ++i) {
                const Instruction& in = code(r, i);
                if (in.op == Op::send) sends[message_of_send(in)].emplace_back(r, i);
                if (in.op == Op::recv) recvs[message_of_recv(in)].emplace_back(r, i);
            }
        // Reported in rank, then program order, so the message is stable.
        for (int r = 0; r < p_.stages; ++r)
            for (int i = 0; i < size(r); ++i) {
                const Instruction& in = code(r, i);
                if (in.op == Op::send) {
                    const auto& same = sends[message_of_send(in)];
                    if (same.size() > 1) {
                        const auto [orr, oi] = same[same.front() == std::pair{r, i} ? 1 : 0];
                        fail(at(r, i), " is sent ", same.size(), " times; also by ", at(orr, oi));
                    }
                    const auto it = recvs.find(message_of_send(in));
                    fail_if(it == recvs.end(), at(r, i), " is never received: rank ", in.peer, " has no matching recv");
                } else if (in.op == Op::recv) {
                    const auto& same = recvs[message_of_recv(in)];
                    fail_if(same.size() > 1, at(r, i), " is received ", same.size(), " times; one send feeds one recv");
                    fail_if(!sends.contains(message_of_recv(in)), at(r, i), " waits forever: no rank sends it");
                }
            }
    }

    void check_order(int r) const {
        // What this rank has done so far, by (v, k); received messages by (payload, k, own chunk).
        std::set<std::pair<int, int>> forward, backward_in, backward_w;
        std::set<std::tuple<Payload, int, int>> received;
        std::map<int, bool> pending;  // async instruction index -> waited
        for (int i = 0; i < size(r); ++i) {
            const Instruction& in = code(r, i);
            const int v = in.chunk, k = in.micro_batch;
            switch (in.op) {
                case Op::forward:
                    if (v > 0 && owner(v - 1) == r)
                        fail_if(!forward.contains({v - 1, k}), at(r, i), " runs before forward c", v - 1, " mb", k,
                                " produced its input");
                    else if (v > 0)
                        fail_if(!received.contains({Payload::activation, k, v}), at(r, i),
                                " runs before its activation arrives: no earlier recv activation from rank ", owner(v - 1),
                                " c", v, " mb", k);
                    forward.insert({v, k});
                    break;
                case Op::backward:
                case Op::backward_input:
                    fail_if(!forward.contains({v, k}), at(r, i), " runs before forward c", v, " mb", k);
                    if (v + 1 < p_.virtual_stages() && owner(v + 1) == r)
                        fail_if(!backward_in.contains({v + 1, k}), at(r, i), " runs before the backward of c", v + 1,
                                " mb", k, " produced its gradient");
                    else if (v + 1 < p_.virtual_stages())
                        fail_if(!received.contains({Payload::gradient, k, v}), at(r, i),
                                " runs before its gradient arrives: no earlier recv gradient from rank ", owner(v + 1),
                                " c", v, " mb", k);
                    backward_in.insert({v, k});
                    if (in.op == Op::backward) backward_w.insert({v, k});
                    break;
                case Op::backward_weight:
                    fail_if(!backward_in.contains({v, k}), at(r, i), " runs before backward_input c", v, " mb", k);
                    backward_w.insert({v, k});
                    break;
                case Op::send:
                    if (in.payload == Payload::activation)
                        fail_if(!forward.contains({v, k}), at(r, i), " sends before forward c", v, " mb", k,
                                " produced it");
                    else
                        fail_if(!backward_in.contains({v, k}), at(r, i), " sends before the backward of c", v, " mb",
                                k, " produced it");
                    break;
                case Op::recv: received.insert({in.payload, k, v}); break;
                case Op::wait: {
                    const auto it = pending.find(in.target);
                    fail_if(it == pending.end(), at(r, i), " waits for #", in.target,
                            ", which is not an earlier asynchronous instruction");
                    fail_if(it->second, at(r, i), " waits for #", in.target, " a second time");
                    it->second = true;
                    break;
                }
                default: break;
            }
            if (is_async(in.op)) pending[i] = false;
        }
        for (const auto& [issued, waited] : pending) fail_if(!waited, at(r, issued), " is never waited for");
    }

    // All ranks together: each runs its program in order; a recv completes
    // only once its send has run; nothing else blocks. Matching is checked
    // already, so a stuck recv is a cycle of ranks waiting on each other.
    void check_deadlock() const {
        std::vector<int> pc(static_cast<std::size_t>(p_.stages), 0);
        std::map<Message, std::pair<int, int>> sent;  // message -> (rank, index) of its send, once run
        std::map<Message, std::pair<int, int>> send_of;
        for (int r = 0; r < p_.stages; ++r)
            for (int i = 0; i < size(r); ++i)
                if (code(r, i).op == Op::send) send_of[message_of_send(code(r, i))] = {r, i};
        for (bool progress = true; progress;) {
            progress = false;
            for (int r = 0; r < p_.stages; ++r) {
                int& i = pc[static_cast<std::size_t>(r)];
                for (; i < size(r); ++i, progress = true) {
                    const Instruction& in = code(r, i);
                    if (in.op == Op::recv && !sent.contains(message_of_recv(in))) break;
                    if (in.op == Op::send) sent[message_of_send(in)] = {r, i};
                }
            }
        }
        std::ostringstream stuck;
        const char* separator = "";
        for (int r = 0; r < p_.stages; ++r) {
            const int i = pc[static_cast<std::size_t>(r)];
            if (i == size(r)) continue;
            const auto [sr, si] = send_of.at(message_of_recv(code(r, i)));
            stuck << separator << at(r, i) << " waits for " << at(sr, si);
            separator = ", ";
        }
        fail_if(!stuck.str().empty(), "deadlock: ", stuck.str());
    }

    void check_memory(int r) const {
        const auto [best, i] = peak(r);
        if (best > p_.activation_bound)
            fail("rank ", r, " holds a peak of ", best, " activations at ", at(r, i), ", above the promised bound of ",
                 p_.activation_bound);
    }

    const PipelineProgram& p_;
};

}  // namespace detail

// Throws loom::Error (one line: rank, instruction index, rule) for the first
// broken rule; returns quietly for a program that is safe to run.
inline void verify_pipeline(const PipelineProgram& program) { detail::PipelineVerifier(program).run(); }

// The most micro-batch-chunk activations rank `rank` holds at once, following
// its program order (forward adds one; the combined backward, or W when the
// backward is split, frees one). Checks only the program's shape, so it also
// measures programs that fail other rules.
[[nodiscard]] inline int peak_activations(const PipelineProgram& program, int rank) {
    const detail::PipelineVerifier verifier(program);
    verifier.check_shape();
    LOOM_CHECK(rank >= 0 && rank < program.stages, "peak_activations: rank ", rank, " of ", program.stages);
    return verifier.peak(rank).first;
}

}  // namespace loom::schedule
