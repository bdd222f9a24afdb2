// A CPU simulator for CUDA device code: just enough of CUDA for loom's
// kernels to run on the host, so that their indexing, masking, reductions
// and fragment bookkeeping are tested where there is no GPU (CI, this
// project's machines). tests/simulated/extract_device_code.py says which
// kernels: the attention kernels (f32, wmma, mma.sync, ring blocks), the
// row passes, the elementwise kernels, gradient compression's, embedding's,
// top-k's, AdamW's and the collectives' reductions.
//
// A thread block is as many fibers (fiber.hpp) as the launch asks (see
// Block below); __syncthreads is a barrier over them, and a warp's
// collectives (shuffles, ballots, and the tensor-core operations of
// tensor_cores.hpp) exchange values through per-thread slots between two
// per-warp barriers. Kernels without either may run their threads one after
// another instead (launch_each).
// Memory. Shared memory starts as NaN bytes in every block. A warp
// collective's rendezvous here would order memory between the lanes, which
// on a GPU only __syncwarp and __syncthreads do, so two models take that
// back where loom's kernels share memory within a warp: a warp-wide load
// (wmma, ldmatrix) must read what the warp's own barriers ordered before it
// (shared_views.hpp: the block's last __syncthreads, and its own lanes'
// writes before its last __syncwarp, never another warp's), and a wmma store
// writes only the storing lane's share of the matrix. Two warps changing one
// byte of dynamic shared memory between two __syncthreads stop the process
// (shared_views.hpp, which also lists what that cannot see).
// Between warps, the turn order (turns.hpp) decides which of two unordered
// accesses comes first; ctest runs the kernels under three, warps in step
// and one warp far ahead of the others from either end, so that a missing
// __syncthreads shows as NaN or a stale value. scripts/barrier_removals.sh
// measures what this catches, removing each barrier of a header in turn
// (docs/design.md has the figures). Still unseen: a lane's plain read of
// another lane's plain write with only a shuffle between, and a write after
// another lane's plain read (write-after-read) within a warp.
// What this cannot show: the hardware's own behaviour (an mma's internal
// summation order, timing, bank conflicts, register limits), nor the
// device's math library (its expf and logf are within 2 ulp of the host's,
// which run here). A kernel that passes here computes the right thing if
// the GPU does what the PTX ISA says; the CUDA tests on a GPU (tests/cuda)
// are still the verification.
//
// Include after every loom header and the standard library: the CUDA
// keywords (cuda_builtins.hpp) are macros.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <map>
#include <source_location>
#include <span>
#include <type_traits>
#include <vector>

// What the extracted device code uses of the host core.
#include "loom/comm/communicator.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/host_device.hpp"
#include "loom/kernels/attention_shape.hpp"
#include "loom/kernels/column_sum_order.hpp"
#include "loom/kernels/host/attention_blocks.hpp"
#include "loom/kernels/host/gelu.hpp"
#include "loom/kernels/host/low_rank.hpp"
#include "loom/kernels/host/quantize.hpp"
#include "loom/optim/adamw.hpp"

#include "simulated/fiber.hpp"
#include "simulated/shared_views.hpp"
#include "simulated/turns.hpp"
// Last: its keywords are macros.
#include "simulated/cuda_builtins.hpp"

