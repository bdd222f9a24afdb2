// Peer memory pooling, the copy stream (EnergonAI): a thread that copies a
// PooledGpt's pooled blocks, in the order a forward pass reads them, into a
// ring of lookahead + 1 staging buffers, so a pooled block is in the
// engine's memory by the time the engine reaches it. The engine asks for
// each block in turn (acquire), computes, and gives it back (release); the
// copy of the block `lookahead` pooled blocks further on runs meanwhile.
//
// A pass reads every pooled block in ascending order and the next pass does
// the same, so the copies run on across passes: while the engine runs the
// head and samples, the next pass's first blocks arrive. A pass that stopped
// part way (a forward that threw) resumes at the block it asks for next; the
// copies fetched for the blocks it skipped are dropped.
//
// A link model makes a copy of B bytes take at least B / rate (PCIe from the
// host, NVLink from a peer), so a host run shows what the overlap would hide
// on such a link; rate 0 copies as fast as memory allows. With `trace`, it
// records each block's compute and waits (lane 0) and each copy (lane 1) as
// trace events (exec/trace.hpp; scripts/draw_trace.py draws them).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <ostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/shaped.hpp"
#include "loom/core/error.hpp"
#include "loom/exec/trace.hpp"
#include "loom/gpt/model.hpp"
#include "loom/infer/pooled_gpt.hpp"

namespace loom::infer {

struct PrefetchOptions {
    std::int64_t lookahead = 1;         // pooled blocks copied ahead of the one computing (1..pooled count - 1)
    double link_bytes_per_second = 0;  // a copy's floor: bytes / rate seconds; 0: none
    bool trace = false;                // record trace_events()

    friend std::ostream& operator<<(std::ostream& out, const PrefetchOptions& o) {
        out << "Prefetch(lookahead=" << o.lookahead;
        if (o.link_bytes_per_second > 0) out << ", link=" << o.link_bytes_per_second / 1e9 << " GB/s";
        return out << ')';
    }
};

// What the copies cost and how much of it the engine waited for.
struct PrefetchCounts {
    std::int64_t copies = 0;         // blocks copied into the ring
    std::int64_t copied_bytes = 0;
    std::int64_t copy_ns = 0;        // the copy thread's time copying (and on the modelled link)
    std::int64_t acquires = 0;       // pooled blocks the engine asked for
    std::int64_t waited_ns = 0;      // the engine's time waiting for a copy
};

class BlockPrefetcher {
public:
    // Starts the copy thread. `pooled` must outlive this object; its model's
    // pooled blocks are bound to their staged copies between acquire and release.
    BlockPrefetcher(PooledGpt& pooled, PrefetchOptions options)
        : pooled_(pooled), options_(options), order_(pooled.pooled()) {
        const auto count = static_cast<std::int64_t>(order_.size());
        LOOM_CHECK(count >= 2, "BlockPrefetcher: ", count, " pooled block", count == 1 ? "" : "s",
                   "; prefetching needs at least 2 (with fewer, read the pooled block in place: no prefetcher)");
        LOOM_CHECK(options.lookahead >= 1 && options.lookahead < count, "BlockPrefetcher: lookahead ",
                   options.lookahead, " is not in 1..", count - 1, " (the pooled blocks but one; with ", count,
                   " staged every pooled block would stay in the engine's memory)");
        LOOM_CHECK(options.link_bytes_per_second >= 0, "BlockPrefetcher: link rate ", options.link_bytes_per_second,
                   " bytes/s is negative; give 0 (no link model) or a rate");
        slots_ = options.lookahead + 1;
        ring_.resize(static_cast<std::size_t>(slots_ * pooled.block_floats()));
        copier_ = std::thread([this] { copy_loop(); });
    }

    BlockPrefetcher(const BlockPrefetcher&) = delete;
    BlockPrefetcher& operator=(const BlockPrefetcher&) = delete;

