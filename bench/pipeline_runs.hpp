// bench_pipeline's runs: a schedule's generated per-rank programs
// (schedule::pipeline_program) interpreted on ThreadWorld rank threads with
// synthetic stages (a compute is a timed sleep of its stage's share; sends
// and recvs move a real 64 KiB buffer), the rank threads set up so that a
// sleep lasts what it says (RankThread), and each repetition's makespan,
// measured bubble and trace events. See bench/pipeline.cpp for the report.
#pragma once

#include <loom/comm/thread_world.hpp>
#include <loom/exec/schedule_trace.hpp>
#include <loom/exec/trace.hpp>
#include <loom/schedule/pipeline.hpp>
#include <loom/schedule/simulate.hpp>

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace bench::pipeline_runs {

using Clock = std::chrono::steady_clock;
using loom::comm::Request;
using loom::comm::ThreadComm;
using loom::schedule::Op;
using loom::schedule::Payload;
using loom::schedule::PipelineProgram;

// What a p2p message carries: activations and gradients of this size.
inline constexpr std::int64_t message_floats = 16 * 1024;  // 64 KiB

// One chunk's compute times: the whole stage's divided by the chunks per rank.
inline loom::schedule::StageTimes chunk_times(double stage_ms, int chunks) {
    const double t = stage_ms / chunks;
    return {.forward = t, .backward_input = t, .backward_weight = t, .p2p = 0};
}

// One tag per message (payload, sending virtual stage, micro-batch), so a
// recv meets its own send whatever order the two ranks issue theirs in.
inline int tag_of(Payload payload, int sender_chunk, int micro_batch, int micro_batches) {
    return (2 * sender_chunk + (payload == Payload::gradient ? 1 : 0)) * micro_batches + micro_batch;
}

// When one compute or recv of a rank's program ran.
struct Span {
    std::size_t index;  // the instruction
    Clock::time_point start, end;
};

// One rank's run of its program.
struct RankRun {
    Clock::time_point end;
    double busy_s = 0;       // wall time of its computes, as measured
    double overshoot_s = 0;  // of which past their nominal durations
    int computes = 0;
    std::vector<Span> spans;  // named only after the run, to keep the timed loop to clock reads
};

// Interprets one rank's program: a compute sleeps its time, a send posts the
// rank's outgoing buffer, a recv blocks until its message is copied in, a
// wait finishes its send. Time starts at `start`, which every rank shares.
inline void run_rank(ThreadComm& comm, const loom::schedule::StepProgram& program,
                     const loom::schedule::StageTimes& times, int micro_batches, Clock::time_point start,
                     std::vector<float>& outgoing, std::vector<float>& incoming, std::vector<Request>& requests,
                     RankRun& out) {
    const loom::Tensor send_buffer = loom::Tensor::of(outgoing.data(), {message_floats});
    const loom::Tensor recv_buffer = loom::Tensor::of(incoming.data(), {message_floats});
    requests.resize(program.code.size());
    out.spans.reserve(program.code.size());
    std::this_thread::sleep_until(start);
    for (std::size_t i = 0; i < program.code.size(); ++i) {
        const auto& in = program.code[i];
        switch (in.op) {
            case Op::forward:
            case Op::backward:
            case Op::backward_input:
            case Op::backward_weight: {
                const double nominal_ms = loom::schedule::detail::duration_of(in.op, times);
                const auto t0 = Clock::now();
                std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double, std::milli>(nominal_ms)));
                const auto t1 = Clock::now();
                const double took = std::chrono::duration<double>(t1 - t0).count();
                out.busy_s += took;
                out.overshoot_s += took - nominal_ms * 1e-3;
                ++out.computes;
                out.spans.push_back({i, t0, t1});
                break;
            }
            case Op::send:
                requests[i] =
                    comm.send_async(send_buffer, in.peer, tag_of(in.payload, in.chunk, in.micro_batch, micro_batches));
                break;
            case Op::recv: {
                // The message left the neighbouring virtual stage: the one
                // before for an activation, the one after for a gradient.
                const int sender_chunk = in.chunk + (in.payload == Payload::activation ? -1 : 1);
                const auto t0 = Clock::now();
                comm.recv(recv_buffer, in.peer, tag_of(in.payload, sender_chunk, in.micro_batch, micro_batches));
                out.spans.push_back({i, t0, Clock::now()});
                break;
            }
            case Op::wait: requests[static_cast<std::size_t>(in.target)].wait(); break;
            default: break;  // zero_grads, optimizer_step: no time in this bench
        }
    }
    out.end = Clock::now();
}

// A rank's spans as trace events named as the simulator names its own
// ("F c2 mb3", "recv activation c2 mb3"): computes on lane 0, recvs on lane 1.
inline std::vector<loom::exec::TraceEvent> trace_events(const loom::schedule::StepProgram& program,
                                                        const std::vector<Span>& spans) {
    std::vector<loom::exec::TraceEvent> events;
    for (const Span& span : spans) {
        const auto& in = program.code[span.index];
        const std::string where = " c" + std::to_string(in.chunk) + " mb" + std::to_string(in.micro_batch);
        const bool recv = in.op == Op::recv;
        const double start = loom::exec::trace_clock_us(span.start);
        events.push_back({recv ? "recv " + std::string(name(in.payload)) + where
                               : loom::schedule::detail::letter_of(in.op) + where,
                          recv ? "recv" : std::string(name(in.op)),
                          recv ? loom::exec::communication_lane : loom::exec::compute_lane, start,
                          loom::exec::trace_clock_us(span.end) - start, 0, in.micro_batch});
    }
    return events;
}