namespace loom_sim {

// The attention kernels' block.
inline constexpr int block_threads = 128;

// A simulated thread is a fiber (fiber.hpp), and a block's fibers take
// turns on the calling thread: each runs until it waits at a barrier (or
// ends), then the next. Deterministic, and a barrier costs a few context
// switches rather than an OS thread's wake-up. Each fiber's stack lies above
// a guard page (FiberStacks), so an overflow faults rather than corrupts. A
// barrier's waiters are resumed only once the barrier has opened. Threads
// that arrive at one barrier for different collectives (a shuffle and a
// __syncwarp, two __syncthreads calls) abort the process with both named,
// and so does a block whose fibers all wait at barriers that cannot open:
// where a GPU would hang or misbehave.

// Which collective a thread arrived at a barrier for: its name and, for
// __syncthreads, where it was called; and whether it is a memory barrier
// (__syncthreads, __syncwarp) or only a rendezvous the simulator needs (a
// shuffle, an mma), which on a GPU orders no memory (shared_views.hpp).
struct Meeting {
    const char* what = "a barrier";
    const char* file = "";
    unsigned line = 0;
    bool orders_memory = false;
};

struct Barrier {
    int expected = 0, arrived = 0;
    long generation = 0;
    Meeting first;  // of the threads that arrived in this generation
};

inline constexpr std::size_t fiber_stack_bytes = 256 * 1024;

struct Fiber {
    Context context;
    const Barrier* waiting_on = nullptr;
    long waiting_generation = 0;
    bool finished = false;
};

// Where lane 0 of a warp leaves a wmma product, and the operands it was
// formed from, for the other lanes.
struct WmmaSlot {
    std::array<float, 256> product;
    std::array<unsigned char, 2 * 256 * 2 + 256 * 4> operands;
};

// What the fibers of the running block share: its barrier, one barrier per
// warp, each thread's slots for the values a warp collective exchanges, and
// the scheduler's state.
struct Block {
    explicit Block(int threads)
        : fibers(static_cast<std::size_t>(threads)),
          stacks(threads, fiber_stack_bytes),
          words(static_cast<std::size_t>(threads)),
          exchanged(static_cast<std::size_t>(threads)),
          rows(static_cast<std::size_t>(threads)),
          wmma(static_cast<std::size_t>(threads / 32)),
          warp(static_cast<std::size_t>(threads / 32)),
          lanes(static_cast<std::size_t>(threads / 32)) {
        all.expected = threads;
        for (Barrier& w : warp) w.expected = 32;
    }
    std::vector<Fiber> fibers;
    FiberStacks stacks;
    std::vector<std::array<unsigned, 6>> words;
    std::vector<std::array<unsigned char, 8>> exchanged;
    std::vector<const __nv_bfloat16*> rows;
    std::vector<WmmaSlot> wmma;  // one per warp
    Barrier all;
    std::vector<Barrier> warp;
    std::vector<std::map<unsigned, Barrier>> lanes;  // per warp: a barrier for each mask met
    Context scheduler;
    int current = 0;
    const std::function<void()>* body = nullptr;
    unsigned char* shared = nullptr;
    std::size_t shared_bytes = 0;
    SharedViews views;  // of the dynamic shared memory, per warp
    int last_warp = -1;  // the warp of the fiber that ran last
};
inline Block* running = nullptr;  // one block runs at a time; none in launch_each

[[noreturn]] inline void fail(const char* what) {
    std::fprintf(stderr, "warp_simulator: %s\n", what);
    std::abort();
}

inline Block& block() {
    if (running == nullptr) fail("a kernel run by launch_each met a barrier or a warp collective; use launch");
    return *running;
}

// Two warps changed one byte of shared memory with no __syncthreads between
// (SharedViews::attribute): stops the process, naming the byte and the warps.
inline void stop_at_race(WriteRace race) {
    if (race.byte < 0) return;
    char message[256];
    std::snprintf(message, sizeof message,
                  "warps %d and %d of block %u both wrote byte %ld of shared memory with no __syncthreads between",
                  race.first, race.second, blockIdx.x, race.byte);
    fail(message);
}

// A warp-wide load (`what`) by the running thread of `bytes` bytes at `p`
// must read what its warp's barriers ordered before it (shared_views.hpp);
// else it stops the process, naming the load, the thread, the byte and who
// wrote it: the warp's own lanes since its last barrier, or another warp
// since the last __syncthreads.
inline void check_warp_load(const char* what, const void* p, std::size_t bytes) {
    Block& b = block();
    if (b.views.runs_past_end(p, bytes)) {
        char message[256];
        std::snprintf(message, sizeof message, "%s by thread %u of block %u reads past the end of dynamic shared memory",
                      what, threadIdx.x, blockIdx.x);
        fail(message);
    }
    const int warp = static_cast<int>(threadIdx.x / 32);
    const long byte = b.views.unordered_byte(warp, p, bytes);
    if (byte < 0) return;
    stop_at_race(b.views.attribute(warp));  // this turn's writes are the running warp's
    const int writer = b.views.writer_of(static_cast<std::size_t>(byte));
    char by[96];
    if (writer == warp || writer < 0)
        std::snprintf(by, sizeof by, "by its own lanes since its warp's last __syncwarp or __syncthreads");
    else
        std::snprintf(by, sizeof by, "by warp %d since the last __syncthreads", writer);
    char message[512];
    std::snprintf(message, sizeof message,
                  "%s by thread %u of block %u reads byte %ld of shared memory, written %s: no barrier orders that "
                  "write before this load",
                  what, threadIdx.x, blockIdx.x, byte, by);
    fail(message);
}
inline unsigned char* block_shared() { return block().shared; }

// The running fiber waits until every one of the barrier's threads has
// arrived, all for the same collective (the same __syncthreads call):
// threads that meet at different ones would misbehave or hang on a GPU, and
// abort here with both named.
inline void arrive_and_wait(Barrier& barrier, Meeting at) {
    Block& b = block();
    if (barrier.arrived == 0) {
        barrier.first = at;
    } else if (barrier.first.line != at.line ||
               (barrier.first.what != at.what && std::strcmp(barrier.first.what, at.what) != 0) ||
               (barrier.first.file != at.file && std::strcmp(barrier.first.file, at.file) != 0)) {
        char message[1024];
        std::snprintf(message, sizeof message,
                      "thread %u of block %u met its block or warp at %s (%s:%u), where others met at %s (%s:%u)",
                      threadIdx.x, blockIdx.x, at.what, at.file, at.line, barrier.first.what, barrier.first.file,
                      barrier.first.line);
        fail(message);
    }
    if (++barrier.arrived == barrier.expected) {
        barrier.arrived = 0;
        ++barrier.generation;
        if (at.orders_memory) {
            const int warp = static_cast<int>(threadIdx.x / 32);
            if (&barrier == &b.all)
                stop_at_race(b.views.block_barrier(warp));
            else if (&barrier == &b.warp[static_cast<std::size_t>(warp)])
                stop_at_race(b.views.warp_barrier(warp));
        }
        return;  // the last to arrive goes on; the others resume in their turn
    }
    Fiber& me = b.fibers[static_cast<std::size_t>(b.current)];
    me.waiting_on = &barrier;
    me.waiting_generation = barrier.generation;
    switch_context(me.context, b.scheduler);
}
inline void warp_barrier(Meeting at = {"a warp barrier"}) { arrive_and_wait(block().warp[threadIdx.x / 32], at); }
// The lanes of `mask` (which must include the caller) meet, as a
// collective's mask names them; a full mask is the whole warp.
inline void lanes_barrier(unsigned mask, Meeting at) {
    if (mask == 0xffff'ffffu) return warp_barrier(at);
    if ((mask >> (threadIdx.x % 32) & 1u) == 0) fail("a warp collective's mask leaves out the lane that calls it");
    Barrier& barrier = block().lanes[threadIdx.x / 32][mask];
    barrier.expected = std::popcount(mask);
    arrive_and_wait(barrier, at);
}

[[noreturn]] inline void run_fiber() {
    Block& b = *running;
    (*b.body)();
    Fiber& me = b.fibers[static_cast<std::size_t>(b.current)];
    me.finished = true;
    switch_context(me.context, b.scheduler);  // never resumed
    fail("a finished fiber was resumed");
}

// Whether fiber `f` can take a turn: neither finished nor waiting at a
// barrier that has not opened.
inline bool can_run(const Fiber& f) {
    return !f.finished && (f.waiting_on == nullptr || f.waiting_on->generation != f.waiting_generation);
}

// The fibers the next sweep visits (turns.hpp).
inline Sweep next_sweep(const Block& b) {
    return next_sweep(turns, static_cast<int>(b.fibers.size()),
                      [&b](int t) { return can_run(b.fibers[static_cast<std::size_t>(t)]); });
}

// Runs the block's fibers, in turns (Turns), until all have finished.
inline void run_block(Block& b, unsigned bx, unsigned by) {
    const int threads = static_cast<int>(b.fibers.size());
    for (int t = 0; t < threads; ++t) {
        Fiber& f = b.fibers[static_cast<std::size_t>(t)];
        f.waiting_on = nullptr;
        f.finished = false;
        make_context(f.context, b.stacks.stack(t), b.stacks.bytes(), run_fiber);
    }
    blockIdx = {bx, by, 0};
    b.last_warp = -1;
    for (int left = threads, sweep = 0; left > 0; ++sweep) {
        const Sweep visit = next_sweep(b);
        bool progress = false;
        for (int k = 0; k < visit.count; ++k) {
            const int t = visit.first + (sweep % 2 == 0 ? k : visit.count - 1 - k);
            Fiber& f = b.fibers[static_cast<std::size_t>(t)];
            if (!can_run(f)) continue;
            f.waiting_on = nullptr;
            // What the last warp's fibers wrote is theirs (shared_views.hpp).
            if (const int warp = t / 32; warp != b.last_warp) {
                if (b.last_warp >= 0) stop_at_race(b.views.attribute(b.last_warp));
                b.last_warp = warp;
            }
            b.current = t;
            threadIdx = {static_cast<unsigned>(t), 0, 0};
            switch_context(b.scheduler, f.context);
            progress = true;
            if (f.finished) --left;
        }
        if (!progress) fail("every thread left waits at a barrier that cannot open: divergent __syncthreads or warp");
    }
    stop_at_race(b.views.attribute(b.last_warp));  // the last warp's writes since its last turn began
}

struct Grid {
    unsigned x = 1, y = 1;
};

// body() on every block of `grid`, one block after another, each as
// `threads` fibers (a multiple of 32) with `shared_bytes` of dynamic shared
// memory filled with 0xff bytes (NaN as f32 and bf16), and its static
// shared memory too, so that reading what no thread wrote shows in the
// results.
template <class Body>
void launch(Grid grid, int threads, std::size_t shared_bytes, Body body) {
    if (threads <= 0 || threads % 32 != 0) fail("a block is a positive number of whole warps");
    gridDim = {grid.x, grid.y, 1};
    blockDim = {static_cast<unsigned>(threads), 1, 1};
    // 128-byte aligned, as the kernels declare their dynamic shared memory
    // (__align__(128)); wmma's 32-byte alignment rests on it.
    std::vector<unsigned char> storage(shared_bytes + 128);
    const std::size_t skip = (128 - reinterpret_cast<std::uintptr_t>(storage.data()) % 128) % 128;
    const std::span<unsigned char> shared(storage.data() + skip, shared_bytes);
    Block current(threads);
    const std::function<void()> run = body;
    current.body = &run;
    current.shared = shared.data();
    current.shared_bytes = shared.size();
    running = &current;
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            std::memset(shared.data(), 0xff, shared.size());
            ++block_serial;
            current.views.start(shared.data(), shared.size(), threads / 32);
            run_block(current, bx, by);
        }
    running = nullptr;
}

// The attention kernels' launches: `blocks` blocks of 128 threads.
template <class Body>
void launch(std::int64_t blocks, std::size_t shared_bytes, Body body) {
    launch(Grid{static_cast<unsigned>(blocks), 1}, block_threads, shared_bytes, body);
}

// A kernel without barriers or warp collectives (an elementwise pass): its
// threads one after another on the calling thread, which is what a GPU may
// do too, and fast enough for whole rows of GPT-2's vocabulary.
template <class Body>
void launch_each(Grid grid, int threads, Body body) {
    gridDim = {grid.x, grid.y, 1};
    blockDim = {static_cast<unsigned>(threads), 1, 1};
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            ++block_serial;
            for (int t = 0; t < threads; ++t) {
                threadIdx = {static_cast<unsigned>(t), 0, 0};
                blockIdx = {bx, by, 0};
                body();
            }
        }
}

}  // namespace loom_sim

// Every thread of the block from the same call (its place is recorded).
inline void __syncthreads(std::source_location at = std::source_location::current()) {
    loom_sim::arrive_and_wait(loom_sim::block().all, {"__syncthreads", at.file_name(), at.line(), true});
}

// A memory barrier for the lanes of `mask`; of the whole warp, a new view
// of shared memory for its warp-wide loads (shared_views.hpp).
inline void __syncwarp(unsigned mask = 0xffff'ffffu) { loom_sim::lanes_barrier(mask, {"__syncwarp", "", 0, true}); }

// The shuffles and ballots, and ldmatrix, mma.sync and wmma, in headers of
// their own.
#include "simulated/shuffles.hpp"
#include "simulated/tensor_cores.hpp"
