// The step simulator: when would each instruction of every rank's step
// program run, given what each one costs? It is the planner's clock
// (plan/cost_model.hpp prices the executor's own programs and hands them
// here), under the semantics the executor and Shaped<Comm> run them by:
//   - a rank runs its program in order; a compute instruction occupies its
//     CPU for `work` seconds at full speed, then waits `comm` seconds off
//     the CPU (tensor and sequence parallelism's exchanges inside a layer);
//   - a send is issued at once and arrives `comm` seconds later; a recv
//     blocks until it has arrived; waiting on a send blocks until then too;
//   - a collective starts when every member has issued it and the previous
//     collective of its group has ended (they queue on the group's links),
//     and takes `comm` seconds; a blocking one is issued and waited at once;
//   - ranks that share cores (rank threads on one machine) run by processor
//     sharing: with `active` compute-busy devices on `cores` cores, each
//     runs at min(1, cores / active) of its speed;
//   - where a pool's devices outnumber its cores, every exchange a rank
//     blocks on costs it `wake` more CPU seconds on the pool (the thread
//     gave its core away and comes back after the scheduler's turn, with
//     cold caches): after a wait that blocked, and per exchange inside a
//     compute step; and per asynchronous collective, which the rank's
//     progress thread runs (comm::ThreadComm), one more thread to wake.
//     plan/measure.hpp's measure_exchange_seconds times it.
// Event driven: time jumps from one completion to the next.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::plan {

// One instruction as the simulator sees it.
struct SimStep {
    enum class Kind : std::uint8_t { compute, send, recv, collective, wait, instant };
    Kind kind = Kind::instant;
    double work = 0;          // compute: CPU seconds at full speed
    double comm = 0;          // compute: seconds off the CPU after the work; send: transfer; collective: its cost
    int peer = -1;            // send / recv: the other simulated rank
    std::int64_t tag = 0;     // send / recv: what matches them (same on both sides)
    int group = -1;           // collective: its group (members listed in SimProgram::groups)
    bool blocking = false;    // collective: waited at once
    int target = -1;          // wait: the index of the send or collective it finishes
    int source = -1;          // the instruction of the step program it prices, for traces
    const char* label = "";   // "F", "B", "W", "opt", "send", "recv", "reduce", "gather", "loss", ...
    int micro_batch = -1;
    int syncs = 0;            // compute: the exchanges inside it that each wait for every member
};

struct SimProgram {
    std::vector<std::vector<SimStep>> ranks;     // one program per simulated rank
    std::vector<std::vector<int>> groups;        // collective group -> its simulated ranks
    std::vector<int> devices;                    // simulated rank -> devices it stands for (processor sharing)
    std::vector<int> pool;                       // simulated rank -> its core pool, -1: none
    std::vector<double> pool_cores;              // cores of each pool
    // CPU seconds of its pool's cores a rank thread's blocking exchange costs
    // where the pool's devices outnumber its cores (the scheduler's turn and
    // the caches it refills): paid after each wait that blocked, and per
    // exchange inside a compute step.
    double wake = 0;
};

struct SimEvent {
    const char* label = "";
    int micro_batch = -1;
    int source = -1;
    int lane = 0;  // 0 compute, 1 communication
    double start = 0, duration = 0;
};

struct SimResult {
    double makespan = 0;
    std::vector<double> finish;                  // when each simulated rank ended
    std::vector<double> busy;                    // CPU seconds at full speed per rank
    std::vector<std::vector<SimEvent>> events;   // filled when asked for
};

namespace detail {

class StepSimulator {
public:
    StepSimulator(const SimProgram& program, bool record) : p_(program), record_(record) {
        const std::size_t n = p_.ranks.size();
        LOOM_CHECK(n > 0, "simulate: no ranks to simulate");
        LOOM_CHECK(p_.devices.size() == n && p_.pool.size() == n, "simulate: ", p_.devices.size(), " device counts and ",
                   p_.pool.size(), " pools for ", n, " ranks");
        state_.resize(n);
        issued_.resize(n);
        collective_index_.assign(n, std::vector<int>(p_.groups.size(), 0));
        instances_.resize(p_.groups.size());
        lane_free_.assign(p_.groups.size(), 0.0);
        result_.finish.assign(n, 0.0);
        result_.busy.assign(n, 0.0);
        if (record_) result_.events.resize(n);
        for (std::size_t r = 0; r < n; ++r) issued_[r].assign(p_.ranks[r].size(), -1.0);
    }

