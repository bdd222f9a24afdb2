// The flight recorder: each rank keeps its last communicator calls in a ring,
// and writes them to a file when its communicator faults (a timeout, a failed
// rank, a mismatched call). tools/loom_flight.cpp merges the ranks' files and
// names where they diverged or which rank stalled (flight_report.hpp): when a
// job hangs or fails, the question is what every rank was doing, and by then
// the ranks can no longer be asked.
//
// Off unless LOOM_FLIGHT_RECORDER_DIR names a directory (read once, when the
// recorder is made): then one file per rank, `flight-rank<R>.tsv`, is written
// there. A record costs one clock read and one copy into the ring.
//
// File format (text, tab-separated; the reader is flight_report.hpp):
//   # loom flight recorder
//   rank <world rank> of <world size>
//   reason <the fault's sentence>
//   written <seconds>
//   then one line per call, oldest first:
//   <seq> <group> <call> <kind> <dtype> <count> <root> <op> <peer> <seconds> <readable call>
// seq counts this rank's calls over every communicator; group is the world
// ranks of the call's communicator ("0,1,2,3"); call is the collective's
// number in that communicator (-1 for send/recv, whose peer is a world rank).
// Times are the system clock's seconds since 1970, so that ranks compare: a
// call a rank entered after its peers had written their files (given up) is a
// late arrival.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

// One call as the recorder keeps it: fixed size, no allocation.
struct FlightRecord {
    std::int64_t seq = 0;    // this rank's call number over every communicator
    std::int32_t group = 0;  // index into FlightRecorder::groups()
    std::int64_t call = -1;  // the collective's number in its communicator; -1 for send/recv
    CallSignature sig;
    std::int32_t peer = -1;  // send/recv: the peer's world rank
    double seconds = 0;      // when the call started, system clock seconds since 1970
};

class FlightRecorder {
public:
    static constexpr std::size_t default_capacity = 512;

    // Enabled when `directory` is not empty; `capacity` calls are kept.
    FlightRecorder(std::string directory, int world_rank, int world_size,
                   std::size_t capacity = default_capacity)
        : directory_(std::move(directory)), rank_(world_rank), size_(world_size) {
        LOOM_CHECK(capacity > 0, "FlightRecorder: capacity is 0; keep at least one call");
        if (enabled()) ring_.resize(capacity);
    }

    // The directory LOOM_FLIGHT_RECORDER_DIR names, or "" (recorder off).
    [[nodiscard]] static std::string directory_from_environment() {
        const char* dir = std::getenv("LOOM_FLIGHT_RECORDER_DIR");
        return dir != nullptr ? std::string(dir) : std::string();
    }

    [[nodiscard]] bool enabled() const noexcept { return !directory_.empty(); }
    [[nodiscard]] int rank() const noexcept { return rank_; }

    // The index of a communicator's member list (world ranks), made once per
    // communicator so that a record holds a number, not the list.
    [[nodiscard]] std::int32_t group(const std::vector<int>& world_ranks) {
        std::string text;
        for (std::size_t i = 0; i < world_ranks.size(); ++i) {
            if (i != 0) text += ',';
            text += std::to_string(world_ranks[i]);
        }
        const std::lock_guard lock(mutex_);
        for (std::size_t i = 0; i < groups_.size(); ++i)
            if (groups_[i] == text) return static_cast<std::int32_t>(i);
        groups_.push_back(std::move(text));
        return static_cast<std::int32_t>(groups_.size() - 1);
    }

    void record(std::int32_t group, std::int64_t call, const CallSignature& sig, std::int32_t peer = -1) {
        if (!enabled()) return;
        const double seconds = now();
        const std::lock_guard lock(mutex_);
        ring_[static_cast<std::size_t>(next_ % ring_.size())] =
            FlightRecord{static_cast<std::int64_t>(next_), group, call, sig, peer, seconds};
        ++next_;
    }

    // The kept records, oldest first.
    [[nodiscard]] std::vector<FlightRecord> records() const {
        const std::lock_guard lock(mutex_);
        std::vector<FlightRecord> out;
        if (!enabled()) return out;
        const std::uint64_t kept = std::min<std::uint64_t>(next_, ring_.size());
        for (std::uint64_t s = next_ - kept; s < next_; ++s) out.push_back(ring_[static_cast<std::size_t>(s % ring_.size())]);
        return out;
    }

    [[nodiscard]] std::string path() const { return directory_ + "/flight-rank" + std::to_string(rank_) + ".tsv"; }

    // The file's text (see the format above).
    [[nodiscard]] std::string text(const std::string& reason) const {
        std::ostringstream out;
        out.precision(17);
        out << "# loom flight recorder\nrank " << rank_ << " of " << size_ << "\nreason ";
        for (char c : reason) out << (c == '\n' || c == '\t' ? ' ' : c);
        out << "\nwritten " << now() << '\n';
        const auto kept = records();
        const std::lock_guard lock(mutex_);
        for (const FlightRecord& r : kept)
            out << r.seq << '\t' << groups_[static_cast<std::size_t>(r.group)] << '\t' << r.call << '\t'
                << static_cast<int>(r.sig.kind) << '\t' << static_cast<int>(r.sig.dtype) << '\t' << r.sig.count
                << '\t' << r.sig.root << '\t' << static_cast<int>(r.sig.op) << '\t' << r.peer << '\t' << r.seconds
                << '\t' << r.sig << '\n';
        return out.str();
    }

    // Writes the file (when enabled). Called on a fault, so it never throws:
    // a recorder that cannot write must not hide the fault it records.
    void write(const std::string& reason) const noexcept {
        if (!enabled()) return;
        try {
            const std::string contents = text(reason);
            // Under ThreadWorld a rank's own write and the fault's write-all may meet.
            const std::lock_guard lock(file_mutex_);
            std::ofstream file(path(), std::ios::trunc);
            file << contents;
        } catch (...) {
        }
    }

private:
    [[nodiscard]] static double now() {
        return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    }

    std::string directory_;
    int rank_ = 0;
    int size_ = 1;
    mutable std::mutex mutex_;  // a communicator may move between threads; the lock is uncontended
    mutable std::mutex file_mutex_;
    std::vector<FlightRecord> ring_;
    std::uint64_t next_ = 0;
    std::vector<std::string> groups_;
};

}  // namespace loom::comm
