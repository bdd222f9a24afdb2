// The requests a continuous batcher holds (infer/batcher.hpp,
// infer/speculative_batcher.hpp): those waiting for a slot, in submission
// order, and those running, with what a caller may ask of them. Each
// batcher keeps its own Entry (the slot, the blocks promised, its tokens);
// this is the bookkeeping they share.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace loom::infer {

template <class Entry>
struct RequestQueue {
    std::deque<Entry> waiting;  // submitted, not started: the front starts first
    std::vector<Entry> running;

    [[nodiscard]] bool idle() const noexcept { return running.empty() && waiting.empty(); }

    // Drops request `id`: a waiting one from the queue, a running one after
    // `leave(entry)` frees what it holds. False if it is neither (finished,
    // cancelled or never given).
    template <class Leave>
    bool cancel(std::uint64_t id, Leave&& leave) {
        const auto is = [id](const Entry& e) { return e.id == id; };
        if (const auto w = std::find_if(waiting.begin(), waiting.end(), is); w != waiting.end()) {
            waiting.erase(w);
            return true;
        }
        if (const auto r = std::find_if(running.begin(), running.end(), is); r != running.end()) {
            leave(*r);
            running.erase(r);
            return true;
        }
        return false;
    }
};

}  // namespace loom::infer