    SimResult run() {
        const std::size_t n = p_.ranks.size();
        for (;;) {
            // Run every rank through its zero-time instructions until nothing moves.
            for (bool moved = true; moved;) {
                moved = false;
                for (std::size_t r = 0; r < n; ++r)
                    if (state_[r].phase == Phase::ready) moved = advance(static_cast<int>(r)) || moved;
            }
            if (std::all_of(state_.begin(), state_.end(), [](const State& s) { return s.phase == Phase::done; })) break;
            step_time();
        }
        for (double f : result_.finish) result_.makespan = std::max(result_.makespan, f);
        return std::move(result_);
    }

private:
    enum class Phase : std::uint8_t { ready, computing, sleeping, done };
    struct State {
        Phase phase = Phase::ready;
        std::size_t pc = 0;
        double remaining = 0;  // computing: CPU seconds left at full speed
        double then = 0;       // computing: comm seconds after it
        double until = 0;      // sleeping: wake-up time
        double owed = 0;       // sleeping: CPU seconds of the turn it pays on waking
        double blocked = -1;   // since when it waits for a peer to issue its side; -1: not waiting
        double started = 0;
    };
    struct Instance {
        int issued = 0;
        double last_issue = 0;
        double end = -1;  // known once every member has issued it
    };

    // Moves rank r on from a ready state; true if it did anything.
    bool advance(int r) {
        State& s = state_[static_cast<std::size_t>(r)];
        const auto& code = p_.ranks[static_cast<std::size_t>(r)];
        bool moved = false;
        while (s.phase == Phase::ready) {
            if (s.pc == code.size()) {
                s.phase = Phase::done;
                result_.finish[static_cast<std::size_t>(r)] = now_;
                return true;
            }
            const SimStep& in = code[s.pc];
            switch (in.kind) {
                case SimStep::Kind::compute:
                    s.phase = Phase::computing;
                    s.remaining = in.work + (in.syncs > 0 && oversubscribed(r) ? in.syncs * p_.wake : 0.0);
                    s.then = in.comm;
                    s.started = now_;
                    result_.busy[static_cast<std::size_t>(r)] += in.work;
                    ++s.pc;
                    return true;
                case SimStep::Kind::instant:
                    break;
                case SimStep::Kind::send:
                    issued_[static_cast<std::size_t>(r)][s.pc] = now_;
                    sent_[{r, in.peer, in.tag}] = now_ + in.comm;
                    note(r, in, 1, now_, in.comm);
                    break;
                case SimStep::Kind::recv: {
                    const auto it = sent_.find({in.peer, r, in.tag});
                    if (it == sent_.end()) return block(r, moved);  // its send has not been issued
                    if (!sleep_until(r, it->second, in)) return true;
                    break;
                }
                case SimStep::Kind::collective: {
                    if (issued_[static_cast<std::size_t>(r)][s.pc] < 0) {
                        issue(r, in);
                        issued_[static_cast<std::size_t>(r)][s.pc] = now_;
                        moved = true;
                        if (!in.blocking && oversubscribed(r)) {
                            // It runs on the rank's progress thread (comm::ThreadComm's
                            // async calls): one more thread to wake on the pool's cores.
                            s.phase = Phase::computing;
                            s.remaining = p_.wake;
                            s.then = 0;
                            s.started = now_;
                            ++s.pc;
                            return true;
                        }
                    }
                    if (in.blocking) {
                        const double end = collective_end(r, s.pc);
                        if (end < 0) return block(r, moved);  // a member has not issued it yet
                        if (!sleep_until(r, end, in)) return true;
                    }
                    break;
                }
                case SimStep::Kind::wait: {
                    const auto t = static_cast<std::size_t>(in.target);
                    LOOM_CHECK(in.target >= 0 && t < s.pc && issued_[static_cast<std::size_t>(r)][t] >= 0,
                               "simulate: rank ", r, " waits on instruction ", in.target, " before issuing it");
                    const SimStep& what = code[t];
                    const double end = what.kind == SimStep::Kind::send ? issued_[static_cast<std::size_t>(r)][t] + what.comm
                                                                        : collective_end(r, t);
                    if (end < 0) return block(r, moved);  // a member has not issued it yet
                    if (!sleep_until(r, end, in)) return true;
                    break;
                }
            }
            ++s.pc;
            moved = true;
        }
        return moved;
    }

