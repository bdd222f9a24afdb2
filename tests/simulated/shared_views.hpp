// What each warp of a simulated block may rely on seeing in shared memory,
// for the warp simulator (warp_simulator.hpp): the block's dynamic shared
// memory as it stood at the block's last __syncthreads, with what the
// warp's own lanes wrote before its last __syncwarp.
//
// Why. The simulator runs a warp's lanes as fibers that meet at every
// collective, so a shuffle there also orders memory: every lane's writes
// before it are done before any lane goes on. On a GPU only a barrier does
// that. A kernel whose lanes write shared memory and then load it as a
// warp (wmma::load_matrix_sync, whose fragment layout is unspecified, or
// ldmatrix, whose rows go to other lanes) with only a shuffle between would
// pass here and read stale values there. So each warp keeps a view, and a
// warp-wide load from shared memory whose bytes differ from the view read
// something that no barrier ordered before it (written by one of its lanes
// since its last barrier, or by another warp since the last __syncthreads),
// and the simulator stops, naming the warp, the load and the offset.
//
// Who wrote what. A __syncwarp orders only its own warp's writes, so the
// views must know which warp changed each byte. Fibers take turns, so the
// scheduler calls attribute() whenever the next fiber to run belongs to
// another warp, and each barrier calls it for the warp that opens it: the
// bytes changed since the last call are the warp's that ran. A byte two
// warps change between two __syncthreads is a race between warps (on a GPU
// which write lands last is unspecified), and the simulator stops there too.
//
// What it cannot see: static __shared__ arrays (the views and the race
// check cover the block's dynamic shared memory); a write of the same bytes
// the view holds (harmless: the load reads those bytes either way) or the
// memory already holds (a second warp storing the value a first warp stored
// is no race here); a byte changed and changed back within one turn; loads
// that each lane makes of its own (plain C++ reads: a missing __syncthreads
// between warps shows there as NaN from the block's fill or a stale value
// under one of the turn orders, turns.hpp, not here).
// What it would refuse although a GPU allows it: a warp that stores the
// value another warp stored since the last __syncthreads and then loads it
// after a __syncwarp (the bytes stay the first warp's), and any ordering
// between warps but __syncthreads (shared atomics, fences with flags, several
// warps' dead stores to one slot). loom's kernels do none of these; a
// simulated atomic would have to bypass the race check.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <vector>

namespace loom_sim {

// Two warps' writes of one byte with no __syncthreads between them: the
// byte's offset and the warps, in the order they wrote.
struct WriteRace {
    long byte = -1;
    int first = -1, second = -1;
};

class SharedViews {
public:
    // A new block: `bytes` of shared memory at `shared`, just filled, seen
    // alike by all of `warps` warps.
    void start(const unsigned char* shared, std::size_t bytes, int warps) {
        shared_ = shared;
        bytes_ = bytes;
        block_view_.assign(shared, shared + bytes);
        seen_ = block_view_;
        writer_.assign(bytes, no_writer);
        warp_views_.resize(static_cast<std::size_t>(warps));
        own_view_.assign(static_cast<std::size_t>(warps), false);
    }

    // The bytes changed since the last call were written by `warp` (the
    // scheduler calls this before a fiber of another warp runs). Returns the
    // first byte another warp also changed since the last __syncthreads, if any.
    [[nodiscard]] WriteRace attribute(int warp) {
        WriteRace race;
        if (bytes_ == 0 || std::memcmp(seen_.data(), shared_, bytes_) == 0) return race;
        constexpr std::size_t chunk = 64;
        for (std::size_t start = 0; start < bytes_; start += chunk) {
            const std::size_t n = std::min(chunk, bytes_ - start);
            if (std::memcmp(seen_.data() + start, shared_ + start, n) == 0) continue;
            for (std::size_t i = start; i < start + n; ++i) {
                if (seen_[i] == shared_[i]) continue;
                seen_[i] = shared_[i];
                if (writer_[i] != no_writer && writer_[i] != warp && race.byte < 0)
                    race = {static_cast<long>(i), writer_[i], warp};
                writer_[i] = static_cast<signed char>(warp);
            }
        }
        return race;
    }

    // A __syncthreads opened (by a lane of `warp`, whose writes since the
    // scheduler last attributed any are its own): every warp sees everything
    // written before it.
    [[nodiscard]] WriteRace block_barrier(int warp) {
        const WriteRace race = attribute(warp);
        std::memcpy(block_view_.data(), shared_, bytes_);
        seen_ = block_view_;
        writer_.assign(bytes_, no_writer);
        own_view_.assign(own_view_.size(), false);
        return race;
    }

    // A __syncwarp of the whole warp opened: the warp sees what its lanes
    // wrote before it, and of other warps' writes only those before the last
    // __syncthreads.
    [[nodiscard]] WriteRace warp_barrier(int warp) {
        const WriteRace race = attribute(warp);
        const auto w = static_cast<std::size_t>(warp);
        std::vector<unsigned char>& view = warp_views_[w];
        if (!own_view_[w]) view = block_view_;
        for (std::size_t i = 0; i < bytes_; ++i)
            if (writer_[i] == warp) view[i] = shared_[i];
        own_view_[w] = true;
        return race;
    }
    // The warp that changed byte `offset` since the last __syncthreads, as
    // far as attribute() has seen, or -1.
    [[nodiscard]] int writer_of(std::size_t offset) const { return writer_[offset]; }

    // Whether the `bytes` bytes at `p` start in the block's dynamic shared
    // memory but run past its end (a load out of bounds).
    [[nodiscard]] bool runs_past_end(const void* p, std::size_t bytes) const {
        const auto* byte = static_cast<const unsigned char*>(p);
        return byte >= shared_ && byte < shared_ + bytes_ && byte + bytes > shared_ + bytes_;
    }

    // The byte offset of the first of `bytes` bytes at `p` that differ from
    // what `warp` may rely on, or -1 when they are all the same (or not in
    // the block's dynamic shared memory, which the views do not cover).
    [[nodiscard]] long unordered_byte(int warp, const void* p, std::size_t bytes) const {
        const auto* byte = static_cast<const unsigned char*>(p);
        if (byte < shared_ || byte + bytes > shared_ + bytes_) return -1;
        const std::size_t offset = static_cast<std::size_t>(byte - shared_);
        const auto w = static_cast<std::size_t>(warp);
        const unsigned char* view = (own_view_[w] ? warp_views_[w].data() : block_view_.data()) + offset;
        if (std::memcmp(view, byte, bytes) == 0) return -1;
        for (std::size_t i = 0; i < bytes; ++i)
            if (view[i] != byte[i]) return static_cast<long>(offset + i);
        return -1;
    }

private:
    static constexpr signed char no_writer = -1;  // warps number at most 32
    const unsigned char* shared_ = nullptr;
    std::size_t bytes_ = 0;
    std::vector<unsigned char> block_view_;
    std::vector<std::vector<unsigned char>> warp_views_;
    std::vector<bool> own_view_;  // per warp: its own view (a __syncwarp since the last __syncthreads)
    std::vector<unsigned char> seen_;  // shared memory when writes were last attributed
    std::vector<signed char> writer_;  // per byte: the warp that changed it since the last __syncthreads
};

}  // namespace loom_sim
