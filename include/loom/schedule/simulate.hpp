// The pipeline simulator: when would each instruction of a PipelineProgram
// run if every forward, backward and p2p transfer took a fixed time? It is
// how a schedule is priced (makespan, bubble) and drawn without running a
// model, under exactly the semantics the verifier checks:
//   - each rank runs its program in order, one compute at a time;
//   - a send costs nothing on the sender's clock (it is asynchronous) and its
//     data arrives p2p time units after it was issued;
//   - a recv completes at max(the rank's clock, arrival of its send);
//   - waits cost nothing (the data left when the send was issued; a wait
//     only releases the buffer), and so do the non-pipeline instructions.
// Times are abstract units. The events are plain structs so this header stays
// below exec/; exec/schedule_trace.hpp turns them into a Chrome trace.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/schedule/pipeline_program.hpp"
#include "loom/schedule/program.hpp"

namespace loom::schedule {

// Durations of one chunk's work on one micro-batch. A combined backward takes
// backward_input + backward_weight.
struct StageTimes {
    double forward = 1;
    double backward_input = 1;
    double backward_weight = 1;
    double p2p = 0;
};

// One bar of the timeline; the fields mirror exec::TraceEvent.
struct ScheduleEvent {
    std::string name;      // "F c2 mb3", "B c2 mb3", "W c2 mb3", "recv activation c2 mb3"
    std::string category;  // forward, backward, backward_input, backward_weight, send, recv
    int lane = 0;          // 0 compute, 1 point-to-point
    double start = 0, duration = 0;
    int micro_batch = -1;
    int chunk = -1;
    int index = -1;        // the instruction in the rank's program
};

struct Simulation {
    std::vector<std::vector<ScheduleEvent>> events;  // events[r]: rank r's, in program order
    std::vector<double> busy;                        // compute time per rank
    double makespan = 0;                             // when the last rank finishes
    double bubble = 0;                               // 1 - sum(busy) / (ranks * makespan)
};

namespace detail {

[[nodiscard]] inline double duration_of(Op op, const StageTimes& t) {
    switch (op) {
        case Op::forward: return t.forward;
        case Op::backward: return t.backward_input + t.backward_weight;
        case Op::backward_input: return t.backward_input;
        case Op::backward_weight: return t.backward_weight;
        default: return 0;
    }
}

[[nodiscard]] inline const char* letter_of(Op op) {
    switch (op) {
        case Op::forward: return "F";
        case Op::backward: return "B";
        case Op::backward_input: return "B";
        case Op::backward_weight: return "W";
        default: return "?";
    }
}

}  // namespace detail

// Throws loom::Error if some rank can never finish (a recv without a send, or
// a cycle of recvs): simulate verified programs (schedule/verify_pipeline.hpp).
[[nodiscard]] inline Simulation simulate(const PipelineProgram& program, const StageTimes& times = {}) {
    const int ranks = static_cast<int>(program.ranks.size());
    LOOM_CHECK(ranks > 0, "simulate: pipeline program (", program.schedule, ") has no ranks");
    LOOM_CHECK(times.forward >= 0 && times.backward_input >= 0 && times.backward_weight >= 0 && times.p2p >= 0,
               "simulate: stage times must not be negative (F ", times.forward, ", B ", times.backward_input, ", W ",
               times.backward_weight, ", p2p ", times.p2p, ")");
    Simulation sim;
    sim.events.resize(static_cast<std::size_t>(ranks));
    sim.busy.assign(static_cast<std::size_t>(ranks), 0.0);
    std::vector<double> clock(static_cast<std::size_t>(ranks), 0.0);
    std::vector<std::size_t> pc(static_cast<std::size_t>(ranks), 0);
    // (payload, micro-batch, sender chunk) -> when its send was issued. A
    // recv's sender is its own chunk -1 (activation) or +1 (gradient).
    std::map<std::tuple<Payload, int, int>, double> sent;

    // Round-robin until nothing moves: each rank runs until it blocks on a
    // recv. The times do not depend on the visiting order, only on the
    // program order of each rank and the send times.
    for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < ranks; ++r) {
            const auto& code = program.ranks[static_cast<std::size_t>(r)].code;
            auto& events = sim.events[static_cast<std::size_t>(r)];
            double& t = clock[static_cast<std::size_t>(r)];
            for (std::size_t& i = pc[static_cast<std::size_t>(r)]; i < code.size(); ++i, progress = true) {
                const Instruction& in = code[i];
                const int index = static_cast<int>(i);
                const std::string where = loom::detail::concat(" c", in.chunk, " mb", in.micro_batch);
                if (in.op == Op::forward || in.op == Op::backward || in.op == Op::backward_input ||
                    in.op == Op::backward_weight) {
                    const double d = detail::duration_of(in.op, times);
                    events.push_back({detail::letter_of(in.op) + where, std::string(name(in.op)), 0, t, d,
                                      in.micro_batch, in.chunk, index});
                    t += d;
                    sim.busy[static_cast<std::size_t>(r)] += d;
                } else if (in.op == Op::send) {
                    sent[{in.payload, in.micro_batch, in.chunk}] = t;
                    // The transfer occupies the link, not the rank: drawn only when it takes time.
                    if (times.p2p > 0)
                        events.push_back({loom::detail::concat("send ", name(in.payload), where), "send", 1, t,
                                          times.p2p, in.micro_batch, in.chunk, index});
                } else if (in.op == Op::recv) {
                    const int from = in.chunk + (in.payload == Payload::activation ? -1 : 1);
                    const auto it = sent.find({in.payload, in.micro_batch, from});
                    if (it == sent.end()) break;  // blocked until the sender gets there
                    const double done = std::max(t, it->second + times.p2p);
                    if (done > t)
                        events.push_back({loom::detail::concat("recv ", name(in.payload), where), "recv", 1, t,
                                          done - t, in.micro_batch, in.chunk, index});
                    t = done;
                }
            }
        }
    }

    std::ostringstream stuck;
    for (int r = 0; r < ranks; ++r) {
        const auto& code = program.ranks[static_cast<std::size_t>(r)].code;
        const std::size_t i = pc[static_cast<std::size_t>(r)];
        if (i < code.size()) stuck << " rank " << r << " #" << i << " (" << code[i] << ")";
    }
    LOOM_CHECK(stuck.str().empty(), "simulate: pipeline program (", program.schedule, ") never finishes; stuck:",
               stuck.str());

    double total = 0;
    for (int r = 0; r < ranks; ++r) {
        sim.makespan = std::max(sim.makespan, clock[static_cast<std::size_t>(r)]);
        total += sim.busy[static_cast<std::size_t>(r)];
    }
    // (capacity - busy) / capacity rather than 1 - busy / capacity: with
    // integral times both are exact rationals and this form rounds once, so
    // GPipe's bubble compares equal to (p-1)/(m+p-1) computed directly.
    const double capacity = static_cast<double>(ranks) * sim.makespan;
    sim.bubble = capacity > 0 ? (capacity - total) / capacity : 0.0;
    return sim;
}

}  // namespace loom::schedule