    // Sleeps rank r until `end` if that is later; false if it now sleeps
    // (the instruction completes when it wakes).
    // A rank that blocked (waiting for a peer to issue its side, or for the
    // exchange to end) pays its turn on the pool when it runs again.
    bool sleep_until(int r, double end, const SimStep& in) {
        State& s = state_[static_cast<std::size_t>(r)];
        const bool waited = s.blocked >= 0 && now_ > s.blocked + epsilon;
        s.blocked = -1;
        const double owed = (waited || end > now_ + epsilon) && oversubscribed(r) ? p_.wake : 0.0;
        if (end <= now_ + epsilon) {
            if (owed <= 0) return true;
            s.phase = Phase::computing;
            s.remaining = owed;
            s.then = 0;
            s.started = now_;
            ++s.pc;
            return false;
        }
        note(r, in, 1, now_, end - now_);
        s.phase = Phase::sleeping;
        s.until = end;
        s.owed = owed;
        ++s.pc;
        return false;
    }

    // Rank r cannot pass its instruction until a peer issues its side: it blocks from now.
    bool block(int r, bool moved) {
        State& s = state_[static_cast<std::size_t>(r)];
        if (s.blocked < 0) s.blocked = now_;
        return moved;
    }

    void issue(int r, const SimStep& in) {
        const auto g = static_cast<std::size_t>(in.group);
        LOOM_CHECK(in.group >= 0 && g < p_.groups.size(), "simulate: collective group ", in.group, " of ",
                   p_.groups.size());
        const int k = collective_index_[static_cast<std::size_t>(r)][g]++;
        auto& list = instances_[g];
        if (static_cast<int>(list.size()) <= k) list.resize(static_cast<std::size_t>(k) + 1);
        Instance& at = list[static_cast<std::size_t>(k)];
        at.issued += 1;
        at.last_issue = std::max(at.last_issue, now_);
        if (at.issued == static_cast<int>(p_.groups[g].size())) {
            at.end = std::max(at.last_issue, lane_free_[g]) + in.comm;
            lane_free_[g] = at.end;
        }
        position_[{r, static_cast<int>(state_[static_cast<std::size_t>(r)].pc)}] = {static_cast<int>(g), k};
    }

    [[nodiscard]] double collective_end(int r, std::size_t index) const {
        const auto it = position_.find({r, static_cast<int>(index)});
        LOOM_CHECK(it != position_.end(), "simulate: rank ", r, " waits on instruction ", index,
                   ", which is not a send or a collective");
        return instances_[static_cast<std::size_t>(it->second.first)][static_cast<std::size_t>(it->second.second)].end;
    }

    void note(int r, const SimStep& in, int lane, double start, double duration) {
        if (record_ && duration > 0)
            result_.events[static_cast<std::size_t>(r)].push_back({in.label, in.micro_batch, in.source, lane, start, duration});
    }

