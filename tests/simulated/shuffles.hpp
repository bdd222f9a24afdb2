// The warp simulator's shuffles and ballot (warp_simulator.hpp): CUDA's
// __shfl_xor_sync, __shfl_sync and __ballot_sync as the PTX ISA defines
// them, exchanged through per-thread slots between two meetings of the
// lanes of the mask. A meeting here orders no memory (shared_views.hpp).
// Included by warp_simulator.hpp, after its Block.
#pragma once

#include <cstring>

namespace loom_sim {
// A shuffle: every lane of `mask` gives `value` and gets that of lane
// source_lane(its own lane) of its warp, which must be in `mask` too (a
// lane outside it would hand over a stale value). Any value of up to 8
// bytes (the reductions shuffle floats, doubles and 64-bit integers), as
// CUDA's overloads.
template <class T, class Source>
T shuffle(const char* what, unsigned mask, T value, Source source_lane) {
    static_assert(sizeof(T) <= 8);
    const int me = static_cast<int>(threadIdx.x), lane = me % 32;
    Block& b = block();
    std::memcpy(b.exchanged[me].data(), &value, sizeof value);
    lanes_barrier(mask, {what});
    const int source = source_lane(lane);
    if ((mask >> source & 1u) == 0) fail("a shuffle reads a lane its mask leaves out");
    T theirs;
    std::memcpy(&theirs, b.exchanged[me - lane + source].data(), sizeof theirs);
    lanes_barrier(mask, {what});
    return theirs;
}
}  // namespace loom_sim

// Lane (lane ^ lane_mask), the PTX ISA's shfl.bfly: the mask's low 5 bits.
template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
    return loom_sim::shuffle("__shfl_xor_sync", mask, value, [lane_mask](int lane) { return (lane ^ lane_mask) & 31; });
}

// Lane `source` of the lane's `width` lanes (a power of two up to 32), the
// PTX ISA's shfl.idx with its segment: source's low bits within the segment.
template <class T>
T __shfl_sync(unsigned mask, T value, int source, int width = 32) {
    return loom_sim::shuffle("__shfl_sync", mask, value,
                             [source, width](int lane) { return (lane & ~(width - 1)) | (source & (width - 1)); });
}

// Bit l set where lane l of `mask` has a nonzero predicate.
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    const int me = static_cast<int>(threadIdx.x);
    loom_sim::Block& b = loom_sim::block();
    b.exchanged[me][0] = predicate != 0 ? 1 : 0;
    loom_sim::lanes_barrier(mask, {"__ballot_sync"});
    unsigned bits = 0;
    for (int lane = 0; lane < 32; ++lane)
        if ((mask >> lane & 1u) != 0 && b.exchanged[me / 32 * 32 + lane][0] != 0) bits |= 1u << lane;
    loom_sim::lanes_barrier(mask, {"__ballot_sync"});
    return bits;
}
