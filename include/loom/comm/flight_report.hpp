// Reading the flight recorder's files (flight_recorder.hpp) back and merging
// them: which rank and call diverged from the others, which rank stalled. The
// merge compares the ranks of each communicator (group) call by call, by the
// call's number in that communicator, since that number is what every member
// of a collective shares; send/recv have none and are listed, not compared.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

struct FlightEntry {
    std::int64_t seq = 0;
    std::string group;       // world ranks of the communicator, "0,1,2,3"
    std::int64_t call = -1;  // -1 for send/recv
    CallSignature sig;
    std::int32_t peer = -1;
    double seconds = 0;
};

// One rank's file.
struct FlightLog {
    int rank = -1;
    int size = 0;
    std::string reason;
    double written = 0;                // when the file was written: when this rank gave up
    std::vector<FlightEntry> entries;  // oldest first
};

// Parses one file's text; `name` is what errors call it.
[[nodiscard]] inline FlightLog parse_flight_log(std::string_view text, const std::string& name) {
    FlightLog log;
    std::istringstream in{std::string(text)};
    std::string line;
    int number = 0;
    while (std::getline(in, line)) {
        ++number;
        if (line.empty() || line[0] == '#') continue;
        if (line.rfind("rank ", 0) == 0) {
            std::istringstream words(line.substr(5));
            std::string of;
            words >> log.rank >> of >> log.size;
            LOOM_CHECK(words && of == "of" && log.rank >= 0 && log.rank < log.size, name, ":", number,
                       ": expected 'rank R of N' with 0 <= R < N, got '", line, "'");
            continue;
        }
        if (line.rfind("reason ", 0) == 0) {
            log.reason = line.substr(7);
            continue;
        }
        if (line.rfind("written ", 0) == 0) {
            std::istringstream words(line.substr(8));
            LOOM_CHECK(static_cast<bool>(words >> log.written), name, ":", number, ": expected 'written <seconds>', got '",
                       line, "'");
            continue;
        }
        std::istringstream words(line);
        FlightEntry e;
        int kind = 0, dtype = 0, op = 0;
        words >> e.seq >> e.group >> e.call >> kind >> dtype >> e.sig.count >> e.sig.root >> op >> e.peer >> e.seconds;
        LOOM_CHECK(words && kind >= 0 && kind <= static_cast<int>(OpKind::split) && dtype >= 0 && op >= 0, name, ":",
                   number, ": expected a record '<seq> <group> <call> <kind> <dtype> <count> <root> <op> <peer> "
                   "<seconds> ...', got '", line, "'");
        e.sig.kind = static_cast<OpKind>(kind);
        e.sig.dtype = static_cast<DType>(dtype);
        e.sig.op = static_cast<ReduceOp>(op);
        log.entries.push_back(std::move(e));
    }
    LOOM_CHECK(log.rank >= 0, name, ": no 'rank R of N' line; is this a loom flight recorder file?");
    return log;
}

[[nodiscard]] inline FlightLog read_flight_log(const std::string& path) {
    std::ifstream file(path);
    LOOM_CHECK(file.good(), "cannot read the flight recorder file ", path);
    std::ostringstream text;
    text << file.rdbuf();
    return parse_flight_log(text.str(), path);
}

namespace detail {

[[nodiscard]] inline std::string rank_list(const std::vector<int>& ranks) {
    std::string out = ranks.size() == 1 ? "world rank " : "world ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) {
        if (i != 0) out += ", ";
        out += std::to_string(ranks[i]);
    }
    return out;
}

}  // namespace detail

