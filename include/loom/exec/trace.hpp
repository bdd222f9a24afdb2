// Trace: what each rank computed and communicated, when, as Chrome trace
// events (chrome://tracing, ui.perfetto.dev; scripts/draw_trace.py makes a
// PNG). One process per rank, lane 0 its computation, lane 1 its
// communication. Times are steady_clock microseconds, which one machine
// shares across threads and processes (CLOCK_MONOTONIC); the file starts
// at the earliest event of any rank.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/staged.hpp"
#include "loom/core/tensor.hpp"
#include "loom/io/atomic_file.hpp"
#include "loom/io/json.hpp"

namespace loom::exec {

struct TraceEvent {
    std::string name;      // "backward blocks[2] Block"
    std::string category;  // forward, backward, optimizer, all_reduce, reduce_scatter, all_gather, wait, ...
    int lane = 0;          // 0 compute, 1 communication
    double start_us = 0, duration_us = 0;
    std::int64_t step = -1;
    int micro_batch = -1;
};

inline constexpr int compute_lane = 0;
inline constexpr int communication_lane = 1;

[[nodiscard]] inline double trace_clock_us(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

class Trace {
public:
    Trace() = default;
    explicit Trace(bool enabled) : enabled_(enabled) {}

    [[nodiscard]] bool enabled() const noexcept { return enabled_; }

    void add(TraceEvent event) {
        if (enabled_) events_.push_back(std::move(event));
    }
    void add(std::string name, std::string category, int lane, std::chrono::steady_clock::time_point start,
             std::chrono::steady_clock::time_point end, std::int64_t step, int micro_batch = -1) {
        if (!enabled_) return;
        const double s = trace_clock_us(start);
        events_.push_back({std::move(name), std::move(category), lane, s, std::max(0.0, trace_clock_us(end) - s), step,
                           micro_batch});
    }

    [[nodiscard]] const std::vector<TraceEvent>& events() const noexcept { return events_; }
    void clear() { events_.clear(); }

private:
    bool enabled_ = false;
    std::vector<TraceEvent> events_;
};

// The Chrome trace JSON of every rank's events (events[r] = rank r's).
[[nodiscard]] inline std::string chrome_trace_json(const std::vector<std::vector<TraceEvent>>& events) {
    double origin = std::numeric_limits<double>::infinity();
    for (const auto& rank : events)
        for (const auto& e : rank) origin = std::min(origin, e.start_us);
    if (!std::isfinite(origin)) origin = 0;
    std::ostringstream out;
    out.precision(3);
    out << std::fixed << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    const char* separator = "";
    for (std::size_t r = 0; r < events.size(); ++r) {
        out << separator << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << r
            << ",\"args\":{\"name\":\"rank " << r << "\"}},\n"
            << "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" << r << ",\"args\":{\"sort_index\":" << r << "}},\n"
            << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << r << ",\"tid\":0,\"args\":{\"name\":\"compute\"}},\n"
            << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << r
            << ",\"tid\":1,\"args\":{\"name\":\"communication\"}}";
        separator = ",\n";
        for (const auto& e : events[r]) {
            out << separator << "{\"ph\":\"X\",\"name\":" << io::json::quote(e.name) << ",\"cat\":"
                << io::json::quote(e.category) << ",\"pid\":" << r << ",\"tid\":" << e.lane
                << ",\"ts\":" << e.start_us - origin << ",\"dur\":" << e.duration_us << ",\"args\":{\"step\":" << e.step;
            if (e.micro_batch >= 0) out << ",\"micro_batch\":" << e.micro_batch;
            out << "}}";
        }
    }
    out << "\n]}\n";
    return out.str();
}

namespace detail {

// Events as text lines: name \t category \t lane \t start \t duration \t step \t mb.
[[nodiscard]] inline std::string serialize(const std::vector<TraceEvent>& events) {
    std::ostringstream out;
    out.precision(17);
    for (const auto& e : events)
        out << e.name << '\t' << e.category << '\t' << e.lane << '\t' << e.start_us << '\t' << e.duration_us << '\t'
            << e.step << '\t' << e.micro_batch << '\n';
    return out.str();
}

[[nodiscard]] inline std::vector<TraceEvent> deserialize(const std::string& text) {
    std::vector<TraceEvent> events;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream fields(line);
        TraceEvent e;
        std::string lane, start, duration, step, mb;
        std::getline(fields, e.name, '\t');
        std::getline(fields, e.category, '\t');
        std::getline(fields, lane, '\t');
        std::getline(fields, start, '\t');
        std::getline(fields, duration, '\t');
        std::getline(fields, step, '\t');
        std::getline(fields, mb, '\t');
        e.lane = std::stoi(lane);
        e.start_us = std::stod(start);
        e.duration_us = std::stod(duration);
        e.step = std::stoll(step);
        e.micro_batch = std::stoi(mb);
        events.push_back(std::move(e));
    }
    return events;
}

}  // namespace detail

// Collective over `comm`: every rank's events reach rank 0, which writes the
// trace file atomically. Works on any transport (the text travels as i32
// words through two all-gathers: lengths, then the padded texts), through
// device memory on `where` when `comm` moves a device's memory.
template <comm::Communicator C>
void write_trace(C& comm, const Trace& trace, const std::filesystem::path& path, Device where = host_device) {
    const std::string text = detail::serialize(trace.events());
    std::int32_t length = static_cast<std::int32_t>(text.size());
    std::vector<std::int32_t> lengths(static_cast<std::size_t>(comm.size()));
    comm::staged_all_gather(comm, Tensor::of(&length, {1}), Tensor::of(lengths.data(), {comm.size()}), where);
    std::int32_t longest = 0;
    for (auto l : lengths) longest = std::max(longest, l);
    const std::int64_t words = (longest + 3) / 4 + 1;
    std::vector<std::int32_t> mine(static_cast<std::size_t>(words), 0), all(static_cast<std::size_t>(words * comm.size()));
    std::memcpy(mine.data(), text.data(), text.size());
    comm::staged_all_gather(comm, Tensor::of(mine.data(), {words}), Tensor::of(all.data(), {words * comm.size()}), where);
    if (comm.rank() != 0) return;
    std::vector<std::vector<TraceEvent>> events;
    for (int r = 0; r < comm.size(); ++r) {
        const char* begin = reinterpret_cast<const char*>(all.data() + r * words);
        events.push_back(detail::deserialize(std::string(begin, static_cast<std::size_t>(lengths[static_cast<std::size_t>(r)]))));
    }
    io::write_file_atomically(path, chrome_trace_json(events));
}

}  // namespace loom::exec
