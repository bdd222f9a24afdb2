// A simulated pipeline schedule as a Chrome trace, drawn like a measured one
// (scripts/draw_trace.py). Lives in exec/ because schedule/ sits below exec/
// and may not include trace.hpp; the simulator's events mirror TraceEvent.
#pragma once

#include <filesystem>
#include <vector>

#include "loom/exec/trace.hpp"
#include "loom/io/atomic_file.hpp"
#include "loom/schedule/simulate.hpp"

namespace loom::exec {

// One simulated time unit in trace microseconds: a unit reads as 1 ms, so
// draw_trace.py's millisecond axis counts units.
inline constexpr double schedule_unit_us = 1000.0;

// events[r] = rank r's events, step 0; lane 0 compute, lane 1 p2p.
[[nodiscard]] inline std::vector<std::vector<TraceEvent>> schedule_trace_events(const schedule::Simulation& sim) {
    std::vector<std::vector<TraceEvent>> events(sim.events.size());
    for (std::size_t r = 0; r < sim.events.size(); ++r)
        for (const auto& e : sim.events[r])
            events[r].push_back({e.name, e.category, e.lane, e.start * schedule_unit_us, e.duration * schedule_unit_us,
                                 0, e.micro_batch});
    return events;
}

// Writes the simulation's Chrome trace JSON to `path`, atomically.
inline void write_schedule_trace(const schedule::Simulation& sim, const std::filesystem::path& path) {
    io::write_file_atomically(path, chrome_trace_json(schedule_trace_events(sim)));
}

}  // namespace loom::exec