// The merged report, one finding a line:
//   diverged: the first call (lowest number, per group) where the ranks'
//             signatures differ, the odd ranks against the most common one;
//   stalled:  a rank that wrote no file (stopped, killed, or stuck outside
//             loom), a rank whose last call in a group is behind the others',
//             or a rank that entered a call after a peer in it had given up.
[[nodiscard]] inline std::vector<std::string> merge_flight_logs(const std::vector<FlightLog>& logs) {
    LOOM_CHECK(!logs.empty(), "loom-flight: no flight recorder files to merge");
    struct Seen {
        CallSignature sig;
        double seconds;
    };
    // group -> call -> world rank -> what it called, when.
    std::map<std::string, std::map<std::int64_t, std::map<int, Seen>>> calls;
    std::map<int, const FlightLog*> by_rank;
    for (const FlightLog& log : logs) {
        LOOM_CHECK(log.size == logs.front().size, "loom-flight: world rank ", log.rank, "'s file is of a ", log.size,
                   "-rank job, world rank ", logs.front().rank, "'s of a ", logs.front().size,
                   "-rank one; merge the files of one job");
        LOOM_CHECK(by_rank.emplace(log.rank, &log).second, "loom-flight: two files of world rank ", log.rank,
                   "; merge one file per rank");
        for (const FlightEntry& e : log.entries)
            if (e.call >= 0) calls[e.group][e.call][log.rank] = Seen{e.sig, e.seconds};
    }
    std::vector<std::string> report;

    for (const auto& [group, by_call] : calls) {
        for (const auto& [call, seen] : by_call) {
            std::map<std::string, std::vector<int>> variants;  // readable signature -> ranks
            for (const auto& [rank, s] : seen) variants[loom::detail::concat(s.sig)].push_back(rank);
            if (variants.size() < 2) continue;
            const auto common = std::max_element(variants.begin(), variants.end(), [](const auto& a, const auto& b) {
                return a.second.size() < b.second.size() ||
                       (a.second.size() == b.second.size() && a.second[0] > b.second[0]);
            });
            for (const auto& [text, ranks] : variants)
                if (text != common->first)
                    report.push_back(loom::detail::concat("diverged: call ", call, " of group [", group, "]: ",
                                                          detail::rank_list(ranks), " called ", text, ", ",
                                                          detail::rank_list(common->second), " called ",
                                                          common->first));
            break;
        }
    }

    for (int r = 0; r < logs.front().size; ++r) {
        if (by_rank.count(r) != 0) continue;
        const FlightLog& other = *by_rank.begin()->second;
        std::string where = "no calls recorded";
        for (auto it = other.entries.rbegin(); it != other.entries.rend(); ++it)
            if (it->call >= 0) {
                where = loom::detail::concat("call ", it->call, " of group [", it->group, "] (", it->sig, ")");
                break;
            }
        report.push_back(loom::detail::concat("stalled: world rank ", r,
                                              " wrote no file (stopped, killed, or stuck outside loom); world rank ",
                                              other.rank, "'s last call was ", where));
    }

    for (const auto& [group, by_call] : calls) {
        std::map<int, std::int64_t> last;  // world rank -> its last call in this group
        for (const auto& [call, seen] : by_call)
            for (const auto& [rank, s] : seen) last[rank] = call;
        std::int64_t furthest = -1;
        for (const auto& [rank, call] : last) furthest = std::max(furthest, call);
        std::vector<int> front;
        for (const auto& [rank, call] : last)
            if (call == furthest) front.push_back(rank);
        const CallSignature& ahead = by_call.at(furthest).at(front.front()).sig;
        for (const auto& [rank, call] : last)
            if (call < furthest)
                report.push_back(loom::detail::concat("stalled: world rank ", rank, " in group [", group,
                                                      "]: its last call was ", call, " (",
                                                      by_call.at(call).at(rank).sig, "); ", detail::rank_list(front),
                                                      " reached call ", furthest, " (", ahead, ")"));
        // Late arrivals: entered a call after a peer that made it had given up.
        std::map<int, bool> named;
        for (const auto& [call, seen] : by_call)
            for (const auto& [rank, s] : seen)
                for (const auto& [peer, t] : seen) {
                    const double gave_up = by_rank.at(peer)->written;
                    if (peer == rank || named[rank] || gave_up <= t.seconds || s.seconds <= gave_up) continue;
                    named[rank] = true;
                    report.push_back(loom::detail::concat("stalled: world rank ", rank, " arrived late at call ",
                                                          call, " of group [", group, "] (", s.sig, "), ",
                                                          s.seconds - gave_up, " s after world rank ", peer,
                                                          " had given up"));
                }
    }
    if (report.empty()) report.emplace_back("no divergence and no stall found in the recorded calls");
    return report;
}

}  // namespace loom::comm
