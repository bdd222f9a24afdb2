// Links: the bandwidth and latency between every pair of ranks, and what a
// collective costs over them. Shaped<Comm> sleeps for these costs so a slow or
// heterogeneous cluster can be studied on one machine.
//
//   auto links = Links::nodes(8, 4, Link::unlimited(), Link::gbit(10, 5e-6));
//   // ranks 0-3 and 4-7 are two nodes joined by 10 Gbit/s with 5 us latency
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/error.hpp"

namespace loom::comm {

struct Link {
    double bytes_per_second = std::numeric_limits<double>::infinity();
    double latency_seconds = 0;

    [[nodiscard]] static Link unlimited() { return {}; }
    [[nodiscard]] static Link gbit(double gigabits_per_second, double latency_seconds = 0) {
        return checked(gigabits_per_second * 1e9 / 8, latency_seconds);
    }
    [[nodiscard]] static Link gbytes(double gigabytes_per_second, double latency_seconds = 0) {
        return checked(gigabytes_per_second * 1e9, latency_seconds);
    }
    // Seconds to move `bytes` across this link.
    [[nodiscard]] double seconds(double bytes) const {
        return latency_seconds + (bytes > 0 ? bytes / bytes_per_second : 0.0);
    }

    friend bool operator==(const Link&, const Link&) = default;
    friend std::ostream& operator<<(std::ostream& out, const Link& link) {
        if (std::isinf(link.bytes_per_second)) out << "unlimited";
        else out << link.bytes_per_second * 8 / 1e9 << " Gbit/s";
        if (link.latency_seconds > 0) out << " + " << link.latency_seconds * 1e6 << " us";
        return out;
    }

private:
    static Link checked(double bytes_per_second, double latency_seconds) {
        LOOM_CHECK(bytes_per_second > 0 && std::isfinite(bytes_per_second), "Link: bandwidth ",
                   bytes_per_second, " bytes/s must be positive and finite (Link::unlimited() for none)");
        LOOM_CHECK(latency_seconds >= 0 && std::isfinite(latency_seconds), "Link: latency ", latency_seconds,
                   " s must be 0 or more");
        return {bytes_per_second, latency_seconds};
    }
};

// The link of every ordered pair of world ranks.
class Links {
public:
    explicit Links(int ranks, Link everywhere = Link::unlimited())
        : ranks_(ranks), links_(static_cast<std::size_t>(ranks) * static_cast<std::size_t>(ranks), everywhere) {
        LOOM_CHECK(ranks >= 1, "Links: ", ranks, " ranks; a world has at least 1");
    }

    // `ranks` ranks in nodes of `per_node` consecutive ranks: `intra` inside a
    // node, `inter` between nodes.
    [[nodiscard]] static Links nodes(int ranks, int per_node, Link intra, Link inter) {
        LOOM_CHECK(per_node >= 1 && ranks % per_node == 0, "Links::nodes: ", ranks, " ranks do not split into nodes of ",
                   per_node, "; use a divisor of ", ranks);
        Links links(ranks, intra);
        for (int a = 0; a < ranks; ++a)
            for (int b = 0; b < ranks; ++b)
                if (a / per_node != b / per_node) links.set(a, b, inter);
        return links;
    }

    Links& set(int a, int b, Link link) {
        check_rank(a);
        check_rank(b);
        links_[index(a, b)] = link;
        return *this;
    }

    [[nodiscard]] int ranks() const noexcept { return ranks_; }
    [[nodiscard]] const Link& between(int a, int b) const {
        check_rank(a);
        check_rank(b);
        return links_[index(a, b)];
    }

    // Seconds a collective takes over the ring of `members` (world ranks, in
    // group order), `bytes` being the full array as nccl-tests counts it. A
    // ring step moves one chunk over every edge at once: the slowest edge sets
    // its pace.
    [[nodiscard]] double cost(OpKind kind, const std::vector<int>& members, double bytes, int root = 0) const {
        const auto n = static_cast<int>(members.size());
        if (n <= 1 || kind == OpKind::split) return 0;
        auto ring_step = [&](double chunk) {
            double slowest = 0;
            for (int i = 0; i < n; ++i) slowest = std::max(slowest, between(members[i], members[(i + 1) % n]).seconds(chunk));
            return slowest;
        };
        switch (kind) {
            case OpKind::all_reduce: return 2.0 * (n - 1) * ring_step(bytes / n);
            case OpKind::reduce_scatter:
            case OpKind::all_gather: return (n - 1) * ring_step(bytes / n);
            case OpKind::broadcast: {
                // Pipelined down the ring from the root: every hop's latency, the
                // slowest hop's bandwidth.
                double latency = 0, slowest = std::numeric_limits<double>::infinity();
                for (int i = 0; i + 1 < n; ++i) {
                    const Link& link = between(members[(root + i) % n], members[(root + i + 1) % n]);
                    latency += link.latency_seconds;
                    slowest = std::min(slowest, link.bytes_per_second);
                }
                return latency + (bytes > 0 ? bytes / slowest : 0.0);
            }
            case OpKind::all_to_all: {
                // Each rank sends a block to every peer, one after another.
                double worst = 0;
                for (int i = 0; i < n; ++i) {
                    double mine = 0;
                    for (int j = 0; j < n; ++j)
                        if (j != i) mine += between(members[i], members[j]).seconds(bytes / n);
                    worst = std::max(worst, mine);
                }
                return worst;
            }
            case OpKind::barrier: return 2.0 * ring_step(0);
            default: return 0;
        }
    }

    friend std::ostream& operator<<(std::ostream& out, const Links& links) {
        out << "Links(" << links.ranks_ << " ranks";
        // Print each distinct link once with the pairs it joins, compactly.
        std::vector<Link> seen;
        for (const Link& link : links.links_)
            if (std::find(seen.begin(), seen.end(), link) == seen.end()) seen.push_back(link);
        for (const Link& link : seen) {
            int pairs = 0;
            for (int a = 0; a < links.ranks_; ++a)
                for (int b = a + 1; b < links.ranks_; ++b) pairs += links.between(a, b) == link;
            if (pairs > 0) out << "; " << pairs << " pairs at " << link;
        }
        return out << ")";
    }

private:
    void check_rank(int rank) const {
        LOOM_CHECK(rank >= 0 && rank < ranks_, "Links: rank ", rank, " is outside 0..", ranks_ - 1);
    }
    [[nodiscard]] std::size_t index(int a, int b) const {
        return static_cast<std::size_t>(a) * static_cast<std::size_t>(ranks_) + static_cast<std::size_t>(b);
    }

    int ranks_;
    std::vector<Link> links_;
};

}  // namespace loom::comm