    ~BlockPrefetcher() {
        {
            const std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        changed_.notify_all();
        copier_.join();
        if (held_ >= 0) pooled_.bind_block_home(order_[static_cast<std::size_t>(held_ % count())]);
    }

    [[nodiscard]] PooledGpt& pooled() noexcept { return pooled_; }
    [[nodiscard]] const PrefetchOptions& options() const noexcept { return options_; }
    // The ring's bytes: what prefetching adds to the engine's memory.
    [[nodiscard]] std::int64_t staging_bytes() const noexcept {
        return static_cast<std::int64_t>(ring_.size() * sizeof(float));
    }
    [[nodiscard]] PrefetchCounts counts() const {
        const std::lock_guard lock(mutex_);
        return counts_;
    }
    // With PrefetchOptions::trace: every block's compute (acquire to release)
    // and wait on lane 0, every copy on lane 1, in the order they ended.
    [[nodiscard]] std::vector<exec::TraceEvent> trace_events() const {
        const std::lock_guard lock(mutex_);
        return events_;
    }

    // Block `block` of the model, ready to compute with: a resident block as
    // it is, a pooled one bound to its staged copy (after waiting for it).
    gpt::Block& acquire(std::int64_t block) {
        gpt::Block& b = pooled_.model().blocks.at(static_cast<std::size_t>(block));
        if (options_.trace) computing_since_ = std::chrono::steady_clock::now();
        if (pooled_.home(block) == BlockHome::resident) return b;
        std::unique_lock lock(mutex_);
        if (held_ >= 0) give_back(lock);  // the last pass stopped while it held a block
        const auto start = comm::detail::steady_now_ns();
        while (order_[static_cast<std::size_t>(consumed_ % count())] != block) {  // skip what a stopped pass left
            changed_.wait(lock, [&] { return fetched_ > consumed_; });
            ++consumed_;
            changed_.notify_all();
        }
        changed_.wait(lock, [&] { return fetched_ > consumed_; });
        const auto waited = comm::detail::steady_now_ns() - start;
        counts_.waited_ns += waited;
        ++counts_.acquires;
        if (options_.trace && waited > 0) {
            const auto now = std::chrono::steady_clock::now();
            events_.push_back({"wait for block " + std::to_string(block), "wait", exec::compute_lane,
                               exec::trace_clock_us(computing_since_),
                               exec::trace_clock_us(now) - exec::trace_clock_us(computing_since_)});
            computing_since_ = now;
        }
        held_ = consumed_;
        pooled_.bind_block(block, slot(held_));
        return b;
    }

    // Gives block `block` back: its staging buffer takes the next copy.
    void release(std::int64_t block) {
        if (options_.trace) record_compute(block);
        if (pooled_.home(block) == BlockHome::resident) return;
        std::unique_lock lock(mutex_);
        LOOM_CHECK(held_ >= 0 && order_[static_cast<std::size_t>(held_ % count())] == block,
                   "BlockPrefetcher: release of block ", block, " which is not the block acquired (",
                   held_ < 0 ? std::string("none") : std::to_string(order_[static_cast<std::size_t>(held_ % count())]),
                   ")");
        give_back(lock);
    }

    friend std::ostream& operator<<(std::ostream& out, const BlockPrefetcher& p) {
        return out << "BlockPrefetcher(" << p.options_ << ", " << p.slots_ << " staging buffers of "
                   << p.pooled_.block_floats() * static_cast<std::int64_t>(sizeof(float)) << " bytes)";
    }

private:
    [[nodiscard]] std::int64_t count() const noexcept { return static_cast<std::int64_t>(order_.size()); }
    [[nodiscard]] float* slot(std::int64_t sequence) noexcept {
        return ring_.data() + (sequence % slots_) * pooled_.block_floats();
    }

    void record_compute(std::int64_t block) {
        const double from = exec::trace_clock_us(computing_since_);
        const double to = exec::trace_clock_us(std::chrono::steady_clock::now());
        const std::lock_guard lock(mutex_);
        events_.push_back({"block " + std::to_string(block) + " (" + to_string(pooled_.home(block)) + ")",
                           "forward", exec::compute_lane, from, to - from});
    }

    void give_back(std::unique_lock<std::mutex>&) {
        pooled_.bind_block_home(order_[static_cast<std::size_t>(held_ % count())]);
        held_ = -1;
        ++consumed_;
        changed_.notify_all();
    }

    // Copy number j is pooled block order_[j % count] into slot j % slots, once
    // copy j - slots has been given back.
    void copy_loop() {
        const auto bytes = pooled_.block_floats() * static_cast<std::int64_t>(sizeof(float));
        const std::int64_t floor_ns =
            options_.link_bytes_per_second > 0
                ? comm::detail::seconds_to_ns(static_cast<double>(bytes) / options_.link_bytes_per_second)
                : 0;
        std::unique_lock lock(mutex_);
        for (;;) {
            changed_.wait(lock, [&] { return stopping_ || fetched_ - consumed_ < slots_; });
            if (stopping_) return;
            const std::int64_t j = fetched_;
            lock.unlock();
            const auto start = comm::detail::steady_now_ns();
            const std::int64_t block = order_[static_cast<std::size_t>(j % count())];
            const std::span<const float> from = pooled_.block_values(block);
            std::memcpy(slot(j), from.data(), static_cast<std::size_t>(bytes));
            if (floor_ns > 0) comm::detail::sleep_until_ns(start + floor_ns);
            const auto took = comm::detail::steady_now_ns() - start;
            lock.lock();
            ++fetched_;
            ++counts_.copies;
            counts_.copied_bytes += bytes;
            counts_.copy_ns += took;
            if (options_.trace)
                events_.push_back({"copy block " + std::to_string(block), "copy", exec::communication_lane,
                                   static_cast<double>(start) / 1e3, static_cast<double>(took) / 1e3});
            changed_.notify_all();
        }
    }

    PooledGpt& pooled_;
    PrefetchOptions options_;
    std::vector<std::int64_t> order_;  // the pooled blocks, in the order a pass reads them
    std::int64_t slots_ = 0;
    std::vector<float> ring_;

    mutable std::mutex mutex_;
    std::condition_variable changed_;
    std::int64_t fetched_ = 0;   // copies finished
    std::int64_t consumed_ = 0;  // copies given back (or skipped)
    std::int64_t held_ = -1;     // the copy the engine holds, if any
    bool stopping_ = false;
    PrefetchCounts counts_;
    std::vector<exec::TraceEvent> events_;
    std::chrono::steady_clock::time_point computing_since_;  // the engine thread's: when its block began
    std::thread copier_;  // last: started once everything above is set
};

}  // namespace loom::infer
