// What each warp of a simulated block may rely on seeing in shared memory,
// for the warp simulator (warp_simulator.hpp): the block's dynamic shared
// memory as it stood at the warp's last memory barrier, __syncthreads or
// __syncwarp.
//
// Why. The simulator runs a warp's lanes as fibers that meet at every
// collective, so a shuffle there also orders memory: every lane's writes
// before it are done before any lane goes on. On a GPU only a barrier does
// that. A kernel whose lanes write shared memory and then load it as a
// warp (wmma::load_matrix_sync, whose fragment layout is unspecified, or
// ldmatrix, whose rows go to other lanes) with only a shuffle between would
// pass here and read stale values there. So each warp keeps a view: a copy
// of the shared memory taken when its last barrier opened. A warp-wide load
// from shared memory whose bytes differ from the view read something that
// no barrier ordered before it (written by one of its lanes, or by another
// warp, since that barrier), and the simulator stops, naming the warp, the
// load and the offset.
//
// What it cannot see: a write of the same bytes the view holds (harmless:
// the load reads those bytes either way); loads that each lane makes of its
// own (plain C++ reads; a missing __syncthreads between warps shows there
// as NaN from the block's fill, not here); static __shared__ arrays; a
// race between warps read after a __syncwarp (see warp_barrier below).
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <vector>

namespace loom_sim {

class SharedViews {
public:
    // A new block: `bytes` of shared memory at `shared`, just filled, seen
    // alike by all of `warps` warps.
    void start(const unsigned char* shared, std::size_t bytes, int warps) {
        shared_ = shared;
        bytes_ = bytes;
        block_view_.assign(shared, shared + bytes);
        warp_views_.resize(static_cast<std::size_t>(warps));
        own_view_.assign(static_cast<std::size_t>(warps), false);
    }

    // A __syncthreads opened: every warp sees everything written before it.
    void block_barrier() {
        std::memcpy(block_view_.data(), shared_, bytes_);
        own_view_.assign(own_view_.size(), false);
    }

    // A __syncwarp of the whole warp opened: the warp sees what its lanes
    // wrote before it. (The copy also takes in what other warps wrote since
    // the last __syncthreads, which no barrier orders for this warp: a race
    // between warps read by a warp-wide load after a __syncwarp goes unseen
    // here. Between warps the block's NaN fill and the turn order are what
    // show a missing __syncthreads.)
    void warp_barrier(int warp) {
        const auto w = static_cast<std::size_t>(warp);
        warp_views_[w].assign(shared_, shared_ + bytes_);
        own_view_[w] = true;
    }

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
    const unsigned char* shared_ = nullptr;
    std::size_t bytes_ = 0;
    std::vector<unsigned char> block_view_;
    std::vector<std::vector<unsigned char>> warp_views_;
    std::vector<bool> own_view_;  // per warp: its own view (a __syncwarp since the last __syncthreads)
};

}  // namespace loom_sim
