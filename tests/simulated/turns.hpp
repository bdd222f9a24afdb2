// The turn orders of the warp simulator (warp_simulator.hpp): in which
// order a block's fibers take turns, chosen by LOOM_SIM_TURNS. Which of two
// threads' accesses that no barrier orders comes first is the hardware's
// choice on a GPU, so a kernel must give the same results under each, and a
// missing barrier shows under one or another.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loom_sim {

// The order of the turns (LOOM_SIM_TURNS), which decides which of two
// threads' accesses that no barrier orders comes first. On a GPU that is
// the hardware's choice, so a kernel must give the same results under each:
//   sweeps          every thread in turn, first to last, then last to first
//                   (the default): warps in step, and a read and a write of
//                   the same phase run both ways round;
//   warps           the first warp with a thread that can run, alone, until
//                   it waits at a __syncthreads (or ends), then the next: one
//                   warp far ahead of the others, so that it overwrites what
//                   a later warp has yet to read, or reads what a later warp
//                   has yet to write, where a __syncthreads is missing;
//   warps-reversed  the same from the last warp.
// ctest runs the kernel tests under each (the simulator's own, under sweeps).
enum class Turns { sweeps, warps, warps_reversed };

inline Turns turns_from_environment() {
    const char* name = std::getenv("LOOM_SIM_TURNS");
    if (name == nullptr || *name == 0 || std::strcmp(name, "sweeps") == 0) return Turns::sweeps;
    if (std::strcmp(name, "warps") == 0) return Turns::warps;
    if (std::strcmp(name, "warps-reversed") == 0) return Turns::warps_reversed;
    std::fprintf(stderr, "warp_simulator: LOOM_SIM_TURNS=%s is not a turn order; use sweeps, warps or warps-reversed\n",
                 name);
    std::abort();
}
inline Turns turns = turns_from_environment();  // tests of the simulator itself may set it

// The fibers a sweep visits: [first, first + count).
struct Sweep {
    int first = 0, count = 0;
};

// The next sweep over a block of `threads` fibers, of which can_run(t) says
// whether fiber t can take a turn: the whole block, or (Turns::warps,
// warps_reversed) the first warp in that order with a fiber that can run
// (the whole block when none can, which then makes no progress).
template <class CanRun>
Sweep next_sweep(Turns order, int threads, CanRun can_run) {
    if (order == Turns::sweeps) return {0, threads};
    const int warps = threads / 32;
    for (int i = 0; i < warps; ++i) {
        const int warp = order == Turns::warps ? i : warps - 1 - i;
        for (int lane = 0; lane < 32; ++lane)
            if (can_run(32 * warp + lane)) return {32 * warp, 32};
    }
    return {0, threads};
}

}  // namespace loom_sim