// What a rank thread needs so that a synthetic compute lasts what it says and
// a woken rank runs at once, as on a device of its own; undone on leaving
// (rank 0 is the main thread).
//   - Timer slack 1 ns: the default 50 us would be added to every sleep.
//   - SCHED_FIFO at the lowest real-time priority, where the system allows it
//     (root or CAP_SYS_NICE): a woken normal thread can wait milliseconds
//     behind a neighbour's compile on this shared 2-core machine, and the
//     bench would book that as the schedule's bubble. Rank threads sleep or
//     block almost all the time, so they take little from anyone else.
//   - One core per rank when the ranks fit the cores: ThreadComm spins for
//     ~0.5 ms before sleeping when ranks <= cores, and a spinning rank must
//     not share its core with one whose sleep has just ended.
class RankThread {
public:
    RankThread(int rank, int ranks, bool realtime) {
        slack_ = prctl(PR_GET_TIMERSLACK, 0UL, 0UL, 0UL, 0UL);
        prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
        if (realtime && pthread_getschedparam(pthread_self(), &policy_, &param_) == 0) {
            const sched_param fifo{.sched_priority = 1};
            realtime_ = pthread_setschedparam(pthread_self(), SCHED_FIFO, &fifo) == 0;
        }
        if (sched_getaffinity(0, sizeof affinity_, &affinity_) == 0 && ranks <= CPU_COUNT(&affinity_)) {
            int seen = 0;
            for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
                if (!CPU_ISSET(cpu, &affinity_) || seen++ != rank) continue;
                cpu_set_t mine;
                CPU_ZERO(&mine);
                CPU_SET(cpu, &mine);
                pinned_ = sched_setaffinity(0, sizeof mine, &mine) == 0;
                break;
            }
        }
    }
    ~RankThread() {
        if (pinned_) sched_setaffinity(0, sizeof affinity_, &affinity_);
        if (realtime_) pthread_setschedparam(pthread_self(), policy_, &param_);
        prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack_), 0UL, 0UL, 0UL);
    }
    RankThread(const RankThread&) = delete;
    RankThread& operator=(const RankThread&) = delete;

    // Whether this process may run threads at real-time priority.
    static bool realtime_allowed() {
        bool ok = false;
        std::thread([&ok] {
            const sched_param fifo{.sched_priority = 1};
            ok = pthread_setschedparam(pthread_self(), SCHED_FIFO, &fifo) == 0;
        }).join();
        return ok;
    }

private:
    int slack_ = 0;
    int policy_ = SCHED_OTHER;
    sched_param param_{};
    bool realtime_ = false;
    cpu_set_t affinity_{};
    bool pinned_ = false;
};

// One repetition of one schedule, all ranks.
struct Repetition {
    double makespan_s = 0;
    double bubble = 0;
    double overshoot_s = 0;  // mean per compute
    std::vector<std::vector<loom::exec::TraceEvent>> events;  // events[r]
};

// Runs each program `reps` times after one warm-up on ThreadWorld(p), the
// schedules' repetitions interleaved. Returns [program][repetition].
inline std::vector<std::vector<Repetition>> measure(const std::vector<PipelineProgram>& programs, int p, int reps,
                                                    double stage_ms, bool realtime) {
    const std::size_t runs_total = programs.size() * static_cast<std::size_t>(reps + 1);
    std::vector<Clock::time_point> starts(runs_total);
    std::vector<std::vector<RankRun>> ranks(runs_total, std::vector<RankRun>(static_cast<std::size_t>(p)));
    loom::comm::ThreadWorld(p).run([&](ThreadComm& comm) {
        const RankThread setup(comm.rank(), p, realtime);
        const auto r = static_cast<std::size_t>(comm.rank());
        std::vector<float> outgoing(message_floats, 1.0f), incoming(message_floats, 0.0f);
        std::vector<Request> requests;
        for (std::size_t run = 0; run < runs_total; ++run) {
            const PipelineProgram& program = programs[run % programs.size()];
            // Once every rank has finished the previous run (the first
            // barrier; ranks end a program at different times), a start far
            // enough ahead that every rank is asleep before it comes, so none
            // starts late for having been slow to leave the second.
            comm.barrier();
            if (r == 0) starts[run] = Clock::now() + std::chrono::milliseconds(3);
            comm.barrier();
            run_rank(comm, program.ranks[r], chunk_times(stage_ms, program.chunks), program.micro_batches, starts[run],
                     outgoing, incoming, requests, ranks[run][r]);
        }
    });

    std::vector<std::vector<Repetition>> out(programs.size());
    for (std::size_t run = programs.size(); run < runs_total; ++run) {  // the first round is the warm-up
        Repetition rep;
        double busy = 0, overshoot = 0;
        int computes = 0;
        for (auto& rank : ranks[run]) {
            rep.makespan_s = std::max(rep.makespan_s, std::chrono::duration<double>(rank.end - starts[run]).count());
            busy += rank.busy_s;
            overshoot += rank.overshoot_s;
            computes += rank.computes;
            rep.events.push_back(trace_events(programs[run % programs.size()].ranks[rep.events.size()], rank.spans));
        }
        rep.bubble = 1 - busy / (p * rep.makespan_s);
        rep.overshoot_s = computes > 0 ? overshoot / computes : 0;
        out[run % programs.size()].push_back(std::move(rep));
    }
    return out;
}

}  // namespace bench::pipeline_runs