    // Advances the clock to the next completion.
    void step_time() {
        const std::size_t n = p_.ranks.size();
        std::vector<double> active(p_.pool_cores.size(), 0.0);
        for (std::size_t r = 0; r < n; ++r)
            if (state_[r].phase == Phase::computing && p_.pool[r] >= 0)
                active[static_cast<std::size_t>(p_.pool[r])] += p_.devices[r];
        rate_.assign(n, 1.0);
        double next = std::numeric_limits<double>::infinity();
        for (std::size_t r = 0; r < n; ++r) {
            const State& s = state_[r];
            if (s.phase == Phase::computing) {
                if (p_.pool[r] >= 0) {
                    const double busy = active[static_cast<std::size_t>(p_.pool[r])];
                    rate_[r] = std::min(1.0, p_.pool_cores[static_cast<std::size_t>(p_.pool[r])] / busy);
                }
                next = std::min(next, now_ + s.remaining / rate_[r]);
            } else if (s.phase == Phase::sleeping) {
                next = std::min(next, s.until);
            }
        }
        if (next == std::numeric_limits<double>::infinity()) fail_stuck();
        const double dt = next - now_;
        const double before = now_;
        now_ = next;
        for (std::size_t r = 0; r < n; ++r) {
            State& s = state_[r];
            if (s.phase == Phase::computing) {
                // The rank whose completion chose `next` completes, whatever
                // rounding did to dt: far from 0 a double's step exceeds any
                // fixed tolerance (about 1e-7 s near 1e9 s), and leaving a
                // residue there stopped the clock for good. Event driven,
                // every call moves at least one rank on, so the run ends.
                const bool chosen = before + s.remaining / rate_[r] <= next;
                s.remaining -= dt * rate_[r];
                if (!chosen && s.remaining > epsilon * std::max(1.0, rate_[r])) continue;
                const SimStep& in = p_.ranks[r][s.pc - 1];
                note(static_cast<int>(r), in, 0, s.started, now_ - s.started);
                const double then = s.then;
                s.then = 0;
                if (then > 0) {
                    s.phase = Phase::sleeping;
                    s.until = now_ + then;
                    note(static_cast<int>(r), in, 1, now_, then);
                } else {
                    s.phase = Phase::ready;
                }
            } else if (s.phase == Phase::sleeping && s.until <= now_ + epsilon) {
                if (s.owed > 0) {
                    // Back from a blocking wait: its turn runs on the pool first.
                    s.phase = Phase::computing;
                    s.remaining = s.owed;
                    s.started = now_;
                    s.owed = 0;
                } else {
                    s.phase = Phase::ready;
                }
            }
        }
    }

    // Whether r's pool has more device threads than cores, so a thread that
    // blocks gives its core to another and queues for it again. A static
    // rule, not whether the others compute at this instant: a blocked thread
    // waits for the scheduler whichever threads hold the cores, and the price
    // of a program then does not hang on its own simulated timing.
    [[nodiscard]] bool oversubscribed(int r) const {
        if (p_.wake <= 0) return false;
        const int pool = p_.pool[static_cast<std::size_t>(r)];
        if (pool < 0) return false;
        double threads = 0;
        for (std::size_t k = 0; k < state_.size(); ++k)
            if (p_.pool[k] == pool) threads += p_.devices[k];
        return threads > p_.pool_cores[static_cast<std::size_t>(pool)];
    }

    [[noreturn]] void fail_stuck() const {
        std::ostringstream stuck;
        for (std::size_t r = 0; r < p_.ranks.size(); ++r)
            if (state_[r].phase != Phase::done)
                stuck << " rank " << r << " at #" << p_.ranks[r][state_[r].pc].source;
        LOOM_FAIL("simulate: the step never finishes; blocked:", stuck.str());
    }

    static constexpr double epsilon = 1e-12;

    const SimProgram& p_;
    bool record_;
    double now_ = 0;
    std::vector<State> state_;
    std::vector<double> rate_;
    std::vector<std::vector<double>> issued_;                  // per rank, per instruction: when it was issued
    std::map<std::tuple<int, int, std::int64_t>, double> sent_;  // (from, to, tag) -> arrival
    std::vector<std::vector<int>> collective_index_;           // per rank, per group: collectives issued
    std::vector<std::vector<Instance>> instances_;             // per group, in issue order
    std::vector<double> lane_free_;                            // per group: when its last collective ends
    std::map<std::pair<int, int>, std::pair<int, int>> position_;  // (rank, instruction) -> (group, instance)
    SimResult result_;
};

}  // namespace detail

// Runs `program` to its end; `record` keeps every event for a trace.
// Throws loom::Error naming the blocked ranks if it can never finish.
[[nodiscard]] inline SimResult simulate_steps(const SimProgram& program, bool record = false) {
    return detail::StepSimulator(program, record).run();
}

}  // namespace loom::plan
